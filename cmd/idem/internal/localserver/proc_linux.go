package localserver

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// childAttr puts a server in a process group of its own, so that a Ctrl-C
// on the terminal reaches the caller alone and a signal to the group
// reaches the server's helpers too; has the kernel kill it if the caller
// dies, so none outlives it; and runs it as cred, when set. Go sets the
// parent-death signal after the credentials, whose change would clear it.
func childAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, Credential: cred}
}

// killTree SIGKILLs the server whose pid is leader, its process group and
// every process descended from it, and returns the descendants. The group
// is not enough: each of PostgreSQL's backends makes itself a session of
// its own (setsid), and one left running after its postmaster holds the
// shared memory that a new postmaster refuses to start beside. The server
// is stopped first (SIGSTOP), so that it forks no process while its
// descendants are listed.
func killTree(leader int) ([]int, error) {
	if err := syscall.Kill(-leader, syscall.SIGSTOP); err != nil {
		if errors.Is(err, syscall.ESRCH) {
			return nil, nil
		}
		return nil, err
	}
	// A fork under way when SIGSTOP came completes first.
	deadline := time.Now().Add(time.Second)
	for step := time.Millisecond; time.Now().Before(deadline); step = min(2*step, 50*time.Millisecond) {
		if p, ok := readProcs()[leader]; !ok || p.state == "T" || p.state == "Z" {
			break
		}
		time.Sleep(step)
	}
	procs := readProcs()
	var tree []int
	for pid := range procs {
		if pid != leader && descends(procs, pid, leader) {
			tree = append(tree, pid)
		}
	}
	err := syscall.Kill(-leader, syscall.SIGKILL)
	if errors.Is(err, syscall.ESRCH) {
		err = nil
	}
	for _, pid := range tree {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	return tree, err
}

// descends reports whether pid is a descendant of ancestor.
func descends(procs map[int]procInfo, pid, ancestor int) bool {
	for range len(procs) { // bounds a loop in a table read while it changed
		p, ok := procs[pid]
		if !ok || p.ppid <= 1 {
			return false
		}
		if p.ppid == ancestor {
			return true
		}
		pid = p.ppid
	}
	return false
}

// waitGone waits until no process of group pgid nor any of pids is left
// but zombies: the orphans of a killed server are reaped by whoever adopts
// them, which may take its time or never come, and a zombie holds neither
// a port nor memory.
func waitGone(pgid int, pids []int, limit time.Duration, server string) error {
	deadline := time.Now().Add(limit)
	for step := time.Millisecond; ; step = min(2*step, 100*time.Millisecond) {
		var left []int
		procs := readProcs()
		for pid, p := range procs {
			if p.pgrp == pgid {
				left = append(left, pid)
			}
		}
		for _, pid := range pids {
			if p, ok := procs[pid]; ok && p.pgrp != pgid {
				left = append(left, pid)
			}
		}
		if len(left) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("localserver: %s: processes %v still run %s after SIGKILL", server, left, limit)
		}
		time.Sleep(step)
	}
}

// procInfo is what /proc/PID/stat says of a process.
type procInfo struct {
	state      string
	ppid, pgrp int
}

// readProcs reads every live process (zombies aside) from /proc.
func readProcs() map[int]procInfo {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	procs := make(map[int]procInfo, len(stats))
	for _, path := range stats {
		b, err := os.ReadFile(path)
		if err != nil {
			continue // it ended meanwhile
		}
		// pid (comm) state ppid pgrp …; comm may hold spaces and
		// parentheses, so cut after its last ')'.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		j := strings.IndexByte(s, ' ')
		if i < 0 || j < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) < 3 || f[0] == "Z" || f[0] == "X" {
			continue
		}
		pid, err1 := strconv.Atoi(s[:j])
		ppid, err2 := strconv.Atoi(f[1])
		pgrp, err3 := strconv.Atoi(f[2])
		if err1 != nil || err2 != nil || err3 != nil {
			continue
		}
		procs[pid] = procInfo{state: f[0], ppid: ppid, pgrp: pgrp}
	}
	return procs
}
