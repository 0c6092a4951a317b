package idemtest_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemtest"
)

// txMem adds a CompleteTx to the reference store, so the suite's TxStore
// group runs here too. It is not transactional (there is no database), which
// the suite cannot see and does not need to.
type txMem struct {
	*idemmem.Store
	clock idem.Clock
}

func (s txMem) CompleteTx(ctx context.Context, ref idem.Ref, work idem.TxWork) (bool, error) {
	resp, keep, err := work(ctx)
	if err != nil || !keep {
		return false, err
	}
	if err := s.Complete(ctx, ref, resp); err != nil {
		return false, err
	}
	return true, nil
}

// Replay answers from Get, so the suite's Replayer group runs here too.
func (s txMem) Replay(ctx context.Context, scope idem.Scope, key idem.Key, fp idem.Fingerprint) (*idem.Response, bool, error) {
	rec, err := s.Get(ctx, scope, key)
	switch {
	case errors.Is(err, idem.ErrNotFound):
		return nil, false, nil
	case err != nil:
		return nil, false, err
	case rec.State != idem.StateCompleted:
		return nil, false, nil
	case rec.Fingerprint != fp:
		return nil, true, nil
	}
	return rec.Response, false, nil
}

func newReference(clock idem.Clock) txMem {
	return txMem{idemmem.NewStore(&idemmem.Config{Clock: clock}), clock}
}

func TestStoreOnReference(t *testing.T) {
	t.Parallel()
	idemtest.TestStore(t, func(t *testing.T, clock idem.Clock) idem.Store {
		return newReference(clock)
	})
}

// Broken stores, each wrong in one way the suite must catch, and the
// subtest that must catch it.
var brokenStores = map[string]struct {
	wantFail string
	store    func(txMem) idem.Store
}{
	"none":                     {"", func(s txMem) idem.Store { return s }},
	"complete ignores fencing": {"StaleHolder", func(s txMem) idem.Store { return completeIgnoresFencing{s} }},
	"drops headers":            {"Replay", func(s txMem) idem.Store { return dropsHeaders{s} }},
	"purge ignores limit":      {"Purge", func(s txMem) idem.Store { return purgeIgnoresLimit{s} }},
	"release absent fails":     {"ReleaseAbsent", func(s txMem) idem.Store { return releaseAbsentFails{s} }},
	"ignores cancellation":     {"CancelledContext", func(s txMem) idem.Store { return ignoresCancellation{s} }},
	"accepts empty key":        {"InvalidClaim", func(s txMem) idem.Store { return acceptsEmptyKey{s} }},
	"claim always acquires":    {"ConcurrentClaimOneKey", func(s txMem) idem.Store { return claimAlwaysAcquires{s} }},
	// The same store, as the linearizability check sees it.
	"claim always acquires, checked for linearizability": {"Linearizable", func(s txMem) idem.Store { return claimAlwaysAcquires{s} }},
	"no takeover flag":                             {"LeaseTakeover", func(s txMem) idem.Store { return noTakeoverFlag{s} }},
	"tx keeps on error":                            {"TxStore/WorkError", func(s txMem) idem.Store { return txKeepsOnError{s} }},
	"replay ignores fingerprint":                   {"Replayer", func(s txMem) idem.Store { return replayIgnoresFingerprint{s} }},
	"replays keys in flight":                       {"Replayer", func(s txMem) idem.Store { return replaysInFlight{s} }},
	"renew ignores fencing":                        {"RenewRefused", func(s txMem) idem.Store { return renewIgnoresFencing{s} }},
	"renew keeps nothing":                          {"Renew", func(s txMem) idem.Store { return renewKeepsNothing{s, s.clock} }},
	"yield earlier ends the current incarnation's": {"Restarter/YieldEarlier", func(s txMem) idem.Store { return yieldsEveryIncarnation{s} }},
	"lease clock not the one given":                {"LocalClock", func(s txMem) idem.Store { return otherLeaseClock{s} }},
}

// otherLeaseClock says its leases run on the system's clock, not on the
// one it was given (and decides them by).
type otherLeaseClock struct{ txMem }

func (otherLeaseClock) LeaseClock() idem.Clock { return idem.SystemClock{} }

type completeIgnoresFencing struct{ txMem }

func (s completeIgnoresFencing) Complete(ctx context.Context, ref idem.Ref, resp idem.Response) error {
	if err := s.txMem.Complete(ctx, ref, resp); !errors.Is(err, idem.ErrLeaseLost) {
		return err
	}
	return nil
}

type dropsHeaders struct{ txMem }

func (s dropsHeaders) Complete(ctx context.Context, ref idem.Ref, resp idem.Response) error {
	resp.Header = nil
	return s.txMem.Complete(ctx, ref, resp)
}

type purgeIgnoresLimit struct{ txMem }

func (s purgeIgnoresLimit) Purge(ctx context.Context, limit int) (int, error) {
	return s.txMem.Purge(ctx, 1<<30)
}

type releaseAbsentFails struct{ txMem }

func (s releaseAbsentFails) Release(ctx context.Context, ref idem.Ref) error {
	if _, err := s.Get(ctx, ref.Scope, ref.Key); err != nil {
		return err
	}
	return s.txMem.Release(ctx, ref)
}

type ignoresCancellation struct{ txMem }

func (s ignoresCancellation) Claim(ctx context.Context, req idem.ClaimRequest) (idem.Claim, error) {
	return s.txMem.Claim(context.WithoutCancel(ctx), req)
}

type acceptsEmptyKey struct{ txMem }

