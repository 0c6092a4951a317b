//go:build !linux

package localserver

import (
	"errors"
	"fmt"
	"syscall"
	"time"
)

// childAttr puts a server in a process group of its own, so that a Ctrl-C
// on the terminal reaches the caller alone and a signal to the group
// reaches the server's helpers too, and runs it as cred, when set.
// Outside Linux nothing kills it should the caller die.
func childAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Credential: cred}
}

// killTree SIGKILLs the server's process group. Without /proc it finds no
// process of the server outside the group (PostgreSQL's backends, each a
// session of its own, exit by themselves once their postmaster has gone).
func killTree(leader int) ([]int, error) {
	if err := syscall.Kill(-leader, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return nil, err
	}
	return nil, nil
}

// waitGone waits until kill(2) finds no process in group pgid.
func waitGone(pgid int, _ []int, limit time.Duration, server string) error {
	deadline := time.Now().Add(limit)
	for step := time.Millisecond; ; step = min(2*step, 100*time.Millisecond) {
		if err := syscall.Kill(-pgid, 0); errors.Is(err, syscall.ESRCH) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("localserver: %s: processes of its group still run %s after SIGKILL", server, limit)
		}
		time.Sleep(step)
	}
}
