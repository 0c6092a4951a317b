package idemtest

import (
	"context"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// PostgresPairConfig configures StartPostgresPair. The zero value is a
// primary streaming to one standby asynchronously.
type PostgresPairConfig struct {
	// Synchronous makes every commit on the primary wait until the standby
	// has flushed it (synchronous_standby_names = '*', synchronous_commit
	// on). Defaults to false: the standby may lag behind what the primary
	// acknowledged.
	Synchronous bool
	// Settings are more postgresql.conf settings for both servers, each a
	// name and its value as the file writes it. Defaults to none.
	Settings [][2]string
}

// A PostgresPair is a private PostgreSQL primary and a standby streaming
// from it (pg_basebackup -R), on loopback ports of their own, their data in
// the test's temporary directory, stopped when the test ends. It runs the
// servers as the user "postgres" when the test runs as root, which
// PostgreSQL refuses to run as.
type PostgresPair struct {
	Primary, Standby *PostgresNode

	t    testing.TB
	bins map[string]string
	opt  *ProcessOptions
}

// A PostgresNode is one server of a PostgresPair.
type PostgresNode struct {
	// Port is its port on 127.0.0.1.
	Port int
	// Dir is its data folder.
	Dir string

	pair *PostgresPair
	proc *Process
}

// StartPostgresPair initializes a primary, starts it, takes a base backup
// of it for the standby, starts the standby, and returns once the standby
// streams (in sync, with cfg.Synchronous). It needs PostgreSQL's initdb,
// postgres, pg_basebackup, pg_ctl and psql, and skips without them (or
// fails, under IDEM_REQUIRE_SERVICES=1). cfg may be nil.
func StartPostgresPair(t testing.TB, cfg *PostgresPairConfig) *PostgresPair {
	t.Helper()
	var c PostgresPairConfig
	if cfg != nil {
		c = *cfg
	}
	bins := postgresBinaries(t)
	p := &PostgresPair{t: t, bins: bins, opt: &ProcessOptions{Env: []string{"LC_ALL=C", "TZ=UTC"}}}
	root := t.TempDir()
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			missing(t, "running as root, and there is no user postgres to run PostgreSQL as")
			return nil
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		p.opt.Credential = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		// The servers' user must reach its folders through the test's.
		for _, d := range []string{root, filepath.Dir(root)} {
			if err := os.Chmod(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Chown(root, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	ports := FreePorts(t, 2)
	ctx := context.Background()
	p.Primary = &PostgresNode{Port: ports[0], Dir: filepath.Join(root, "primary"), pair: p}
	p.Standby = &PostgresNode{Port: ports[1], Dir: filepath.Join(root, "standby"), pair: p}

	if out, err := RunCommand(ctx, 2*time.Minute, p.opt, bins["initdb"], "-D", p.Primary.Dir,
		"-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync", "--no-instructions"); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	conf := []string{
		"listen_addresses = '127.0.0.1'",
		"unix_socket_directories = ''",
		"wal_level = replica",
		"max_wal_senders = 5",
		"hot_standby = on",
		"max_connections = 60",
		"shared_buffers = 16MB",
		// The machine does not crash under the test, only the servers do:
		// what the kernel holds survives them.
		"fsync = off",
		"log_min_messages = warning",
	}
	for _, s := range c.Settings {
		conf = append(conf, s[0]+" = "+s[1])
	}
	f, err := os.OpenFile(filepath.Join(p.Primary.Dir, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.WriteString("\n" + strings.Join(conf, "\n") + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	p.Primary.start()
	p.Primary.waitReady(time.Minute, false)

	if out, err := RunCommand(ctx, 2*time.Minute, p.opt, bins["pg_basebackup"], "-h", "127.0.0.1",
		"-p", strconv.Itoa(p.Primary.Port), "-U", "postgres", "-D", p.Standby.Dir,
		"-R", "-X", "stream", "-c", "fast", "--no-sync"); err != nil {
		t.Fatalf("pg_basebackup: %v\n%s", err, out)
	}
	p.Standby.start()
	p.Standby.waitReady(time.Minute, true)
	if c.Synchronous {
		// Set on the primary only, after the backup: a promoted standby
		// has no standby of its own to wait for.
		p.Primary.MustExec("ALTER SYSTEM SET synchronous_standby_names = '*'")
		p.Primary.MustExec("SELECT pg_reload_conf()")
	}
	want := "async"
	if c.Synchronous {
		want = "sync"
	}
	p.eventually(time.Minute, "the standby to stream ("+want+")", func() bool {
		out, err := p.Primary.Query("SELECT sync_state FROM pg_stat_replication WHERE state = 'streaming'")
		return err == nil && strings.TrimSpace(out) == want
	})
	return p
}

// postgresBinaries finds PostgreSQL's programs in PATH, or else in the
// folder of the newest installed version (Debian keeps them there).
func postgresBinaries(t testing.TB) map[string]string {
	t.Helper()
	names := []string{"initdb", "postgres", "pg_basebackup", "pg_ctl", "psql"}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	if len(dirs) > 0 {
		dir := dirs[len(dirs)-1]
		out := map[string]string{}
		for _, n := range names {
			if _, err := os.Stat(filepath.Join(dir, n)); err != nil {
				out = nil
				break
			}
			out[n] = filepath.Join(dir, n)
		}
		if out != nil {
			return out
		}
	}
	return RequireBinaries(t, names...)
}

func (n *PostgresNode) start() {
	n.proc = StartProcess(n.pair.t, fmt.Sprintf("postgres :%d", n.Port), filepath.Join(filepath.Dir(n.Dir), filepath.Base(n.Dir)+".log"),
		&ProcessOptions{Credential: n.pair.opt.Credential, Env: n.pair.opt.Env, StopSignal: syscall.SIGQUIT}, n.pair.bins["postgres"], "-D", n.Dir, "-p", strconv.Itoa(n.Port))
}

// waitReady waits until the server accepts queries, and is (or is not) in
// recovery.
func (n *PostgresNode) waitReady(limit time.Duration, standby bool) {
	n.pair.eventually(limit, fmt.Sprintf("PostgreSQL on port %d to accept queries", n.Port), func() bool {
		out, err := n.Query("SELECT pg_is_in_recovery()")
		return err == nil && strings.TrimSpace(out) == map[bool]string{true: "t", false: "f"}[standby]
	})
}

// URL is the node's own URL, for database db.
func (n *PostgresNode) URL(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", n.Port, db)
}

// URL names both servers, primary first, for database db, with
// target_session_attrs=read-write: a client connects to whichever accepts
// writes, so after a promotion it finds the new primary by itself.
func (p *PostgresPair) URL(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/%s?sslmode=disable&target_session_attrs=read-write&connect_timeout=2",
		p.Primary.Port, p.Standby.Port, db)
}

// Query runs sql with psql on the node's database "postgres" and returns
// its unaligned output.
func (n *PostgresNode) Query(sql string) (string, error) {
	return RunCommand(context.Background(), 30*time.Second, nil, n.pair.bins["psql"],
		"-h", "127.0.0.1", "-p", strconv.Itoa(n.Port), "-U", "postgres", "-d", "postgres",
		"-X", "-At", "-v", "ON_ERROR_STOP=1", "-c", sql)
}

// MustExec is Query that fails the test on an error.
func (n *PostgresNode) MustExec(sql string) string {
	n.pair.t.Helper()
	out, err := n.Query(sql)
	if err != nil {
		n.pair.t.Fatalf("on port %d: %s: %v", n.Port, sql, err)
	}
	return out
}

// Stop shuts the server down in mode "fast" (SIGINT: clients are cut off,
// everything committed is written) or "immediate" (SIGQUIT: it stops at
// once, as after a crash), and waits for it to exit.
func (n *PostgresNode) Stop(mode string) {
	n.pair.t.Helper()
	sig := map[string]syscall.Signal{"fast": syscall.SIGINT, "immediate": syscall.SIGQUIT}[mode]
	if sig == 0 {
		n.pair.t.Fatalf("Stop(%q): want fast or immediate", mode)
	}
	if err := n.proc.Signal(sig); err != nil {
		n.pair.t.Fatal(err)
	}
	if err := n.proc.WaitExit(30 * time.Second); err != nil {
		n.pair.t.Fatalf("postgres :%d: %v", n.Port, err)
	}
}

// Stopped reports whether the server has exited.
func (n *PostgresNode) Stopped() bool { return n.proc.Exited() }

// PauseReceiver stops the standby's WAL receiver (SIGSTOP) until the
// returned function continues it: the standby falls behind whatever the
// primary commits meanwhile, as one on a slow link would.
func (p *PostgresPair) PauseReceiver() (resume func()) {
	p.t.Helper()
	out := strings.TrimSpace(p.Standby.MustExec("SELECT pid FROM pg_stat_wal_receiver"))
	pid, err := strconv.Atoi(out)
	if err != nil {
		p.t.Fatalf("the standby's WAL receiver: pid %q", out)
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		p.t.Fatalf("pausing the WAL receiver: %v", err)
	}
	return func() { _ = syscall.Kill(pid, syscall.SIGCONT) }
}

// Promote makes the standby a primary (pg_ctl promote) and waits until it
// accepts writes.
func (p *PostgresPair) Promote() {
	p.t.Helper()
	if out, err := RunCommand(context.Background(), time.Minute, p.opt, p.bins["pg_ctl"], "promote", "-w", "-t", "60", "-D", p.Standby.Dir); err != nil {
		p.t.Fatalf("pg_ctl promote: %v\n%s", err, out)
	}
	p.Standby.waitReady(time.Minute, false)
}

func (p *PostgresPair) eventually(limit time.Duration, what string, cond func() bool) {
	p.t.Helper()
	deadline := time.Now().Add(limit)
	for step := 10 * time.Millisecond; !cond(); step = min(2*step, 200*time.Millisecond) {
		if time.Now().After(deadline) {
			var logs strings.Builder
			for _, n := range []*PostgresNode{p.Primary, p.Standby} {
				if n.proc != nil {
					fmt.Fprintf(&logs, "--- port %d:\n%s\n", n.Port, n.proc.TailLog())
				}
			}
			p.t.Fatalf("timed out after %s waiting for %s\n%s", limit, what, logs.String())
		}
		time.Sleep(step)
	}
}
