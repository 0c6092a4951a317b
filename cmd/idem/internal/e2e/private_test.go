package e2e

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// Private PostgreSQL and Redis instances, for the tests that stop their
// database under load: the shared services must stay up for every other
// test running at the same time.

// freePort asks the kernel for a free TCP port on 127.0.0.1. Another
// process could take it before the caller binds it; on this machine that
// is unlikely enough, and the start would fail loudly.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// privatePG is a PostgreSQL cluster of the test's own in a temporary
// directory, run as the postgres user.
type privatePG struct {
	runuser string
	bin     string // directory of initdb and pg_ctl
	data    string
	logf    string
	port    int
	URL     string
}

// startPrivatePG creates and starts a private cluster, stopped when the
// test ends. It needs root (runuser) and the server's binaries.
func startPrivatePG(t *testing.T) *privatePG {
	t.Helper()
	if os.Geteuid() != 0 {
		requirePrerequisite(t, "a private PostgreSQL needs root, to run it as the postgres user with runuser")
	}
	runuser, err := exec.LookPath("runuser")
	if err != nil {
		requirePrerequisite(t, "runuser not found: %v", err)
	}
	initdbs, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(initdbs) == 0 {
		requirePrerequisite(t, "no PostgreSQL server binaries in /usr/lib/postgresql/*/bin")
	}
	pgUser, err := user.Lookup("postgres")
	if err != nil {
		requirePrerequisite(t, "no postgres user to run a private PostgreSQL: %v", err)
	}
	uid, _ := strconv.Atoi(pgUser.Uid)
	gid, _ := strconv.Atoi(pgUser.Gid)

	// The postgres user must reach the directory: t.TempDir makes its
	// directories private to root, so open them to traversal.
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	p := &privatePG{
		runuser: runuser,
		bin:     filepath.Dir(initdbs[len(initdbs)-1]),
		data:    filepath.Join(dir, "pgdata"),
		logf:    filepath.Join(dir, "pg.log"),
		port:    freePort(t),
	}
	p.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", p.port)
	if err := os.Mkdir(p.data, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(p.data, uid, gid); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p.logf, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(p.logf, uid, gid); err != nil {
		t.Fatal(err)
	}
	p.run(t, filepath.Join(p.bin, "initdb"), "-D", p.data, "-A", "trust", "-U", "postgres", "--no-sync")
	p.start(t)
	t.Cleanup(func() {
		// Immediate: the test is over, nothing needs to be flushed.
		out, err := p.ctl("-m", "immediate", "stop")
		if err != nil && !pgStopped(p.data) {
			t.Errorf("stopping the private PostgreSQL: %v\n%s", err, out)
		}
		if t.Failed() {
			if b, err := os.ReadFile(p.logf); err == nil {
				t.Logf("private PostgreSQL log:\n%s", tailOf(string(b), 4000))
			}
		}
	})
	return p
}

func pgStopped(data string) bool {
	_, err := os.Stat(filepath.Join(data, "postmaster.pid"))
	return os.IsNotExist(err)
}

func (p *privatePG) run(t *testing.T, args ...string) {
	t.Helper()
	cmd := exec.Command(p.runuser, append([]string{"-u", "postgres", "--"}, args...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v: %v\n%s", args, err, out)
	}
}

func (p *privatePG) ctl(args ...string) ([]byte, error) {
	full := []string{"-u", "postgres", "--", filepath.Join(p.bin, "pg_ctl"), "-D", p.data, "-l", p.logf, "-w", "-t", "30"}
	full = append(full, args...)
	return exec.Command(p.runuser, full...).CombinedOutput()
}

// start starts the cluster and waits (pg_ctl -w) until it accepts
// connections; fsync is off, the data is thrown away anyway.
func (p *privatePG) start(t *testing.T) {
	t.Helper()
	opts := fmt.Sprintf("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=50", p.port, p.data)
	if out, err := p.ctl("-o", opts, "start"); err != nil {
		t.Fatalf("starting the private PostgreSQL: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, p.URL)
	if err != nil {
		t.Fatalf("connecting to the private PostgreSQL: %v", err)
	}
	conn.Close(ctx)
}

// stop is a fast shutdown: sessions are disconnected and their open
// transactions rolled back, as when a database fails over.
func (p *privatePG) stop(t *testing.T) {
	t.Helper()
	if out, err := p.ctl("-m", "fast", "stop"); err != nil {
		t.Fatalf("stopping the private PostgreSQL: %v\n%s", err, out)
	}
}

// privateRedis is a Redis server of the test's own, without persistence: a
// restart loses every key, the harshest case for the key store.
type privateRedis struct {
	bin  string
	dir  string
	port int
	URL  string
	cmd  *exec.Cmd
	done chan struct{}
}

func startPrivateRedis(t *testing.T) *privateRedis {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		requirePrerequisite(t, "redis-server not found for a private Redis: %v", err)
	}
	r := &privateRedis{bin: bin, dir: t.TempDir(), port: freePort(t)}
	r.URL = fmt.Sprintf("redis://127.0.0.1:%d/0", r.port)
	r.start(t)
	t.Cleanup(func() {
		if r.cmd != nil {
			r.kill()
		}
	})
	return r
}

func (r *privateRedis) start(t *testing.T) {
	t.Helper()
	logf, err := os.OpenFile(filepath.Join(r.dir, "redis.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(r.bin, "--port", strconv.Itoa(r.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", r.dir)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting the private Redis: %v", err)
	}
	r.cmd, r.done = cmd, make(chan struct{})
	go func(done chan struct{}) {
		_ = cmd.Wait()
		close(done)
	}(r.done)

	rdb := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", r.port), MaxRetries: -1})
	defer rdb.Close()
	waitFor(t, "the private Redis to answer PING", 10*time.Second, func() bool {
		select {
		case <-r.done:
			b, _ := os.ReadFile(filepath.Join(r.dir, "redis.log"))
			t.Fatalf("the private Redis exited: %s\n%s", cmd.ProcessState, b)
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		return rdb.Ping(ctx).Err() == nil
	})
}

// stop shuts the server down (SIGTERM, without saving: persistence is
// off) and waits until it is gone and its port is free.
func (r *privateRedis) stop(t *testing.T) {
	t.Helper()
	_ = r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-r.done:
	case <-time.After(exitTimeout):
		r.kill()
		t.Fatalf("the private Redis ignored SIGTERM for %s", exitTimeout)
	}
	r.cmd = nil
}

func (r *privateRedis) kill() {
	_ = r.cmd.Process.Kill()
	<-r.done
	r.cmd = nil
}

func tailOf(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}
