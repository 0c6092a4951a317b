package torture

import "syscall"

// childAttr puts a replica in a process group of its own, so a Ctrl-C on
// the terminal reaches the run alone, which then stops its replicas; and
// has the kernel kill it if the run itself dies, so none outlives it.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
