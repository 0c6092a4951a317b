package keyed

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"sync"
	"time"

	"github.com/idem-go/idem"
)

// heldLease is one lease this process holds on a key and renews while its
// execution runs (heartbeat). An execution holds it inside its own
// allocation: holding and letting go cost no allocation.
type heldLease struct {
	prev, next *heldLease
	ref        idem.Ref
	// since is when the lease last began, by the engine's clock, as
	// began counts it from its claim or its last successful renewal: the
	// lease ends no sooner than since + Lease.
	since time.Time
	// renewing says a renewal is in flight; failed that the lease was
	// given up as lost (its context cancelled). missed says a tick found
	// the lease due while its renewal was in flight, and so sent none.
	renewing, failed, missed bool
	// listed says the lease is in the heartbeat's list.
	listed bool
	// settled, made by settle when a renewal is in flight, is closed when
	// that renewal has returned.
	settled chan struct{}
	// ctx is the execution's context, cancelled when the lease cannot be
	// kept.
	ctx *execCtx
	// patient says that the renewals may wait behind the execution's own
	// transaction (a serial writer's CompleteTx: see Engine.serialTx), and
	// so may any takeover: once a renewal has been sent, the execution is
	// not cancelled for want of renewals, only when one finds the key
	// taken over, and its completion is fenced as any. (A lease that ran
	// out with none sent, the process stalled, is given up as any.)
	// tried says a renewal was sent since the lease last began.
	patient, tried bool
	// log names the key in log records.
	log reqLog
}

// heartbeat renews the leases of the executions running in this process.
// One chain of timers serves the engine, ticking every sixth of the lease
// while anything runs and not at all otherwise; at each tick a lease whose
// last renewal (or claim) is a third of the lease old is renewed, on a
// goroutine of its own, and one that would have less than a sixth of the
// lease left by the next tick, unrenewed, has its execution's context
// cancelled, so that it stops before another may take the key over. A request shorter than a third of
// the lease is never renewed: it costs two list operations.
type heartbeat struct {
	e       *Engine
	mu      sync.Mutex
	head    heldLease // the sentinel of a circular list
	ticking bool
	// tick is every sixth of the lease; each is a third.
	tick, each time.Duration
	// beatFn is beat, made once.
	beatFn func()
	// sameClock says the store decides leases by the engine's own Clock
	// (idem.LocalClock), so that the lease ends it reports are times on
	// that clock.
	sameClock bool
}

func (hb *heartbeat) init(e *Engine) {
	hb.e = e
	hb.head.prev, hb.head.next = &hb.head, &hb.head
	hb.tick = max(e.cfg.Lease/6, time.Millisecond)
	hb.each = max(e.cfg.Lease/3, time.Millisecond)
	hb.beatFn = hb.beat
	if lc, ok := e.store.(idem.LocalClock); ok {
		hb.sameClock = sameClock(lc.LeaseClock(), e.cfg.Clock)
	}
}

// sameClock reports whether a and b are one clock: equal values of a
// comparable type (idem.SystemClock{}, one *idemmem.Clock). Clocks that
// cannot be compared (an idem.ClockFunc) are not known to be one.
func sameClock(a, b idem.Clock) bool {
	va, vb := reflect.ValueOf(a), reflect.ValueOf(b)
	return va.IsValid() && vb.IsValid() && va.Type() == vb.Type() && va.Comparable() && vb.Comparable() && a == b
}

// began returns when the heartbeat counts a lease from, given when the
// claim or renewal that began it was sent and when its answer came, by the
// engine's clock, and the lease's end as the store answered it. Every
// lease the heartbeat holds counts from it, whatever the execution's form:
// it is the one place that decides how long a lease is assumed to last,
// and never longer than the store honours it.
//
// A store on a clock of its own (a server's) began the lease when it ran
// the claim, some time after it was sent: counted from the sending, the
// lease ends no later than the store's, whatever the two clocks read. A
// store that decides leases by the engine's own clock (sameClock) reports
// the lease's end on it: counted from that end less the lease, a claim
// that waited long before the store ran it (behind SQLite's one writer)
// keeps the whole lease it was given, where counted from its sending it
// would be given up at once; and a lease shorter than asked for counts as
// granted. No later than the answer, when the store cannot have begun it
// yet: an end past the answer's time plus the lease is not taken as said.
//
// Such a store keeps the lease's end as a wall-clock time, and other claims
// judge it by the wall clock, so the lease's age is counted on the wall
// clock too (the time carries no monotonic reading): were it counted on the
// monotonic clock, a step of the wall clock forward during the execution
// would end the lease for the store and not for the heartbeat, and another
// execution could take the key while this one ran. A step backward makes
// the lease last longer for both alike.
func (hb *heartbeat) began(sent, answered, end time.Time) time.Time {
	switch {
	case !hb.sameClock:
		return sent
	case end.IsZero():
		return sent.Round(0)
	}
	if began := end.Add(-hb.e.cfg.Lease); began.Before(answered) {
		return began.Round(0)
	}
	return answered.Round(0)
}

// hold starts renewing l, whose claim was sent at sent and acquired the
// key with a lease that ends at end, as the store answered it (zero: not
// known). It is called as soon as the claim's answer has come.
func (hb *heartbeat) hold(l *heldLease, sent, end time.Time) {
	since := hb.began(sent, hb.e.cfg.Clock.Now(), end)
	hb.mu.Lock()
	defer hb.mu.Unlock()
	l.since, l.renewing, l.failed, l.listed, l.tried, l.missed = since, false, false, true, false, false
	l.prev, l.next = hb.head.prev, &hb.head
	hb.head.prev.next = l
	hb.head.prev = l
	if !hb.ticking {
		hb.ticking = true
		hb.e.cfg.Timers.AfterFunc(hb.tick, hb.beatFn)
	}
}

