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

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/idemtest"
)

// claimTxFixture is a DB with the payments table and a Store on it, on the
// test's clock.
type claimTxFixture struct {
	db    *idempg.DB
	store *idempg.Store
	clock *idemmem.Clock
	req   idem.ClaimRequest
}

func newClaimTxFixture(t *testing.T) *claimTxFixture {
	t.Helper()
	clock := idemmem.NewClock(idemtest.Start)
	db := openDB(t, pgURL(t), idempg.Config{Clock: clock})
	migratePayments(t, db)
	return &claimTxFixture{
		db: db, store: newStore(t, db), clock: clock,
		req: idem.ClaimRequest{Scope: "tenant", Key: "order-42", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour},
	}
}

// claimedPayWork is payWork under a claim: it records the claim it ran
// under and how often it ran.
func claimedPayWork(db *idempg.DB, id string, keep bool, err error, ran *[]idem.Claim) idem.ClaimedWork {
	return func(ctx context.Context, c idem.Claim) (idem.Response, bool, error) {
		*ran = append(*ran, c)
		return payWork(db, id, keep, err)(ctx)
	}
}

func (f *claimTxFixture) get(t *testing.T) (idem.Record, error) {
	t.Helper()
	r, err := f.store.Get(t.Context(), f.req.Scope, f.req.Key)
	if err != nil && !errors.Is(err, idem.ErrNotFound) {
		t.Fatal(err)
	}
	return r, err
}

// The claim, the work's writes and the completion commit together; when the
// work does not keep its answer, fails or panics, the claim is rolled back
// with its writes and the key is free, with nothing to release.
func TestClaimTxOutcomes(t *testing.T) {
	t.Parallel()
	errWork := errors.New("card declined by a flaky provider")
	cases := []struct {
		name     string
		keep     bool
		err      error
		wantKept bool
	}{
		{name: "kept", keep: true, wantKept: true},
		{name: "not kept", keep: false},
		{name: "work error", keep: true, err: errWork},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newClaimTxFixture(t)
			var ran []idem.Claim
			c, kept, err := f.store.ClaimTx(t.Context(), f.req, time.Second, claimedPayWork(f.db, "pay_1", tc.keep, tc.err, &ran))
			if c.Outcome != idem.Acquired || kept != tc.wantKept || !errors.Is(err, tc.err) || (tc.err == nil && err != nil) {
				t.Fatalf("ClaimTx = %v, %v, %v; want acquired, %v, %v", c.Outcome, kept, err, tc.wantKept, tc.err)
			}
			if len(ran) != 1 || ran[0].Token != c.Token || ran[0].TookOver {
				t.Fatalf("work ran under %+v, want once under the returned claim", ran)
			}
			rec, gerr := f.get(t)
			if !tc.wantKept {
				if gerr == nil {
					t.Fatalf("the key is %v after a rollback, want absent", rec.State)
				}
				if got := payments(t, f.db); len(got) != 0 {
					t.Fatalf("payments = %v after a rollback, want none", got)
				}
				// Free at once: a retry runs.
				again, kept, err := f.store.ClaimTx(t.Context(), f.req, time.Second, claimedPayWork(f.db, "pay_2", true, nil, &ran))
				if again.Outcome != idem.Acquired || !kept || err != nil {
					t.Fatalf("retry = %v, %v, %v; want acquired and kept", again.Outcome, kept, err)
				}
				return
			}
			if rec.State != idem.StateCompleted || rec.Token != c.Token || string(rec.Response.Body) != "pay_1" {
				t.Fatalf("record = %+v, want completed under token %d with pay_1", rec, c.Token)
			}
			if got := payments(t, f.db); !slices.Equal(got, []string{"pay_1"}) {
				t.Fatalf("payments = %v, want [pay_1]", got)
			}
			// Replays and mismatches are answered without running work.
			ran = nil
			replay, kept, err := f.store.ClaimTx(t.Context(), f.req, time.Second, claimedPayWork(f.db, "pay_2", true, nil, &ran))
			if replay.Outcome != idem.Completed || kept || err != nil || string(replay.Record.Response.Body) != "pay_1" {
				t.Fatalf("replay = %v %q, %v, %v; want completed with pay_1", replay.Outcome, replay.Record.Response.Body, kept, err)
			}
			other := f.req
			other.Fingerprint = "another body"
			mm, kept, err := f.store.ClaimTx(t.Context(), other, time.Second, claimedPayWork(f.db, "pay_3", true, nil, &ran))
			if mm.Outcome != idem.Mismatch || kept || err != nil {
				t.Fatalf("other body = %v, %v, %v; want mismatch", mm.Outcome, kept, err)
			}
			if len(ran) != 0 {
				t.Fatalf("work ran %d times for a replay and a mismatch", len(ran))
			}
			if got := payments(t, f.db); !slices.Equal(got, []string{"pay_1"}) {
				t.Fatalf("payments = %v, want [pay_1]", got)
			}
		})
	}
}

