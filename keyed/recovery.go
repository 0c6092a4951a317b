package keyed

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/idem-go/idem"
)

// ErrNoRecovery is returned by SaveRecovery when the execution cannot keep
// recovery points: the context belongs to no execution, the store is no
// idem.Recoverer, or the handler runs inside the store's transaction (the
// same-transaction forms), where a point would roll back with everything
// else on a failure and so say nothing. Phases need the claim-first form:
// Config.SeparateTx.
var ErrNoRecovery = errors.New("keyed: this execution cannot save recovery points")

// pointSaver is an execution's access to recovery points.
type pointSaver struct {
	store idem.Recoverer
	// inTx: the handler runs in the store's transaction (see ErrNoRecovery).
	inTx bool
	// bodies seal the points' data (nil: kept in the envelope alone).
	bodies *bodySealer
	// saved is set once the execution tried to save a point: from then on
	// its key is never released after a failure.
	saved atomic.Bool
}

// SaveRecovery records that the execution ctx belongs to reached the
// phase name, with data what the next phases need, in the key's record.
// Called with a context that carries a transaction of the store's database
// (the backend's WithTx), the point commits or rolls back with that
// transaction's writes: save each phase's point with the phase's own
// writes. Otherwise it commits at once; save it so before a call that
// leaves the database (a charge at a card network), with what a retry
// needs to make the same call again.
//
// Once an execution saved a point, its key is never released after a
// failure: whatever the phases did past the database's edge may have
// happened. The key stays in flight with its point and the execution
// yields its lease (idem.Recoverer.Yield), so the client's retry takes it
// over at once and goes on from the point (Execution.Recovery), or, with
// nobody asking, a Completer does. An execution that dies (a crash) holds
// its lease until it ends.
//
// The store keeps data with the seed of the request's downstream keys,
// sealed like kept answers when Config.BodyKeys are set (AES-256-GCM,
// bound to the record's scope and key and to name): a dump of the store
// shows the point's name, never its data. data may be up to
// MaxRecoveryDataLen bytes.
//
// Returns ErrNoRecovery (see there), an *idem.ArgumentError for a malformed
// point, or idem.ErrLeaseLost when another execution took the key over.
func SaveRecovery(ctx context.Context, name string, data []byte) error {
	ex, ok := ExecutionFromContext(ctx)
	switch {
	case !ok:
		return fmt.Errorf("%w: the context belongs to no execution of a key", ErrNoRecovery)
	case ex.points == nil:
		return fmt.Errorf("%w: the store keeps no recovery points (it is no idem.Recoverer)", ErrNoRecovery)
	case ex.points.inTx:
		return fmt.Errorf("%w: the handler runs inside the store's transaction; set Config.SeparateTx", ErrNoRecovery)
	}
	rp := idem.RecoveryPoint{Name: name, Data: data}
	if err := rp.Validate(); err != nil {
		return err
	}
	seed := ex.seed
	if !ex.hasSeed {
		seed = downstreamSeed(ex.Scope, ex.Key)
	}
	rp, err := wrapPoint(ex.points.bodies, ex.Scope, ex.Key, seed, rp)
	if err != nil {
		return err
	}
	// Set before saving: a save whose outcome is unknown may have
	// committed.
	ex.points.saved.Store(true)
	return ex.points.store.SaveRecovery(ctx, idem.Ref{Scope: ex.Scope, Key: ex.Key, Token: ex.Token}, rp)
}

// hasRecovery reports whether ex's key carries a recovery point, saved
// by this execution or an earlier one.
func (ex *Execution) hasRecovery() bool {
	return !ex.Recovery.IsZero() || (ex.points != nil && ex.points.saved.Load())
}
