package idemtest_test

import (
	"context"
	"errors"
	"os"
	"sync"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemtest"
)

func TestMemoryRecoverer(t *testing.T) {
	t.Parallel()
	idemtest.TestRecoverer(t, func(t *testing.T, clock idem.Clock) (idem.Recoverer, idemtest.TxRunner, idemtest.InboxEffects) {
		return idemmem.NewStore(&idemmem.Config{Clock: clock}), nil, nil
	})
}

// stagedDB gives idemmem's store the transactions the suite's phase
// subtests need: a transaction stages its writes and the recovery points
// saved in it, and applies them when it commits. It is the reference the
// broken recoverers below are derived from.
type stagedDB struct {
	*idemmem.Store
	mu      sync.Mutex
	written map[string]int
}

type stagedTx struct {
	writes []string
	points []func() error
}

type stagedTxKey struct{}

func newStagedDB(clock idem.Clock) *stagedDB {
	return &stagedDB{Store: idemmem.NewStore(&idemmem.Config{Clock: clock}), written: map[string]int{}}
}

func (db *stagedDB) WithTx(ctx context.Context, fn func(ctx context.Context) error) error {
	if _, ok := ctx.Value(stagedTxKey{}).(*stagedTx); ok {
		return fn(ctx)
	}
	tx := &stagedTx{}
	if err := fn(context.WithValue(ctx, stagedTxKey{}, tx)); err != nil {
		return err
	}
	for _, p := range tx.points {
		if err := p(); err != nil {
			return err
		}
	}
	db.mu.Lock()
	defer db.mu.Unlock()
	for _, w := range tx.writes {
		db.written[w]++
	}
	return nil
}

func (db *stagedDB) Write(ctx context.Context, tag string) error {
	tx, ok := ctx.Value(stagedTxKey{}).(*stagedTx)
	if !ok {
		return errors.New("no transaction")
	}
	tx.writes = append(tx.writes, tag)
	return nil
}

func (db *stagedDB) Count(_ context.Context, tag string) (int, error) {
	db.mu.Lock()
	defer db.mu.Unlock()
	return db.written[tag], nil
}

// SaveRecovery checks the lease now and saves the point when the
// transaction ctx carries commits (a real database holds the row's lock
// meanwhile; the suite's phases do not race).
func (db *stagedDB) SaveRecovery(ctx context.Context, ref idem.Ref, rp idem.RecoveryPoint) error {
	tx, ok := ctx.Value(stagedTxKey{}).(*stagedTx)
	if !ok {
		return db.Store.SaveRecovery(ctx, ref, rp)
	}
	if err := rp.Validate(); err != nil {
		return err
	}
	rec, err := db.Get(ctx, ref.Scope, ref.Key)
	if err != nil || rec.Token != ref.Token || rec.State != idem.StateInFlight {
		return idem.ErrLeaseLost
	}
	tx.points = append(tx.points, func() error { return db.Store.SaveRecovery(context.WithoutCancel(ctx), ref, rp) })
	return nil
}

func TestStagedRecoverer(t *testing.T) {
	t.Parallel()
	idemtest.TestRecoverer(t, func(t *testing.T, clock idem.Clock) (idem.Recoverer, idemtest.TxRunner, idemtest.InboxEffects) {
		db := newStagedDB(clock)
		return db, db, db
	})
}

// Broken recoverers, each wrong in one way the suite must catch, and the
// subtest that must catch it.
var brokenRecoverers = map[string]struct {
	wantFail string
	store    func(*stagedDB) idem.Recoverer
}{
	"none":                        {"", func(db *stagedDB) idem.Recoverer { return db }},
	"clears point on takeover":    {"SurvivesTakeover", func(db *stagedDB) idem.Recoverer { return clearsOnTakeover{db} }},
	"saves outside the phase":     {"RollsBackWithPhase", func(db *stagedDB) idem.Recoverer { return savesOutsideTx{db} }},
	"lists live keys":             {"Abandoned", func(db *stagedDB) idem.Recoverer { return listsLive{db} }},
	"ignores fencing":             {"RefusedWithoutLease", func(db *stagedDB) idem.Recoverer { return saveIgnoresFencing{db} }},
	"yield releases":              {"Yield", func(db *stagedDB) idem.Recoverer { return yieldReleases{db} }},
	"releases a key with a point": {"ReleaseRefusedWithPoint", func(db *stagedDB) idem.Recoverer { return releasesWithPoint{db} }},
}

