package idempg

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/pgsql"
)

// Completions and releases notify only the keys someone waits for, and wake
// those: after their own commit, whether they ran on their own, in
// CompleteTx, or joined a caller's transaction.
func TestWakesOnlyWaitedKeys(t *testing.T) {
	t.Parallel()
	db := openTraced(t, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	s, err := NewStore(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// The store's LISTEN connection wakes every waiter when it starts
	// listening: started first, so that no waiter below wakes spuriously.
	listening := make(chan uint32, 1)
	s.waits.onListen = func(pid uint32) {
		select {
		case listening <- pid:
		default:
		}
	}
	if err := s.WaitChange(ctx, "", "absent"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-listening:
	case <-ctx.Done():
		t.Fatal("the store never listened")
	}
	listen, err := pgx.ConnectConfig(ctx, db.pool.Config().ConnConfig)
	if err != nil {
		t.Fatal(err)
	}
	defer listen.Close(context.Background())
	if _, err := listen.Exec(ctx, "LISTEN "+quoteIdent(s.channel)); err != nil {
		t.Fatal(err)
	}

	claim := func(key idem.Key) idem.Ref {
		t.Helper()
		c, err := s.Claim(ctx, idem.ClaimRequest{Key: key, Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour})
		if err != nil || c.Outcome != idem.Acquired {
			t.Fatalf("Claim(%s) = %v, %v", key, c.Outcome, err)
		}
		return idem.Ref{Key: key, Token: c.Token}
	}
	registered := func(key idem.Key) int {
		t.Helper()
		var n int
		if err := db.pool.QueryRow(ctx, `SELECT count(*) FROM idem_waiters WHERE key = $1`, string(key)).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	// wait starts a waiter of key and returns once it is registered.
	wait := func(key idem.Key) <-chan error {
		t.Helper()
		done := make(chan error, 1)
		go func() { done <- s.WaitChange(ctx, "", key) }()
		for registered(key) == 0 {
			select {
			case err := <-done:
				t.Fatalf("WaitChange(%s) returned before waiting: %v", key, err)
			case <-ctx.Done():
				t.Fatalf("the waiter of %s never registered", key)
			case <-time.After(5 * time.Millisecond):
			}
		}
		return done
	}
	complete := func(ctx context.Context, ref idem.Ref) error {
		return s.Complete(ctx, ref, idem.Response{Status: 200})
	}
	cases := []struct {
		name   string
		change func(ref idem.Ref) error
	}{
		{"Complete", func(ref idem.Ref) error { return complete(ctx, ref) }},
		{"Release", func(ref idem.Ref) error { return s.Release(ctx, ref) }},
		{"CompleteTx", func(ref idem.Ref) error {
			_, err := s.CompleteTx(ctx, ref, func(context.Context) (idem.Response, bool, error) {
				return idem.Response{Status: 201}, true, nil
			})
			return err
		}},
		{"Complete in a caller's transaction", func(ref idem.Ref) error {
			return db.WithTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
				if err := complete(ctx, ref); err != nil {
					return err
				}
				// Not before the commit: the waiter would find the key
				// still in flight.
				if n, err := pendingNotifications(ctx, listen); err != nil || n != 0 {
					t.Errorf("before the commit: %d notifications, %v", n, err)
				}
				return nil
			})
		}},
		{"Release in a caller's transaction", func(ref idem.Ref) error {
			return db.WithTx(ctx, func(ctx context.Context, tx pgx.Tx) error { return s.Release(ctx, ref) })
		}},
	}
	for _, tc := range cases {
		// Unwaited first: if it notified, its notification would come
		// before the waited key's.
		unwaited, waited := idem.Key(tc.name+"/unwaited"), idem.Key(tc.name+"/waited")
		if err := tc.change(claim(unwaited)); err != nil {
			t.Fatalf("%s of a key nobody waits for: %v", tc.name, err)
		}
		ref := claim(waited)
		done := wait(waited)
		if err := tc.change(ref); err != nil {
			t.Fatalf("%s of a waited key: %v", tc.name, err)
		}
		n, err := listen.WaitForNotification(ctx)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if want := pgsql.NotifyID("", waited); n.Payload != want {
			t.Errorf("%s: notified %s, want only the waited key's %s", tc.name, n.Payload, want)
		}
		if err := <-done; err != nil {
			t.Errorf("%s: the waiter returned %v", tc.name, err)
		}
		if n := registered(waited); n != 0 {
			t.Errorf("%s: %d registrations left after the waiter returned", tc.name, n)
		}
	}
}

// pendingNotifications returns how many notifications conn has received.
func pendingNotifications(ctx context.Context, conn *pgx.Conn) (int, error) {
	// An empty statement reads what the server sent meanwhile.
	if _, err := conn.Exec(ctx, ";"); err != nil {
		return 0, err
	}
	n := 0
	for {
		wctx, cancel := context.WithTimeout(ctx, time.Millisecond)
		_, err := conn.WaitForNotification(wctx)
		cancel()
		if err != nil {
			if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
				return n, nil
			}
			return n, err
		}
		n++
	}
}

// Purge deletes the registrations of waiters whose lease has ended: those a
// process that died while waiting left behind.
func TestPurgeDeletesStaleRegistrations(t *testing.T) {
	t.Parallel()
	db := openTraced(t, nil)
	ctx := t.Context()
	s, err := NewStore(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := db.pool.Exec(ctx, `INSERT INTO idem_waiters (scope, key, waiter, until) VALUES
		('', 'stale', 1, clock_timestamp() - interval '1 second'),
		('', 'live', 2, clock_timestamp() + interval '1 hour')`); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Purge(ctx, 10); err != nil {
		t.Fatal(err)
	}
	rows, err := db.pool.Query(ctx, `SELECT key FROM idem_waiters ORDER BY key`)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 1 || keys[0] != "live" {
		t.Errorf("registrations after Purge = %v, want [live]", keys)
	}
}
