package keyed

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/keywait"
)

// Engine runs requests under their idempotency keys: it claims a request's
// key, runs its handler at most once, keeps its answer and replays it to
// every duplicate. A face (idemhttp, idemgrpc, one of your own) reads the
// key from its request and speaks the engine's answers in its protocol's
// words; the engine makes every decision about the key. Create it with New;
// it is safe for concurrent use, and one Engine serves every request of a
// face.
type Engine struct {
	cfg     Config
	store   idem.Store
	txStore idem.TxStore
	// txClaimer is txStore when it claims keys in its transaction too.
	txClaimer idem.TxClaimer
	// replayer is the store when it reads replays narrowly.
	replayer idem.Replayer
	// recoverer is the store when it keeps recovery points.
	recoverer idem.Recoverer
	waiter    idem.Waiter
	log       *slog.Logger
	local     keywait.Local
	gates     keywait.Gates
	// recent are the keys seen completed lately (nil: none are kept).
	recent *keywait.Recent
	// bodies seals kept bodies (nil: they are kept as they are).
	bodies *bodySealer
	// keys seals keys (nil: they are kept as they are).
	keys   *keySealer
	counts []atomic.Uint64 // one per Outcomes
	// obs is Config.Observer; storeName the store's type, for it.
	obs       Observer
	storeName string
	// hb renews the leases of the executions running here.
	hb heartbeat
	// serialTx says the handler runs in the transaction of a store that
	// writes serially (CompleteTx on idemsqlite): from its first write it
	// holds the only writer, which its renewals wait for, as would
	// another's takeover.
	serialTx bool
}

// New applies the defaults to cfg, validates it and returns an Engine.
func New(cfg *Config) (*Engine, error) {
	c, err := withDefaults(cfg)
	if err != nil {
		return nil, err
	}
	bodies, err := newBodySealer(c.BodyKeys)
	if err != nil {
		return nil, &idem.ArgumentError{Field: "keyed.Config.BodyKeys", Reason: err.Error()}
	}
	e := &Engine{cfg: c, store: c.Store, log: c.Logger, bodies: bodies, keys: newKeySealer(c.KeySecret),
		recent: keywait.NewRecent(c.RecentKeys, c.MemoryReplayFor, c.MemoryReplayBytes, c.Clock),
		counts: make([]atomic.Uint64, len(Outcomes)), obs: c.Observer, storeName: fmt.Sprintf("%T", c.Store)}
	e.replayer, _ = c.Store.(idem.Replayer)
	e.recoverer, _ = c.Store.(idem.Recoverer)
	e.waiter, _ = c.Store.(idem.Waiter)
	e.chooseForm()
	e.hb.init(e)
	return e, nil
}

// chooseForm decides, once, how the engine claims a key and runs its
// handler, from what the store offers (see Config.Store):
//   - the separate form: Claim, run the handler, then Complete or Release;
//   - CompleteTx: Claim, then run the handler inside the store's
//     transaction, which keeps the answer as it commits;
//   - ClaimTx: claim the key inside the transaction the handler then runs
//     in, so that the claim, the handler's writes and the answer commit
//     together, and a duplicate in this process waits at the key's gate.
//
// A store whose writes run one at a time (idem.SerialWriter: SQLite) gets
// the CompleteTx form even when it offers ClaimTx: ClaimTx's transaction,
// begun at the claim, would hold the only writer through everything the
// handler does before it writes, and every other request would wait that
// long; CompleteTx's begins at the handler's first write.
func (e *Engine) chooseForm() {
	ts, ok := e.store.(idem.TxStore)
	if !ok || e.cfg.SeparateTx {
		return
	}
	e.txStore = ts
	if sw, ok := ts.(idem.SerialWriter); ok && sw.WritesSerially() {
		e.serialTx = true
		return
	}
	e.txClaimer, _ = ts.(idem.TxClaimer)
}

// Config returns the engine's configuration, its defaults applied. Its
// slices are the engine's own: do not change them.
func (e *Engine) Config() Config { return e.cfg }

// InTx reports whether the handler runs inside the store's transaction
// (the same-transaction forms; see Config.Store).
func (e *Engine) InTx() bool { return e.txStore != nil }

// ClaimsInTx reports whether the key is claimed inside that transaction
// too (idem.TxClaimer's ClaimTx).
func (e *Engine) ClaimsInTx() bool { return e.txClaimer != nil }

// Counts returns how many requests ended in each Outcome.
func (e *Engine) Counts() map[Outcome]uint64 {
	out := make(map[Outcome]uint64, len(Outcomes))
	for i, o := range Outcomes {
		out[o] = e.counts[i].Load()
	}
	return out
}

func (e *Engine) count(o Outcome) {
	for i, x := range Outcomes {
		if x == o {
			e.counts[i].Add(1)
			return
		}
	}
}

// Reject counts a request the face refused before it reached the engine
// (OutcomeRejected): no key, a malformed one, a body too large to
// fingerprint. ctx is the one Begin returned; scope and key are the
// request's, when the face read them before it refused (empty otherwise),
// for the Observer.
func (e *Engine) Reject(ctx context.Context, scope idem.Scope, key idem.Key) {
	if key != "" && e.obs != nil {
		e.noteKey(ctx, scope, e.seal(scope, key))
	}
	e.tally(ctx, OutcomeRejected)
}

// seal is key as the store keeps it.
func (e *Engine) seal(scope idem.Scope, key idem.Key) idem.Key {
	if e.keys == nil {
		return key
	}
	return e.keys.seal(scope, key)
}

// SealKey returns key as the engine's store keeps it: sealed with
// Config.KeySecret, or as it is without one.
func (e *Engine) SealKey(scope idem.Scope, key idem.Key) idem.Key { return e.seal(scope, key) }

// Restart ends at once the leases that earlier incarnations of this
// replica (Config.Holder's Replica under another Incarnation) held when
// they died, on a store that keeps holders (idem.Restarter): a process
// that starts again knows its earlier run is dead, so its keys need not
// wait out their leases. A client's retry then takes such a key over at
// once, and a Completer started afterwards lists those with a recovery
// point in its first round and resumes them. Call it once as the process
// starts, before its Completer. It never ends another replica's leases.
//
// It returns how many leases it ended; 0 and no error without a Holder or
// with a store that keeps none.
func (e *Engine) Restart(ctx context.Context) (int, error) {
	rs, ok := e.store.(idem.Restarter)
	if !ok || e.cfg.Holder.IsZero() {
		return 0, nil
	}
	n, err := rs.YieldEarlier(ctx, e.cfg.Holder)
	if err != nil {
		return n, fmt.Errorf("keyed: ending an earlier incarnation's leases: %w", err)
	}
	if n > 0 {
		e.log.LogAttrs(ctx, slog.LevelWarn, "restarted: ended the leases an earlier incarnation of this replica held",
			slog.String("replica", e.cfg.Holder.Replica), slog.Int("leases", n))
	}
	return n, nil
}
