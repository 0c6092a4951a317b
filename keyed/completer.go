package keyed

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/keywait"
)

// ErrNothingDone is what a Resume returns when it learned that nothing
// happened past the database's edge (the card network has no charge under
// the execution's key, say): the Completer then releases the key, and the
// client's retry runs the request anew.
var ErrNothingDone = errors.New("keyed: the abandoned execution did nothing that needs finishing")

// ResumeFunc finishes an abandoned execution from its recovery point
// (ex.Recovery), with nobody waiting for the answer: it does what the
// handler's remaining phases would, and returns the answer the client
// would have got, which the Completer keeps for the client's retry, as a
// face's Ran.Answer (the headers to replay, the body as written; the
// engine seals it). ctx carries ex, so SaveRecovery and KeyFromContext work
// as in the handler, and ends at CompleterConfig.Timeout.
//
// Returning a nil error keeps the answer, whatever its status. Returning
// ErrNothingDone releases the key. Any other error leaves the key in
// flight with its point: its outcome is unknown, and the Completer tries
// again once the lease it took ends.
type ResumeFunc func(ctx context.Context, ex Execution) (idem.Response, error)

// CompleterConfig configures a Completer.
type CompleterConfig struct {
	// Resume finishes one abandoned execution. Required. One Completer
	// serves every route of its Engine's store: dispatch on
	// ex.Recovery.Name.
	Resume ResumeFunc
	// Every is how often the Completer looks for abandoned executions.
	// Defaults to 1s.
	Every time.Duration
	// Timeout bounds one round, from its start: its listing of the
	// abandoned keys, the Claim that takes each over, each key's Resume
	// (whose lease is renewed while it runs) and the keeping of its
	// answer. It is part of the Completer's Bound. A ResumeKey or a Settle
	// gets Timeout for its Resume. Defaults to nine tenths of the lease.
	Timeout time.Duration
	// Limit is how many abandoned keys one round takes on. Defaults to 100.
	Limit int
	// Parallel is how many of a round's keys are resumed at once. Defaults
	// to 16.
	Parallel int
	// Logger defaults to the Engine's.
	Logger *slog.Logger
	// Points names the recovery points this Completer resumes: a key
	// abandoned at another point is left alone (a round skips it and
	// goes on to the keys past it; ResumeKey and Settle refuse it with
	// ErrOtherPoint), for the Completer that names it. Two faces
	// on one store each run their own Completer, whose answers each
	// keeps in its own form, so each names the points its handlers save.
	// Defaults to none: every point.
	Points []string
	// SettleAnswer turns an operator's answer, as Settle is given it (an
	// HTTP answer: a status, a Content-Type and other headers, a body; as
	// console.FailedAnswer and console.OperatorAnswer make them), into the
	// answer this Completer's face keeps, in the form its replays read
	// (as a face's Ran.Answer). An error refuses the settle, changing
	// nothing; Settle returns it wrapped in an error matching
	// idem.ErrInvalidArgument. Defaults to keeping the answer as it is:
	// HTTP's form, idemhttp's.
	SettleAnswer func(answer idem.Response) (idem.Response, error)
}

