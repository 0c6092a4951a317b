package main

import (
	"fmt"
	"runtime"
	"runtime/debug"

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

func (a *app) versionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		RunE: a.action(func(*cobra.Command, []string) error {
			_, err := fmt.Fprintln(a.stdout, versionString())
			return err
		}),
	}
}