func TestClaimTxPanic(t *testing.T) {
	t.Parallel()
	f := newClaimTxFixture(t)
	func() {
		defer func() {
			if v := recover(); v != "boom" {
				t.Fatalf("recovered %v, want the work's panic", v)
			}
		}()
		f.store.ClaimTx(t.Context(), f.req, time.Second, func(ctx context.Context, c idem.Claim) (idem.Response, bool, error) {
			if err := insertPayment(ctx, f.db, "pay_1"); err != nil {
				t.Fatal(err)
			}
			panic("boom")
		})
	}()
	if rec, err := f.get(t); err == nil {
		t.Fatalf("the key is %v after a panic, want absent", rec.State)
	}
	if got := payments(t, f.db); len(got) != 0 {
		t.Fatalf("payments = %v after a panic, want none", got)
	}
}

// Bad input gets an error and changes nothing.
func TestClaimTxRefusesBadInput(t *testing.T) {
	t.Parallel()
	f := newClaimTxFixture(t)
	noWork := func(context.Context, idem.Claim) (idem.Response, bool, error) {
		t.Fatal("work ran")
		return idem.Response{}, false, nil
	}
	bad := f.req
	bad.Key = ""
	var ae *idem.ArgumentError
	if _, _, err := f.store.ClaimTx(t.Context(), bad, time.Second, noWork); !errors.As(err, &ae) {
		t.Errorf("empty key: %v, want an ArgumentError", err)
	}
	if _, _, err := f.store.ClaimTx(t.Context(), f.req, time.Second, nil); !errors.As(err, &ae) {
		t.Errorf("nil work: %v, want an ArgumentError", err)
	}
	err := f.db.WithTx(t.Context(), func(ctx context.Context, tx pgx.Tx) error {
		_, _, err := f.store.ClaimTx(ctx, f.req, time.Second, noWork)
		return err
	})
	if !errors.Is(err, idempg.ErrNestedCompleteTx) {
		t.Errorf("inside WithTx: %v, want ErrNestedCompleteTx", err)
	}
	if rec, err := f.get(t); err == nil {
		t.Fatalf("the key is %v, want absent", rec.State)
	}
}

// A key claimed by Claim whose lease ended is taken over, and the work runs
// under the new token; an expired completed key is claimed anew.
func TestClaimTxExistingKeys(t *testing.T) {
	t.Parallel()
	t.Run("lease ended", func(t *testing.T) {
		t.Parallel()
		f := newClaimTxFixture(t)
		old := mustClaim(t, f.store, f.req)
		f.clock.Advance(f.req.Lease)
		var ran []idem.Claim
		c, kept, err := f.store.ClaimTx(t.Context(), f.req, time.Second, claimedPayWork(f.db, "pay_1", true, nil, &ran))
		if c.Outcome != idem.Acquired || !c.TookOver || !kept || err != nil || c.Token <= old.Token {
			t.Fatalf("ClaimTx = %+v, %v, %v; want a takeover above token %d, kept", c, kept, err, old.Token)
		}
		if len(ran) != 1 || !ran[0].TookOver {
			t.Fatalf("work ran under %+v, want once, taken over", ran)
		}
		// The old holder's completion is refused.
		if err := f.store.Complete(t.Context(), refOf(old), idem.Response{Status: 201}); !errors.Is(err, idem.ErrLeaseLost) {
			t.Fatalf("old holder's Complete: %v, want ErrLeaseLost", err)
		}
		rec, _ := f.get(t)
		if rec.State != idem.StateCompleted || rec.Token != c.Token {
			t.Fatalf("record = %v under %d, want completed under %d", rec.State, rec.Token, c.Token)
		}
	})
	t.Run("still in flight", func(t *testing.T) {
		t.Parallel()
		f := newClaimTxFixture(t)
		mustClaim(t, f.store, f.req)
		var ran []idem.Claim
		c, kept, err := f.store.ClaimTx(t.Context(), f.req, time.Second, claimedPayWork(f.db, "pay_1", true, nil, &ran))
		if c.Outcome != idem.InFlight || kept || err != nil || len(ran) != 0 {
			t.Fatalf("ClaimTx = %v, %v, %v (work ran %d times); want in flight", c.Outcome, kept, err, len(ran))
		}
	})
	t.Run("expired", func(t *testing.T) {
		t.Parallel()
		f := newClaimTxFixture(t)
		var ran []idem.Claim
		first, _, err := f.store.ClaimTx(t.Context(), f.req, time.Second, claimedPayWork(f.db, "pay_1", true, nil, &ran))
		if err != nil {
			t.Fatal(err)
		}
		f.clock.Advance(f.req.TTL)
		c, kept, err := f.store.ClaimTx(t.Context(), f.req, time.Second, claimedPayWork(f.db, "pay_2", true, nil, &ran))
		if c.Outcome != idem.Acquired || c.TookOver || !kept || err != nil || c.Token <= first.Token {
			t.Fatalf("ClaimTx = %+v, %v, %v; want acquired anew above token %d", c, kept, err, first.Token)
		}
		if got := payments(t, f.db); !slices.Equal(got, []string{"pay_1", "pay_2"}) {
			t.Fatalf("payments = %v, want [pay_1 pay_2]", got)
		}
	})
}

