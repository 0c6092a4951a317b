package keyed

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/keywait"
)

// What an operator's action on one key (Completer.ResumeKey,
// Completer.Settle) is refused with, having changed nothing.
var (
	// ErrNotStopped: the key is not in flight at a recovery point: it is
	// unknown (never used, or expired), completed, released, or in flight
	// without a point. Refusals for an unknown key match idem.ErrNotFound
	// too.
	ErrNotStopped = errors.New("keyed: the key is not in flight at a recovery point")
	// ErrBeingFinished: an execution holds the key under a live lease (a
	// completer's resume, a client's retry): it is being finished now.
	ErrBeingFinished = errors.New("keyed: the key is held by a live execution that is finishing it")
	// ErrOtherPoint: the key stopped at a recovery point outside
	// CompleterConfig.Points: another face's, whose Completer finishes it
	// and keeps its answer in that face's form (an answer kept in this
	// face's form could not be read by the other face's retries).
	ErrOtherPoint = errors.New("keyed: the key stopped at a recovery point this completer does not resume (another face's)")
	// ErrNotRecorded: the record of SettleRecorded or ResumeRecorded
	// failed, so the key was not settled, nor completed or released by the
	// resume: it is left in flight at its point, its lease ended, as it
	// was. When ending the lease fails too (the error then says so), the
	// Completer holds the key under it (ResumeFailures.Holding) and LetGo
	// gives it back.
	ErrNotRecorded = errors.New("keyed: the action could not be recorded, so it was not taken: the key is left as it was")
	// ErrResultUnknown: a resume's last write to the store, keeping its
	// answer or releasing the key, failed without the store's answer (a
	// connection lost at the commit, a timeout), so the key may have been
	// finished all the same: read it again to learn what it holds. An audit
	// history must not call such a resume failed. The Completer holds the
	// key under the resume's lease, as after a failed resume
	// (ResumeFailures.Holding), and LetGo gives it back: a Yield under the
	// resume's token, refused, changing nothing, if the key was finished.
	// ErrHeldAnew: LetGo gave nothing back, as the hold it read is gone:
	// a resume or Settle of this Completer took the key anew since, failed,
	// and holds it under a newer lease (ResumeFailures.Holding), which
	// stays held. LetGo again gives that one back.
	ErrHeldAnew      = errors.New("keyed: the completer took the key anew since and holds it under a newer lease: let it go again to give that back")
	ErrResultUnknown = errors.New("keyed: the store's answer was lost, so the key may have been finished all the same")
)

// SettleRecord records an operator's settle in an audit history
// (Completer.SettleRecorded), once the key is held and before it is
// completed. With inTx, ctx carries the transaction that completes the key
// (the store is an idem.TxStore, whose CompleteTx runs it): what it writes
// with ctx in the store's database commits with the settle or not at all.
// Without, the store shares no transaction with the caller's data (Redis,
// memory), and what it writes stands whatever becomes of the settle: it
// should say that the settle's result is not known yet, and the caller
// records the result once SettleRecorded returns, so that a crash between
// the two leaves an entry saying the result is unknown, never a settle
// without one. An error leaves the key as it was (ErrNotRecorded).
type SettleRecord func(ctx context.Context, inTx bool) error

// ResumeEnd says how an operator's resume (Completer.ResumeRecorded) ends
// the key, as its ResumeRecord is told before it does.
type ResumeEnd struct {
	// Released: Resume found that nothing was done outside
	// (ErrNothingDone), and the key is released; the client's retry runs
	// the request anew. Otherwise Resume's answer is kept.
	Released bool
	// Status is the kept answer's status; 0 when Released.
	Status int
}

// ResumeRecord records an operator's resume in an audit history
// (Completer.ResumeRecorded), once Resume has finished the key and before
// the key is completed or released: end says which. As SettleRecord: with
// inTx, ctx carries the transaction that completes the key (an
// idem.TxStore's CompleteTx), and what it writes with ctx in the store's
// database commits with the completion or not at all. Without (a store
// that shares no transaction with the caller's data, such as Redis or
// memory; and a release, which no store's transaction offers to share),
// what it writes stands whatever becomes of the key: it should say that
// the resume's result is not known yet, and the caller records the result
// once ResumeRecorded returns. An error leaves the key as it was
// (ErrNotRecorded). A resume that does not finish the key (Resume failed)
// calls no record: the key is unchanged, and the caller records the
// failure itself.
type ResumeRecord func(ctx context.Context, inTx bool, end ResumeEnd) error

