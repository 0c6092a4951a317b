//go:build !linux

package torture

import "syscall"

// childAttr adds nothing outside Linux: there a replica shares the run's
// process group, and a Ctrl-C on the terminal reaches both.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{}
}
