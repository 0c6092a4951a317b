package idemredis

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem"
)

// errClosed is returned by WaitChange once the store is closed.
var errClosed = errors.New("idemredis: store closed")

// readyWait bounds how long WaitChange waits for the store's subscription
// to be confirmed before it returns (a spurious return, allowed by
// idem.Waiter) so that the caller claims again and sees whether Redis
// answers at all.
const readyWait = 5 * time.Second

// WaitChange implements idem.Waiter. It returns at once when the key is not
// in flight under a live lease (absent, completed, or claimable by takeover),
// since a Claim would then make progress. Otherwise it flags the record as
// waited on and waits until a Store sharing this Redis and prefix, in any
// process, completes, releases or takes over the key (each publishes on
// "<prefix>:changes" a change to a flagged record; a takeover always does),
// until the lease ends, or until ctx is done. After the subscription
// reconnects it returns too, since a change may have been published while
// it was down.
//
// The store keeps one subscription for all its waiters, started by the
// first WaitChange and stopped by Close.
func (s *Store) WaitChange(ctx context.Context, scope idem.Scope, key idem.Key) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	rk := recordKey(s.prefix, scope, key)
	// Register before reading the record, and read it only once the
	// subscription is live. The read flags the record as waited on, in the
	// same script, and a flagged record's change is published: a change
	// made after the read is then always delivered, and one made before it
	// is seen by the read.
	w, ready, closed := s.hub.watch(rk)
	defer s.hub.unwatch(rk, w)
	select {
	case <-closed:
		return errClosed
	default:
	}

	t := time.NewTimer(readyWait)
	defer t.Stop()
	select {
	case <-ready:
	case <-t.C:
		return nil
	case <-closed:
		return errClosed
	case <-ctx.Done():
		return ctx.Err()
	}

	left, err := s.conn.evalInt(ctx, leaseScript, []string{rk}, s.scriptNow())
	if err != nil {
		return fail("wait", err)
	}
	if left <= 0 {
		return nil
	}
	// Wake when the lease ends too, so that a duplicate takes over a
	// crashed holder's key promptly. With an injected clock this is the
	// remaining lease by that clock, in real time: at worst a spurious
	// return.
	t.Reset(time.Duration(left)*time.Microsecond + time.Millisecond)
	select {
	case <-w:
		return nil
	case <-t.C:
		return nil
	case <-closed:
		return errClosed
	case <-ctx.Done():
		return ctx.Err()
	}
}

// hub is a store's single pub/sub subscription to its change channel,
// fanned out to the local waiters by record key.
type hub struct {
	conn      conn
	channel   string
	closed    chan struct{} // closed by close
	ready     chan struct{} // closed when the subscription is first confirmed
	confirmed atomic.Bool

	mu      sync.Mutex
	stop    func() // nil until the first watch
	waiters map[string]map[chan struct{}]struct{}
}

func newHub(c conn, channel string) *hub {
	return &hub{
		conn:    c,
		channel: channel,
		closed:  make(chan struct{}),
		ready:   make(chan struct{}),
		waiters: make(map[string]map[chan struct{}]struct{}),
	}
}

// watch registers a waiter on key, starting the subscription if needed. It
// returns the waiter's channel, a channel closed once the subscription is
// live, and one closed when the store is closed.
func (h *hub) watch(key string) (w chan struct{}, ready, closed <-chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	ch := make(chan struct{}, 1)
	set := h.waiters[key]
	if set == nil {
		set = make(map[chan struct{}]struct{})
		h.waiters[key] = set
	}
	set[ch] = struct{}{}
	select {
	case <-h.closed:
		return ch, h.ready, h.closed
	default:
	}
	if h.stop == nil {
		h.stop = h.conn.subscribe(h.channel, h.subscribed, h.wake)
	}
	return ch, h.ready, h.closed
}

func (h *hub) unwatch(key string, w chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	set := h.waiters[key]
	delete(set, w)
	if len(set) == 0 {
		delete(h.waiters, key)
	}
}

// subscribed is called on each confirmation of the subscription. The
// first makes it ready; a later one means it reconnected, and changes
// published in between were lost, so every waiter is woken to look again.
func (h *hub) subscribed() {
	if h.confirmed.CompareAndSwap(false, true) {
		close(h.ready)
		return
	}
	h.wakeAll()
}

func (h *hub) wake(key string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for ch := range h.waiters[key] {
		notify(ch)
	}
}

func (h *hub) wakeAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, set := range h.waiters {
		for ch := range set {
			notify(ch)
		}
	}
}

// notify signals ch without blocking: one pending signal is enough, the
// waiter returns on the first.
func notify(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// close stops the subscription and waits for its goroutine to end.
func (h *hub) close() {
	h.mu.Lock()
	close(h.closed)
	stop := h.stop
	h.mu.Unlock()
	if stop != nil {
		stop()
	}
}
