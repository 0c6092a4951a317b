package idempg_test

import (
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem/idempg"
)

// When the server ends every connection at once (a restart or a crash of
// PostgreSQL, a failover, pg_terminate_backend), the first statement to
// find its connection dead fails, since nothing could tell before; the
// pool's other idle connections, dead too, are then checked before they
// are handed out, so the statements that follow run on new connections.
// Before, pgxpool checked only connections idle for over a second, and a
// busy service failed one request per pooled connection after its
// database came back (idem torture requests --db private
// --restart-stores-every: up to 16 answers 503 per replica, one of which
// the check's reads ran into).
func TestPoolAfterTheServerEndedItsConnections(t *testing.T) {
	t.Parallel()
	base := pgURL(t)
	app := randomName("idempg_reconnect_")
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("application_name", app)
	u.RawQuery = q.Encode()
	const conns = 8
	db := openDB(t, u.String(), idempg.Config{MaxConns: conns})
	ctx := t.Context()

	// Every connection of the pool used and given back a moment ago.
	var held []*pgxpool.Conn
	for range conns {
		c, err := db.Pool().Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	for _, c := range held {
		c.Release()
	}
	released := time.Now()

	admin, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close(ctx)
	var ended int
	if err := admin.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&ended); err != nil {
		t.Fatal(err)
	}
	if ended != conns {
		t.Fatalf("ended %d backends, want %d", ended, conns)
	}
	for step := time.Millisecond; ; step = min(2*step, 50*time.Millisecond) {
		var left int
		if err := admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&left); err != nil {
			t.Fatal(err)
		}
		if left == 0 {
			break
		}
		time.Sleep(step)
	}

	failed := 0
	for range conns {
		var one int
		if err := db.Pool().QueryRow(ctx, `SELECT 1`).Scan(&one); err != nil {
			failed++
		}
	}
	// pgxpool pings a connection idle for over a second by itself, which
	// would pass this test whatever idempg does.
	if since := time.Since(released); since > 900*time.Millisecond {
		t.Skipf("the statements ran %s after the connections were used: too late to tell", since)
	}
	if failed > 1 {
		t.Errorf("%d of %d statements failed after the server ended the pool's connections; want at most the first", failed, conns)
	}
	var one int
	if err := db.Pool().QueryRow(ctx, `SELECT 1`).Scan(&one); err != nil {
		t.Errorf("the pool does not reconnect: %v", err)
	}
}
