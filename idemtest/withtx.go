package idemtest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
)

// TxRunner is a database's own transaction helper as TestWithTx sees it
// (a backend's DB.WithTx, adapted to this signature): WithTx runs fn in one
// transaction of the database, joining the one ctx carries, and commits it
// when fn returns nil; it rolls back when fn returns an error (returned
// unchanged) or panics (the panic goes on).
type TxRunner interface {
	WithTx(ctx context.Context, fn func(ctx context.Context) error) error
}

// TestWithTx runs, as subtests of t, the contract of a database's
// transaction helper, which the same-transaction forms of its stores stand
// on: fn's writes commit when it returns nil and roll back when it fails or
// panics (and the database stays usable after a panic); nested calls join
// the outer transaction, commit with it and roll back with it; a context
// kept past the end of its transaction refuses further writes instead of
// committing them on their own; and a store of the same database joins the
// transaction, its claim and completion committing or rolling back with
// the caller's writes, and its Get seeing the uncommitted claim.
//
// newDB is called once per subtest and returns the helper of a fresh
// database, a store on it reading the time from clock, and a view of the
// database's effects (InboxEffects: Write writes in the transaction the
// context carries, and fails without one; Count counts what committed).
func TestWithTx(t *testing.T, newDB func(t *testing.T, clock idem.Clock) (TxRunner, idem.Store, InboxEffects)) {
	t.Helper()
	for _, tc := range withTxTests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			clock := idemmem.NewClock(Start)
			db, s, fx := newDB(t, clock)
			if db == nil || s == nil || fx == nil {
				t.Fatal("newDB returned a nil helper, store or effects")
			}
			tc.run(t, &withTxEnv{t: t, ctx: t.Context(), db: db, store: s, fx: fx})
		})
	}
}

var withTxTests = []struct {
	name string
	run  func(t *testing.T, e *withTxEnv)
}{
	{"Commits", testWithTxCommits},
	{"RollsBackOnError", testWithTxRollsBack},
	{"NestedJoin", testWithTxNested},
	{"Panic", testWithTxPanic},
	{"ContextOutlivesTransaction", testWithTxOutlived},
	{"StoreJoins", testWithTxStoreJoins},
}

type withTxEnv struct {
	t     *testing.T
	ctx   context.Context
	db    TxRunner
	store idem.Store
	fx    InboxEffects
}

func (e *withTxEnv) count(tag string) int {
	e.t.Helper()
	n, err := e.fx.Count(e.ctx, tag)
	if err != nil {
		e.t.Fatalf("InboxEffects.Count(%q): %v", tag, err)
	}
	return n
}

var errWithTxFail = errors.New("idemtest: a business rule failed")

func testWithTxCommits(t *testing.T, e *withTxEnv) {
	if err := e.db.WithTx(e.ctx, func(ctx context.Context) error { return e.fx.Write(ctx, "committed") }); err != nil {
		t.Fatalf("WithTx = %v", err)
	}
	if n := e.count("committed"); n != 1 {
		t.Errorf("%d writes committed, want 1", n)
	}
}

func testWithTxRollsBack(t *testing.T, e *withTxEnv) {
	err := e.db.WithTx(e.ctx, func(ctx context.Context) error {
		if err := e.fx.Write(ctx, "rolled-back"); err != nil {
			return err
		}
		return errWithTxFail
	})
	if !errors.Is(err, errWithTxFail) {
		t.Fatalf("WithTx = %v, want fn's error unchanged", err)
	}
	if n := e.count("rolled-back"); n != 0 {
		t.Errorf("%d writes committed after fn failed, want none", n)
	}
}