// Completer finishes, in the background, the executions whose holder died
// after saving a recovery point, without waiting for the client to retry:
// a replica that crashed between a charge at a card network and its own
// commit, a client that gave up. Every Every, it lists the abandoned keys
// (idem.Recoverer.Abandoned), takes each over with a Claim (so two
// Completers, or a Completer and a client's retry, never run one key at
// once), runs Resume from the key's recovery point and keeps its answer,
// which the client's retry then gets as a replay.
//
// Bound: a holder renews its lease while it lives, so a key is abandoned
// at most Lease after its holder's death (at once when the holder's
// replica restarts: Engine.Restart); a round starts within Every of that
// (a round waits neither for the rounds before it nor for their resumes),
// and everything it does that can delay a finish (listing the keys,
// claiming each, resuming it and keeping its answer, up to Parallel keys
// at once, each renewing its own lease) ends within Timeout of the
// round's start. So an abandoned execution is finished within
// Lease + Every + Timeout of its holder's death (Bound), when no more than
// Parallel keys are abandoned at once, unless the round gives up, which it
// logs: its listing or a claim failed or ran out of Timeout (a claim cut
// off may have taken the key all the same, which then waits out the lease
// it took), or the key's outcome cannot be learned or its answer kept:
// then it stays in flight, with its point, never released (Unknown counts
// it), and is tried again after the lease the Completer took. The bound
// then holds again from the round that gave up.
//
// A round also reads back the keys whose outcome it counts as unknown and
// that its listing did not return (one Get each), to forget those that
// ended without it (a client's retry finished the key). It does so only
// once it has started the resumes of every key it listed, within the same
// Timeout, and only one round at a time: many unknown keys (a card
// network's outage leaves many) never spend the Timeout the claims need,
// and overlapping rounds do not read the same keys again. A round that
// runs out of time reads none back; Unknown then counts a finished key
// until a later round does.
//
// Make one with Engine.NewCompleter (or a face's NewCompleter), run it
// with Run.
type Completer struct {
	e   *Engine
	cfg CompleterConfig
	rs  idem.Recoverer
	log *slog.Logger

	// slots bounds the resumes running at once (Parallel), across rounds.
	slots chan struct{}

	mu      sync.Mutex
	unknown map[keywait.Key]time.Time // keys whose outcome is unknown, since when
	// failures are the failed resumes of the keys still unknown.
	failures map[keywait.Key]ResumeFailures
	stats    CompleterStats
	// active are the keys being resumed (or settled, or let go), which no
	// round takes on again and which ResumeKey, Settle and LetGo wait for;
	// each one's done is closed when that ends.
	active map[keywait.Key]action

	// pruning is set while a round reads back the unknown outcomes
	// (prune).
	pruning atomic.Bool

	// letGoHook, when set (by tests), runs in LetGo between its reading of
	// the held token and its wait for the key.
	letGoHook func()
	// waitHook, when set (by tests), runs in beginWait each time it finds
	// the key under way and is about to wait for it.
	waitHook func()
}

// CompleterStats counts what a Completer did since it was made.
type CompleterStats struct {
	// Rounds is how many times it looked for abandoned keys.
	Rounds uint64
	// Completed: executions finished, their answer kept.
	Completed uint64
	// Released: executions Resume found had done nothing.
	Released uint64
	// Failed: resumes whose outcome is unknown: Resume ended in an error,
	// or its answer could not be kept.
	Failed uint64
	// Unknown is how many keys are in flight, with a point, whose last
	// Resume failed: outcomes nobody has learned yet.
	Unknown int
	// OldestUnknown is when the oldest of them first failed, and
	// UnknownFor how long ago that was, by the Engine's clock; zero when
	// Unknown is 0.
	OldestUnknown time.Time
	UnknownFor    time.Duration
}

