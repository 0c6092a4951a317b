package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"
)

// idemBin is the idem binary every replica runs, built once by TestMain.
var idemBin string

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "idem-e2e-bin-")
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e: %v\n", err)
		return 1
	}
	defer os.RemoveAll(dir)
	idemBin = filepath.Join(dir, "idem")
	// Built without -race whatever the test binary uses: the replicas are
	// subprocesses, and the race detector would only slow them down.
	build := exec.Command("go", "build", "-o", idemBin, "github.com/idem-go/idem/cmd/idem")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: building the idem binary: %v\n", err)
		return 1
	}
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: goroutines leaked: %v\n", err)
			return 1
		}
	}
	return code
}
