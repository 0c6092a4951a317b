package idempg

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemtest"
	"github.com/idem-go/idem/internal/pgsql"
)

// When the LISTEN connection dies, the store wakes every waiter (it may
// have missed their notifications), reconnects, and delivers notifications
// again on the new connection.
func TestListenerReconnects(t *testing.T) {
	t.Parallel()
	url := idemtest.RequireService(t, "PostgreSQL", "IDEM_POSTGRES_URL",
		"postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	schema := "idempg_test_listen_" + pgsql.NotifyID(idem.Scope(t.Name()), idem.Key(time.Now().String()))
	db, err := Open(ctx, url, &Config{Schema: schema, Clock: idemmem.NewClock(idemtest.Start), MaxConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		db.Close()
		conn, err := pgx.Connect(context.Background(), url)
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close(context.Background())
		if _, err := conn.Exec(context.Background(), `DROP SCHEMA `+quoteIdent(schema)+` CASCADE`); err != nil {
			t.Error(err)
		}
	})
	s, err := NewStore(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	pids := make(chan uint32, 10)
	s.waits.onListen = func(pid uint32) { pids <- pid }

	req := idem.ClaimRequest{Scope: "s", Key: "k", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
	c, err := s.Claim(ctx, req)
	if err != nil || c.Outcome != idem.Acquired {
		t.Fatalf("Claim = %v, %v", c.Outcome, err)
	}

	// The first WaitChange starts the listener; its first LISTEN wakes it.
	if err := s.WaitChange(ctx, req.Scope, req.Key); err != nil {
		t.Fatal(err)
	}
	first := <-pids

	wait := func() <-chan error {
		before := s.waits.count()
		done := make(chan error, 1)
		go func() { done <- s.WaitChange(ctx, req.Scope, req.Key) }()
		for s.waits.count() == before {
			select {
			case <-ctx.Done():
				t.Fatal("the waiter never registered")
			case <-time.After(5 * time.Millisecond):
			}
		}
		return done
	}

	// Kill the listening session, as a failover or an administrator would.
	woken := wait()
	if _, err := db.Pool().Exec(ctx, `SELECT pg_terminate_backend($1)`, first); err != nil {
		t.Fatal(err)
	}
	if err := <-woken; err != nil {
		t.Fatalf("waiter when the LISTEN connection died: %v", err)
	}
	var second uint32
	select {
	case second = <-pids:
	case <-ctx.Done():
		t.Fatal("the listener did not reconnect")
	}
	if second == first {
		t.Fatalf("reconnected on the same backend %d", first)
	}

	// Notifications arrive on the new connection.
	woken = wait()
	if err := s.Complete(ctx, idem.Ref{Scope: req.Scope, Key: req.Key, Token: c.Token}, idem.Response{Status: 200}); err != nil {
		t.Fatal(err)
	}
	if err := <-woken; err != nil {
		t.Fatalf("waiter after the reconnection: %v", err)
	}
}

// count returns the number of registered waiters.
func (l *listener) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, set := range l.waiters {
		n += len(set)
	}
	return n
}