// ResumeFailures counts the failed resumes of a key whose outcome is
// still unknown, with the last one's error.
type ResumeFailures struct {
	Count     int
	LastError string
	LastAt    time.Time
	// Holding: the Completer holds the key under the lease its last failed
	// resume took (or a resume or Settle whose give-back, a Yield, failed),
	// and tries again once it ends. ResumeKey and Settle act on the key
	// under that lease; nobody else can until it ends.
	Holding bool
	token   idem.Token
	// lease is the held lease the heartbeat renewed during that resume:
	// a Yield under token waits first for a renewal of it still on its
	// way (heartbeat.settle), which would otherwise land after the Yield
	// and give the key a live lease again, for nobody.
	lease *heldLease
}

// holding records that the Completer keeps the key under token after a
// failed resume.
func (c *Completer) holding(wk keywait.Key, token idem.Token, lease *heldLease) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if f, ok := c.failures[wk]; ok {
		f.token, f.Holding, f.lease = token, true, lease
		c.failures[wk] = f
	}
}

// heldToken returns the token the Completer holds wk under after a failed
// resume; 0 when none.
func (c *Completer) heldToken(wk keywait.Key) idem.Token {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.failures[wk].token
}

// quietHeld returns once no renewal is on its way of the lease the
// Completer holds wk under after a failed resume, when that is still the
// lease of token t. The resume stopped renewing it without waiting for one
// in flight (a round must not wait past its Timeout), and such a renewal,
// reaching the store after a Yield under the lease's token, would undo it:
// the key would have a live lease again, for nobody. It waits at most a
// renewal's time (a sixth of the lease), and only when one is in flight.
func (c *Completer) quietHeld(wk keywait.Key, t idem.Token) {
	c.mu.Lock()
	var lease *heldLease
	if f := c.failures[wk]; f.token == t {
		lease = f.lease
	}
	c.mu.Unlock()
	if lease != nil {
		c.e.hb.settle(lease)
	}
}

// yieldHeld forgets the lease the Completer holds wk under after a failed
// resume (token t) and yields it, once no renewal of it is on its way
// (quietHeld). The caller has wk under way (beginWait). It forgets and
// yields the hold only while it is still under t: a round or resume of
// this Completer that took the key over since t was read, and failed,
// holds it under a newer token, which stays held; a resume or Settle that
// ended the key since, or yielded it, left nothing under t to give back.
// A Yield that failed otherwise than by being refused (the lease is then
// not this Completer's) may not have ended the lease: the Completer holds
// the key under it again, so that LetGo can be tried again and ResumeKey
// and Settle still act on the key at once.
func (c *Completer) yieldHeld(ctx context.Context, wk keywait.Key, t idem.Token) error {
	c.quietHeld(wk, t)
	c.mu.Lock()
	f, ok := c.failures[wk]
	mine := ok && f.token == t
	lease := f.lease
	if mine {
		f.token, f.Holding, f.lease = 0, false, nil
		c.failures[wk] = f
	}
	c.mu.Unlock()
	if !mine {
		return nil
	}
	err := c.rs.Yield(ctx, idem.Ref{Scope: wk.Scope, Key: wk.Key, Token: t})
	if err != nil && !errors.Is(err, idem.ErrLeaseLost) {
		c.mu.Lock()
		if f, ok := c.failures[wk]; ok && f.token == 0 {
			f.token, f.Holding, f.lease = t, true, lease
			c.failures[wk] = f
		}
		c.mu.Unlock()
	}
	return err
}

