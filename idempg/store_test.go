package idempg_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/idemtest"
)

// Many callers on many connections of several pools (as several replicas
// would be) race for one key, judged by the database's clock: exactly one
// gets it.
func TestClaimManyConnections(t *testing.T) {
	t.Parallel()
	url := pgURL(t)
	schema := freshSchema(t, url)
	const pools, perPool = 3, 24
	stores := make([]*idempg.Store, pools)
	for i := range stores {
		stores[i] = newStore(t, openDB(t, url, idempg.Config{Schema: schema, MaxConns: 8}))
	}
	for round := range 3 {
		req := idem.ClaimRequest{Scope: "s", Key: idem.Key(fmt.Sprintf("k-%d", round)), Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
		var (
			mu       sync.Mutex
			acquired []idem.Claim
			others   []idem.Claim
			errs     []error
		)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range pools * perPool {
			wg.Go(func() {
				<-start
				c, err := stores[i%pools].Claim(t.Context(), req)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err != nil:
					errs = append(errs, err)
				case c.Outcome == idem.Acquired:
					acquired = append(acquired, c)
				default:
					others = append(others, c)
				}
			})
		}
		close(start)
		wg.Wait()
		for _, err := range errs {
			t.Error(err)
		}
		if len(acquired) != 1 {
			t.Fatalf("round %d: %d claims acquired, want exactly 1", round, len(acquired))
		}
		for _, c := range others {
			if c.Outcome != idem.InFlight || c.Record.Token != acquired[0].Token {
				t.Errorf("round %d: losing claim = %v with token %d, want in_flight with the winner's %d",
					round, c.Outcome, c.Record.Token, acquired[0].Token)
			}
		}
	}
}

// With Config.Clock nil the database's clock decides: the record's times
// are clock_timestamp() of the statement that wrote them.
func TestDatabaseClock(t *testing.T) {
	t.Parallel()
	url := pgURL(t)
	db := openDB(t, url, idempg.Config{})
	s := newStore(t, db)
	req := idem.ClaimRequest{Scope: "s", Key: "k", Fingerprint: "fp", Lease: 7 * time.Second, TTL: time.Hour}

	before := dbNow(t, db)
	c := mustClaim(t, s, req)
	after := dbNow(t, db)
	r := c.Record
	if r.CreatedAt.Before(before) || r.CreatedAt.After(after) {
		t.Errorf("CreatedAt %v is not between the database's clock before (%v) and after (%v) the claim", r.CreatedAt, before, after)
	}
	if got := r.LeaseExpiresAt.Sub(r.CreatedAt); got != req.Lease {
		t.Errorf("LeaseExpiresAt - CreatedAt = %v, want the lease %v", got, req.Lease)
	}
	if got := r.ExpiresAt.Sub(r.CreatedAt); got != req.TTL {
		t.Errorf("ExpiresAt - CreatedAt = %v, want the TTL %v", got, req.TTL)
	}
	// The fencing token is the database's clock in microseconds too, so
	// tokens issued after a crash exceed any issued (and lost) before it.
	if c.Token < idem.Token(before.UnixMicro()) || c.Token > idem.Token(after.UnixMicro()) {
		t.Errorf("Token %d is not between the database's clock before (%d) and after (%d) in microseconds",
			c.Token, before.UnixMicro(), after.UnixMicro())
	}

	before = dbNow(t, db)
	if err := s.Complete(t.Context(), refOf(c), idem.Response{Status: 201}); err != nil {
		t.Fatal(err)
	}
	after = dbNow(t, db)
	got, err := s.Get(t.Context(), req.Scope, req.Key)
	if err != nil {
		t.Fatal(err)
	}
	if got.CompletedAt.Before(before) || got.CompletedAt.After(after) {
		t.Errorf("CompletedAt %v is not between the database's clock before (%v) and after (%v) Complete", got.CompletedAt, before, after)
	}
	if !got.CreatedAt.Equal(r.CreatedAt) {
		t.Errorf("Get: CreatedAt = %v, want %v", got.CreatedAt, r.CreatedAt)
	}
}

