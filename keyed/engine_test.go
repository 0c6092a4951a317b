package keyed_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/keyed"
)

// syncBuffer is a log's output, safe for the engine's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// yieldFails is a Restarter whose YieldEarlier fails.
type yieldFails struct{ *idemmem.Store }

func (yieldFails) YieldEarlier(context.Context, idem.Holder) (int, error) {
	return 0, errors.New("connection refused")
}

// Restart ends the leases an earlier incarnation of this replica held, so
// that a retry takes such a key over at once, says so in the log with how
// many, and reports a store's failure as its error. With nothing to end it
// logs nothing.
func TestRestartEndsTheEarlierIncarnationsLeases(t *testing.T) {
	t.Parallel()
	clock := idemmem.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	store := idemmem.NewStore(&idemmem.Config{Clock: clock})
	fp := idem.NewFingerprint("POST", "/pay", "", "", nil)
	earlier := idem.Holder{Replica: "api-0", Incarnation: "1"}
	claim, err := store.Claim(t.Context(), idem.ClaimRequest{Key: "k", Fingerprint: fp, Lease: time.Minute, TTL: time.Hour, Holder: earlier})
	if err != nil || claim.Outcome != idem.Acquired {
		t.Fatalf("claim by the earlier incarnation: %+v, %v", claim, err)
	}
	var log syncBuffer
	eng, err := keyed.New(&keyed.Config{Store: store, Clock: clock, Holder: idem.Holder{Replica: "api-0", Incarnation: "2"},
		Logger: slog.New(slog.NewTextHandler(&log, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := eng.Restart(t.Context()); n != 1 || err != nil {
		t.Fatalf("Restart: %d, %v; want 1 lease ended", n, err)
	}
	if l := log.String(); !strings.Contains(l, "restarted") || !strings.Contains(l, "leases=1") {
		t.Fatalf("the log after a Restart that ended a lease: %q; want it said, with the count", l)
	}
	face := &replayFace{}
	if o := eng.Serve(t.Context(), keyed.Request{Key: "k", Fingerprint: fp}, face); o != keyed.OutcomeExecuted || face.runs != 1 {
		t.Fatalf("the retry after Restart: %s, ran %d; want the key taken over and run at once", o, face.runs)
	}

	// Nothing left to end: no record of it.
	before := log.String()
	if n, err := eng.Restart(t.Context()); n != 0 || err != nil {
		t.Fatalf("second Restart: %d, %v; want 0", n, err)
	}
	if strings.Contains(strings.TrimPrefix(log.String(), before), "restarted") {
		t.Fatalf("a Restart that ended nothing logged %q", strings.TrimPrefix(log.String(), before))
	}

	failing, err := keyed.New(&keyed.Config{Store: yieldFails{idemmem.NewStore(nil)}, Holder: idem.Holder{Replica: "api-0", Incarnation: "3"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := failing.Restart(t.Context()); err == nil || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("Restart on a failing store: %v; want the store's error", err)
	}
}

// The names of phases and refusals, as logs and metrics print them; a
// value outside the known ones prints as its number.
func TestPhaseAndReasonNames(t *testing.T) {
	t.Parallel()
	for p, want := range map[keyed.Phase]string{keyed.PhaseRequest: "request", keyed.PhaseReplay: "replay", keyed.PhaseReplay + 1: "Phase(5)"} {
		if got := p.String(); got != want {
			t.Errorf("Phase(%d).String() = %q; want %q", int(p), got, want)
		}
	}
	for r, want := range map[keyed.Reason]string{0: "Reason(0)", keyed.RefusedMismatch: "mismatch", keyed.RefusedUnreadable: "unreadable", keyed.RefusedUnreadable + 1: "Reason(11)"} {
		if got := r.String(); got != want {
			t.Errorf("Reason(%d).String() = %q; want %q", int(r), got, want)
		}
	}
}

// Observers skips nil observers, returns nil when none is left (an engine
// then observes nothing), the one observer itself when one is, and else
// calls each in turn.
func TestObserversJoinsTheNonNil(t *testing.T) {
	t.Parallel()
	if o := keyed.Observers(nil, nil); o != nil {
		t.Fatalf("Observers(nil, nil) = %v; want nil", o)
	}
	a, b := &opsAndEnds{}, &opsAndEnds{}
	if o := keyed.Observers(nil, a); o != keyed.Observer(a) {
		t.Fatalf("Observers(nil, a) = %v; want a itself", o)
	}
	eng, err := keyed.New(&keyed.Config{Store: idemmem.NewStore(nil), Observer: keyed.Observers(a, nil, b)})
	if err != nil {
		t.Fatal(err)
	}
	if !eng.Observed() {
		t.Fatal("an engine with two observers says it is not observed")
	}
	if o := serveObserved(t, eng, "k", payFP, &replayFace{}); o != keyed.OutcomeExecuted {
		t.Fatalf("request: %s", o)
	}
	for name, o := range map[string]*opsAndEnds{"a": a, "b": b} {
		if ev := o.end(t, keyed.PhaseRequest); ev.Outcome != keyed.OutcomeExecuted || len(o.ops) != 2 {
			t.Errorf("observer %s saw the request end %s and %d round trips; want executed, 2", name, ev.Outcome, len(o.ops))
		}
	}
	plain, err := keyed.New(&keyed.Config{Store: idemmem.NewStore(nil), Observer: keyed.Observers(nil)})
	if err != nil {
		t.Fatal(err)
	}
	if plain.Observed() {
		t.Fatal("an engine whose observers are all nil says it is observed")
	}
}

// txOnly is a store with CompleteTx: the handler may run in its
// transaction.
type txOnly struct{ *idemmem.Store }

func (txOnly) CompleteTx(context.Context, idem.Ref, idem.TxWork) (bool, error) {
	return false, errors.New("not used")
}

// txClaims is a store with ClaimTx too; serial, when set, says its writes
// run one at a time.
type txClaims struct {
	txOnly
	serial bool
}

func (txClaims) ClaimTx(context.Context, idem.ClaimRequest, time.Duration, idem.ClaimedWork) (idem.Claim, bool, error) {
	return idem.Claim{}, false, errors.New("not used")
}
func (s txClaims) WritesSerially() bool { return s.serial }

// The engine runs the handler inside the store's transaction where the
// store offers one (CompleteTx) and Config.SeparateTx does not say
// otherwise, and claims in it too where the store offers ClaimTx and its
// writes do not run one at a time (a serial writer would be held through
// the whole handler): InTx and ClaimsInTx, which the faces read to capture
// an answer whole, report that choice.
func TestEngineChoosesTheTransactionForm(t *testing.T) {
	t.Parallel()
	mem := idemmem.NewStore(nil)
	cases := []struct {
		name         string
		store        idem.Store
		separate     bool
		inTx, claims bool
	}{
		{"no transactions", mem, false, false, false},
		{"CompleteTx", txOnly{mem}, false, true, false},
		{"ClaimTx", txClaims{txOnly{mem}, false}, false, true, true},
		{"ClaimTx, serial writer", txClaims{txOnly{mem}, true}, false, true, false},
		{"ClaimTx, SeparateTx", txClaims{txOnly{mem}, false}, true, false, false},
	}
	for _, c := range cases {
		eng, err := keyed.New(&keyed.Config{Store: c.store, SeparateTx: c.separate})
		if err != nil {
			t.Fatal(err)
		}
		if eng.InTx() != c.inTx || eng.ClaimsInTx() != c.claims {
			t.Errorf("%s: InTx %v, ClaimsInTx %v; want %v, %v", c.name, eng.InTx(), eng.ClaimsInTx(), c.inTx, c.claims)
		}
	}
}

// deadlineAt is a caller's context whose deadline passes when passed is
// set, in the moment before its timer ends it: Err stays nil.
type deadlineAt struct {
	context.Context
	passed *atomic.Bool
}

func (c deadlineAt) Deadline() (time.Time, bool) {
	if c.passed.Load() {
		return time.Now().Add(-time.Millisecond), true
	}
	return time.Now().Add(time.Hour), true
}

// deadlineConn is a store whose client sets its connection's deadline
// from the context's, as go-redis and rueidis do: a claim whose context's
// deadline has passed fails with the connection's timeout. Its first
// claim answers as the store does and then lets the deadline pass.
type deadlineConn struct {
	*idemmem.Store
	passed *atomic.Bool
}

func (s deadlineConn) Claim(ctx context.Context, req idem.ClaimRequest) (idem.Claim, error) {
	if d, ok := ctx.Deadline(); ok && !time.Now().Before(d) {
		return idem.Claim{}, fmt.Errorf("read tcp 127.0.0.1:6379: %w", os.ErrDeadlineExceeded)
	}
	defer s.passed.Store(true)
	return s.Store.Claim(ctx, req)
}

// A duplicate whose claim fails because its caller's deadline passed is
// the caller leaving, not the store failing, even in the moment before
// the context says it ended: it is counted a conflict whose caller left,
// as when the context has ended, and not refused as the store being
// unavailable. A duplicate whose wait runs out with its caller's deadline
// claims once more at that deadline, and on Redis that claim failed so.
// A first claim failing so never learnt anything of the key: an
// unreachable store failing at every caller's deadline must show as the
// outage it is, counted a store error and logged, not hide among
// conflicts.
func TestClaimFailingAtTheCallersDeadline(t *testing.T) {
	t.Parallel()
	fp := idem.NewFingerprint("POST", "/pay", "", "", nil)
	for _, tc := range []struct {
		name    string
		held    bool
		outcome keyed.Outcome
		refused keyed.Reason
		logged  bool
	}{
		{"duplicate that saw the key in flight", true, keyed.OutcomeConflict, keyed.RefusedInFlight, false},
		{"first claim", false, keyed.OutcomeStoreError, keyed.RefusedStoreUnavailable, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			mem := idemmem.NewStore(nil)
			if tc.held {
				if c, err := mem.Claim(t.Context(), idem.ClaimRequest{Key: "k", Fingerprint: fp, Lease: time.Hour, TTL: time.Hour}); err != nil || c.Outcome != idem.Acquired {
					t.Fatalf("holding the key: %v, %v", c.Outcome, err)
				}
			}
			passed := new(atomic.Bool)
			if !tc.held {
				passed.Store(true)
			}
			var logs bytes.Buffer
			eng, err := keyed.New(&keyed.Config{Store: deadlineConn{mem, passed},
				Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))})
			if err != nil {
				t.Fatal(err)
			}
			face := &funcFace{run: func(context.Context) keyed.Ran {
				t.Error("the handler ran for a caller whose deadline had passed")
				return keyed.Ran{Status: 500}
			}}
			o := eng.Serve(deadlineAt{t.Context(), passed}, keyed.Request{Key: "k", Fingerprint: fp}, face)
			if o != tc.outcome || face.refused != tc.refused {
				t.Errorf("outcome %s, refused %q; want %s, %q", o, face.refused, tc.outcome, tc.refused)
			}
			if got := strings.Contains(logs.String(), "127.0.0.1:6379"); got != tc.logged {
				t.Errorf("the store's error logged %v, want %v; logs:\n%s", got, tc.logged, logs.String())
			}
		})
	}
}

// cancelAfterClaim is a store that ends its caller's context once a claim
// has answered, as a caller that goes away while its duplicate waits.
type cancelAfterClaim struct {
	*idemmem.Store
	cancel context.CancelFunc
}

func (s cancelAfterClaim) Claim(ctx context.Context, req idem.ClaimRequest) (idem.Claim, error) {
	defer s.cancel()
	return s.Store.Claim(ctx, req)
}

// A duplicate refused because the key stayed in flight through all of its
// wait (InflightWait) is logged at Info with when to retry, since it says
// that an execution runs longer than duplicates wait; a duplicate whose
// caller went away while it waited is refused the same way (nobody reads
// the answer) but not logged: a client giving up is not news about the
// key.
func TestDuplicateStillInFlightLoggedOnlyWhenItWaitedItOut(t *testing.T) {
	t.Parallel()
	fp := idem.NewFingerprint("POST", "/pay", "", "", nil)
	const logged = "duplicate still in flight after waiting"
	for _, tc := range []struct {
		name   string
		left   bool
		logged bool
	}{
		{"waited its InflightWait", false, true},
		{"caller left", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			mem := idemmem.NewStore(nil)
			if c, err := mem.Claim(t.Context(), idem.ClaimRequest{Key: "k", Fingerprint: fp, Lease: time.Hour, TTL: time.Hour}); err != nil || c.Outcome != idem.Acquired {
				t.Fatalf("holding the key: %v, %v", c.Outcome, err)
			}
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			var store idem.Store = mem
			if tc.left {
				store = cancelAfterClaim{mem, cancel}
			}
			var logs bytes.Buffer
			eng, err := keyed.New(&keyed.Config{Store: store, InflightWait: 50 * time.Millisecond,
				Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))})
			if err != nil {
				t.Fatal(err)
			}
			face := &funcFace{run: func(context.Context) keyed.Ran {
				t.Error("the handler ran for a duplicate of a key in flight")
				return keyed.Ran{Status: 500}
			}}
			o := eng.Serve(ctx, keyed.Request{Key: "k", Fingerprint: fp}, face)
			if o != keyed.OutcomeConflict || face.refused != keyed.RefusedInFlight {
				t.Errorf("outcome %s, refused %q; want %s, %q", o, face.refused, keyed.OutcomeConflict, keyed.RefusedInFlight)
			}
			if got := strings.Contains(logs.String(), logged); got != tc.logged {
				t.Errorf("%q logged %v, want %v; logs:\n%s", logged, got, tc.logged, logs.String())
			}
			if tc.logged && !strings.Contains(logs.String(), "retry_after=") {
				t.Errorf("%q logged without retry_after; logs:\n%s", logged, logs.String())
			}
		})
	}
}

