package main

import (
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"
)

// version is set at build time with -ldflags "-X main.version=v1.2.3";
// otherwise it comes from the module's build information.
var version = ""

func versionString() string {
	v, rev, dirty := version, "", false
	if info, ok := debug.ReadBuildInfo(); ok {
		if v == "" && info.Main.Version != "" && info.Main.Version != "(devel)" {
			v = info.Main.Version
		}
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
	}
	if v == "" {
		v = "devel"
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if rev != "" {
		v += " " + rev
		if dirty {
			v += "+dirty"
		}
	}
	return fmt.Sprintf("idem %s (%s %s/%s)", v, runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

// idemModules writes the version of each of idem's library modules the
// command was built with, one a line, as the build information has them
// ("(devel)" for a module of the workspace it was built in).
func idemModules(w io.Writer) error {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		_, err := fmt.Fprintln(w, "  (no build information)")
		return err
	}
	for _, m := range info.Deps {
		if m.Path != "github.com/idem-go/idem" && !strings.HasPrefix(m.Path, "github.com/idem-go/idem/") {
			continue
		}
		v := m.Version
		if m.Replace != nil {
			v += " => " + m.Replace.Path
		}
		if _, err := fmt.Fprintf(w, "  %s %s\n", m.Path, v); err != nil {
			return err
		}
	}
	return nil
}

func (a *app) versionCmd() *cobra.Command {
	var modules bool
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Long: `Print the command's version: the module version it was installed at
(go install github.com/idem-go/idem/cmd/idem@VERSION), or "devel" and the
commit for a build from a clone. --modules adds the version of each of
idem's library modules in the build.`,
		Args: cobra.NoArgs,
		RunE: a.action(func(*cobra.Command, []string) error {
			if _, err := fmt.Fprintln(a.stdout, versionString()); err != nil {
				return err
			}
			if modules {
				return idemModules(a.stdout)
			}
			return nil
		}),
	}
	cmd.Flags().BoolVar(&modules, "modules", false, "also print the version of each idem library module in the build")
	return cmd
}