// NewCompleter returns a Completer for e's store, which must be an
// idem.Recoverer. Its takeovers use e's lease and TTL, and it keeps answers
// as e keeps them (sealed with Config.BodyKeys).
func (e *Engine) NewCompleter(cfg *CompleterConfig) (*Completer, error) {
	rs, ok := e.store.(idem.Recoverer)
	if !ok {
		return nil, &idem.ArgumentError{Field: "keyed.Engine", Reason: fmt.Sprintf("its store (%T) keeps no recovery points: it is no idem.Recoverer", e.store)}
	}
	var c CompleterConfig
	if cfg != nil {
		c = *cfg
	}
	switch {
	case c.Resume == nil:
		return nil, &idem.ArgumentError{Field: "keyed.CompleterConfig.Resume", Reason: "is required"}
	case c.Every < 0:
		return nil, &idem.ArgumentError{Field: "keyed.CompleterConfig.Every", Reason: "must not be negative"}
	case c.Timeout < 0:
		return nil, &idem.ArgumentError{Field: "keyed.CompleterConfig.Timeout", Reason: "must not be negative"}
	case c.Limit < 0:
		return nil, &idem.ArgumentError{Field: "keyed.CompleterConfig.Limit", Reason: "must not be negative"}
	case c.Parallel < 0:
		return nil, &idem.ArgumentError{Field: "keyed.CompleterConfig.Parallel", Reason: "must not be negative"}
	}
	if c.Every == 0 {
		c.Every = time.Second
	}
	if c.Timeout == 0 {
		c.Timeout = e.cfg.Lease * 9 / 10
	}
	if c.Limit == 0 {
		c.Limit = 100
	}
	if c.Parallel == 0 {
		c.Parallel = 16
	}
	if c.Logger == nil {
		c.Logger = e.log
	}
	return &Completer{e: e, cfg: c, rs: rs, log: c.Logger, slots: make(chan struct{}, c.Parallel),
		unknown: map[keywait.Key]time.Time{}, failures: map[keywait.Key]ResumeFailures{}, active: map[keywait.Key]action{}}, nil
}

// Lease is how long a key the Completer holds (a resume's, a settle's)
// stays held past its last renewal: the Engine's Config.Lease. A holder
// gone with no give-back leaves the key held until then.
func (c *Completer) Lease() time.Duration { return c.e.cfg.Lease }

// Bound is the longest an abandoned execution waits to be finished, when
// its outcome can be learned: the lease, one round's interval and one
// Resume.
func (c *Completer) Bound() time.Duration { return c.e.cfg.Lease + c.cfg.Every + c.cfg.Timeout }

// Stats returns what the Completer did so far.
func (c *Completer) Stats() CompleterStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.stats
	s.Unknown = len(c.unknown)
	for _, since := range c.unknown {
		if s.OldestUnknown.IsZero() || since.Before(s.OldestUnknown) {
			s.OldestUnknown = since
		}
	}
	if !s.OldestUnknown.IsZero() {
		s.UnknownFor = c.e.cfg.Clock.Now().Sub(s.OldestUnknown)
	}
	return s
}