func (s acceptsEmptyKey) Claim(ctx context.Context, req idem.ClaimRequest) (idem.Claim, error) {
	if req.Key == "" {
		req.Key = "(empty)"
	}
	return s.txMem.Claim(ctx, req)
}

type claimAlwaysAcquires struct{ txMem }

func (s claimAlwaysAcquires) Claim(ctx context.Context, req idem.ClaimRequest) (idem.Claim, error) {
	c, err := s.txMem.Claim(ctx, req)
	if err == nil && c.Outcome == idem.InFlight {
		c.Outcome, c.Token = idem.Acquired, c.Record.Token
	}
	return c, err
}

type noTakeoverFlag struct{ txMem }

func (s noTakeoverFlag) Claim(ctx context.Context, req idem.ClaimRequest) (idem.Claim, error) {
	c, err := s.txMem.Claim(ctx, req)
	c.TookOver = false
	return c, err
}

type txKeepsOnError struct{ txMem }

func (s txKeepsOnError) CompleteTx(ctx context.Context, ref idem.Ref, work idem.TxWork) (bool, error) {
	return s.txMem.CompleteTx(ctx, ref, func(ctx context.Context) (idem.Response, bool, error) {
		resp, _, _ := work(ctx)
		return resp, true, nil
	})
}

const brokenEnv = "IDEMTEST_BROKEN_STORE"

// TestBrokenStore runs the suite on the broken store named by
// IDEMTEST_BROKEN_STORE. TestSuiteCatchesBrokenStores runs it in a child
// process, because a failing suite fails the test that runs it.
func TestBrokenStore(t *testing.T) {
	name := os.Getenv(brokenEnv)
	if name == "" {
		t.Skip("run by TestSuiteCatchesBrokenStores")
	}
	b, ok := brokenStores[name]
	if !ok {
		t.Fatalf("no broken store %q", name)
	}
	idemtest.TestStore(t, func(t *testing.T, clock idem.Clock) idem.Store {
		return b.store(newReference(clock))
	})
}

func TestSuiteCatchesBrokenStores(t *testing.T) {
	t.Parallel()
	wantFail := map[string]string{}
	for name, b := range brokenStores {
		wantFail[name] = b.wantFail
	}
	catchesBroken(t, brokenEnv, "TestBrokenStore", wantFail)
}

// catchesBroken runs testName in a child process once per broken store of
// wantFail, named by the environment variable env, and checks that the
// suite fails it in the subtest named there ("" for the reference store,
// which must pass).
func catchesBroken(t *testing.T, env, testName string, wantFail map[string]string) {
	if os.Getenv(env) != "" {
		t.Skip("inside a child process")
	}
	for name, subtest := range wantFail {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cmd := exec.CommandContext(t.Context(), os.Args[0],
				"-test.run=^"+testName+"$", "-test.v", "-test.count=1", "-test.timeout=2m")
			// TMPDIR: what a failing check saves for a person to read is
			// this test's to clean up.
			cmd.Env = append(os.Environ(), env+"="+name, "TMPDIR="+t.TempDir())
			out, err := cmd.CombinedOutput()
			if subtest == "" {
				if err != nil {
					t.Fatalf("the suite failed the reference store: %v\n%s", err, out)
				}
				return
			}
			if err == nil {
				t.Fatalf("the suite passed a store whose %s\n%s", name, out)
			}
			if want := "--- FAIL: " + testName + "/" + subtest + " "; !strings.Contains(string(out), want) {
				t.Errorf("subtest %s did not fail; output:\n%s", subtest, out)
			}
		})
	}
}

type replayIgnoresFingerprint struct{ txMem }

func (s replayIgnoresFingerprint) Replay(ctx context.Context, scope idem.Scope, key idem.Key, _ idem.Fingerprint) (*idem.Response, bool, error) {
	rec, err := s.Get(ctx, scope, key)
	if err != nil || rec.State != idem.StateCompleted {
		return nil, false, nil
	}
	return rec.Response, false, nil
}

type replaysInFlight struct{ txMem }

func (s replaysInFlight) Replay(ctx context.Context, scope idem.Scope, key idem.Key, fp idem.Fingerprint) (*idem.Response, bool, error) {
	rec, err := s.Get(ctx, scope, key)
	switch {
	case err != nil:
		return nil, false, nil
	case rec.Response == nil:
		return &idem.Response{}, false, nil
	}
	return s.txMem.Replay(ctx, scope, key, fp)
}

type renewIgnoresFencing struct{ txMem }

// Renew renews whatever token holds the key.
func (s renewIgnoresFencing) Renew(ctx context.Context, ref idem.Ref, lease time.Duration) (time.Time, error) {
	if rec, err := s.Get(ctx, ref.Scope, ref.Key); err == nil && rec.State == idem.StateInFlight {
		ref.Token = rec.Token
	}
	return s.txMem.Renew(ctx, ref, lease)
}

type renewKeepsNothing struct {
	txMem
	clock idem.Clock
}

// Renew answers as if it renewed, and changes nothing.
func (s renewKeepsNothing) Renew(ctx context.Context, ref idem.Ref, lease time.Duration) (time.Time, error) {
	return s.clock.Now().Add(lease), nil
}

type yieldsEveryIncarnation struct{ txMem }

// YieldEarlier ends the leases of every incarnation of the replica, the
// current one's too.
func (s yieldsEveryIncarnation) YieldEarlier(ctx context.Context, current idem.Holder) (int, error) {
	current.Incarnation = "none of them"
	return s.txMem.YieldEarlier(ctx, current)
}