// With the database's clock, a lease really ends: the key is taken over no
// sooner than the database's clock passes the lease, and a waiter is woken
// when it does.
func TestLeaseExpiryRealTime(t *testing.T) {
	t.Parallel()
	url := pgURL(t)
	db := openDB(t, url, idempg.Config{})
	s := newStore(t, db)
	const lease = 200 * time.Millisecond
	req := idem.ClaimRequest{Scope: "s", Key: "k", Fingerprint: "fp", Lease: lease, TTL: time.Minute}
	first := mustClaim(t, s, req)

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for {
		c, err := s.Claim(ctx, req)
		if err != nil {
			t.Fatalf("Claim while waiting for the lease to end: %v", err)
		}
		if c.Outcome == idem.Acquired {
			claimedAt := c.Record.LeaseExpiresAt.Add(-lease)
			if !c.TookOver || c.Token <= first.Token {
				t.Errorf("claim after the lease = TookOver %v, token %d; want a takeover with a token above %d", c.TookOver, c.Token, first.Token)
			}
			if claimedAt.Before(first.Record.LeaseExpiresAt) {
				t.Errorf("taken over at %v, before the lease ended at %v", claimedAt, first.Record.LeaseExpiresAt)
			}
			return
		}
		if c.Outcome != idem.InFlight || c.Record.Token != first.Token {
			t.Fatalf("Claim during the lease = %v, token %d; want in_flight under %d", c.Outcome, c.Record.Token, first.Token)
		}
		// Returns when the lease ends, by the store's timer: nothing else
		// changes the key.
		if err := s.WaitChange(ctx, req.Scope, req.Key); err != nil {
			t.Fatalf("WaitChange: %v (the lease of %v should have ended)", err, lease)
		}
	}
}