// heldAfterYield holds wk under token t again after a Yield under t failed
// otherwise than by being refused (idem.ErrLeaseLost): the lease under t
// may still be live, with nothing else holding it, so the Completer keeps
// (or takes) the hold, that LetGo can give it back and ResumeKey and Settle
// act on the key at once rather than refuse it until the lease ends. lease
// is the one the heartbeat renewed under t, nil when none did; a hold
// under an older token was ended by the claim under t and is replaced, one
// under a newer token was taken since and stays.
func (c *Completer) heldAfterYield(wk keywait.Key, t idem.Token, lease *heldLease) {
	c.mu.Lock()
	defer c.mu.Unlock()
	f := c.failures[wk]
	if f.token > t {
		return
	}
	if f.token != t {
		f.lease = lease
	}
	f.token, f.Holding = t, true
	c.failures[wk] = f
}

// letGo forgets the lease held after a failed resume, once the key was
// given back or taken from under token t (the caller's): when that lease's
// token is t, or older. Tokens only grow (idem.Token), so a claim under t
// ended every lease under an older token, while a hold under a newer one
// was taken since, by another resume of this Completer, and stays.
func (c *Completer) letGo(wk keywait.Key, t idem.Token) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if f, ok := c.failures[wk]; ok && f.token != 0 && f.token <= t {
		f.token, f.Holding, f.lease = 0, false, nil
		c.failures[wk] = f
	}
}

// Failures returns the resumes of scope/key this Completer saw fail since
// its outcome became unknown (zero when none did, or the key was finished
// since). They are kept in memory: a restart forgets them.
func (c *Completer) Failures(scope idem.Scope, key idem.Key) ResumeFailures {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.failures[keywait.Key{Scope: scope, Key: key}]
}

// stopped returns the record of scope/key when it is in flight at a
// recovery point with its holder's lease ended, and otherwise an error
// matching ErrNotStopped or ErrBeingFinished.
func (c *Completer) stopped(ctx context.Context, scope idem.Scope, key idem.Key) (idem.Record, error) {
	rec, err := c.rs.Get(ctx, scope, key)
	switch {
	case errors.Is(err, idem.ErrNotFound):
		return rec, fmt.Errorf("%w: no key %q in scope %q (%w)", ErrNotStopped, string(key), string(scope), idem.ErrNotFound)
	case err != nil:
		return rec, fmt.Errorf("reading the key: %w", err)
	case rec.State != idem.StateInFlight:
		return rec, fmt.Errorf("%w: it is %s", ErrNotStopped, rec.State)
	case rec.Recovery.IsZero():
		return rec, fmt.Errorf("%w: it is in flight without a recovery point (a retry runs it anew)", ErrNotStopped)
	case rec.LeaseExpiresAt.After(c.e.cfg.Clock.Now()) && rec.Token != c.heldToken(keywait.Key{Scope: scope, Key: key}):
		return rec, fmt.Errorf("%w: its lease ends at %s", ErrBeingFinished, rec.LeaseExpiresAt.UTC().Format(time.RFC3339))
	}
	return rec, nil
}

// stoppedHere is stopped, for a key this Completer acts on: one stopped at
// a recovery point outside CompleterConfig.Points is refused with an error
// matching ErrOtherPoint. ResumeKey and Settle share it: an answer this
// Completer keeps is in its face's form, which the face that saved another
// point could not read back.
func (c *Completer) stoppedHere(ctx context.Context, scope idem.Scope, key idem.Key) (idem.Record, error) {
	rec, err := c.stopped(ctx, scope, key)
	if err != nil {
		return rec, err
	}
	if err := c.ownPoint(rec.Recovery.Name); err != nil {
		return rec, err
	}
	return rec, nil
}

// ownPoint returns nil when the Completer acts on keys stopped at point,
// and otherwise an error matching ErrOtherPoint.
func (c *Completer) ownPoint(point string) error {
	if c.takes(point) {
		return nil
	}
	return fmt.Errorf("%w: it stopped at %q; this one resumes %q (CompleterConfig.Points)", ErrOtherPoint, point, c.cfg.Points)
}

