package keyed

import (
	"context"
	"errors"
	"fmt"

	"github.com/idem-go/idem"
)

// Completers acts on a key stopped at a recovery point through the
// Completer of the face that stopped it: the one whose
// CompleterConfig.Points names the key's point. Two faces on one store
// (idemhttp's and idemgrpc's) each keep answers in their own form, which
// only their own replays read, so an operator's action must be taken by
// the face's own Completer: an answer settled by idemhttp's under a key
// idemgrpc stopped could never be replayed to the gRPC client. Completers
// lets one console (or command) act on every face's keys, each by its own
// Completer: their resumes run the face's Resume, and their settles keep
// the operator's answer in the face's form (CompleterConfig.SettleAnswer).
//
// The Completers must share one store. A key that is not stopped at a
// point (unknown, completed, released) is refused by the first, as it
// would refuse it; a key stopped at a point none of them names is refused
// with ErrOtherPoint, changing nothing. Its methods are those of
// console.KeyActions.
type Completers []*Completer

// of returns the Completer that acts on scope/key: the one naming its
// point, or the first when the key is not stopped at a point (it refuses
// it as it should).
//
// The chosen Completer reads the key again, and that second read is left
// on purpose: it must come after the Completer waited for its own resume
// of the key under way (beginWait), so that it acts on the key as that
// resume left it, whereas this read, which only picks the Completer, comes
// before. Handing it this record would act on a key read while its own
// round still held it: a dry run would call being finished a key the
// round leaves unknown and held, which it may resume. Reading once after
// the wait would need the wait before the Completer is known, that is
// every Completer's mark on the key held while one acts, keeping the
// others' rounds off it for as long; a second Get is cheaper than that.
// A point that changes between the two reads is safe: the Completer
// checks its own point again (ErrOtherPoint), changing nothing.
func (cs Completers) of(ctx context.Context, scope idem.Scope, key idem.Key) (*Completer, error) {
	if len(cs) == 0 {
		return nil, &idem.ArgumentError{Field: "keyed.Completers", Reason: "is empty"}
	}
	rec, err := cs[0].rs.Get(ctx, scope, key)
	if err != nil || rec.State != idem.StateInFlight || rec.Recovery.IsZero() {
		return cs[0], nil
	}
	for _, c := range cs {
		if c.takes(rec.Recovery.Name) {
			return c, nil
		}
	}
	points := []string{}
	for _, c := range cs {
		points = append(points, c.cfg.Points...)
	}
	return nil, fmt.Errorf("%w: it stopped at %q; these completers resume %q", ErrOtherPoint, rec.Recovery.Name, points)
}

// ResumeKey is Completer.ResumeKey, by the Completer of the key's face.
func (cs Completers) ResumeKey(ctx context.Context, scope idem.Scope, key idem.Key, dryRun bool) (bool, error) {
	c, err := cs.of(ctx, scope, key)
	if err != nil {
		return false, err
	}
	return c.ResumeKey(ctx, scope, key, dryRun)
}

// Settle is Completer.Settle, by the Completer of the key's face, which
// keeps answer in its face's form.
func (cs Completers) Settle(ctx context.Context, scope idem.Scope, key idem.Key, answer idem.Response, dryRun bool) (idem.Record, error) {
	c, err := cs.of(ctx, scope, key)
	if err != nil {
		return idem.Record{}, err
	}
	return c.Settle(ctx, scope, key, answer, dryRun)
}

// ResumeRecorded is Completer.ResumeRecorded, by the Completer of the
// key's face, which runs that face's Resume.
func (cs Completers) ResumeRecorded(ctx context.Context, scope idem.Scope, key idem.Key, record ResumeRecord) (bool, error) {
	c, err := cs.of(ctx, scope, key)
	if err != nil {
		return false, err
	}
	return c.ResumeRecorded(ctx, scope, key, record)
}

// SettleRecorded is Completer.SettleRecorded, by the Completer of the
// key's face.
func (cs Completers) SettleRecorded(ctx context.Context, scope idem.Scope, key idem.Key, answer idem.Response, record SettleRecord) (idem.Record, error) {
	c, err := cs.of(ctx, scope, key)
	if err != nil {
		return idem.Record{}, err
	}
	return c.SettleRecorded(ctx, scope, key, answer, record)
}

// Failures returns the failed resumes of scope/key that one of the
// Completers saw (only the Completer of its face resumes it).
func (cs Completers) Failures(scope idem.Scope, key idem.Key) ResumeFailures {
	for _, c := range cs {
		if f := c.Failures(scope, key); f.Count > 0 || f.Holding {
			return f
		}
	}
	return ResumeFailures{}
}

// UnknownKeys returns every Completer's UnknownKeys.
func (cs Completers) UnknownKeys() []idem.Ref {
	var out []idem.Ref
	for _, c := range cs {
		out = append(out, c.UnknownKeys()...)
	}
	return out
}

// LetGo is Completer.LetGo on every Completer (only the one that resumed
// the key last holds it, though another may still think it holds an
// earlier lease), and returns their errors joined: one that fails does not
// keep the others from giving their leases back.
func (cs Completers) LetGo(ctx context.Context, scope idem.Scope, key idem.Key) error {
	var errs []error
	for _, c := range cs {
		errs = append(errs, c.LetGo(ctx, scope, key))
	}
	return errors.Join(errs...)
}
