package idemtest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
)

// TestTxEffects runs, as subtests of t, the same-transaction contract of
// idem.TxStore, and of idem.TxClaimer when the store implements it, on the
// caller's own writes, which TestStore cannot see: the work's writes
// commit with the key's completion, exactly once, or not at all.
//
//   - CompleteTx whose work keeps its answer commits every write of the
//     work with the completion; one that does not keep it, fails, panics
//     (the panic goes on) or finds its lease taken over commits none, and
//     leaves the key as it was; a second CompleteTx by the token that
//     completed the key succeeds without applying its work's writes, and
//     the first answer stays.
//   - ClaimTx whose work keeps its answer commits the claim, the writes
//     and the completion together; one that does not keep it, fails or
//     panics leaves the key free (claimable at once) and no write behind.
//
// newStore is called once per subtest and returns a fresh store reading
// the time from clock and a view of its database's effects
// (InboxEffects: Write writes in the transaction the work's context
// carries, and should fail without one; Count counts what committed).
func TestTxEffects(t *testing.T, newStore func(t *testing.T, clock idem.Clock) (idem.TxStore, InboxEffects)) {
	t.Helper()
	for _, tc := range txEffectsTests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			clock := idemmem.NewClock(Start)
			s, fx := newStore(t, clock)
			if s == nil || fx == nil {
				t.Fatal("newStore returned a nil store or effects")
			}
			e := &txEffectsEnv{env: &env{t: t, ctx: t.Context(), clock: clock, store: s}, tx: s, fx: fx}
			if tc.claimer {
				c, ok := s.(idem.TxClaimer)
				if !ok {
					t.Skip("the store does not implement idem.TxClaimer")
				}
				e.claimer = c
			}
			tc.run(t, e)
		})
	}
}

var txEffectsTests = []struct {
	name    string
	claimer bool
	run     func(t *testing.T, e *txEffectsEnv)
}{
	{"CompleteTxKept", false, testEffectsKept},
	{"CompleteTxRolledBack", false, testEffectsRolledBack},
	{"CompleteTxPanic", false, testEffectsPanic},
	{"CompleteTxLeaseTakenOver", false, testEffectsTakenOver},
	{"CompleteTxRetry", false, testEffectsRetry},
	{"ClaimTxKept", true, testClaimTxEffectsKept},
	{"ClaimTxRolledBack", true, testClaimTxEffectsRolledBack},
}

type txEffectsEnv struct {
	*env
	tx      idem.TxStore
	claimer idem.TxClaimer
	fx      InboxEffects
}

// work writes each tag through the effects, then answers resp, keep, err.
func (e *txEffectsEnv) work(body string, keep bool, err error, tags ...string) idem.TxWork {
	return func(ctx context.Context) (idem.Response, bool, error) {
		for _, tag := range tags {
			if werr := e.fx.Write(ctx, tag); werr != nil {
				return idem.Response{}, false, errors.Join(errors.New("idemtest: InboxEffects.Write in the work"), werr)
			}
		}
		return idem.Response{Status: 201, Body: []byte(body)}, keep, err
	}
}

func (e *txEffectsEnv) wantCount(tag string, want int, why string) {
	e.t.Helper()
	n, err := e.fx.Count(e.ctx, tag)
	if err != nil {
		e.t.Fatalf("InboxEffects.Count(%q): %v", tag, err)
	}
	if n != want {
		e.t.Errorf("%d writes tagged %q committed, want %d: %s", n, tag, want, why)
	}
}

func testEffectsKept(t *testing.T, e *txEffectsEnv) {
	c := e.acquire(e.req("k", "fp"))
	kept, err := e.tx.CompleteTx(e.ctx, ref(c), e.work("answer", true, nil, "kept-1", "kept-2"))
	if err != nil || !kept {
		t.Fatalf("CompleteTx = %v, %v; want kept", kept, err)
	}
	e.wantCount("kept-1", 1, "the work's writes commit with the completion")
	e.wantCount("kept-2", 1, "every write of the work commits")
	if r := e.get("s", "k"); r.State != idem.StateCompleted || string(r.Response.Body) != "answer" {
		t.Errorf("record %v with %q, want completed with the work's answer", r.State, r.Response.Body)
	}
}

func testEffectsRolledBack(t *testing.T, e *txEffectsEnv) {
	errWork := errors.New("card declined by a flaky provider")
	for _, tc := range []struct {
		name    string
		keep    bool
		err     error
		wantErr error
	}{
		{"not kept", false, nil, nil},
		{"work error", true, errWork, errWork},
	} {
		c := e.acquire(e.req("k-"+tc.name, "fp"))
		kept, err := e.tx.CompleteTx(e.ctx, ref(c), e.work("answer", tc.keep, tc.err, "rolled-"+tc.name))
		if kept || !errors.Is(err, tc.wantErr) || (tc.wantErr == nil && err != nil) {
			t.Fatalf("%s: CompleteTx = %v, %v; want not kept, %v", tc.name, kept, err, tc.wantErr)
		}
		e.wantCount("rolled-"+tc.name, 0, tc.name+": nothing the work wrote commits")
		if r := e.get("s", idem.Key("k-"+tc.name)); r.State != idem.StateInFlight || r.Token != c.Token {
			t.Errorf("%s: record %v under token %d, want still in flight under %d", tc.name, r.State, r.Token, c.Token)
		}
	}
}