// Run starts a round every Every until ctx is done, and returns ctx's
// error once the rounds and the resumes it started have ended. A round
// waits for a slot for each key it takes on (at most Parallel resumes run
// at once), not for their resumes to end, and the next round starts on
// time whatever the ones before it are doing: a key abandoned while a slow
// one is resumed, or while a round's listing is slow, is taken on by the
// next round. Each round ends within Timeout (CompleterConfig.Timeout),
// so at most Timeout/Every+1 run at once. A round that fails (the store
// unavailable) is logged and tried again at the next tick.
func (c *Completer) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	t := time.NewTicker(c.cfg.Every)
	defer t.Stop()
	for {
		wg.Go(func() {
			began := time.Now()
			if err := c.round(ctx, &wg, nil); err != nil && ctx.Err() == nil {
				// When the round began: rounds overlap, and a give-up
				// concerns the keys its own listing would have found.
				c.log.LogAttrs(ctx, slog.LevelWarn, "completer: could not list abandoned executions", slog.String("error", err.Error()),
					slog.Time("round_began", began))
			}
		})
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// RunOnce runs one round: it takes on every abandoned key the store lists
// (at most Limit) and that the Completer is not resuming already, with at
// most Parallel resumes running at once, and returns how many it finished
// once all have ended.
func (c *Completer) RunOnce(ctx context.Context) (finished int, err error) {
	var wg sync.WaitGroup
	var n atomic.Int64
	err = c.round(ctx, &wg, &n)
	wg.Wait()
	if err == nil {
		err = ctx.Err()
	}
	return int(n.Load()), err
}

// round lists the abandoned keys and starts a resume, in wg, of each that
// no resume of this Completer has under way, each once a slot is free;
// it returns once it has started them all, or ctx ended. Everything the
// round does ends within Timeout of its start (the Completer's Bound):
// its listing, its claims and its resumes are given that deadline, and a
// key it could not start a resume of by then is logged, as a claim that
// failed is. finished, when not nil, counts the keys finished.
func (c *Completer) round(ctx context.Context, wg *sync.WaitGroup, finished *atomic.Int64) error {
	c.mu.Lock()
	c.stats.Rounds++
	c.mu.Unlock()
	began := time.Now()
	until := began.Add(c.cfg.Timeout)
	rctx, cancel := context.WithDeadline(ctx, until)
	// The round's context ends once the resumes it started have ended (or
	// its deadline passed): their claims are made under it.
	var started sync.WaitGroup
	defer func() { wg.Go(func() { started.Wait(); cancel() }) }()
	recs, err := c.abandoned(rctx)
	if err != nil {
		return err
	}
	for i, rec := range recs {
		if !c.takes(rec.Recovery.Name) {
			continue // another Completer's (CompleterConfig.Points)
		}
		wk := keywait.Key{Scope: rec.Scope, Key: rec.Key}
		if !c.begin(wk) {
			continue // a resume of it is under way
		}
		var ok bool
		if rctx.Err() == nil {
			select {
			case c.slots <- struct{}{}:
				ok = true
			case <-rctx.Done():
			}
		}
		if !ok {
			c.end(wk)
			if ctx.Err() == nil {
				c.outOfTime(ctx, recs[i:], began)
			}
			return nil
		}
		started.Add(1)
		wg.Go(func() {
			defer func() {
				c.end(wk)
				<-c.slots
				started.Done()
			}()
			if r, _ := c.resume(rctx, rec, until, nil); r.finished() && finished != nil {
				finished.Add(1)
			}
		})
	}
	// Only once every claim is under way: the reading back of the
	// unknown outcomes, one Get per key, must not spend the Timeout the
	// claims need.
	c.prune(rctx, recs)
	return nil
}

// prune runs pruneUnknown, unless another round is at it: overlapping
// rounds would read the same keys back again.
func (c *Completer) prune(ctx context.Context, listed []idem.Record) {
	if !c.pruning.CompareAndSwap(false, true) {
		return
	}
	defer c.pruning.Store(false)
	c.pruneUnknown(ctx, listed)
}

// outOfTime logs each of the keys a round listed and ran out of its
// Timeout before it could take over (waiting for a slot, with Parallel
// resumes under way): the Completer's Bound counts again from then for
// them. A key another resume of this Completer has under way (listed
// again, its lease having ended while that resume runs) is being taken
// over: it is not logged. Each line says when its round began (rounds
// overlap).
func (c *Completer) outOfTime(ctx context.Context, recs []idem.Record, began time.Time) {
	for _, rec := range recs {
		if !c.takes(rec.Recovery.Name) || c.underWay(keywait.Key{Scope: rec.Scope, Key: rec.Key}) {
			continue
		}
		log := reqLog{l: c.log, scope: rec.Scope, key: rec.Key, method: "completer", path: rec.Recovery.Name}
		log.LogAttrs(ctx, slog.LevelWarn, "completer: the round ran out of time before it could take the abandoned execution over",
			slog.Duration("timeout", c.cfg.Timeout), slog.Time("round_began", began))
	}
}

// abandoned lists the abandoned keys for a round: up to Limit at the
// Completer's points, and the keys at other points listed before them
// (oldest lease end first). idem.Recoverer.Abandoned has no cursor and
// knows no points, so while the keys at other points fill what it returned,
// it is asked again for twice as many: keys left at another face's point
// (that face's Completer not running) never starve this one's. A round
// thus reads at most about twice the abandoned keys in the store.
func (c *Completer) abandoned(ctx context.Context) ([]idem.Record, error) {
	limit := c.cfg.Limit
	for {
		recs, err := c.rs.Abandoned(ctx, limit)
		if err != nil || len(c.cfg.Points) == 0 || len(recs) < limit {
			return recs, err
		}
		own := 0
		for i, rec := range recs {
			if c.takes(rec.Recovery.Name) {
				if own++; own == c.cfg.Limit {
					return recs[:i+1], nil // no more than Limit of its own
				}
			}
		}
		if limit > math.MaxInt/2 {
			return recs, nil
		}
		limit *= 2
	}
}

// takes reports whether the Completer resumes keys abandoned at point
// (CompleterConfig.Points).
func (c *Completer) takes(point string) bool {
	return len(c.cfg.Points) == 0 || slices.Contains(c.cfg.Points, point)
}

// begin marks wk as being resumed, unless it is already: false then.
func (c *Completer) begin(wk keywait.Key) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.active[wk]; ok {
		return false
	}
	c.active[wk] = action{done: make(chan struct{}), what: resuming}
	return true
}