// lostOnRelease is a store whose Release finds the lease lost, as when
// another took the key over while the handler ran.
type lostOnRelease struct{ *idemmem.Store }

func (lostOnRelease) Release(context.Context, idem.Ref) error { return idem.ErrLeaseLost }

// The record of a key given up after a transient failure says why: a
// handler that gave no answer (Ran.Failure: panicked, timed out) has its
// failure in the record, a handler that answered with a transient status
// has none; so for the key released, and for the release the store
// refused because the lease was lost meanwhile.
func TestReleaseRecordSaysTheHandlersFailure(t *testing.T) {
	t.Parallel()
	fp := idem.NewFingerprint("POST", "/pay", "", "", nil)
	for _, tc := range []struct {
		name string
		lost bool
		ran  keyed.Ran
		msg  string
	}{
		{"panicked, released", false, keyed.Ran{Status: 500, Failure: "panicked"}, "transient failure: key released so a retry runs again"},
		{"503, released", false, keyed.Ran{Status: 503}, "transient failure: key released so a retry runs again"},
		{"panicked, lease lost", true, keyed.Ran{Status: 500, Failure: "panicked"}, "release refused: the lease was lost while the handler ran"},
		{"503, lease lost", true, keyed.Ran{Status: 503}, "release refused: the lease was lost while the handler ran"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var store idem.Store = idemmem.NewStore(nil)
			if tc.lost {
				store = lostOnRelease{idemmem.NewStore(nil)}
			}
			var logs bytes.Buffer
			eng, err := keyed.New(&keyed.Config{Store: store,
				Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))})
			if err != nil {
				t.Fatal(err)
			}
			face := &funcFace{run: func(context.Context) keyed.Ran { return tc.ran }}
			eng.Serve(t.Context(), keyed.Request{Key: "k", Fingerprint: fp}, face)
			var rec string
			for _, l := range strings.Split(logs.String(), "\n") {
				if strings.Contains(l, tc.msg) {
					rec = l
				}
			}
			if rec == "" {
				t.Fatalf("no record %q; logs:\n%s", tc.msg, logs.String())
			}
			if want := fmt.Sprintf("status=%d", tc.ran.Status); !strings.Contains(rec, want) {
				t.Errorf("record %q without %s", rec, want)
			}
			if got, want := strings.Contains(rec, "failure="), tc.ran.Failure != ""; got != want {
				t.Errorf("record %q has a failure attribute: %v, want %v", rec, got, want)
			}
			if tc.ran.Failure != "" && !strings.Contains(rec, `failure=panicked`) {
				t.Errorf("record %q without failure=panicked", rec)
			}
		})
	}
}

