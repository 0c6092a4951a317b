package localserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// Bounds on a server's life, so that one that hangs fails its caller
// instead of holding it.
const (
	// stopTimeout is how long a clean stop may take before the server is
	// killed.
	stopTimeout = 60 * time.Second
	// goneTimeout is how long the processes of a killed server may take
	// to be gone.
	goneTimeout = 20 * time.Second
	// probeTimeout bounds one readiness probe.
	probeTimeout = 2 * time.Second
	// logTail is how much of the end of a server's log an error carries.
	logTail = 3000
)

// A Server is a private server process: started by one of the Start
// functions, restarted by Restart, stopped for good by Close. Its methods
// are safe for concurrent use; Restart and Close wait for each other.
type Server struct {
	name string
	addr string // host:port of its clients' port
	url  string
	log  string // its log file, in its folder

	argv         []string
	env          []string // its whole environment
	dir          string   // its working directory
	cred         *syscall.Credential
	stdinPipe    bool           // give it a pipe on stdin that the caller holds (RabbitMQ)
	stopSignal   syscall.Signal // a clean stop
	readyTimeout time.Duration
	// ready reports whether the server serves; it is called again until
	// it returns nil, within readyTimeout.
	ready func(ctx context.Context) error

	mu     sync.Mutex
	proc   *process
	closed bool
}

// process is one run of a server's program.
type process struct {
	cmd   *exec.Cmd
	done  chan struct{} // closed once it has exited and been reaped
	stdin *os.File      // the write end of its stdin pipe, or nil
}

// URL is the URL a client connects to the server with.
func (s *Server) URL() string { return s.url }

// Name is the server's kind: "postgres", "redis", "nats" or "rabbitmq".
func (s *Server) Name() string { return s.name }

// Addr is host:port of the server's clients' port, on 127.0.0.1.
func (s *Server) Addr() string { return s.addr }

// Log is the path of the server's log file, in its folder.
func (s *Server) Log() string { return s.log }

// Restart stops the server, with SIGKILL to its whole process group when
// crash is true (it dies with whatever it had not written) or cleanly
// otherwise, then starts it again on the same port and data, and returns
// once it serves again.
func (s *Server) Restart(ctx context.Context, crash bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("localserver: %s: Restart after Close", s.name)
	}
	if crash {
		if err := s.kill(); err != nil {
			return err
		}
	} else if err := s.stop(); err != nil {
		return err
	}
	return s.start(ctx)
}

// Close stops the server for good: cleanly (SIGINT for PostgreSQL, which
// SIGTERM would leave waiting for its clients to leave; SIGTERM for the
// others), then with SIGKILL if it has not stopped within a minute. It
// leaves the server's folder to the caller. Closing again does nothing.
func (s *Server) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	return s.stop()
}