// underWay reports whether a resume (or settle) of wk is under way.
func (c *Completer) underWay(wk keywait.Key) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.active[wk]
	return ok
}

// beginWait is begin that waits, until ctx ends, for a resume of wk under
// way to end, or an operator's action on it (ResumeKey, Settle, LetGo):
// those take wk with beginWait, so that none of them acts on a key while
// another, or a round's resume, does.
// what says which of them it is, for the error of one that gave up
// waiting for it.
func (c *Completer) beginWait(ctx context.Context, wk keywait.Key, what string) error {
	for {
		c.mu.Lock()
		a, ok := c.active[wk]
		if !ok {
			c.active[wk] = action{done: make(chan struct{}), what: what}
			c.mu.Unlock()
			return nil
		}
		c.mu.Unlock()
		if c.waitHook != nil {
			c.waitHook()
		}
		select {
		case <-a.done:
		case <-ctx.Done():
			return fmt.Errorf("%w: this completer is %s (%w)", ErrBeingFinished, a.what, ctx.Err())
		}
	}
}

func (c *Completer) end(wk keywait.Key) {
	c.mu.Lock()
	if a, ok := c.active[wk]; ok {
		close(a.done)
		delete(c.active, wk)
	}
	c.mu.Unlock()
}

// action is a resume of a key, or an operator's action on it, under way:
// done is closed when it ends; what says which it is, in the words of
// ErrBeingFinished's error for one that gave up waiting for it.
type action struct {
	done chan struct{}
	what string
}

// What an action under way is doing to its key (action.what).
const (
	resuming  = "resuming it"
	settling  = "settling it"
	lettingGo = "letting it go"
)

// resumed says how one resume of a key ended.
type resumed int

const (
	resumeNotTaken resumed = iota // the key was not taken over: another holder has it, or it was finished
	resumeCompleted
	resumeReleased
	resumeFailed      // the outcome is still unknown
	resumeNotRecorded // finished, but its record failed: the key is given back as it was
)

func (r resumed) finished() bool { return r == resumeCompleted || r == resumeReleased }

