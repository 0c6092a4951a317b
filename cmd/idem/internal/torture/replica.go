package torture

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/idem-go/idem/cmd/idem/internal/startwatch"
)

// listeningPrefix starts the line `idem serve` prints once it listens; the
// rest of the line is its base URL.
const listeningPrefix = "idem: listening on "

// Bounds on a replica's life, so a replica that hangs fails the run instead
// of holding it. startTimeout bounds a start that does no work (see
// startwatch), not one that keeps working on a loaded machine.
const (
	startTimeout = 30 * time.Second
	stopTimeout  = 15 * time.Second
	tailLines    = 40
)

// replica is one child process of the run, started again after each kill
// with the same arguments: an `idem serve` replica, or a consumer of the
// message torture.
type replica struct {
	n    int
	exe  string
	args []string
	env  []string
	// what names it in errors and logs; defaults to "replica".
	what string
	// ready starts the line the process prints once it is ready. Empty
	// means an `idem serve` replica: its "listening on" line, whose base
	// URL must be on a loopback address.
	ready string
	// startWait bounds the wait for the ready line while the process does
	// no work (startwatch). Defaults to startTimeout.
	startWait time.Duration

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed once the process has exited and been reaped
	base string
	tail []string    // its last stderr lines, for the error that says why it failed
	log  *lineWriter // receives every line; nil for none
	// onLine, when set, is given every line the process writes on stderr,
	// with the number of the process's life (1 for the first start, 2 for
	// the next…).
	onLine func(life int, line string)
	// onExit, when set, is told when each life ended, once every line it
	// wrote went through onLine: when the run killed it (just before the
	// signal), or when its exit was seen.
	onExit func(life int, at time.Time)
	// lives counts the starts; killedAt is when the run last killed the
	// process.
	lives    int
	killedAt time.Time
	// exit is how the last process ended, once done is closed; killed says
	// whether the run killed or stopped it.
	exit   error
	killed bool
	// ups are the spans the process was up: from its ready line to its
	// exit (zero while it runs).
	ups []upSpan
	// crashTries counts the tries asking for a crash after their charge
	// that a fault proxy forwarded to the process of life crashLife and
	// that have not ended (crashTry): the run's own orders to SIGKILL
	// itself. crashSilentAt is when the last of them that got no answer
	// ended (zero for none).
	crashLife, crashTries int
	crashSilentAt         time.Time
}

// crashDeathWindow is how soon after a try asking for a crash got no
// answer its process must have exited for its SIGKILL to be that crash.
// A process that dies of the order dies as the try's connection breaks;
// one that outlived it (the fault proxy's header timeout, the client
// gone) was ordered nothing, and a SIGKILL later on is someone else's.
const crashDeathWindow = stopTimeout

// crashTry notes that a fault proxy forwards a try asking for a crash
// after its charge to the process at base, and returns what to call once
// the try ended: answered says that the process answered it, so did not
// die of it. A base that is not the running process's (it was started
// again meanwhile) notes nothing.
func (r *replica) crashTry(base string) (ended func(answered bool)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if base == "" || base != r.base {
		return func(bool) {}
	}
	if r.crashLife != r.lives {
		r.crashLife, r.crashTries, r.crashSilentAt = r.lives, 0, time.Time{}
	}
	r.crashTries++
	life := r.lives
	return func(answered bool) {
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.crashLife != life || r.crashTries == 0 {
			return
		}
		r.crashTries--
		if !answered {
			r.crashSilentAt = time.Now()
		}
	}
}

// crashAsked reports whether the last process started was asked for its
// crash: a try asking for a crash after its charge forwarded to it has
// not ended, or one got no answer from it shortly (crashDeathWindow)
// before it exited. A SIGKILL of its own is then the crash the run
// ordered, and any other (the OOM killer's) is not.
func (r *replica) crashAsked() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.lives == 0 || r.crashLife != r.lives {
		return false
	}
	if r.crashTries > 0 {
		return true
	}
	if r.crashSilentAt.IsZero() {
		return false
	}
	// The process's exit, once seen; now while it runs.
	exit := time.Now()
	if n := len(r.ups); n > 0 && !r.ups[n-1].to.IsZero() {
		exit = r.ups[n-1].to
	}
	return !exit.After(r.crashSilentAt.Add(crashDeathWindow))
}