func testWithTxNested(t *testing.T, e *withTxEnv) {
	for _, fail := range []bool{false, true} {
		tag := map[bool]string{false: "nested-kept", true: "nested-failed"}[fail]
		err := e.db.WithTx(e.ctx, func(ctx context.Context) error {
			if err := e.fx.Write(ctx, tag); err != nil {
				return err
			}
			if err := e.db.WithTx(ctx, func(ctx context.Context) error { return e.fx.Write(ctx, tag) }); err != nil {
				return err
			}
			if fail {
				return errWithTxFail
			}
			return nil
		})
		switch want := map[bool]int{false: 2, true: 0}[fail]; {
		case fail && !errors.Is(err, errWithTxFail), !fail && err != nil:
			t.Fatalf("fail=%v: WithTx = %v", fail, err)
		case e.count(tag) != want:
			t.Errorf("fail=%v: %d writes committed, want %d: a nested call joins the outer transaction", fail, e.count(tag), want)
		}
	}
}

func testWithTxPanic(t *testing.T, e *withTxEnv) {
	func() {
		defer func() {
			if p := recover(); p != "boom" {
				t.Errorf("recovered %v, want the panic of fn", p)
			}
		}()
		_ = e.db.WithTx(e.ctx, func(ctx context.Context) error {
			if err := e.fx.Write(ctx, "panicked"); err != nil {
				t.Error(err)
			}
			panic("boom")
		})
	}()
	if n := e.count("panicked"); n != 0 {
		t.Errorf("%d writes committed after a panic, want none", n)
	}
	// Whatever the transaction held came back: a new one commits, within
	// a bound.
	ctx, cancel := context.WithTimeout(e.ctx, 10*time.Second)
	defer cancel()
	if err := e.db.WithTx(ctx, func(ctx context.Context) error { return e.fx.Write(ctx, "after") }); err != nil {
		t.Fatalf("a transaction after the panic: %v", err)
	}
}

func testWithTxOutlived(t *testing.T, e *withTxEnv) {
	var kept context.Context
	if err := e.db.WithTx(e.ctx, func(ctx context.Context) error { kept = ctx; return nil }); err != nil {
		t.Fatal(err)
	}
	err := e.db.WithTx(kept, func(ctx context.Context) error { return e.fx.Write(ctx, "late") })
	if err == nil {
		t.Errorf("a write with the context of an ended transaction succeeded; want an error")
	}
	if n := e.count("late"); n != 0 {
		t.Errorf("%d late writes committed, want none", n)
	}
}

func testWithTxStoreJoins(t *testing.T, e *withTxEnv) {
	for _, commit := range []bool{false, true} {
		key := idem.Key(map[bool]string{false: "joined-rolled-back", true: "joined-committed"}[commit])
		req := idem.ClaimRequest{Scope: "s", Key: key, Fingerprint: "fp", Lease: lease, TTL: ttl}
		err := e.db.WithTx(e.ctx, func(ctx context.Context) error {
			c, err := e.store.Claim(ctx, req)
			if err != nil || c.Outcome != idem.Acquired {
				t.Fatalf("Claim in a transaction = %v, %v", c.Outcome, err)
			}
			if r, err := e.store.Get(ctx, req.Scope, req.Key); err != nil || r.Token != c.Token {
				t.Errorf("Get in the transaction = %+v, %v; want the uncommitted claim", r, err)
			}
			if err := e.fx.Write(ctx, string(key)); err != nil {
				return err
			}
			if !commit {
				return errWithTxFail
			}
			return e.store.Complete(ctx, idem.Ref{Scope: req.Scope, Key: req.Key, Token: c.Token}, idem.Response{Status: 201})
		})
		if commit != (err == nil) {
			t.Fatalf("commit=%v: WithTx = %v", commit, err)
		}
		r, err := e.store.Get(e.ctx, req.Scope, req.Key)
		switch {
		case !commit && !errors.Is(err, idem.ErrNotFound):
			t.Errorf("after the rollback, Get = %+v, %v; want ErrNotFound: the claim rolls back with the caller's writes", r, err)
		case commit && (err != nil || r.State != idem.StateCompleted):
			t.Errorf("after the commit, Get = %+v, %v; want completed", r, err)
		}
		if got, want := e.count(string(key)), map[bool]int{false: 0, true: 1}[commit]; got != want {
			t.Errorf("commit=%v: %d writes committed, want %d", commit, got, want)
		}
	}
}