// resume takes rec's key over and finishes it, saying how it ended and,
// unless it was finished, why not. until, when not zero, is the deadline
// of the round that listed the key (ctx's), which the Resume, the keeping
// of its answer and the writes that give the key back (a key released
// since it was listed, a point that cannot be opened) are given too; an
// operator's resume (zero) gives Resume Timeout, and its writes a write's
// time of their own. record, when not nil, records an operator's resume as
// it ends the key (see ResumeRecord).
//
// The claim is logged before it is sent and once it is answered: a
// replica killed between the claim's commit and its next line has said
// that it may hold the key.
func (c *Completer) resume(ctx context.Context, rec idem.Record, until time.Time, record ResumeRecord) (resumed, error) {
	e := c.e
	wk := keywait.Key{Scope: rec.Scope, Key: rec.Key}
	log := reqLog{l: c.log, scope: rec.Scope, key: rec.Key, method: "completer", path: rec.Recovery.Name}
	log.LogAttrs(ctx, slog.LevelWarn, "completer: taking an abandoned execution over")
	// A round's writes after the claim (giving the key back, keeping the
	// answer) are part of the round's Timeout; an operator's have a
	// write's time of their own.
	inRound := !until.IsZero()
	writeCtx := func() (context.Context, context.CancelFunc) {
		if inRound {
			return detachedUntil(ctx, until)
		}
		return detached(ctx)
	}
	sent := e.cfg.Clock.Now()
	claim, err := c.rs.Claim(ctx, idem.ClaimRequest{Scope: rec.Scope, Key: rec.Key, Fingerprint: rec.Fingerprint,
		Lease: e.cfg.Lease, TTL: max(e.cfg.TTL, e.cfg.Lease), Holder: e.cfg.Holder})
	if err != nil {
		// The claim may have been committed all the same: the key then
		// waits out the lease it took.
		log.LogAttrs(ctx, slog.LevelWarn, "completer: could not take the abandoned execution over", slog.String("error", err.Error()))
		return resumeNotTaken, fmt.Errorf("taking the execution over: %w", err)
	}
	if claim.Outcome != idem.Acquired {
		// A client's retry or another replica got there first.
		log.LogAttrs(ctx, slog.LevelWarn, "completer: another holder has the abandoned execution", slog.String("outcome", claim.Outcome.String()))
		c.forget(wk)
		return resumeNotTaken, notTaken(claim.Outcome)
	}
	// The claim ended every lease under an older token, one this
	// Completer held the key under after an earlier failed resume
	// included: forget that hold, however this resume ends (a failure
	// holds the key under the claim's token again).
	c.letGo(wk, claim.Token)
	if claim.Record.Recovery.IsZero() {
		// The key was released (or purged) since it was listed, and this
		// claim made it anew: there is nothing to go on from. Give it back
		// as it was.
		dctx, cancel := writeCtx()
		defer cancel()
		if err := c.rs.Release(dctx, idem.Ref{Scope: rec.Scope, Key: rec.Key, Token: claim.Token}); err != nil {
			log.LogAttrs(ctx, slog.LevelWarn, "completer: could not give back a key it claimed anew", slog.String("error", err.Error()))
		} else {
			log.LogAttrs(ctx, slog.LevelWarn, "completer: gave back a key released since it was listed")
		}
		c.forget(wk)
		return resumeNotTaken, fmt.Errorf("%w: it was released meanwhile", ErrNotStopped)
	}
	defer e.local.Notify(wk)
	ref := idem.Ref{Scope: rec.Scope, Key: rec.Key, Token: claim.Token}
	rp, seed, err := unwrapPoint(e.bodies, rec.Scope, rec.Key, claim.Record.Recovery)
	if err != nil {
		// Nothing can go on from data nobody can read; the key stays in
		// flight with its point until someone gives the key that opens it.
		c.unknownNow(wk, err)
		log.LogAttrs(ctx, slog.LevelError, "completer: the recovery point cannot be opened (are BodyKeys missing a key?); the key stays in flight",
			slog.String("error", err.Error()))
		dctx, cancel := writeCtx()
		defer cancel()
		if yerr := c.rs.Yield(dctx, ref); yerr != nil {
			log.LogAttrs(ctx, slog.LevelWarn, "completer: could not yield the key", slog.String("error", yerr.Error()))
		}
		return resumeFailed, fmt.Errorf("the recovery point cannot be opened: %w", err)
	}
	ex := Execution{Scope: rec.Scope, Key: rec.Key, Token: claim.Token, ClaimedAt: claim.Record.CreatedAt,
		TookOver: claim.TookOver, Recovery: rp, points: &pointSaver{store: c.rs, bodies: e.bodies}, seed: seed, hasSeed: true}
	log.LogAttrs(ctx, slog.LevelWarn, "completer: finishing an abandoned execution",
		slog.String("recovery_point", ex.Recovery.Name), slog.Time("saved_at", ex.Recovery.SavedAt))

	resumeUntil := until
	if !inRound {
		resumeUntil = time.Now().Add(c.cfg.Timeout)
	}
	hctx := newExecCtxUntil(ctx, resumeUntil, ex)
	held := &heldLease{ref: ref, ctx: hctx, log: log}
	e.hb.hold(held, sent, claim.Record.LeaseExpiresAt)
	defer e.hb.drop(held) // once the key is settled
	answer, rerr := runResume(hctx, c.cfg.Resume, ex)
	hctx.stop()
	dctx, cancel := writeCtx()
	defer cancel()
	switch {
	case errors.Is(rerr, ErrNothingDone):
		// The one release of a key with a point: Resume learned that
		// nothing happened outside (Release itself refuses such a key).
		// No store shares a release's transaction: its record is written
		// first, saying the release is under way.
		if record != nil {
			if err := record(dctx, false, ResumeEnd{Released: true}); err != nil {
				return c.notRecorded(ctx, dctx, wk, held, log, err)
			}
		}
		if err := c.rs.ReleaseWithPoint(dctx, ref); err != nil {
			log.LogAttrs(ctx, slog.LevelWarn, "completer: could not release the key", slog.String("error", err.Error()))
			if errors.Is(err, idem.ErrLeaseLost) {
				// Refused: another holder has the key; nothing was released.
				return resumeFailed, fmt.Errorf("releasing the key: %w", err)
			}
			// The release may have been committed all the same. If it was
			// not, the key is in flight at its point under this resume's
			// lease, which LetGo can give back: a Yield under its token is
			// refused, changing nothing, if the key was released since.
			err = fmt.Errorf("releasing the key: %w: %w", ErrResultUnknown, err)
			c.unknownNow(wk, err)
			c.holding(wk, claim.Token, held)
			return resumeFailed, err
		}
		c.forget(wk)
		c.count(func(s *CompleterStats) { s.Released++ })
		log.LogAttrs(ctx, slog.LevelInfo, "completer: the abandoned execution had done nothing; key released")
		return resumeReleased, nil
	case rerr != nil:
		c.unknownNow(wk, rerr)
		c.holding(wk, claim.Token, held)
		log.LogAttrs(ctx, slog.LevelError, "completer: outcome unknown; the key stays in flight and is tried again after its lease",
			slog.String("error", rerr.Error()), slog.Duration("lease", e.cfg.Lease))
		return resumeFailed, rerr
	}
	kept, err := e.keptAnswer(ref, answer, false)
	if err == nil {
		if err = c.complete(dctx, ref, kept, record.completing(kept.Status)); err != nil && !errors.Is(err, ErrNotRecorded) && !errors.Is(err, idem.ErrLeaseLost) {
			// The store's answer was lost, not its refusal read (a lost
			// lease is a refusal: another holder has the key): the
			// answer may have been kept all the same.
			err = fmt.Errorf("%w: %w", ErrResultUnknown, err)
		}
	}
	if errors.Is(err, ErrNotRecorded) {
		return c.notRecorded(ctx, dctx, wk, held, log, err)
	}
	if err != nil {
		// Finished, but nobody can tell from the store: as unknown as a
		// Resume that failed.
		c.unknownNow(wk, err)
		if errors.Is(err, ErrResultUnknown) {
			// Not kept, the key is in flight at its point under this
			// resume's lease, which LetGo can give back; kept, a Yield
			// under its token is refused, changing nothing.
			c.holding(wk, claim.Token, held)
		}
		log.LogAttrs(ctx, slog.LevelError, "completer: finished, but could not keep the answer; tried again after the lease",
			slog.String("error", err.Error()))
		return resumeFailed, fmt.Errorf("keeping the answer: %w", err)
	}
	c.forget(wk)
	c.count(func(s *CompleterStats) { s.Completed++ })
	e.recent.Keep(wk, rec.Fingerprint, &kept, claim.Record.ExpiresAt)
	log.LogAttrs(ctx, slog.LevelInfo, "completer: finished an abandoned execution", slog.Int("status", kept.Status))
	return resumeCompleted, nil
}

