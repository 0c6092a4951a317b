package idemsqlite_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemsqlite"
	"github.com/idem-go/idem/idemtest"
)

// txFixture is a DB with the payments table, a Store on it, and a key
// claimed by the test.
type txFixture struct {
	db    *idemsqlite.DB
	store *idemsqlite.Store
	clock *idemtest.Clock
	req   idem.ClaimRequest
	claim idem.Claim
}

func newTxFixture(t *testing.T) *txFixture {
	t.Helper()
	db := openDB(t)
	migratePayments(t, db)
	clock := idemtest.NewClock(idemtest.Start)
	f := &txFixture{
		db:    db,
		store: newStore(t, db, clock),
		clock: clock,
		req:   idem.ClaimRequest{Scope: "tenant", Key: "order-42", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour},
	}
	f.claim = f.mustClaim(t, f.req)
	return f
}

func (f *txFixture) mustClaim(t *testing.T, req idem.ClaimRequest) idem.Claim {
	t.Helper()
	c, err := f.store.Claim(t.Context(), req)
	if err != nil || c.Outcome != idem.Acquired {
		t.Fatalf("Claim(%s) = %v, %v; want acquired", req.Key, c.Outcome, err)
	}
	return c
}

func (f *txFixture) ref() idem.Ref {
	return idem.Ref{Scope: f.req.Scope, Key: f.req.Key, Token: f.claim.Token}
}

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
func payWork(db *idemsqlite.DB, id string, keep bool, err error) idem.TxWork {
	return func(ctx context.Context) (idem.Response, bool, error) {
		if werr := insertPayment(ctx, db, id); werr != nil {
			return idem.Response{}, false, werr
		}
		return idem.Response{Status: 201, Body: []byte(id)}, keep, err
	}
}

func TestCompleteTxBusinessWrites(t *testing.T) {
	t.Parallel()
	errWork := errors.New("card declined by a flaky provider")
	cases := []struct {
		name      string
		work      func(db *idemsqlite.DB) idem.TxWork
		takeover  bool
		wantKept  bool
		wantErr   error
		wantPays  []string
		wantState idem.State
	}{
		{name: "kept", work: func(db *idemsqlite.DB) idem.TxWork { return payWork(db, "pay_1", true, nil) },
			wantKept: true, wantPays: []string{"pay_1"}, wantState: idem.StateCompleted},
		{name: "not kept", work: func(db *idemsqlite.DB) idem.TxWork { return payWork(db, "pay_1", false, nil) },
			wantState: idem.StateInFlight},
		{name: "work error", work: func(db *idemsqlite.DB) idem.TxWork { return payWork(db, "pay_1", true, errWork) },
			wantErr: errWork, wantState: idem.StateInFlight},
		{name: "lease taken over", work: func(db *idemsqlite.DB) idem.TxWork { return payWork(db, "pay_1", true, nil) },
			takeover: true, wantErr: idem.ErrLeaseLost, wantState: idem.StateInFlight},
		{name: "several writes", work: func(db *idemsqlite.DB) idem.TxWork {
			return func(ctx context.Context) (idem.Response, bool, error) {
				for _, id := range []string{"pay_1", "pay_2"} {
					if err := insertPayment(ctx, db, id); err != nil {
						return idem.Response{}, false, err
					}
				}
				return idem.Response{Status: 201}, true, nil
			}
		}, wantKept: true, wantPays: []string{"pay_1", "pay_2"}, wantState: idem.StateCompleted},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newTxFixture(t)
			holder := f.claim
			if tc.takeover {
				f.clock.Advance(f.req.Lease)
				holder = f.mustClaim(t, f.req)
			}
			kept, err := f.store.CompleteTx(t.Context(), f.ref(), tc.work(f.db))
			if kept != tc.wantKept || !errors.Is(err, tc.wantErr) || (tc.wantErr == nil && err != nil) {
				t.Fatalf("CompleteTx = %v, %v; want %v, %v", kept, err, tc.wantKept, tc.wantErr)
			}
			if got := payments(t, f.db); !slices.Equal(got, tc.wantPays) {
				t.Errorf("committed payments = %v, want %v", got, tc.wantPays)
			}
			r := f.record(t)
			if r.State != tc.wantState || r.Token != holder.Token {
				t.Errorf("record = %v under token %d, want %v under %d", r.State, r.Token, tc.wantState, holder.Token)
			}
		})
	}
}

