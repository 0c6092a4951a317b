package idemsqlite_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemsqlite"
	"github.com/idem-go/idem/idemtest"
)

// txFixture is a DB with the payments table, a Store on it, and a key
// claimed by the test.
type txFixture struct {
	db    *idemsqlite.DB
	store *idemsqlite.Store
	clock *idemmem.Clock
	req   idem.ClaimRequest
	claim idem.Claim
}

func newTxFixture(t *testing.T) *txFixture {
	t.Helper()
	db := openDB(t)
	migratePayments(t, db)
	clock := idemmem.NewClock(idemtest.Start)
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