// notRecorded gives back a key whose resume finished but whose record
// (ResumeRecord) failed, before it was completed or released: in flight
// at its point, its lease ended, as it was, for the next resume, which
// finds what this one did outside. When that Yield fails, the Completer
// holds the key under the resume's lease, and its log says so.
func (c *Completer) notRecorded(ctx, dctx context.Context, wk keywait.Key, held *heldLease, log reqLog, rerr error) (resumed, error) {
	err := rerr
	if !errors.Is(err, ErrNotRecorded) {
		err = fmt.Errorf("%w: %w", ErrNotRecorded, rerr)
	}
	// No renewal may reach the store after the yield.
	c.e.hb.settle(held)
	// The line says what became of the key: given back, taken by another
	// holder meanwhile, or still held under this resume's lease (until
	// LetGo or the lease's end) because the Yield failed.
	msg := "completer: a resume was not recorded; the key is given back, in flight at its point"
	switch yerr := c.rs.Yield(dctx, held.ref); {
	case yerr == nil:
		c.letGo(wk, held.ref.Token)
	case errors.Is(yerr, idem.ErrLeaseLost):
		c.letGo(wk, held.ref.Token)
		msg = "completer: a resume was not recorded; another holder took the key meanwhile"
	default:
		err = errors.Join(err, fmt.Errorf("yielding the key: %w", yerr))
		c.heldAfterYield(wk, held.ref.Token, held)
		msg = "completer: a resume was not recorded, and it could not give the key back: it holds the key under the resume's lease until LetGo or the lease's end"
	}
	log.LogAttrs(ctx, slog.LevelError, msg, slog.String("error", err.Error()))
	return resumeNotRecorded, err
}

