package idemtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

// ClusterScaleEnv names the environment variable that lengthens the
// cluster tests: an integer multiplier of their operations. Unset, empty or
// 1 is the short form CI runs (a few hundred operations, one failover per
// engine).
const ClusterScaleEnv = "IDEMTEST_CLUSTER_SCALE"

// ClusterScale returns the multiplier ClusterScaleEnv asks for, 1 when it is
// unset. A value that is not a positive integer fails the test: it is a
// mistake, not a request for the default.
func ClusterScale(t testing.TB) int {
	t.Helper()
	raw := os.Getenv(ClusterScaleEnv)
	if raw == "" {
		return 1
	}
	n, err := strconv.Atoi(raw)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a positive integer", ClusterScaleEnv, raw)
	}
	return n
}

// RequireBinaries is the gate for tests that start their own servers: it
// looks each program up in PATH and returns their paths by name. When one
// is missing the test is skipped with the reason, or fails if
// IDEM_REQUIRE_SERVICES is 1, the rule RequireService follows.
func RequireBinaries(t testing.TB, names ...string) map[string]string {
	t.Helper()
	paths := make(map[string]string, len(names))
	for _, name := range names {
		p, err := exec.LookPath(name)
		if err != nil {
			missing(t, fmt.Sprintf("%s is not installed (%v)", name, err))
			return nil
		}
		paths[name] = p
	}
	return paths
}

// missing skips the test with reason, or fails it under
// IDEM_REQUIRE_SERVICES=1.
func missing(t testing.TB, reason string) {
	t.Helper()
	if os.Getenv(RequireServicesEnv) == "1" {
		t.Fatalf("%s; %s=1 requires it", reason, RequireServicesEnv)
		return
	}
	t.Skipf("skipping: %s; set %s=1 to fail instead", reason, RequireServicesEnv)
}

// FreePorts returns n distinct TCP ports on 127.0.0.1 that were free a
// moment ago. They are held open together while picked, so no two are the
// same; another process could still take one before the server binds it,
// which on a test machine is rare enough to be a failure worth seeing.
func FreePorts(t testing.TB, n int) []int {
	t.Helper()
	ports := make([]int, 0, n)
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("picking a free port: %v", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports
}

// A Process is a server a test started. It is killed (SIGKILL, or
// ProcessOptions.StopSignal) when the test ends, pass or fail, unless it has
// already exited.
type Process struct {
	// Name says which server it is, in messages.
	Name string
	// Log is the file that holds its standard output and error.
	Log string

	cmd   *exec.Cmd
	group bool
	done  chan struct{}
	err   error // set before done closes
}

// ProcessOptions are StartProcess's optional settings; nil means none.
type ProcessOptions struct {
	// Dir is the working directory. Defaults to the test's.
	Dir string
	// Credential runs the process as another user (a database server that
	// refuses to run as root). Defaults to nil: the test's own user.
	Credential *syscall.Credential
	// Env is added to the test's environment.
	Env []string
	// StopSignal is what the end of the test sends the process, unless it
	// has exited. Defaults to SIGKILL.
	StopSignal syscall.Signal
	// Group sends every signal to the process's whole process group, for
	// a launcher script that runs the server as its child
	// (rabbitmq-server), which a signal to the script alone would leave
	// running. Defaults to false: the process alone.
	Group bool
}

// StartProcess starts argv[0] with the rest as its arguments, its output
// appended to log, and returns at once: the caller waits for the server to
// answer in its own way.
func StartProcess(t testing.TB, name, log string, opt *ProcessOptions, argv ...string) *Process {
	t.Helper()
	if opt == nil {
		opt = &ProcessOptions{}
	}
	out, err := os.OpenFile(log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatalf("%s: opening its log: %v", name, err)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.Dir = opt.Dir
	cmd.Env = append(os.Environ(), opt.Env...)
	// Its own process group, so that a terminal's ^C reaches the test
	// (which then kills it) rather than the server behind its back.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: opt.Credential}
	if err := cmd.Start(); err != nil {
		out.Close()
		t.Fatalf("%s: starting %s: %v", name, argv[0], err)
	}
	p := &Process{Name: name, Log: log, cmd: cmd, done: make(chan struct{}), group: opt.Group}
	go func() {
		p.err = cmd.Wait()
		out.Close()
		close(p.done)
	}()
	stop := opt.StopSignal
	if stop == 0 {
		stop = syscall.SIGKILL
	}
	t.Cleanup(func() {
		if err := p.Signal(stop); err != nil {
			t.Error(err)
		}
		if err := p.WaitExit(30 * time.Second); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	})
	return p
}

// Pid is the process's id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Signal sends sig to the process, unless it has exited.
func (p *Process) Signal(sig syscall.Signal) error {
	select {
	case <-p.done:
		return nil
	default:
	}
	if p.group {
		// The group's id is the launcher's pid (Setpgid).
		if err := syscall.Kill(-p.cmd.Process.Pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("%s: sending %v to its process group: %w", p.Name, sig, err)
		}
		return nil
	}
	if err := p.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("%s: sending %v: %w", p.Name, sig, err)
	}
	return nil
}

// Kill sends SIGKILL: the process dies at once, with whatever it had not
// written or sent.
func (p *Process) Kill() { _ = p.Signal(syscall.SIGKILL) }

// Exited reports whether the process has ended.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Done is closed when the process has ended.
func (p *Process) Done() <-chan struct{} { return p.done }

// WaitExit waits up to limit for the process to end, and says so if it did
// not.
func (p *Process) WaitExit(limit time.Duration) error {
	t := time.NewTimer(limit)
	defer t.Stop()
	select {
	case <-p.done:
		return nil
	case <-t.C:
		return fmt.Errorf("still running %s after it was told to stop", limit)
	}
}

// TailLog returns the end of the process's log, for a failure message.
func (p *Process) TailLog() string { return tailFile(p.Log, 4096) }

func tailFile(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	if len(b) > n {
		b = b[len(b)-n:]
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	return string(b)
}

// RunCommand runs a short command (a server's command-line client or
// control program) to completion within limit and returns its combined
// output; a failure is an error carrying that output.
func RunCommand(ctx context.Context, limit time.Duration, opt *ProcessOptions, argv ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	if opt != nil {
		cmd.Dir = opt.Dir
		cmd.Env = append(os.Environ(), opt.Env...)
		if opt.Credential != nil {
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: opt.Credential}
		}
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s: %w: %s", argv[0], err, bytes.TrimSpace(out))
	}
	return string(out), nil
}

// mkdir makes a private folder for a server's data.
func mkdir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("making %s: %w", dir, err)
	}
	return nil
}

// resultMu keeps the RESULT lines of parallel tests whole.
var resultMu sync.Mutex

// ClusterResult reports one figure of a cluster test: in the test's log,
// and on standard output as
//
//	RESULT,cluster-<engine>-failover,<metric>,<value>,<unit>
//
// so that runs can be collected and compared.
func ClusterResult(t testing.TB, engine, metric string, value any, unit string) {
	t.Helper()
	t.Logf("cluster-%s-failover: %s = %v %s", engine, metric, value, unit)
	resultMu.Lock()
	defer resultMu.Unlock()
	fmt.Printf("RESULT,cluster-%s-failover,%s,%v,%s\n", engine, metric, value, unit)
}
