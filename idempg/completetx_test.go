package idempg_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/idemtest"
)

// txFixture is a DB with the payments table, a Store on it, and a key
// claimed by the test.
type txFixture struct {
	db    *idempg.DB
	store *idempg.Store
	clock *idemmem.Clock
	req   idem.ClaimRequest
	claim idem.Claim
}

func newTxFixture(t *testing.T, cfg idempg.Config) *txFixture {
	t.Helper()
	url := pgURL(t)
	clock := idemmem.NewClock(idemtest.Start)
	cfg.Clock = clock
	db := openDB(t, url, cfg)
	migratePayments(t, db)
	f := &txFixture{
		db:    db,
		store: newStore(t, db),
		clock: clock,
		req:   idem.ClaimRequest{Scope: "tenant", Key: "order-42", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour},
	}
	f.claim = mustClaim(t, f.store, f.req)
	return f
}

func (f *txFixture) ref() idem.Ref { return refOf(f.claim) }

func (f *txFixture) record(t *testing.T) idem.Record {
	t.Helper()
	r, err := f.store.Get(t.Context(), f.req.Scope, f.req.Key)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// payWork is a handler's work: it writes a payment through WithTx and
// answers resp, keep, err.
func payWork(db *idempg.DB, id string, keep bool, err error) idem.TxWork {
	return func(ctx context.Context) (idem.Response, bool, error) {
		if werr := insertPayment(ctx, db, id); werr != nil {
			return idem.Response{}, false, werr
		}
		return idem.Response{Status: 201, Body: []byte(id)}, keep, err
	}
}

// The transaction begins when work first writes, so a handler that waits
// (for a provider, a lock, a slow client) holds no connection, and other
// keys are claimed meanwhile even with a pool of one.
func TestCompleteTxWaitingWorkHoldsNoConnection(t *testing.T) {
	t.Parallel()
	f := newTxFixture(t, idempg.Config{MaxConns: 1})
	entered := make(chan struct{})
	proceed := make(chan struct{})
	type result struct {
		kept bool
		err  error
	}
	done := make(chan result, 1)
	go func() {
		kept, err := f.store.CompleteTx(t.Context(), f.ref(), func(ctx context.Context) (idem.Response, bool, error) {
			close(entered)
			if err := await(ctx, proceed); err != nil {
				return idem.Response{}, false, err
			}
			return payWork(f.db, "pay_1", true, nil)(ctx)
		})
		done <- result{kept, err}
	}()

	receive(t, entered, "CompleteTx did not call its work")
	// Bounded so that a transaction begun too early fails the test instead
	// of hanging it.
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	other := f.req
	other.Key = "order-43"
	c, err := f.store.Claim(ctx, other)
	var cerr error
	if err == nil {
		cerr = f.store.Complete(ctx, refOf(c), idem.Response{Status: 200})
	}
	close(proceed)
	r := receive(t, done, "CompleteTx did not return once its work went on")
	if err != nil || c.Outcome != idem.Acquired {
		t.Errorf("Claim of another key while work waits = %v, %v; want acquired without waiting", c.Outcome, err)
	}
	if cerr != nil {
		t.Errorf("Complete of the other key while work waits: %v", cerr)
	}
	if r.err != nil || !r.kept {
		t.Fatalf("CompleteTx = %v, %v", r.kept, r.err)
	}
	if got := payments(t, f.db); !slices.Equal(got, []string{"pay_1"}) {
		t.Errorf("payments = %v, want [pay_1]", got)
	}
}

// Work that never touches the database still completes the key.
func TestCompleteTxWithoutWrites(t *testing.T) {
	t.Parallel()
	f := newTxFixture(t, idempg.Config{})
	kept, err := f.store.CompleteTx(t.Context(), f.ref(), func(ctx context.Context) (idem.Response, bool, error) {
		return idem.Response{Status: 202}, true, nil
	})
	if err != nil || !kept {
		t.Fatalf("CompleteTx = %v, %v", kept, err)
	}
	if r := f.record(t); r.State != idem.StateCompleted || r.Response.Status != 202 {
		t.Errorf("record = %v, %+v; want completed with 202", r.State, r.Response)
	}
}

func TestCompleteTxNested(t *testing.T) {
	t.Parallel()
	f := newTxFixture(t, idempg.Config{})
	var nestedErr error
	_, err := f.store.CompleteTx(t.Context(), f.ref(), func(ctx context.Context) (idem.Response, bool, error) {
		_, nestedErr = f.store.CompleteTx(ctx, f.ref(), payWork(f.db, "nested", true, nil))
		return idem.Response{}, false, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !errors.Is(nestedErr, idempg.ErrNestedCompleteTx) {
		t.Errorf("nested CompleteTx = %v, want ErrNestedCompleteTx", nestedErr)
	}
	if got := payments(t, f.db); len(got) != 0 {
		t.Errorf("payments = %v, want none", got)
	}
}

var isolationLevels = []pgx.TxIsoLevel{pgx.ReadCommitted, pgx.RepeatableRead, pgx.Serializable}

// Duplicates that arrive while the first execution is in flight never run
// the work, whatever isolation level the handler's writes use: the claim
// committed before the work began. They wait, and replay the answer.
func TestDuplicatesWhileInFlight(t *testing.T) {
	t.Parallel()
	url := pgURL(t)
	for _, iso := range isolationLevels {
		t.Run(string(iso), func(t *testing.T) {
			t.Parallel()
			schema := freshSchema(t, url)
			// Three replicas: the first runs the work, the others get the
			// duplicates.
			var (
				dbs    []*idempg.DB
				stores []*idempg.Store
			)
			for range 3 {
				db := openDB(t, url, idempg.Config{Schema: schema, TxOptions: pgx.TxOptions{IsoLevel: iso}})
				dbs = append(dbs, db)
				stores = append(stores, newStore(t, db))
			}
			migratePayments(t, dbs[0])
			req := idem.ClaimRequest{Scope: "merchant", Key: "order-1", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()

			var executions atomic.Int32
			wrote := make(chan struct{})
			proceed := make(chan struct{})
			first := mustClaim(t, stores[0], req)
			holderDone := make(chan error, 1)
			go func() {
				kept, err := stores[0].CompleteTx(ctx, refOf(first), func(ctx context.Context) (idem.Response, bool, error) {
					executions.Add(1)
					if err := insertPayment(ctx, dbs[0], "first"); err != nil {
						return idem.Response{}, false, err
					}
					close(wrote)
					if err := await(ctx, proceed); err != nil {
						return idem.Response{}, false, err
					}
					return idem.Response{Status: 201, Body: []byte("first")}, true, nil
				})
				if err == nil && !kept {
					err = errors.New("not kept")
				}
				holderDone <- err
			}()
			receive(t, wrote, "the first CompleteTx's work did not write")

			const dups = 16
			var sawInFlight sync.WaitGroup
			sawInFlight.Add(dups)
			replies := make(chan string, dups)
			var wg sync.WaitGroup
			for i := range dups {
				wg.Go(func() {
					s, db := stores[1+i%2], dbs[1+i%2]
					counted := false
					// A duplicate that ends before it saw the key in
					// flight does not hold the others up: its reply
					// says how it ended, and fails the test.
					defer func() {
						if !counted {
							sawInFlight.Done()
						}
					}()
					for {
						c, err := s.Claim(ctx, req)
						if err != nil {
							replies <- fmt.Sprintf("error: %v", err)
							return
						}
						switch c.Outcome {
						case idem.InFlight:
							if !counted {
								counted = true
								sawInFlight.Done()
							}
							if err := s.WaitChange(ctx, req.Scope, req.Key); err != nil {
								replies <- fmt.Sprintf("wait: %v", err)
								return
							}
						case idem.Completed:
							replies <- string(c.Record.Response.Body)
							return
						case idem.Acquired:
							// A double execution: run it, so that it shows.
							s.CompleteTx(ctx, refOf(c), func(ctx context.Context) (idem.Response, bool, error) {
								executions.Add(1)
								return payWork(db, fmt.Sprintf("dup-%d", i), true, nil)(ctx)
							})
							replies <- "executed"
							return
						default:
							replies <- c.Outcome.String()
							return
						}
					}
				})
			}
			sawInFlight.Wait()
			close(proceed)
			if err := receive(t, holderDone, "the first CompleteTx did not return once its work did"); err != nil {
				t.Fatalf("first execution: %v", err)
			}
			wg.Wait()
			close(replies)
			expectReplayedOnce(t, replies, &executions, dbs[0])
		})
	}
}

// expectReplayedOnce checks that every duplicate's reply was the first
// execution's body, "first", that the work ran once, and that only its
// payment committed.
func expectReplayedOnce(t *testing.T, replies <-chan string, executions *atomic.Int32, db *idempg.DB) {
	t.Helper()
	for r := range replies {
		if r != "first" {
			t.Errorf("duplicate got %q, want the replayed body \"first\"", r)
		}
	}
	if n := executions.Load(); n != 1 {
		t.Errorf("the work ran %d times, want 1", n)
	}
	if got := payments(t, db); !slices.Equal(got, []string{"first"}) {
		t.Errorf("payments = %v, want [first]", got)
	}
}

// When the first holder's lease ends in the middle of its work and another
// holder takes over and completes, the first one's completion is refused and
// its writes roll back, at every isolation level: exactly one payment.
func TestTakeoverDuringWork(t *testing.T) {
	t.Parallel()
	for _, iso := range isolationLevels {
		for _, writeFirst := range []bool{true, false} {
			name := fmt.Sprintf("%s/takeover %s the first writes", iso, map[bool]string{true: "after", false: "before"}[writeFirst])
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				f := newTxFixture(t, idempg.Config{TxOptions: pgx.TxOptions{IsoLevel: iso}})
				ready := make(chan struct{})
				proceed := make(chan struct{})
				type result struct {
					kept bool
					err  error
				}
				done := make(chan result, 1)
				go func() {
					kept, err := f.store.CompleteTx(t.Context(), f.ref(), func(ctx context.Context) (idem.Response, bool, error) {
						if writeFirst {
							if err := insertPayment(ctx, f.db, "first"); err != nil {
								return idem.Response{}, false, err
							}
						}
						close(ready)
						if err := await(ctx, proceed); err != nil {
							return idem.Response{}, false, err
						}
						if !writeFirst {
							if err := insertPayment(ctx, f.db, "first"); err != nil {
								return idem.Response{}, false, err
							}
						}
						return idem.Response{Status: 201, Body: []byte("first")}, true, nil
					})
					done <- result{kept, err}
				}()
				receive(t, ready, "CompleteTx did not call its work")

				f.clock.Advance(f.req.Lease)
				second := mustClaim(t, f.store, f.req)
				if !second.TookOver {
					t.Fatal("expected a takeover")
				}
				kept, err := f.store.CompleteTx(t.Context(), refOf(second), payWork(f.db, "second", true, nil))
				if err != nil || !kept {
					t.Fatalf("second holder's CompleteTx = %v, %v", kept, err)
				}
				close(proceed)
				r := receive(t, done, "the first holder's CompleteTx did not return once its work went on")
				if r.kept || r.err == nil {
					t.Fatalf("first holder's CompleteTx = %v, %v; want refused", r.kept, r.err)
				}
				var pgErr *pgconn.PgError
				serialization := errors.As(r.err, &pgErr) && pgErr.Code == "40001"
				wantSerialization := writeFirst && iso != pgx.ReadCommitted
				switch {
				case wantSerialization && !serialization:
					t.Errorf("first holder's CompleteTx = %v, want a serialization failure (its snapshot predates the takeover)", r.err)
				case !wantSerialization && !errors.Is(r.err, idem.ErrLeaseLost):
					t.Errorf("first holder's CompleteTx = %v, want ErrLeaseLost", r.err)
				}
				if got := payments(t, f.db); !slices.Equal(got, []string{"second"}) {
					t.Errorf("payments = %v, want [second]", got)
				}
				if rec := f.record(t); rec.Token != second.Token || string(rec.Response.Body) != "second" {
					t.Errorf("record = token %d, body %q; want the second holder's %d, \"second\"", rec.Token, rec.Response.Body, second.Token)
				}
			})
		}
	}
}

// A takeover attempted while the holder's completion is written but not yet
// committed waits for the holder's transaction, then finds the key
// completed: it never acquires a key whose completion is about to commit.
func TestTakeoverWaitsForUncommittedCompletion(t *testing.T) {
	t.Parallel()
	url := pgURL(t)
	for _, iso := range isolationLevels {
		t.Run(string(iso), func(t *testing.T) {
			t.Parallel()
			schema := freshSchema(t, url)
			clock := idemmem.NewClock(idemtest.Start)
			holderDB := openDB(t, url, idempg.Config{Schema: schema, Clock: clock, TxOptions: pgx.TxOptions{IsoLevel: iso}})
			app := randomName("idempg_claimer_")
			claimerDB := openDB(t, withAppName(url, app), idempg.Config{Schema: schema, Clock: clock})
			holder, claimer := newStore(t, holderDB), newStore(t, claimerDB)
			req := idem.ClaimRequest{Scope: "s", Key: "k", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
			first := mustClaim(t, holder, req)
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()

			claimed := make(chan idem.Claim, 1)
			claimErr := make(chan error, 1)
			err := holderDB.WithTx(ctx, func(txCtx context.Context, tx pgx.Tx) error {
				// Joins the transaction: the completion is written, locked
				// and not committed until fn returns.
				if err := holder.Complete(txCtx, refOf(first), idem.Response{Status: 201, Body: []byte("done")}); err != nil {
					return err
				}
				clock.Advance(req.Lease)
				go func() {
					c, err := claimer.Claim(ctx, req)
					claimed <- c
					claimErr <- err
				}()
				waitForLockWait(t, ctx, holderDB, app)
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			c, err := receive(t, claimed, "the takeover claim did not return once the completion committed"), <-claimErr
			if err != nil || c.Outcome != idem.Completed || c.Record.Token != first.Token {
				t.Errorf("takeover claim racing the completion = %v (token %d), %v; want completed under %d", c.Outcome, c.Record.Token, err, first.Token)
			}
		})
	}
}

// waitForLockWait returns once a session with application_name app waits
// for a lock.
func waitForLockWait(t *testing.T, ctx context.Context, db *idempg.DB, app string) {
	t.Helper()
	for {
		var waiting bool
		err := db.Pool().QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE application_name = $1 AND wait_event_type = 'Lock')`, app).Scan(&waiting)
		if err != nil {
			t.Fatalf("waiting for the claim to wait for the lock: %v", err)
		}
		if waiting {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatal("the claim never waited for the holder's lock")
		case <-time.After(10 * time.Millisecond):
		}
	}
}