type clearsOnTakeover struct{ *stagedDB }

func (s clearsOnTakeover) Claim(ctx context.Context, req idem.ClaimRequest) (idem.Claim, error) {
	c, err := s.stagedDB.Claim(ctx, req)
	if c.TookOver {
		c.Record.Recovery = idem.RecoveryPoint{}
	}
	return c, err
}

type savesOutsideTx struct{ *stagedDB }

func (s savesOutsideTx) SaveRecovery(ctx context.Context, ref idem.Ref, rp idem.RecoveryPoint) error {
	return s.Store.SaveRecovery(ctx, ref, rp)
}

type listsLive struct{ *stagedDB }

// Abandoned lists every key in flight with a point, its lease ended or not.
func (s listsLive) Abandoned(ctx context.Context, limit int) ([]idem.Record, error) {
	var out []idem.Record
	for _, k := range []idem.Key{"first", "second", "live", "k0", "k1", "k2", "k3", "k4"} {
		rec, err := s.Get(ctx, "s", k)
		if err == nil && rec.State == idem.StateInFlight && !rec.Recovery.IsZero() && len(out) < limit {
			out = append(out, rec)
		}
	}
	if limit <= 0 {
		return s.stagedDB.Abandoned(ctx, limit)
	}
	return out, nil
}

type saveIgnoresFencing struct{ *stagedDB }

// SaveRecovery saves under whatever token holds the key.
func (s saveIgnoresFencing) SaveRecovery(ctx context.Context, ref idem.Ref, rp idem.RecoveryPoint) error {
	if rec, err := s.Get(ctx, ref.Scope, ref.Key); err == nil && rec.State == idem.StateInFlight {
		ref.Token = rec.Token
	}
	return s.stagedDB.SaveRecovery(ctx, ref, rp)
}

type yieldReleases struct{ *stagedDB }

// Yield gives the key up, point and all.
func (s yieldReleases) Yield(ctx context.Context, ref idem.Ref) error {
	return s.ReleaseWithPoint(ctx, ref)
}

type releasesWithPoint struct{ *stagedDB }

// Release gives the key up, whatever point it has.
func (s releasesWithPoint) Release(ctx context.Context, ref idem.Ref) error {
	return s.ReleaseWithPoint(ctx, ref)
}

const brokenRecovererEnv = "IDEMTEST_BROKEN_RECOVERER"

// TestBrokenRecoverer runs the suite on the broken recoverer named by
// IDEMTEST_BROKEN_RECOVERER, in a child process of
// TestRecovererSuiteCatchesBrokenStores.
func TestBrokenRecoverer(t *testing.T) {
	name := os.Getenv(brokenRecovererEnv)
	if name == "" {
		t.Skip("run by TestRecovererSuiteCatchesBrokenStores")
	}
	b, ok := brokenRecoverers[name]
	if !ok {
		t.Fatalf("no broken recoverer %q", name)
	}
	idemtest.TestRecoverer(t, func(t *testing.T, clock idem.Clock) (idem.Recoverer, idemtest.TxRunner, idemtest.InboxEffects) {
		db := newStagedDB(clock)
		return b.store(db), db, db
	})
}

func TestRecovererSuiteCatchesBrokenStores(t *testing.T) {
	t.Parallel()
	wantFail := map[string]string{}
	for name, b := range brokenRecoverers {
		wantFail[name] = b.wantFail
	}
	catchesBroken(t, brokenRecovererEnv, "TestBrokenRecoverer", wantFail)
}