func testEffectsPanic(t *testing.T, e *txEffectsEnv) {
	c := e.acquire(e.req("k", "fp"))
	func() {
		defer func() {
			if p := recover(); p != "handler bug" {
				t.Errorf("recovered %v, want the work's panic", p)
			}
		}()
		_, _ = e.tx.CompleteTx(e.ctx, ref(c), func(ctx context.Context) (idem.Response, bool, error) {
			if err := e.fx.Write(ctx, "panicked"); err != nil {
				t.Error(err)
			}
			panic("handler bug")
		})
	}()
	e.wantCount("panicked", 0, "a panic rolls the work back")
	if r := e.get("s", "k"); r.State != idem.StateInFlight {
		t.Errorf("record after a panic %v, want in flight", r.State)
	}
	// Whatever the transaction held was given back: the key can be
	// released, within a bound.
	ctx, cancel := context.WithTimeout(e.ctx, 10*time.Second)
	defer cancel()
	if err := e.store.Release(ctx, ref(c)); err != nil {
		t.Fatalf("Release after a panic: %v", err)
	}
}

func testEffectsTakenOver(t *testing.T, e *txEffectsEnv) {
	req := e.req("k", "fp")
	stale := e.acquire(req)
	e.clock.Advance(lease)
	holder := e.acquire(req)
	if !holder.TookOver {
		t.Fatalf("the second claim did not take over: %+v", holder)
	}
	kept, err := e.tx.CompleteTx(e.ctx, ref(stale), e.work("stale answer", true, nil, "stale"))
	if kept || !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("CompleteTx by the stale holder = %v, %v; want ErrLeaseLost", kept, err)
	}
	e.wantCount("stale", 0, "a holder that lost the key commits nothing")
	if r := e.get("s", "k"); r.State != idem.StateInFlight || r.Token != holder.Token {
		t.Errorf("record %v under token %d, want in flight under the new holder's %d", r.State, r.Token, holder.Token)
	}
}

func testEffectsRetry(t *testing.T, e *txEffectsEnv) {
	c := e.acquire(e.req("k", "fp"))
	if kept, err := e.tx.CompleteTx(e.ctx, ref(c), e.work("first", true, nil, "first")); err != nil || !kept {
		t.Fatalf("CompleteTx = %v, %v", kept, err)
	}
	kept, err := e.tx.CompleteTx(e.ctx, ref(c), e.work("second", true, nil, "second"))
	if err != nil || !kept {
		t.Fatalf("CompleteTx again by the token that completed the key = %v, %v; want true, nil", kept, err)
	}
	e.wantCount("first", 1, "the first execution's writes stay")
	e.wantCount("second", 0, "a retry after the completion does not apply its work again")
	if r := e.get("s", "k"); string(r.Response.Body) != "first" {
		t.Errorf("stored answer %q, want the first execution's", r.Response.Body)
	}
}

func testClaimTxEffectsKept(t *testing.T, e *txEffectsEnv) {
	req := e.req("k", "fp")
	claim, kept, err := e.claimer.ClaimTx(e.ctx, req, time.Second, func(ctx context.Context, c idem.Claim) (idem.Response, bool, error) {
		return e.work("answer", true, nil, "claimtx-kept")(ctx)
	})
	if err != nil || !kept || claim.Outcome != idem.Acquired {
		t.Fatalf("ClaimTx = %v, %v, %v; want acquired and kept", claim.Outcome, kept, err)
	}
	e.wantCount("claimtx-kept", 1, "the claim, the writes and the completion commit together")
	if r := e.get("s", "k"); r.State != idem.StateCompleted || string(r.Response.Body) != "answer" {
		t.Errorf("record %v with %q, want completed with the work's answer", r.State, r.Response.Body)
	}
}

func testClaimTxEffectsRolledBack(t *testing.T, e *txEffectsEnv) {
	errWork := errors.New("card declined by a flaky provider")
	for _, tc := range []struct {
		name  string
		keep  bool
		err   error
		panic bool
	}{
		{"not kept", false, nil, false},
		{"work error", true, errWork, false},
		{"panic", true, nil, true},
	} {
		key := "k-" + tc.name
		req := e.req(key, "fp")
		func() {
			defer func() {
				if p := recover(); tc.panic && p != "handler bug" {
					t.Errorf("%s: recovered %v, want the work's panic", tc.name, p)
				}
			}()
			claim, kept, err := e.claimer.ClaimTx(e.ctx, req, time.Second, func(ctx context.Context, c idem.Claim) (idem.Response, bool, error) {
				resp, keep, err := e.work("answer", tc.keep, tc.err, "claimtx-"+tc.name)(ctx)
				if tc.panic {
					panic("handler bug")
				}
				return resp, keep, err
			})
			if kept || !errors.Is(err, tc.err) || (tc.err == nil && err != nil) || claim.Outcome != idem.Acquired {
				t.Errorf("%s: ClaimTx = %v, %v, %v; want acquired, not kept, %v", tc.name, claim.Outcome, kept, err, tc.err)
			}
		}()
		e.wantCount("claimtx-"+tc.name, 0, tc.name+": nothing of the work commits")
		// The claim rolled back with the rest: the key is free at once.
		e.wantNotFound("s", idem.Key(key))
		ctx, cancel := context.WithTimeout(e.ctx, 10*time.Second)
		if c, err := e.store.Claim(ctx, req); err != nil || c.Outcome != idem.Acquired {
			t.Errorf("%s: Claim after the rollback = %v, %v; want acquired", tc.name, c.Outcome, err)
		}
		cancel()
	}
}