// drop stops renewing l: its execution has settled its key.
func (hb *heartbeat) drop(l *heldLease) {
	hb.mu.Lock()
	defer hb.mu.Unlock()
	if !l.listed {
		return
	}
	l.prev.next, l.next.prev = l.next, l.prev
	l.prev, l.next, l.listed = nil, nil, false
}

// settle stops renewing l, as drop does, and returns once no renewal of
// it is on its way: before an execution yields its lease, since a renewal
// that reached the store after the Yield would give the key a live lease
// again, for nobody, and a retry or a Completer would wait for it to end.
// It waits only when a renewal is in flight, at most that renewal's time
// (a sixth of the lease).
func (hb *heartbeat) settle(l *heldLease) {
	hb.mu.Lock()
	if l.listed {
		l.prev.next, l.next.prev = l.next, l.prev
		l.prev, l.next, l.listed = nil, nil, false
	}
	var wait chan struct{}
	if l.renewing {
		if l.settled == nil {
			l.settled = make(chan struct{})
		}
		wait = l.settled
	}
	hb.mu.Unlock()
	if wait != nil {
		<-wait
	}
}

// beat is one tick: it renews the leases due and gives up those about to
// end, then schedules the next tick while any lease is held.
func (hb *heartbeat) beat() {
	now := hb.e.cfg.Clock.Now()
	lease := hb.e.cfg.Lease
	var due []*heldLease
	hb.mu.Lock()
	for l := hb.head.next; l != &hb.head; l = l.next {
		age := now.Sub(l.since)
		switch {
		case l.failed:
		case age > lease-2*hb.tick && !(l.patient && l.tried):
			// Renewals failed since a third of the lease, and by the next
			// tick less than a sixth of it would be left (the ticks are
			// the engine's, not this lease's: a lease begun between two
			// ends up to a tick later than they see): before it ends, the
			// execution stops, rather than run on while another may take
			// the key over.
			l.failed = true
			l.ctx.fail(fmt.Errorf("%w: the lease could not be renewed for %s, and ends in %s", errLeaseEnding, age.Round(time.Millisecond), (lease - age).Round(time.Millisecond)))
			l.log.LogAttrs(context.Background(), slog.LevelError, "lease not renewed: the execution is cancelled before another may take its key over",
				slog.Duration("since_renewal", age), slog.Duration("lease", lease))
		case !l.renewing && age >= hb.each:
			l.renewing, l.tried = true, true
			due = append(due, l)
		case age >= hb.each:
			// Due, but its renewal is still on its way: the renewal's
			// return makes up for this tick (see renew).
			l.missed = true
		}
	}
	more := hb.head.next != &hb.head
	if !more {
		hb.ticking = false
	}
	hb.mu.Unlock()
	for _, l := range due {
		go hb.renew(l)
	}
	if more {
		hb.e.cfg.Timers.AfterFunc(hb.tick, hb.beatFn)
	}
}

// errLeaseEnding is the cause an execution's context ends with when its
// lease could not be renewed in time: it wraps idem.ErrLeaseLost.
var errLeaseEnding = fmt.Errorf("keyed: lease not renewed: %w", idem.ErrLeaseLost)

// renew renews l once; a renewal that fails for a reason other than the
// key taken over is sent again (see again).
func (hb *heartbeat) renew(l *heldLease) {
	e := hb.e
	sent, sentReal := e.cfg.Clock.Now(), time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), hb.tick)
	end, err := e.store.Renew(ctx, l.ref, e.cfg.Lease)
	cancel()
	answered := e.cfg.Clock.Now()
	hb.mu.Lock()
	defer hb.mu.Unlock()
	l.renewing = false
	missed := l.missed
	l.missed = false
	if l.settled != nil {
		close(l.settled)
		l.settled = nil
	}
	if !l.listed {
		return // settled meanwhile
	}
	switch {
	case err == nil:
		l.since, l.tried = hb.began(sent, answered, end), false
		if missed && !l.failed && answered.Sub(l.since) >= hb.each {
			// A tick found the lease due while this renewal was on its
			// way, and the lease, counted from this one, is due again:
			// renewed at once, not a tick later, when the next tick may
			// be the last before the lease is given up (and an injected
			// clock may stand still until it is renewed).
			l.renewing, l.tried = true, true
			go hb.renew(l)
		}
	case errors.Is(err, idem.ErrLeaseLost):
		// Taken over (or ended by hand): whatever the execution does now
		// will be refused; it stops at once.
		if !l.failed {
			l.failed = true
			l.ctx.fail(fmt.Errorf("keyed: renewing the lease: %w", err))
			l.log.LogAttrs(context.Background(), slog.LevelWarn, "lease lost while the execution ran: it is cancelled", slog.String("error", err.Error()))
		}
	default:
		l.log.LogAttrs(context.Background(), slog.LevelWarn, "could not renew the lease; trying again", slog.String("error", err.Error()))
		if !l.failed {
			// Sent again a tick of real time after this one was sent (at
			// once when it timed out, having taken that long), not at the
			// engine's next tick: the renewal's own timeout is real time,
			// and an injected clock may stand still until the lease is
			// renewed. The beat still gives the lease up as before when
			// no renewal succeeds in time.
			time.AfterFunc(max(hb.tick-time.Since(sentReal), 0), func() { hb.again(l) })
		}
	}
}

// again sends a renewal of l again after one failed, unless l was settled
// or given up meanwhile, or a tick has sent one already.
func (hb *heartbeat) again(l *heldLease) {
	hb.mu.Lock()
	if !l.listed || l.failed || l.renewing {
		hb.mu.Unlock()
		return
	}
	l.renewing, l.tried = true, true
	hb.mu.Unlock()
	hb.renew(l)
}