// upSpan is a span of time a replica was up.
type upSpan struct{ from, to time.Time }

// upFor returns the earliest time t at or after from such that the
// replica was up without a break from t to t+d, and whether there is one.
func (r *replica) upFor(from time.Time, d time.Duration) (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, u := range r.ups {
		t := u.from
		if t.Before(from) {
			t = from
		}
		if u.to.IsZero() || !t.Add(d).After(u.to) {
			return t, true
		}
	}
	return time.Time{}, false
}

// name is how errors and logs name the process: "replica 2".
func (r *replica) name() string {
	what := r.what
	if what == "" {
		what = "replica"
	}
	return fmt.Sprintf("%s %d", what, r.n)
}

// lineWriter writes whole lines from several replicas to one writer, up
// to maxLogBytes: a run's log is evidence to read, and must not fill the
// disk of a run that goes wrong in a loop.
type lineWriter struct {
	mu      sync.Mutex
	w       io.Writer
	written int64
}

// maxLogBytes bounds what a lineWriter writes.
const maxLogBytes = 64 << 20

func (l *lineWriter) line(name, s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.written >= maxLogBytes {
		return
	}
	n, _ := fmt.Fprintf(l.w, "%s: %s\n", name, s)
	if l.written += int64(n); l.written >= maxLogBytes {
		fmt.Fprintf(l.w, "(the log stops here: %d bytes written, its bound)\n", l.written)
	}
}

// start starts the process and waits for its ready line.
func (r *replica) start(ctx context.Context) error {
	cmd := exec.Command(r.exe, r.args...)
	cmd.Env = r.env
	cmd.SysProcAttr = childAttr()
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return fmt.Errorf("%s: %w", r.name(), err)
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("%s: starting %s: %w", r.name(), r.exe, err)
	}
	done := make(chan struct{})
	listening := make(chan string, 1)
	r.mu.Lock()
	r.cmd, r.done, r.base, r.tail, r.exit, r.killed, r.killedAt = cmd, done, "", nil, nil, false, time.Time{}
	r.lives++
	life := r.lives
	r.mu.Unlock()
	go func() {
		defer close(done)
		r.read(life, stderr, listening)
		err := cmd.Wait()
		r.mu.Lock()
		r.exit = err
		at := time.Now()
		if r.killed && !r.killedAt.IsZero() && r.killedAt.Before(at) {
			at = r.killedAt
		}
		if n := len(r.ups); n > 0 && r.ups[n-1].to.IsZero() {
			r.ups[n-1].to = at
		}
		r.mu.Unlock()
		if r.onExit != nil {
			r.onExit(life, at)
		}
	}()

	wait := cmp.Or(r.startWait, startTimeout)
	progress := startwatch.New(cmd.Process.Pid, wait, time.Now())
	poll := time.NewTicker(progress.Every())
	defer poll.Stop()
	for {
		select {
		case base := <-listening:
			if r.ready != "" && !strings.HasPrefix(base, "http") {
				return nil
			}
			if err := checkLoopback(base); err != nil {
				r.kill()
				return fmt.Errorf("%s: %w", r.name(), err)
			}
			r.mu.Lock()
			r.base = base
			r.ups = append(r.ups, upSpan{from: time.Now()})
			r.mu.Unlock()
			return nil
		case <-done:
			return fmt.Errorf("%s exited before it was ready: %s", r.name(), r.lastLines())
		case now := <-poll.C:
			if why := progress.Check(now); why != "" {
				return r.notReady(why)
			}
		case <-ctx.Done():
			r.kill()
			return fmt.Errorf("%s: %w", r.name(), context.Cause(ctx))
		}
	}
}

// notReady ends a process whose start failed (why, from
// startwatch.Watch.Check), and returns the error that says so with what it
// wrote. With a log, it is asked for its goroutines' stacks first (quit):
// they land there under its name, naming what its start waited for, and
// the error says where.
func (r *replica) notReady(why string) error {
	said := r.lastLines()
	if r.log == nil {
		r.kill()
		return fmt.Errorf("%s did not say it was ready %s: %s", r.name(), why, said)
	}
	r.quit()
	return fmt.Errorf("%s did not say it was ready %s: %s; its goroutines' stacks (SIGQUIT) are in the replicas' log, under %q", r.name(), why, said, r.name())
}