// start starts the program and waits until it serves; a server that does
// not is killed, and the error says why.
func (s *Server) start(ctx context.Context) error {
	out, err := os.OpenFile(s.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("localserver: %s: opening its log: %w", s.name, err)
	}
	fmt.Fprintf(out, "\n=== localserver: starting %s at %s\n", s.name, time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(s.argv[0], s.argv[1:]...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.Env = s.env
	cmd.Dir = s.dir
	cmd.SysProcAttr = childAttr(s.cred)
	p := &process{cmd: cmd, done: make(chan struct{})}
	var stdinRead *os.File
	if s.stdinPipe {
		if stdinRead, p.stdin, err = os.Pipe(); err != nil {
			out.Close()
			return fmt.Errorf("localserver: %s: %w", s.name, err)
		}
		cmd.Stdin = stdinRead
	}
	err = cmd.Start()
	if stdinRead != nil {
		stdinRead.Close() // the child holds its own copy
	}
	if err != nil {
		out.Close()
		if p.stdin != nil {
			p.stdin.Close()
		}
		return fmt.Errorf("localserver: %s: starting %s: %w", s.name, s.argv[0], err)
	}
	go func() {
		_ = cmd.Wait() // a killed server's status says nothing new
		out.Close()
		close(p.done)
	}()
	s.proc = p
	if err := s.waitReady(ctx, p); err != nil {
		_ = s.kill()
		return err
	}
	return nil
}

// waitReady probes the server until it serves, it exits, ctx ends or
// readyTimeout passes.
func (s *Server) waitReady(ctx context.Context, p *process) error {
	deadline := time.NewTimer(s.readyTimeout)
	defer deadline.Stop()
	var last error
	for step := 10 * time.Millisecond; ; step = min(2*step, 250*time.Millisecond) {
		pctx, cancel := context.WithTimeout(ctx, probeTimeout)
		last = s.ready(pctx)
		cancel()
		if last == nil {
			return nil
		}
		wait := time.NewTimer(step)
		select {
		case <-wait.C:
		case <-p.done:
			wait.Stop()
			return s.errorf("exited while starting (%v)", p.cmd.ProcessState)
		case <-deadline.C:
			wait.Stop()
			return s.errorf("did not serve on %s within %s: %v", s.addr, s.readyTimeout, last)
		case <-ctx.Done():
			wait.Stop()
			return fmt.Errorf("localserver: %s: waiting for it to serve: %w", s.name, context.Cause(ctx))
		}
	}
}

// kill SIGKILLs the server, its process group and its descendants, and
// waits until the server has been reaped and none of them is left, so
// that a new server finds its port and its data free (PostgreSQL refuses
// to start while a process of the old one still holds its shared memory).
func (s *Server) kill() error {
	p := s.proc
	if p == nil {
		return nil
	}
	// Setpgid made the server the leader of a group whose id is its pid.
	pid := p.cmd.Process.Pid
	var tree []int
	select {
	case <-p.done:
		// Reaped: its pid may be another's now, and only its group is
		// left to kill.
		if err := syscall.Kill(-pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("localserver: %s: killing its process group: %w", s.name, err)
		}
	default:
		var err error
		if tree, err = killTree(pid); err != nil {
			return fmt.Errorf("localserver: %s: killing it: %w", s.name, err)
		}
	}
	t := time.NewTimer(goneTimeout)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
		return fmt.Errorf("localserver: %s: still running %s after SIGKILL", s.name, goneTimeout)
	}
	if p.stdin != nil {
		p.stdin.Close()
	}
	return waitGone(pid, tree, goneTimeout, s.name)
}

// stop stops the server cleanly with its stop signal, and kills it if it
// has not stopped within stopTimeout.
func (s *Server) stop() error {
	p := s.proc
	if p == nil {
		return nil
	}
	select {
	case <-p.done:
		return s.kill() // what is left of its group
	default:
	}
	if err := p.cmd.Process.Signal(s.stopSignal); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("localserver: %s: sending %v: %w", s.name, s.stopSignal, err)
	}
	t := time.NewTimer(stopTimeout)
	defer t.Stop()
	select {
	case <-p.done:
		return s.kill()
	case <-t.C:
		if err := s.kill(); err != nil {
			return err
		}
		return s.errorf("did not stop within %s of %v, and was killed", stopTimeout, s.stopSignal)
	}
}

// errorf is an error that names the server's program and carries the end
// of its log.
func (s *Server) errorf(format string, args ...any) error {
	return fmt.Errorf("localserver: %s (%s) %s\n--- the end of its log, %s:\n%s",
		s.name, s.argv[0], fmt.Sprintf(format, args...), s.log, tailFile(s.log, logTail))
}

// tailFile returns about the last n bytes of the file at path, from a line's
// start.
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
	return string(bytes.TrimRight(b, "\n"))
}

// freePorts returns n distinct ports on 127.0.0.1 that were free a moment
// ago. They are held open together while picked, so no two are the same;
// another process could still take one before the server binds it, which is
// rare enough to be a failure worth seeing.
func freePorts(n int) ([]int, error) {
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
			return nil, fmt.Errorf("localserver: picking a free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// lookPath finds a program in PATH, with an error that names it.
func lookPath(server, program string) (string, error) {
	p, err := exec.LookPath(program)
	if err != nil {
		return "", fmt.Errorf("localserver: %s needs %s, which is not installed: %w", server, program, err)
	}
	return p, nil
}

// runOnce runs a short program (initdb) to completion within limit, its
// output appended to log; a failure is an error carrying that output.
func runOnce(ctx context.Context, limit time.Duration, server, log string, env []string, cred *syscall.Credential, argv ...string) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = env
	cmd.SysProcAttr = childAttr(cred)
	out, err := cmd.CombinedOutput()
	if f, ferr := os.OpenFile(log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); ferr == nil {
		f.Write(out)
		f.Close()
	}
	if err != nil {
		return fmt.Errorf("localserver: %s: %s: %w\n%s", server, argv[0], err, bytes.TrimSpace(out))
	}
	return nil
}

// mkdir makes a private folder for a server's data.
func mkdir(server, dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("localserver: %s: %w", server, err)
	}
	return nil
}

// launch starts a new Server's first process and waits until it serves.
func (s *Server) launch(ctx context.Context) (*Server, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.start(ctx); err != nil {
		return nil, err
	}
	return s, nil
}