// notTaken says why a Claim of a stopped key did not acquire it.
func notTaken(o idem.Outcome) error {
	switch o {
	case idem.Completed:
		return fmt.Errorf("%w: it was completed meanwhile", ErrNotStopped)
	case idem.InFlight:
		return fmt.Errorf("%w: another execution took it over meanwhile", ErrBeingFinished)
	default:
		return fmt.Errorf("%w: the claim found it %s", ErrNotStopped, o)
	}
}

// ResumeKey runs one round of the Completer for scope/key alone, now: it
// takes the key over, runs Resume from its recovery point and keeps its
// answer (or releases the key when Resume returns ErrNothingDone), as a
// round would. finished reports that the key ended (its answer kept, or
// released); when it did not, err says why:
//
//   - a refusal matching ErrNotStopped, ErrBeingFinished or ErrOtherPoint,
//     or the key that could not be read, having changed nothing;
//   - the claim that takes the key over failing: it may have been
//     committed all the same, and the key then waits out its lease;
//   - Resume's error: the outcome is still unknown, Failures counts it, and
//     the Completer holds the key under the lease the resume took
//     (ResumeFailures.Holding) until that lease ends or LetGo gives it
//     back; a recovery point that cannot be opened is counted too, the key
//     given back at once;
//   - an error matching ErrResultUnknown: the last write (keeping the
//     answer, releasing the key) got no answer from the store, so the key
//     may have been finished all the same; counted and held as after
//     Resume's error;
//   - idem.ErrLeaseLost: another holder took the key meanwhile, and this
//     resume did not finish it.
//
// A resume of the key by this Completer under way, or a LetGo of it, is
// waited for (until ctx ends), by a dry run too; one by another is
// refused. A key this
// Completer holds after its own failed resume is taken over anew at once,
// its lease yielded first. With dryRun, it only checks that the key could
// be resumed, changing nothing.
func (c *Completer) ResumeKey(ctx context.Context, scope idem.Scope, key idem.Key, dryRun bool) (finished bool, err error) {
	return c.resumeKey(ctx, scope, key, dryRun, nil)
}

// ResumeRecorded is ResumeKey, not a dry run, with the resume recorded by
// record (see ResumeRecord) once Resume has finished the key, before the
// key is completed or released; a Resume that fails calls no record. On a
// store that is an idem.TxStore (SQLite, PostgreSQL), a completion's
// record is written in the very transaction that completes the key, so
// that a crash never leaves a resumed key without its record nor a record
// of a completion that did not happen; that transaction's commit getting
// no answer is ErrResultUnknown, the record and the completion unknown
// together. A release's record, and a completion's on another store, is
// written before the key is released or completed (inTx false). A record
// that fails leaves the key in flight at its point, its lease yielded,
// and returns an error matching ErrNotRecorded; when the Yield fails too
// (the error then says so), the lease may still be live, and the Completer
// holds the key under it (ResumeFailures.Holding), for LetGo to give back
// and ResumeKey and Settle to act on at once. What Resume
// did outside stands, and the next resume finds it (Resume must be
// idempotent, as it is for a completer's rounds).
func (c *Completer) ResumeRecorded(ctx context.Context, scope idem.Scope, key idem.Key, record ResumeRecord) (finished bool, err error) {
	if record == nil {
		return false, &idem.ArgumentError{Field: "record", Reason: "must not be nil"}
	}
	return c.resumeKey(ctx, scope, key, false, record)
}

func (c *Completer) resumeKey(ctx context.Context, scope idem.Scope, key idem.Key, dryRun bool, record ResumeRecord) (finished bool, err error) {
	wk := keywait.Key{Scope: scope, Key: key}
	// A dry run waits too: asked while this Completer's own round resumes
	// the key, it would otherwise find the key under that round's lease
	// and call it being finished, though the round may leave it unknown.
	if err := c.beginWait(ctx, wk, resuming); err != nil {
		return false, err
	}
	defer c.end(wk)
	rec, err := c.stoppedHere(ctx, scope, key)
	if err != nil {
		return false, err
	}
	if dryRun {
		return false, nil
	}
	if t := c.heldToken(wk); t != 0 && t == rec.Token {
		// Under the lease of this Completer's last failed resume: end it,
		// and take the key over anew.
		if err := c.yieldHeld(ctx, wk, t); err != nil && !errors.Is(err, idem.ErrLeaseLost) {
			return false, fmt.Errorf("ending the lease of the last failed resume: %w", err)
		}
	}
	r, err := c.resume(ctx, rec, time.Time{}, record)
	return r.finished(), err
}