// read drains the process's stderr (a child blocked on a full pipe would
// stall), keeps its last lines and reports its ready line: for a replica,
// the base URL it listens on.
func (r *replica) read(life int, stderr io.Reader, listening chan<- string) {
	sc := bufio.NewScanner(stderr)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	prefix := r.ready
	if prefix == "" {
		prefix = listeningPrefix
	}
	for sc.Scan() {
		line := sc.Text()
		if r.log != nil {
			r.log.line(r.name(), line)
		}
		if r.onLine != nil {
			r.onLine(life, line)
		}
		if base, ok := strings.CutPrefix(line, prefix); ok {
			select {
			case listening <- strings.TrimSpace(base):
			default:
			}
		}
		r.mu.Lock()
		r.tail = append(r.tail, line)
		if len(r.tail) > tailLines {
			r.tail = r.tail[len(r.tail)-tailLines:]
		}
		r.mu.Unlock()
	}
	_, _ = io.Copy(io.Discard, stderr) // a line too long for the scanner
}

// lastLines is the replica's last stderr lines, on one line.
func (r *replica) lastLines() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.tail) == 0 {
		return "(it wrote nothing on stderr)"
	}
	return strings.Join(r.tail, " | ")
}

// baseURL is where the replica listens, or "" while it is not running.
func (r *replica) baseURL() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.base
}

// kill SIGKILLs the process and waits until it is reaped. It reports
// whether the signal met a live process: one that had already exited by
// itself (a crash) was not killed by the run, and keeps its own exit.
func (r *replica) kill() bool {
	cmd, done, live := r.endByRun()
	if !live {
		return false
	}
	_ = cmd.Process.Kill()
	<-done
	return true
}

// endByRun marks the running process as ended by the run, which is about
// to signal it (kill, quit): its exit is then not its own (run.selfExit),
// and it is dated from now. A process that has exited already, by itself,
// keeps its own exit, and live is false, as it is when none was started.
// Either way no request goes to it any more.
func (r *replica) endByRun() (cmd *exec.Cmd, done <-chan struct{}, live bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.base = ""
	if r.cmd == nil || r.done == nil {
		return nil, nil, false
	}
	select {
	case <-r.done:
		return nil, nil, false
	default:
	}
	r.killed, r.killedAt = true, time.Now()
	return r.cmd, r.done, true
}

// quit asks the process for every goroutine's stack (SIGQUIT: a Go
// program writes them on stderr, which read drains into the log, and
// exits), waits for its exit up to stopTimeout, and kills it after. It
// reports whether it met a live process. The run ended it: its exit is
// not its own (see run.selfExit).
func (r *replica) quit() bool {
	cmd, done, live := r.endByRun()
	if !live {
		return false
	}
	_ = cmd.Process.Signal(syscall.SIGQUIT)
	timer := time.NewTimer(stopTimeout)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
		r.kill()
	}
	return true
}

// stop asks the process to shut down (SIGTERM) and kills it if it has not
// within stopTimeout.
func (r *replica) stop() {
	r.mu.Lock()
	cmd, done := r.cmd, r.done
	r.base = ""
	r.killed = true
	r.mu.Unlock()
	if cmd == nil {
		return
	}
	select {
	case <-done:
		return
	default:
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	timer := time.NewTimer(stopTimeout)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
		r.kill()
	}
}

// exited returns the channel closed once the running process has exited,
// or nil when none was started.
func (r *replica) exited() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.done
}

// ended says how the process that closed done ended: whether the run
// killed or stopped it, and its exit error otherwise.
func (r *replica) ended() (byRun bool, exit error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.killed, r.exit
}

// checkLoopback refuses a base URL whose host is not a loopback address:
// the run sends its load and its faults nowhere else.
func checkLoopback(base string) error {
	u, err := url.Parse(base)
	if err != nil {
		return fmt.Errorf("listening URL %q: %w", base, err)
	}
	host := u.Hostname()
	if host == "localhost" {
		return nil
	}
	ip := net.ParseIP(host)
	if ip == nil || !ip.IsLoopback() {
		return errors.New("listening on " + base + ", which is not a loopback address")
	}
	return nil
}
