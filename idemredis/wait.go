package idemredis

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

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

	left, err := leaseScript.Run(ctx, s.client, []string{rk}, s.now()).Int64()
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
	client  redis.UniversalClient
	channel string
	closed  chan struct{} // closed by close

	mu      sync.Mutex
	ps      *redis.PubSub // nil until the first watch
	ready   chan struct{} // closed when the subscription is first confirmed
	done    chan struct{} // closed when the receive loop has ended
	waiters map[string]map[chan struct{}]struct{}
}

func newHub(client redis.UniversalClient, channel string) *hub {
	return &hub{
		client:  client,
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
	if h.ps == nil {
		// The subscription outlives any one caller, so it does not take
		// the caller's context. go-redis retries the connection on its
		// own, pings it, and resubscribes after a failure.
		h.ps = h.client.Subscribe(context.Background(), h.channel)
		h.done = make(chan struct{})
		go h.receive(h.ps.ChannelWithSubscriptions(), h.ready, h.done)
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

// receive delivers the subscription's messages until it is closed. The
// first confirmation makes the subscription ready; a later one means it
// reconnected, and changes published in between were lost, so every waiter
// is woken to look again.
func (h *hub) receive(msgs <-chan any, ready, done chan struct{}) {
	defer close(done)
	subscribed := false
	for m := range msgs {
		switch m := m.(type) {
		case *redis.Subscription:
			if m.Kind != "subscribe" {
				continue
			}
			if !subscribed {
				subscribed = true
				close(ready)
				continue
			}
			h.wakeAll()
		case *redis.Message:
			h.wake(m.Payload)
		}
	}
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

// close stops the subscription and waits for its receive loop to end.
func (h *hub) close() {
	h.mu.Lock()
	close(h.closed)
	ps, done := h.ps, h.done
	h.mu.Unlock()
	if ps != nil {
		_ = ps.Close()
		<-done
	}
}