// Settle ends the execution of scope/key, in flight at a recovery point
// (one of CompleterConfig.Points) with its holder gone, with answer as its kept answer, without resuming
// it: the decision of a person who learned the outcome elsewhere (or that
// nothing happened outside). The client's retry gets answer as a replay.
// answer is kept as an execution's answer is (its body sealed with
// Config.BodyKeys); it should say that it was settled by an operator.
//
// Settle takes the key over with a Claim before completing it, so it is
// atomic against a resume (this Completer's, another replica's, a
// client's retry): if one holds the key, or finished it first, Settle is
// refused (ErrBeingFinished, ErrNotStopped) and the key is left as that
// execution leaves it; once Settle holds it, they find it held, then
// completed. A resume or LetGo of the key by this Completer itself is
// waited for (until ctx ends), and the key read as it left it. It returns the record as it was
// before.
//
// A key stopped at a point outside CompleterConfig.Points is refused
// (ErrOtherPoint), having changed nothing: the answer would be kept in this
// Completer's face's form, which the face that saved the point could not
// replay; settle it with that face's Completer.
//
// With dryRun, it only checks that the key could be settled with answer
// (that its face can keep it); a zero answer (Status 0) checks the key
// alone.
func (c *Completer) Settle(ctx context.Context, scope idem.Scope, key idem.Key, answer idem.Response, dryRun bool) (idem.Record, error) {
	return c.settle(ctx, scope, key, answer, dryRun, nil)
}

// SettleRecorded is Settle, not a dry run, with the settle recorded by
// record (see SettleRecord): on a store that is an idem.TxStore (SQLite,
// PostgreSQL), in the very transaction that completes the key, so that a
// crash never leaves a settled key without its record nor a record of a
// settle that did not happen. An ambiguous failure of that commit leaves
// both unknown, together: idem.Recoverer.Get tells which it was.
//
// A Settle that fails once it holds the key (its record or its Complete)
// gives the key back with a Yield, in flight at its point; when that Yield
// fails too, the error says so, and the Completer holds the key under the
// Settle's lease (ResumeFailures.Holding), for LetGo to give back and
// ResumeKey and Settle to act on at once.
func (c *Completer) SettleRecorded(ctx context.Context, scope idem.Scope, key idem.Key, answer idem.Response, record SettleRecord) (idem.Record, error) {
	if record == nil {
		return idem.Record{}, &idem.ArgumentError{Field: "record", Reason: "must not be nil"}
	}
	return c.settle(ctx, scope, key, answer, false, record)
}

