//go:build !linux

package torture

import (
	"syscall"
	"time"
)

// childAttr adds nothing outside Linux: there a replica shares the run's
// process group, and a Ctrl-C on the terminal reaches both.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{}
}

// cpuTime cannot read a process's CPU time outside Linux: a replica's
// start is then bounded by the wall clock alone.
func cpuTime(int) (time.Duration, bool) { return 0, false }
