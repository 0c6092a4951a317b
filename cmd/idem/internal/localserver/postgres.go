package localserver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// StartPostgres initializes a PostgreSQL cluster in dir/data (initdb: user
// postgres, trust authentication), starts postgres on it, listening on
// 127.0.0.1 on a free port with its Unix socket in dir, fsync on, its log
// in dir/postgres.log, and returns once a connection to the database
// postgres runs a query. dir is made if it does not exist; dir/data must
// not exist yet or be empty.
func StartPostgres(ctx context.Context, dir string) (*Server, error) {
	bins, err := postgresBinaries()
	if err != nil {
		return nil, err
	}
	if err := mkdir("postgres", dir); err != nil {
		return nil, err
	}
	dir, err = filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("localserver: postgres: %w", err)
	}
	cred, err := postgresCredential(dir)
	if err != nil {
		return nil, err
	}
	ports, err := freePorts(1)
	if err != nil {
		return nil, err
	}
	port := strconv.Itoa(ports[0])
	data := filepath.Join(dir, "data")
	log := filepath.Join(dir, "postgres.log")
	// The C locale and UTC, whatever the caller's, so that the cluster is
	// the same on every machine.
	env := append(os.Environ(), "LC_ALL=C", "TZ=UTC")
	// --no-sync: the machine does not crash under the caller, only the
	// server does, and what the kernel holds survives it.
	if err := runOnce(ctx, 2*time.Minute, "postgres", log, env, cred, bins["initdb"], "-D", data,
		"-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync", "--no-instructions"); err != nil {
		return nil, err
	}
	s := &Server{
		name: "postgres",
		addr: "127.0.0.1:" + port,
		url:  "postgres://postgres@127.0.0.1:" + port + "/postgres?sslmode=disable",
		log:  log,
		argv: []string{bins["postgres"], "-D", data, "-p", port, "-k", dir,
			"-c", "listen_addresses=127.0.0.1",
			// What a commit acknowledged must survive the SIGKILL of
			// Restart(ctx, true): that is what a crash test tests.
			"-c", "fsync=on", "-c", "synchronous_commit=on",
			// Room for several services' pools (idempg's is 16 apiece on
			// this size of machine) and a person's psql.
			"-c", "max_connections=200",
			"-c", "log_min_messages=warning"},
		env:  env,
		dir:  dir,
		cred: cred,
		// SIGTERM is a smart shutdown, which waits for every client to
		// leave; SIGINT, the fast one, disconnects them and still writes
		// everything committed.
		stopSignal:   syscall.SIGINT,
		readyTimeout: time.Minute,
	}
	s.ready = func(ctx context.Context) error {
		conn, err := pgx.Connect(ctx, s.url)
		if err != nil {
			return err
		}
		defer conn.Close(context.Background())
		var one int
		return conn.QueryRow(ctx, "SELECT 1").Scan(&one)
	}
	return s.launch(ctx)
}

// postgresBinaries finds initdb and postgres in PATH, or else in the
// newest /usr/lib/postgresql/*/bin that has both (Debian keeps them
// there, out of PATH).
func postgresBinaries() (map[string]string, error) {
	names := []string{"initdb", "postgres"}
	out := map[string]string{}
	for _, n := range names {
		if p, err := exec.LookPath(n); err == nil {
			out[n] = p
		}
	}
	if len(out) == len(names) {
		return out, nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	// Newest first, by the version's number: 9.6 is older than 15.
	slices.SortFunc(dirs, func(a, b string) int {
		va, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(a)), 64)
		vb, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(b)), 64)
		switch {
		case va > vb:
			return -1
		case va < vb:
			return 1
		}
		return 0
	})
	for _, d := range dirs {
		found := map[string]string{}
		for _, n := range names {
			if st, err := os.Stat(filepath.Join(d, n)); err == nil && !st.IsDir() {
				found[n] = filepath.Join(d, n)
			}
		}
		if len(found) == len(names) {
			return found, nil
		}
	}
	var lacking []string
	for _, n := range names {
		if out[n] == "" {
			lacking = append(lacking, n)
		}
	}
	return nil, fmt.Errorf("localserver: postgres needs %s, which is not installed (not in PATH nor in /usr/lib/postgresql/*/bin)",
		strings.Join(lacking, " and "))
}

// postgresCredential returns the user to run PostgreSQL as, nil for the
// caller's own, and prepares dir for it: PostgreSQL refuses to run as
// root, so a caller running as root gets a server run by the user
// postgres, which must own dir and pass through every folder above it.
func postgresCredential(dir string) (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, errors.New("localserver: postgres: running as root, which PostgreSQL refuses, and there is no user postgres to run it as")
	}
	uid, err1 := strconv.Atoi(u.Uid)
	gid, err2 := strconv.Atoi(u.Gid)
	if err1 != nil || err2 != nil {
		return nil, fmt.Errorf("localserver: postgres: the user postgres has ids %q and %q", u.Uid, u.Gid)
	}
	if err := os.Chown(dir, uid, gid); err != nil {
		return nil, fmt.Errorf("localserver: postgres: %w", err)
	}
	// Search permission alone: the user can reach dir, not list what
	// is beside it.
	for d := filepath.Dir(dir); ; d = filepath.Dir(d) {
		st, err := os.Stat(d)
		if err != nil {
			return nil, fmt.Errorf("localserver: postgres: %w", err)
		}
		if st.Mode().Perm()&0o001 == 0 {
			keep := os.ModePerm | os.ModeSticky | os.ModeSetgid | os.ModeSetuid
			if err := os.Chmod(d, st.Mode()&keep|0o001); err != nil {
				return nil, fmt.Errorf("localserver: postgres: letting the user postgres through %s: %w", d, err)
			}
		}
		if d == filepath.Dir(d) {
			break
		}
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}