func (c *Completer) settle(ctx context.Context, scope idem.Scope, key idem.Key, answer idem.Response, dryRun bool, record SettleRecord) (idem.Record, error) {
	wk := keywait.Key{Scope: scope, Key: key}
	// A resume of the key by this Completer is waited for, by a dry run
	// too: the key is then read as it left it.
	if err := c.beginWait(ctx, wk, settling); err != nil {
		return idem.Record{}, err
	}
	defer c.end(wk)
	rec, err := c.stoppedHere(ctx, scope, key)
	if err != nil {
		return rec, err
	}
	if c.cfg.SettleAnswer != nil && (!dryRun || answer.Status != 0) {
		// In this face's form, before anything changes: an answer the face
		// cannot keep is refused with the key left as it is, by a dry run
		// too, which must refuse what the settle would.
		faced, err := c.cfg.SettleAnswer(answer)
		if err != nil {
			return rec, fmt.Errorf("%w: %w", &idem.ArgumentError{Field: "answer", Reason: "cannot be kept in the form of the face that stopped the key"}, err)
		}
		answer = faced
	}
	if dryRun {
		return rec, nil
	}
	e := c.e
	var claim idem.Claim
	if t := c.heldToken(wk); t != 0 && t == rec.Token {
		// Under the lease of this Completer's last failed resume: Complete
		// is fenced by its token, so a takeover since then refuses it. A
		// Yield under it may follow, which no renewal must undo.
		c.quietHeld(wk, t)
		claim = idem.Claim{Outcome: idem.Acquired, Token: t, Record: rec}
	} else {
		claim, err = c.rs.Claim(ctx, idem.ClaimRequest{Scope: scope, Key: key, Fingerprint: rec.Fingerprint,
			Lease: e.cfg.Lease, TTL: max(e.cfg.TTL, e.cfg.Lease), Holder: e.cfg.Holder})
		if err != nil {
			return rec, fmt.Errorf("taking the key over: %w", err)
		}
		if claim.Outcome != idem.Acquired {
			return rec, notTaken(claim.Outcome)
		}
	}
	ref := idem.Ref{Scope: scope, Key: key, Token: claim.Token}
	dctx, cancel := detached(ctx)
	defer cancel()
	defer e.local.Notify(wk)
	if claim.Record.Recovery.IsZero() {
		// Released since it was read, and claimed anew here: give it back.
		// Its outcome is known (released), as a resume that finds it so
		// learns: forget its failed resumes, and with them a hold of this
		// Completer's under an older token, whose lease the claim ended.
		if err := c.rs.Release(dctx, ref); err != nil {
			c.log.LogAttrs(ctx, slog.LevelWarn, "completer: could not give back a key it claimed anew", slog.String("error", err.Error()))
		}
		c.forget(wk)
		return rec, fmt.Errorf("%w: it was released meanwhile", ErrNotStopped)
	}
	if err := c.ownPoint(claim.Record.Recovery.Name); err != nil {
		// Stopped at another point since it was read: give it back as it
		// is, point and all.
		if yerr := c.rs.Yield(dctx, ref); yerr != nil && !errors.Is(yerr, idem.ErrLeaseLost) {
			c.log.LogAttrs(ctx, slog.LevelWarn, "completer: could not give back a key it claimed anew", slog.String("error", yerr.Error()))
			c.heldAfterYield(wk, ref.Token, nil)
		} else {
			c.letGo(wk, ref.Token)
		}
		return rec, err
	}
	kept, err := e.keptAnswer(ref, answer, false)
	if err == nil {
		err = c.complete(dctx, ref, kept, record)
	}
	if errors.Is(err, idem.ErrLeaseLost) {
		c.letGo(wk, ref.Token)
		return rec, fmt.Errorf("%w: another execution took it over meanwhile", ErrBeingFinished)
	}
	if err != nil {
		if yerr := c.rs.Yield(dctx, ref); yerr != nil && !errors.Is(yerr, idem.ErrLeaseLost) {
			err = errors.Join(err, fmt.Errorf("yielding the key: %w", yerr))
			c.heldAfterYield(wk, ref.Token, nil)
		} else {
			c.letGo(wk, ref.Token)
		}
		if errors.Is(err, ErrNotRecorded) {
			return rec, err
		}
		return rec, fmt.Errorf("keeping the settled answer: %w", err)
	}
	c.forget(wk)
	e.recent.Keep(wk, rec.Fingerprint, &kept, claim.Record.ExpiresAt)
	c.log.LogAttrs(ctx, slog.LevelWarn, "completer: an execution stopped at a recovery point was settled",
		slog.String("recovery_point", rec.Recovery.Name), slog.Int("status", kept.Status))
	return rec, nil
}

// completing is record for a resume that keeps an answer with status, as
// complete takes it: nil when record is.
func (record ResumeRecord) completing(status int) func(context.Context, bool) error {
	if record == nil {
		return nil
	}
	return func(ctx context.Context, inTx bool) error { return record(ctx, inTx, ResumeEnd{Status: status}) }
}