func TestCompleteTxPanic(t *testing.T) {
	t.Parallel()
	f := newTxFixture(t)
	func() {
		defer func() {
			if p := recover(); p != "handler bug" {
				t.Errorf("recovered %v, want the work's panic", p)
			}
		}()
		_, _ = f.store.CompleteTx(t.Context(), f.ref(), func(ctx context.Context) (idem.Response, bool, error) {
			if err := insertPayment(ctx, f.db, "pay_1"); err != nil {
				t.Error(err)
			}
			panic("handler bug")
		})
	}()
	if got := payments(t, f.db); len(got) != 0 {
		t.Errorf("payments after a panic = %v, want none", got)
	}
	if r := f.record(t); r.State != idem.StateInFlight {
		t.Errorf("record after a panic = %v, want in flight", r.State)
	}
	// The writer was given back: the key can be released.
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := f.store.Release(ctx, f.ref()); err != nil {
		t.Fatalf("Release after a panic: %v", err)
	}
}

// A retry of CompleteTx by the token that completed the key succeeds
// without applying the work's writes a second time.
func TestCompleteTxRetryDoesNotApplyTwice(t *testing.T) {
	t.Parallel()
	f := newTxFixture(t)
	if kept, err := f.store.CompleteTx(t.Context(), f.ref(), payWork(f.db, "pay_1", true, nil)); err != nil || !kept {
		t.Fatalf("CompleteTx = %v, %v", kept, err)
	}
	kept, err := f.store.CompleteTx(t.Context(), f.ref(), payWork(f.db, "pay_2", true, nil))
	if err != nil || !kept {
		t.Fatalf("retried CompleteTx = %v, %v; want true, nil", kept, err)
	}
	if got := payments(t, f.db); !slices.Equal(got, []string{"pay_1"}) {
		t.Errorf("payments = %v, want only the first execution's [pay_1]", got)
	}
	if r := f.record(t); string(r.Response.Body) != "pay_1" {
		t.Errorf("stored body = %q, want the first execution's", r.Response.Body)
	}
}

// The transaction begins when work first writes, so a handler that waits
// (for a provider, a lock, a slow client) does not hold the single writer
// connection, and other keys are claimed meanwhile.
func TestCompleteTxWaitingWorkDoesNotBlockClaims(t *testing.T) {
	t.Parallel()
	f := newTxFixture(t)
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
			<-proceed
			return payWork(f.db, "pay_1", true, nil)(ctx)
		})
		done <- result{kept, err}
	}()

	<-entered
	// Bounded so that a transaction begun too early fails the test instead
	// of hanging it.
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	other := f.req
	other.Key = "order-43"
	c, err := f.store.Claim(ctx, other)
	close(proceed)
	r := <-done
	if err != nil || c.Outcome != idem.Acquired {
		t.Errorf("Claim of another key while work waits = %v, %v; want acquired without waiting", c.Outcome, err)
	}
	if err := f.store.Complete(ctx, idem.Ref{Scope: other.Scope, Key: other.Key, Token: c.Token}, idem.Response{Status: 200}); err != nil {
		t.Errorf("Complete of the other key while work waits: %v", err)
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
	f := newTxFixture(t)
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
	f := newTxFixture(t)
	var nestedErr error
	_, err := f.store.CompleteTx(t.Context(), f.ref(), func(ctx context.Context) (idem.Response, bool, error) {
		_, nestedErr = f.store.CompleteTx(ctx, f.ref(), payWork(f.db, "nested", true, nil))
		return idem.Response{}, false, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !errors.Is(nestedErr, idemsqlite.ErrNestedCompleteTx) {
		t.Errorf("nested CompleteTx = %v, want ErrNestedCompleteTx", nestedErr)
	}
	if got := payments(t, f.db); len(got) != 0 {
		t.Errorf("payments = %v, want none", got)
	}
}