// A claim made on its own commits with synchronous_commit off; a claim that
// joins the caller's transaction leaves that transaction's setting alone.
func TestClaimCommitsAsynchronously(t *testing.T) {
	t.Parallel()
	url := pgURL(t)
	db := openDB(t, url, idempg.Config{})
	s := newStore(t, db)
	ctx := t.Context()

	var serverDefault string
	if err := db.Pool().QueryRow(ctx, `SHOW synchronous_commit`).Scan(&serverDefault); err != nil {
		t.Fatal(err)
	}
	if serverDefault == "off" {
		t.Skip("the server runs with synchronous_commit=off already")
	}

	// The function as Claim calls it on its own, inside a transaction kept
	// open to look at the setting it leaves for the COMMIT.
	err := pgx.BeginFunc(ctx, db.Pool(), func(tx pgx.Tx) error {
		var outcome, setting string
		if err := tx.QueryRow(ctx, `SELECT o_outcome FROM idem_claim('s', 'k', 'fp', 1000000, 3600000000, NULL, true, 'c', 'id')`).Scan(&outcome); err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&setting); err != nil {
			return err
		}
		if outcome != "acquired" || setting != "off" {
			t.Errorf("after idem_claim(async): outcome %q, synchronous_commit %q; want acquired, off", outcome, setting)
		}
		return errors.New("roll back")
	})
	if err == nil {
		t.Fatal("the transaction committed")
	}

	err = db.WithTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := s.Claim(ctx, idem.ClaimRequest{Scope: "s", Key: "k2", Fingerprint: "fp", Lease: time.Second, TTL: time.Hour}); err != nil {
			return err
		}
		var setting string
		if err := tx.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&setting); err != nil {
			return err
		}
		if setting != serverDefault {
			t.Errorf("after a joined Claim, synchronous_commit = %q, want the session's %q", setting, serverDefault)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Purge skips rows another transaction holds (SKIP LOCKED) instead of
// waiting for them, and takes them on a later call.
func TestPurgeSkipsLockedRows(t *testing.T) {
	t.Parallel()
	url := pgURL(t)
	clock := idemmem.NewClock(idemtest.Start)
	db := openDB(t, url, idempg.Config{Clock: clock})
	s := newStore(t, db)
	ctx := t.Context()
	for _, k := range []idem.Key{"a", "b", "c"} {
		c := mustClaim(t, s, idem.ClaimRequest{Scope: "s", Key: k, Fingerprint: "fp", Lease: time.Second, TTL: time.Minute})
		if err := s.Complete(ctx, refOf(c), idem.Response{Status: 200}); err != nil {
			t.Fatal(err)
		}
	}
	clock.Advance(2 * time.Minute)

	locker, err := db.Pool().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Rollback(context.WithoutCancel(ctx))
	if _, err := locker.Exec(ctx, `SELECT 1 FROM idem_keys WHERE scope = 's' AND key = 'b' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}

	// Bounded, so that a purge waiting for the lock fails instead of
	// hanging.
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if n, err := s.Purge(pctx, 10); err != nil || n != 2 {
		t.Fatalf("Purge with b locked = %d, %v; want 2, nil", n, err)
	}
	if err := locker.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := s.Purge(ctx, 10); err != nil || n != 1 {
		t.Fatalf("Purge after b was unlocked = %d, %v; want 1, nil", n, err)
	}
}

func TestClaimRefusesTextPostgreSQLCannotHold(t *testing.T) {
	t.Parallel()
	url := pgURL(t)
	s := newStore(t, openDB(t, url, idempg.Config{}))
	valid := idem.ClaimRequest{Scope: "s", Key: "k", Fingerprint: "fp", Lease: time.Second, TTL: time.Hour}
	cases := []struct {
		name   string
		mutate func(*idem.ClaimRequest)
	}{
		{"NUL in scope", func(r *idem.ClaimRequest) { r.Scope = "a\x00b" }},
		{"invalid UTF-8 in scope", func(r *idem.ClaimRequest) { r.Scope = "\xff" }},
		{"NUL in key", func(r *idem.ClaimRequest) { r.Key = "a\x00" }},
		{"invalid UTF-8 in fingerprint", func(r *idem.ClaimRequest) { r.Fingerprint = "\xc3" }},
	}
	for _, tc := range cases {
		req := valid
		tc.mutate(&req)
		_, err := s.Claim(t.Context(), req)
		var argErr *idem.ArgumentError
		if !errors.As(err, &argErr) {
			t.Errorf("%s: Claim = %v, want an *idem.ArgumentError", tc.name, err)
		}
	}
	mustClaim(t, s, valid)
}

// Purge joins the caller's transaction and rolls back with it; on its own
// it fails cleanly on a cancelled context and the pool keeps working.
func TestPurgeTransactions(t *testing.T) {
	t.Parallel()
	url := pgURL(t)
	clock := idemmem.NewClock(idemtest.Start)
	db := openDB(t, url, idempg.Config{Clock: clock, MaxConns: 1})
	s := newStore(t, db)
	ctx := t.Context()
	for _, k := range []idem.Key{"a", "b"} {
		mustClaim(t, s, idem.ClaimRequest{Scope: "s", Key: k, Fingerprint: "fp", Lease: time.Second, TTL: time.Minute})
	}
	clock.Advance(2 * time.Minute)

	errUndo := errors.New("undo")
	err := db.WithTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		if n, err := s.Purge(ctx, 10); err != nil || n != 2 {
			t.Errorf("Purge in a transaction = %d, %v; want 2, nil", n, err)
		}
		return errUndo
	})
	if !errors.Is(err, errUndo) {
		t.Fatalf("WithTx = %v", err)
	}

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if n, err := s.Purge(cancelled, 10); !errors.Is(err, context.Canceled) || n != 0 {
		t.Errorf("Purge with a cancelled context = %d, %v; want 0, context.Canceled", n, err)
	}
	if n, err := s.Purge(ctx, 10); err != nil || n != 2 {
		t.Errorf("Purge after the rolled back one = %d, %v; want 2, nil", n, err)
	}

	// A statement of its batch that fails is named in its error (the
	// batch's Close repeats only the server's error, which is kept only
	// when reading the results found none).
	if _, err := db.Pool().Exec(ctx, `DROP TABLE idem_waiters`); err != nil {
		t.Fatal(err)
	}
	var pgErr *pgconn.PgError
	if n, err := s.Purge(ctx, 10); n != 0 || !errors.As(err, &pgErr) || pgErr.Code != "42P01" ||
		!strings.HasPrefix(err.Error(), "idempg: purge: waiters: ") {
		t.Errorf("Purge whose statement on the waiters fails = %d, %v; want 0 and the undefined table's error, named \"waiters\"", n, err)
	}
}

// A process that has not been upgraded past the holders' migration still
// claims through the function it knows (idem_claim's nine arguments), and
// its takeover records no holder: the key is no longer the named holder's,
// so a YieldEarlier of that holder's replica leaves it alone.
func TestEarlierClaimFunctionTakesOverAnonymously(t *testing.T) {
	t.Parallel()
	url := pgURL(t)
	clock := idemmem.NewClock(idemtest.Start)
	db := openDB(t, url, idempg.Config{Clock: clock})
	s := newStore(t, db)
	ctx := t.Context()
	held := idem.Holder{Replica: "a", Incarnation: "1"}
	c, err := s.Claim(ctx, idem.ClaimRequest{Scope: "s", Key: "k", Fingerprint: "fp", Lease: time.Second, TTL: time.Hour, Holder: held})
	if err != nil || c.Outcome != idem.Acquired || c.Record.Holder != held {
		t.Fatalf("Claim = %v, holder %+v, %v", c.Outcome, c.Record.Holder, err)
	}
	var (
		outcome  string
		tookOver bool
	)
	after := idemtest.Start.Add(time.Second + time.Millisecond)
	err = db.Pool().QueryRow(ctx, `SELECT o_outcome, o_took_over FROM idem_claim('s', 'k', 'fp', 1000000, 3600000000, $1, false, 'c', 'id')`, after).
		Scan(&outcome, &tookOver)
	if err != nil || outcome != "acquired" || !tookOver {
		t.Fatalf("the nine-argument idem_claim = %q, took over %v, %v; want a takeover", outcome, tookOver, err)
	}
	clock.Set(after)
	rec, err := s.Get(ctx, "s", "k")
	if err != nil || !rec.Holder.IsZero() {
		t.Fatalf("Get after the earlier function's takeover = holder %+v, %v; want none", rec.Holder, err)
	}
	if n, err := s.YieldEarlier(ctx, idem.Holder{Replica: "a", Incarnation: "2"}); err != nil || n != 0 {
		t.Fatalf("YieldEarlier of the replica whose key was taken over = %d, %v; want 0", n, err)
	}
}

// A takeover that waits for a transaction holding the key's row (here one
// that locked it, as a purge deciding on the row does) counts its lease
// from when it writes, after the wait, on the database's clock: it returns
// with its whole lease, not with part of it spent waiting. (The claim's
// INSERT and its read do not wait for a lock that changes nothing; only
// the function idem_claim does.)
func TestTakeoverAfterARowWaitGetsWholeLease(t *testing.T) {
	t.Parallel()
	url := pgURL(t)
	schema := freshSchema(t, url)
	app := randomName("idem_rowwait_")
	holderDB := openDB(t, url, idempg.Config{Schema: schema})
	claimerDB := openDB(t, withAppName(url, app), idempg.Config{Schema: schema})
	holder, claimer := newStore(t, holderDB), newStore(t, claimerDB)
	ctx := t.Context()
	req := idem.ClaimRequest{Scope: "s", Key: "k", Fingerprint: "fp", Lease: time.Millisecond, TTL: time.Hour}
	first, err := holder.Claim(ctx, req)
	if err != nil || first.Outcome != idem.Acquired {
		t.Fatalf("Claim = %v, %v", first.Outcome, err)
	}
	dbNow := func() time.Time {
		t.Helper()
		var now time.Time
		if err := holderDB.Pool().QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&now); err != nil {
			t.Fatal(err)
		}
		return now
	}
	idemtest.Eventually(t, 10*time.Second, "the first lease's end", func() bool {
		return dbNow().After(first.Record.LeaseExpiresAt)
	})

	locked, proceed := make(chan struct{}), make(chan struct{})
	lock := make(chan error, 1)
	go func() {
		lock <- holderDB.WithTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `SELECT 1 FROM idem_keys WHERE scope = 's' AND key = 'k' FOR UPDATE`)
			close(locked)
			if err != nil {
				return err
			}
			return await(ctx, proceed)
		})
	}()
	receive(t, locked, "the transaction did not lock the key's row")

	const lease = time.Minute
	taken := make(chan idem.Claim, 1)
	takenErr := make(chan error, 1)
	go func() {
		c, err := claimer.Claim(ctx, idem.ClaimRequest{Scope: "s", Key: "k", Fingerprint: "fp", Lease: lease, TTL: time.Hour})
		taken <- c
		takenErr <- err
	}()
	waitingOn(t, claimerDB, app, "SELECT o_outcome")
	waited := dbNow()
	close(proceed)
	if err := receive(t, lock, "the transaction holding the row did not end once let go"); err != nil {
		t.Fatalf("the transaction holding the row: %v", err)
	}
	c, err := receive(t, taken, "the takeover did not return once the row was free"), <-takenErr
	if err != nil || c.Outcome != idem.Acquired || !c.TookOver {
		t.Fatalf("the takeover = %v (took over %v), %v", c.Outcome, c.TookOver, err)
	}
	if start := c.Record.LeaseExpiresAt.Add(-lease); !start.After(waited) {
		t.Errorf("the takeover's lease starts at %v, before the end of its wait (it was still waiting at %v): %v of it spent waiting",
			start, waited, waited.Sub(start))
	}
}

// A renewal that waits for a transaction holding the key's row (here one
// that locked it, as a phase's transaction that saved a recovery point
// does) counts its lease from when it writes, after the wait, on the
// database's clock: the holder is not told it holds the key for longer
// than it does, and a duplicate cannot take the key over from a live
// execution as soon as the wait ends.
func TestRenewAfterARowWaitGetsWholeLease(t *testing.T) {
	t.Parallel()
	url := pgURL(t)
	schema := freshSchema(t, url)
	app := randomName("idem_renewwait_")
	lockDB := openDB(t, url, idempg.Config{Schema: schema})
	renewDB := openDB(t, withAppName(url, app), idempg.Config{Schema: schema})
	store := newStore(t, renewDB)
	ctx := t.Context()
	c := mustClaim(t, store, idem.ClaimRequest{Scope: "s", Key: "k", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour})

	locked, proceed := make(chan struct{}), make(chan struct{})
	lock := make(chan error, 1)
	go func() {
		lock <- lockDB.WithTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `SELECT 1 FROM idem_keys WHERE scope = 's' AND key = 'k' FOR UPDATE`)
			close(locked)
			if err != nil {
				return err
			}
			return await(ctx, proceed)
		})
	}()
	receive(t, locked, "the transaction did not lock the key's row")

	const lease = time.Minute
	type renewal struct {
		end time.Time
		err error
	}
	renewed := make(chan renewal, 1)
	go func() {
		end, err := store.Renew(ctx, refOf(c), lease)
		renewed <- renewal{end, err}
	}()
	waitingOn(t, renewDB, app, "")
	// The wait lasts long enough to be told from the database's clock.
	idemtest.Eventually(t, 10*time.Second, "time passing during the wait", func() bool {
		var waiting time.Duration
		err := lockDB.Pool().QueryRow(ctx, `SELECT clock_timestamp() - query_start FROM pg_stat_activity
			WHERE application_name = $1 AND wait_event_type = 'Lock'`, app).Scan(&waiting)
		return err == nil && waiting > 50*time.Millisecond
	})
	waited := dbNow(t, lockDB)
	close(proceed)
	if err := receive(t, lock, "the transaction holding the row did not end once let go"); err != nil {
		t.Fatalf("the transaction holding the row: %v", err)
	}
	r := receive(t, renewed, "Renew did not return once the row was free")
	if r.err != nil {
		t.Fatalf("Renew = %v", r.err)
	}
	if start := r.end.Add(-lease); !start.After(waited) {
		t.Errorf("the renewed lease starts at %v, before the end of its wait (it was still waiting at %v): %v of it spent waiting",
			start, waited, waited.Sub(start))
	}
	if got, err := store.Get(ctx, "s", "k"); err != nil || !got.LeaseExpiresAt.Equal(r.end) {
		t.Errorf("Get = lease end %v, %v; want %v, as Renew said", got.LeaseExpiresAt, err, r.end)
	}
}

// A renewal that waits for a transaction that completes the key is
// refused once that transaction commits: the lock rechecks the token and
// the state on the row as the wait left it.
func TestRenewAfterARowWaitSeesTheCompletion(t *testing.T) {
	t.Parallel()
	url := pgURL(t)
	schema := freshSchema(t, url)
	app := randomName("idem_renewdone_")
	lockDB := openDB(t, url, idempg.Config{Schema: schema})
	renewDB := openDB(t, withAppName(url, app), idempg.Config{Schema: schema})
	store, completer := newStore(t, renewDB), newStore(t, lockDB)
	ctx := t.Context()
	c := mustClaim(t, store, idem.ClaimRequest{Scope: "s", Key: "k", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour})

	locked, proceed := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := completer.CompleteTx(ctx, refOf(c), func(ctx context.Context) (idem.Response, bool, error) {
			err := lockDB.WithTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, `SELECT 1 FROM idem_keys WHERE scope = 's' AND key = 'k' FOR UPDATE`)
				return err
			})
			close(locked)
			<-proceed
			return idem.Response{Status: 201}, true, err
		})
		done <- err
	}()
	<-locked
	renewErr := make(chan error, 1)
	go func() {
		_, err := store.Renew(ctx, refOf(c), time.Minute)
		renewErr <- err
	}()
	waitingOn(t, renewDB, app, "")
	close(proceed)
	if err := <-done; err != nil {
		t.Fatalf("CompleteTx = %v", err)
	}
	if err := <-renewErr; !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("Renew after the completion committed = %v; want ErrLeaseLost", err)
	}
	if got, err := store.Get(ctx, "s", "k"); err != nil || got.State != idem.StateCompleted || !got.LeaseExpiresAt.Equal(c.Record.LeaseExpiresAt) {
		t.Fatalf("Get = %v, lease end %v, %v; want completed with the claim's lease end %v", got.State, got.LeaseExpiresAt, err, c.Record.LeaseExpiresAt)
	}
}