// complete completes ref with kept, recorded by record (when not nil): in
// the store's transaction when it is an idem.TxStore, and otherwise
// before the completion (see SettleRecord). A failed record is returned
// matching ErrNotRecorded, the key not completed.
func (c *Completer) complete(ctx context.Context, ref idem.Ref, kept idem.Response, record func(ctx context.Context, inTx bool) error) error {
	if record == nil {
		return c.rs.Complete(ctx, ref, kept)
	}
	if ts, ok := c.rs.(idem.TxStore); ok {
		var rerr error
		_, err := ts.CompleteTx(ctx, ref, func(txctx context.Context) (idem.Response, bool, error) {
			if rerr = record(txctx, true); rerr != nil {
				return idem.Response{}, false, rerr
			}
			return kept, true, nil
		})
		if rerr != nil {
			// Rolled back, the key with it: nothing was settled.
			return fmt.Errorf("%w: %w", ErrNotRecorded, rerr)
		}
		return err
	}
	if err := record(ctx, false); err != nil {
		return fmt.Errorf("%w: %w", ErrNotRecorded, err)
	}
	return c.rs.Complete(ctx, ref, kept)
}

// UnknownKeys returns the keys whose last resume by this Completer failed,
// which it may hold under that resume's lease, and the keys it holds after
// a give-back (a Yield) failed though no resume of them did (a Settle or
// ResumeRecorded whose record failed, then its Yield: ResumeFailures.Holding
// with Count 0). idem.Recoverer.Abandoned does not list a key so held
// until its lease ends, so this is how the key can be found and let go
// meanwhile. Token is the held lease's, or 0.
func (c *Completer) UnknownKeys() []idem.Ref {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]idem.Ref, 0, len(c.unknown))
	for wk := range c.unknown {
		out = append(out, idem.Ref{Scope: wk.Scope, Key: wk.Key, Token: c.failures[wk].token})
	}
	for wk, f := range c.failures {
		// Held, but not counted unknown (Stats.Unknown, and the alert on
		// it, count failed resumes only).
		if _, counted := c.unknown[wk]; !counted && f.token != 0 {
			out = append(out, idem.Ref{Scope: wk.Scope, Key: wk.Key, Token: f.token})
		}
	}
	return out
}

// LetGo ends the lease this Completer holds scope/key under after a
// failed resume, or one whose result is unknown (ResumeFailures.Holding;
// ErrResultUnknown), so that another completer or a client's retry can
// take the key on at once, rather than after that lease: for a Completer
// that stops before its lease would end (a command that resumed one key).
// The key stays in flight at its point, its outcome unknown; one that the
// unknown write finished stays as it left it (the store refuses the
// Yield). A Yield that fails (the store down) returns its error and leaves
// the Completer holding the key, so that LetGo can be tried again. Without
// such a lease, it does nothing.
//
// It gives back the lease held when it is called, once no resume, Settle
// or ResumeKey of the key by this Completer is under way (until ctx ends):
// one that keeps an answer under that lease (a Settle of a key the
// Completer holds keeps it under the held lease's token) is not undone by
// a Yield under it, and one that ends the key, or gives it back, leaves
// nothing to give back (nil). One that takes it anew and fails holds it
// under a newer lease, which stays held: LetGo then returns ErrHeldAnew,
// and a LetGo again gives that lease back. Settle and ResumeKey in turn
// wait for a LetGo under way, and act on the key as it leaves it.
func (c *Completer) LetGo(ctx context.Context, scope idem.Scope, key idem.Key) error {
	wk := keywait.Key{Scope: scope, Key: key}
	t := c.heldToken(wk)
	if t == 0 {
		return nil
	}
	if c.letGoHook != nil {
		c.letGoHook()
	}
	if err := c.beginWait(ctx, wk, lettingGo); err != nil {
		return fmt.Errorf("ending the lease of the failed resume: %w", err)
	}
	defer c.end(wk)
	if now := c.heldToken(wk); now != t {
		if now == 0 {
			// Ended, or given back, meanwhile: nothing is left to let go.
			return nil
		}
		// Taken anew since, by an action that failed: the key still
		// needs letting go, under a lease this LetGo did not read.
		return ErrHeldAnew
	}
	if err := c.yieldHeld(ctx, wk, t); err != nil && !errors.Is(err, idem.ErrLeaseLost) {
		return fmt.Errorf("ending the lease of the failed resume: %w", err)
	}
	return nil
}