// runResume runs resume, turning a panic into an error: one execution's
// bug must not stop the Completer.
func runResume(ctx context.Context, resume ResumeFunc, ex Execution) (answer idem.Response, err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("resume panicked: %v", v)
		}
	}()
	return resume(ctx, ex)
}

// pruneUnknown forgets the unknown outcomes that ended without the
// Completer: a client's retry finished the key, say. A key the round lists
// is still unknown; one it does not list may be held under the lease the
// Completer took when its Resume failed, so its record decides: still in
// flight, it stays unknown.
// It stops at ctx's end, the round's deadline.
func (c *Completer) pruneUnknown(ctx context.Context, listed []idem.Record) {
	c.mu.Lock()
	var check []keywait.Key
	for wk := range c.unknown {
		check = append(check, wk)
	}
	c.mu.Unlock()
	if len(check) == 0 {
		return
	}
	inList := make(map[keywait.Key]bool, len(listed))
	for _, r := range listed {
		inList[keywait.Key{Scope: r.Scope, Key: r.Key}] = true
	}
	for _, wk := range check {
		if ctx.Err() != nil {
			return
		}
		if inList[wk] {
			continue
		}
		rec, err := c.rs.Get(ctx, wk.Scope, wk.Key)
		switch {
		case errors.Is(err, idem.ErrNotFound), err == nil && rec.State != idem.StateInFlight:
			c.forget(wk)
		}
	}
}

// unknownNow counts a resume whose outcome nobody can learn from the
// store: its Resume failed (with err), or its answer could not be kept.
func (c *Completer) unknownNow(wk keywait.Key, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.e.cfg.Clock.Now()
	if _, ok := c.unknown[wk]; !ok {
		c.unknown[wk] = now
	}
	f := c.failures[wk]
	f.Count++
	f.LastError, f.LastAt = err.Error(), now
	c.failures[wk] = f
	c.stats.Failed++
}

func (c *Completer) forget(wk keywait.Key) {
	c.mu.Lock()
	delete(c.unknown, wk)
	delete(c.failures, wk)
	c.mu.Unlock()
}

func (c *Completer) count(f func(*CompleterStats)) {
	c.mu.Lock()
	f(&c.stats)
	c.mu.Unlock()
}