// countedClaims is a store that counts its claims.
type countedClaims struct {
	*idemmem.Store
	n *atomic.Int64
}

func (s countedClaims) Claim(ctx context.Context, req idem.ClaimRequest) (idem.Claim, error) {
	s.n.Add(1)
	return s.Store.Claim(ctx, req)
}

// A duplicate waiting for a key in flight asks the store again soon at
// first (most executions end quickly), then less and less often, never
// less often than PollInterval: over half a second it claims a handful of
// times (10 ms doubled each round, at most 250 ms apart: about 7), not in
// a loop that keeps the store busy for as long as it waits.
func TestDuplicateWaitingBacksOff(t *testing.T) {
	t.Parallel()
	fp := idem.NewFingerprint("POST", "/pay", "", "", nil)
	mem := idemmem.NewStore(nil)
	if c, err := mem.Claim(t.Context(), idem.ClaimRequest{Key: "k", Fingerprint: fp, Lease: time.Hour, TTL: time.Hour}); err != nil || c.Outcome != idem.Acquired {
		t.Fatalf("holding the key: %v, %v", c.Outcome, err)
	}
	claims := new(atomic.Int64)
	eng, err := keyed.New(&keyed.Config{Store: countedClaims{mem, claims}, InflightWait: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	face := &funcFace{run: func(context.Context) keyed.Ran {
		t.Error("the handler ran for a duplicate of a key in flight")
		return keyed.Ran{Status: 500}
	}}
	if o := eng.Serve(t.Context(), keyed.Request{Key: "k", Fingerprint: fp}, face); o != keyed.OutcomeConflict || face.refused != keyed.RefusedInFlight {
		t.Fatalf("outcome %s, refused %q; want %s, %q", o, face.refused, keyed.OutcomeConflict, keyed.RefusedInFlight)
	}
	if n := claims.Load(); n < 2 || n > 15 {
		t.Errorf("a duplicate waiting 500ms claimed %d times; want a handful (about 7)", n)
	}
}

// The engine's records about a request name it by Request.Method and
// Request.Path, each when the face gives it: an HTTP request both, a gRPC
// one its full method name alone, a face that names none neither; so that
// no record carries an empty method or path.
func TestRecordsNameTheRequest(t *testing.T) {
	t.Parallel()
	fp := idem.NewFingerprint("POST", "/pay", "", "", nil)
	for _, tc := range []struct {
		method, path string
		has, hasNot  []string
	}{
		{"POST", "/pay", []string{"method=POST", "path=/pay"}, nil},
		{"/pay.Payments/Charge", "", []string{"method=/pay.Payments/Charge"}, []string{"path="}},
		{"", "", nil, []string{"method=", "path="}},
	} {
		var logs bytes.Buffer
		eng, err := keyed.New(&keyed.Config{Store: idemmem.NewStore(nil),
			Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))})
		if err != nil {
			t.Fatal(err)
		}
		face := &funcFace{run: func(context.Context) keyed.Ran { return keyed.Ran{Status: 503} }}
		eng.Serve(t.Context(), keyed.Request{Key: "k", Fingerprint: fp, Method: tc.method, Path: tc.path}, face)
		rec := logs.String()
		if !strings.Contains(rec, "key released so a retry runs again") {
			t.Fatalf("method %q, path %q: no record of the release; logs:\n%s", tc.method, tc.path, rec)
		}
		for _, s := range tc.has {
			if !strings.Contains(rec, s) {
				t.Errorf("method %q, path %q: record without %s: %s", tc.method, tc.path, s, rec)
			}
		}
		for _, s := range tc.hasNot {
			if strings.Contains(rec, s) {
				t.Errorf("method %q, path %q: record with %s: %s", tc.method, tc.path, s, rec)
			}
		}
	}
}