// Duplicates that arrive while the first ClaimTx runs wait for its
// transaction, in the database, and then replay its answer, at every
// isolation level: the work runs once, on three replicas.
func TestClaimTxDuplicatesWhileInFlight(t *testing.T) {
	t.Parallel()
	url := pgURL(t)
	for _, iso := range isolationLevels {
		t.Run(string(iso), func(t *testing.T) {
			t.Parallel()
			schema := freshSchema(t, url)
			app := randomName("claimtx")
			var (
				dbs    []*idempg.DB
				stores []*idempg.Store
			)
			for range 3 {
				db := openDB(t, withAppName(url, app), idempg.Config{Schema: schema, MaxConns: 10, TxOptions: pgx.TxOptions{IsoLevel: iso}})
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
			holderDone := make(chan error, 1)
			go func() {
				_, kept, err := stores[0].ClaimTx(ctx, req, time.Second, func(ctx context.Context, c idem.Claim) (idem.Response, bool, error) {
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
			receive(t, wrote, "the first ClaimTx's work did not write")

			const dups = 16
			replies := make(chan string, dups)
			var wg sync.WaitGroup
			for i := range dups {
				wg.Go(func() {
					s, db := stores[1+i%2], dbs[1+i%2]
					c, _, err := s.ClaimTx(ctx, req, 20*time.Second, func(ctx context.Context, c idem.Claim) (idem.Response, bool, error) {
						executions.Add(1)
						return payWork(db, fmt.Sprintf("dup-%d", i), true, nil)(ctx)
					})
					switch {
					case err != nil:
						replies <- fmt.Sprintf("error: %v", err)
					case c.Outcome == idem.Completed:
						replies <- string(c.Record.Response.Body)
					default:
						replies <- c.Outcome.String()
					}
				})
			}
			// Every duplicate is blocked on the first one's key, each on a
			// connection of its own (two pools of 10 for 16 duplicates).
			idemtest.Eventually(t, 10*time.Second, "duplicates blocked on the key", func() bool {
				var n int
				err := dbs[0].Pool().QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity
					WHERE application_name = $1 AND wait_event_type = 'Lock' AND query LIKE 'WITH o AS MATERIALIZED%'`, app).Scan(&n)
				if err != nil {
					t.Fatal(err)
				}
				return n == dups
			})
			close(proceed)
			if err := receive(t, holderDone, "the first ClaimTx did not return once its work did"); err != nil {
				t.Fatalf("first execution: %v", err)
			}
			wg.Wait()
			close(replies)
			expectReplayedOnce(t, replies, &executions, dbs[0])
		})
	}
}

// A duplicate waiting for a first execution that then rolls back claims the
// key and runs; one that waits longer than its wait is answered in flight,
// and gives its connection back.
func TestClaimTxWaitEnds(t *testing.T) {
	t.Parallel()
	url := pgURL(t)
	app := randomName("claimtx")
	db := openDB(t, withAppName(url, app), idempg.Config{})
	migratePayments(t, db)
	store := newStore(t, db)
	req := idem.ClaimRequest{Scope: "merchant", Key: "order-1", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
	ctx := t.Context()

	wrote := make(chan struct{})
	proceed := make(chan struct{})
	holderDone := make(chan error, 1)
	go func() {
		_, _, err := store.ClaimTx(ctx, req, time.Second, func(ctx context.Context, c idem.Claim) (idem.Response, bool, error) {
			if err := insertPayment(ctx, db, "first"); err != nil {
				return idem.Response{}, false, err
			}
			close(wrote)
			if err := await(ctx, proceed); err != nil {
				return idem.Response{}, false, err
			}
			return idem.Response{Status: 503}, false, nil // a transient failure: not kept
		})
		holderDone <- err
	}()
	receive(t, wrote, "the first ClaimTx's work did not write")

	// A short wait ends in flight.
	c, kept, err := store.ClaimTx(ctx, req, 20*time.Millisecond, func(context.Context, idem.Claim) (idem.Response, bool, error) {
		t.Error("work ran while the first holds the key")
		return idem.Response{}, false, nil
	})
	if c.Outcome != idem.InFlight || kept || err != nil || c.Record.State != idem.StateInFlight || c.Record.Key != req.Key {
		t.Fatalf("short wait: %+v, %v, %v; want in flight", c, kept, err)
	}

	// A long one outlasts the first execution, which rolls back.
	second := make(chan error, 1)
	go func() {
		c, kept, err := store.ClaimTx(ctx, req, 20*time.Second, claimedPayWork(db, "second", true, nil, new([]idem.Claim)))
		if err == nil && (c.Outcome != idem.Acquired || !kept) {
			err = fmt.Errorf("%v, kept %v; want acquired and kept", c.Outcome, kept)
		}
		second <- err
	}()
	waitingOn(t, db, app, "WITH o AS MATERIALIZED")
	close(proceed)
	if err := receive(t, holderDone, "the first ClaimTx did not return once its work did"); err != nil {
		t.Fatal(err)
	}
	if err := receive(t, second, "the waiting duplicate did not return once the first rolled back"); err != nil {
		t.Fatalf("the waiting duplicate: %v", err)
	}
	if got := payments(t, db); !slices.Equal(got, []string{"second"}) {
		t.Fatalf("payments = %v, want [second]", got)
	}
	// The connection that timed out is not left waiting: the pool still
	// serves its four connections.
	var n int
	if err := db.Pool().QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'`, app).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d sessions still wait for a lock (%v)", n, err)
	}
}

// A process that dies in the middle of the work takes its claim with it:
// the server rolls the transaction back, and the retry runs at once
// instead of waiting for a lease to end.
func TestClaimTxCrashFreesTheKey(t *testing.T) {
	t.Parallel()
	f := newClaimTxFixture(t)
	_, _, err := f.store.ClaimTx(t.Context(), f.req, time.Second, func(ctx context.Context, c idem.Claim) (idem.Response, bool, error) {
		if err := insertPayment(ctx, f.db, "lost"); err != nil {
			return idem.Response{}, false, err
		}
		// The connection dies as it would with its process.
		var pid int
		if err := f.db.WithTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
			return tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid)
		}); err != nil {
			return idem.Response{}, false, err
		}
		if _, err := f.db.Pool().Exec(t.Context(), `SELECT pg_terminate_backend($1)`, pid); err != nil {
			return idem.Response{}, false, err
		}
		return idem.Response{Status: 201}, true, nil
	})
	if err == nil {
		t.Fatal("ClaimTx succeeded on a terminated connection")
	}
	if rec, err := f.get(t); err == nil {
		t.Fatalf("the key is %v after the crash, want absent", rec.State)
	}
	if got := payments(t, f.db); len(got) != 0 {
		t.Fatalf("payments = %v after the crash, want none", got)
	}
	c, kept, err := f.store.ClaimTx(t.Context(), f.req, time.Second, claimedPayWork(f.db, "retry", true, nil, new([]idem.Claim)))
	if c.Outcome != idem.Acquired || !kept || err != nil {
		t.Fatalf("retry = %v, %v, %v; want acquired and kept", c.Outcome, kept, err)
	}
}
