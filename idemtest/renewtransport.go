package idemtest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/idem-go/idem"
)

// renewer subscribes and returns the stream as an idem.BatchRenewer, or
// skips the test when it is not one.
func (e *transportEnv) renewer(topic, consumer string) idem.BatchRenewer {
	e.t.Helper()
	s := e.subscribe(topic, consumer)
	br, ok := s.(idem.BatchRenewer)
	if !ok {
		e.t.Skip("the transport's streams are not idem.BatchRenewer")
	}
	return br
}

// takeAll returns the next n deliveries of s, one message each.
func (e *transportEnv) takeAll(s idem.Stream, n int, what string) []idem.Delivery {
	e.t.Helper()
	var ds []idem.Delivery
	seen := make(map[string]bool)
	for deliveries := 0; len(ds) < n; deliveries++ {
		e.bound(deliveries, n, len(ds))
		d := e.next(s, fmt.Sprintf("%s, %d of %d", what, len(ds)+1, n))
		if id := d.Message().ID; !seen[id] {
			seen[id] = true
			ds = append(ds, d)
		}
	}
	return ds
}

// testBatchRenew: one InProgressBatch holds every delivery of the call for
// a whole AckWait from the call, beyond where their first AckWait ended,
// and no longer; none of them is reported stale.
func testBatchRenew(t *testing.T, e *transportEnv) {
	const n = 3
	e.untilDecided("BatchRenew", func(topic, consumer string, try int) bool {
		s := e.renewer(topic, consumer)
		for i := range n {
			e.publish(e.msg(topic, i))
		}
		held := e.now() // the AckWaits begin no earlier: the Nexts are yet to hand them out
		ds := e.takeAll(s, n, "the messages to renew")
		e.notBefore(s, held, e.ackWait*3/4, "the AckWait has not passed")
		asked := e.now()
		stale, err := s.InProgressBatch(e.ctx, ds)
		if err != nil {
			t.Fatalf("InProgressBatch of %d deliveries within their AckWait: %v", n, err)
		}
		if len(stale) > 0 {
			if e.pastAckWait(try, "InProgressBatch", fmt.Errorf("deliveries %v: %w", stale, idem.ErrStaleDelivery), held) {
				_ = s.Close()
				return false
			}
			t.Fatalf("InProgressBatch of %d deliveries within their AckWait reported %v stale, want none", n, stale)
		}
		// Held for a whole AckWait from the call (counted from before it:
		// the transport renews no earlier)...
		e.notBefore(s, asked, e.ackWait, "InProgressBatch holds every delivery for another AckWait")
		// ...and no longer.
		again := []idem.Delivery{e.after(s, asked, e.ackWait, "a message after the AckWait that InProgressBatch started")}
		again = append(again, e.takeAll(s, n-1, "the other messages after that AckWait")...)
		for _, d := range again {
			e.ack(d)
		}
		return true
	})
}

// testBatchRenewStale: in one InProgressBatch, a delivery whose AckWait
// ended and whose message was handed out again since, and a delivery
// settled already, are reported stale, by their indexes, and change
// nothing; the others of the call, the message's later delivery among
// them, are renewed all the same.
func testBatchRenewStale(t *testing.T, e *transportEnv) {
	e.untilDecided("BatchRenewStale", func(topic, consumer string, try int) bool {
		s := e.renewer(topic, consumer)
		m1 := e.msg(topic, 1)
		e.publish(m1)
		from := e.now()                // the AckWait begins no earlier than the Next
		first := e.nextID(s, m1.ID, 1) // and never settled
		// The later delivery is handed out once the first's AckWait has
		// passed, no earlier than an AckWait after from.
		again := from.Add(e.ackWait)
		second := e.after(s, from, e.ackWait, "the message whose AckWait ended")
		if second.Message().ID != m1.ID {
			t.Fatalf("Next = %q, want %q again", second.Message().ID, m1.ID)
		}
		e.publish(e.msg(topic, 2), e.msg(topic, 3))
		ds := e.takeAll(s, 2, "two messages more")
		settled, live := ds[0], ds[1]
		e.ack(settled)
		e.notBefore(s, again, e.ackWait*3/4, "the later delivery's AckWait has not passed")
		asked := e.now()
		stale, err := s.InProgressBatch(e.ctx, []idem.Delivery{first, settled, second, live})
		if err != nil {
			t.Fatalf("InProgressBatch with stale deliveries = %v, want them reported, not an error", err)
		}
		if slices.ContainsFunc(stale, func(i int) bool { return i >= 2 }) &&
			e.pastAckWait(try, "InProgressBatch", fmt.Errorf("deliveries %v: %w", stale, idem.ErrStaleDelivery), again) {
			_ = s.Close()
			return false
		}
		if !slices.Equal(stale, []int{0, 1}) {
			t.Fatalf("InProgressBatch(a delivery handed out again since, one acknowledged, two held) reported %v stale, want [0 1]", stale)
		}
		// The stale deliveries changed nothing, and the live ones are held
		// for a whole AckWait from the call.
		e.notBefore(s, asked, e.ackWait, "InProgressBatch holds the live deliveries for another AckWait")
		back := []idem.Delivery{e.after(s, asked, e.ackWait, "a message after the AckWait that InProgressBatch started")}
		back = append(back, e.takeAll(s, 1, "the other message after that AckWait")...)
		want := []string{m1.ID, live.Message().ID}
		var got []string
		for _, d := range back {
			got = append(got, d.Message().ID)
			e.ack(d)
		}
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("after the AckWait, messages %q came back, want %q", got, want)
		}
		return true
	})
}

// testBatchRenewInvalid: a delivery of another stream is refused with an
// idem.ErrInvalidArgument, and the call renews nothing; an empty call is a
// no-op.
func testBatchRenewInvalid(t *testing.T, e *transportEnv) {
	topic := e.topic("orders")
	s := e.renewer(topic, e.consumer("c"))
	other := e.subscribe(topic, e.consumer("other"))
	if stale, err := s.InProgressBatch(e.ctx, nil); stale != nil || err != nil {
		t.Errorf("InProgressBatch(nil) = %v, %v; want nil, nil", stale, err)
	}
	if stale, err := s.InProgressBatch(e.ctx, []idem.Delivery{}); stale != nil || err != nil {
		t.Errorf("InProgressBatch(none) = %v, %v; want nil, nil", stale, err)
	}
	m := e.msg(topic, 1)
	e.publish(m)
	held := e.now()
	d := e.nextID(s, m.ID, 1)
	foreign := e.nextID(other, m.ID, 1)
	if e.clock != nil {
		// Late in the AckWait, so that a renewal would show.
		e.notBefore(s, held, e.ackWait*3/4, "the AckWait has not passed")
	}
	stale, err := s.InProgressBatch(e.ctx, []idem.Delivery{d, foreign})
	if !errors.Is(err, idem.ErrInvalidArgument) {
		t.Fatalf("InProgressBatch with a delivery of another stream = %v, %v; want idem.ErrInvalidArgument", stale, err)
	}
	if stale != nil {
		t.Errorf("InProgressBatch refused = %v stale, want nil", stale)
	}
	e.ack(foreign)
	if e.clock == nil {
		// On real time, the suite's margins cannot tell a renewal from
		// none: only the manual clock checks that nothing was renewed.
		e.ack(d)
		return
	}
	// Nothing was renewed: the message comes back when its first AckWait
	// ends.
	e.clock.Set(held.Add(e.ackWait))
	ctx, cancel := context.WithTimeout(e.ctx, waitLimit)
	defer cancel()
	again, err := s.Next(ctx)
	if err != nil {
		t.Fatalf("Next at the end of the AckWait that a refused InProgressBatch must not have renewed: %v", err)
	}
	if again.Message().ID != m.ID {
		t.Fatalf("Next = %q, want %q again", again.Message().ID, m.ID)
	}
	e.ack(again)
}

// testBatchRenewBounds: InProgressBatch renews the deliveries of the call
// and no other that the stream holds, and, as InProgress does, refuses as
// stale (renewing it no more) a delivery whose AckWait has ended though
// its message has not been handed out again yet. On the manual clock only:
// on real time a renewal of one delivery more cannot be told from none.
func testBatchRenewBounds(t *testing.T, e *transportEnv) {
	if e.clock == nil {
		t.Skip("the manual clock tells which deliveries a call renewed; real time cannot")
	}
	topic := e.topic("orders")
	s := e.renewer(topic, e.consumer("c"))
	msgs := []idem.Message{e.msg(topic, 1), e.msg(topic, 2), e.msg(topic, 3)}
	e.publish(msgs...)
	held := e.now()
	byID := make(map[string]idem.Delivery)
	for _, d := range e.takeAll(s, len(msgs), "the messages to renew") {
		byID[d.Message().ID] = d
	}
	a, b := byID[msgs[0].ID], byID[msgs[1].ID]
	// Halfway through the AckWait, renew a alone: b and c keep theirs.
	e.clock.Set(held.Add(e.ackWait / 2))
	if stale, err := s.InProgressBatch(e.ctx, []idem.Delivery{a}); err != nil || len(stale) != 0 {
		t.Fatalf("InProgressBatch(a) halfway through its AckWait = %v, %v; want nothing stale", stale, err)
	}
	// At the end of b's AckWait (no Next has handed it out again), b is
	// stale and a, renewed, is not.
	e.clock.Set(held.Add(e.ackWait))
	stale, err := s.InProgressBatch(e.ctx, []idem.Delivery{a, b})
	if err != nil {
		t.Fatalf("InProgressBatch(a, b) at the end of b's AckWait: %v", err)
	}
	if !slices.Equal(stale, []int{1}) {
		t.Fatalf("InProgressBatch(a renewed since, b whose AckWait has just ended and that no call renewed) reported %v stale, want [1]", stale)
	}
	// b was not renewed, nor c, left out of both calls: both come back
	// now; a, renewed, does not.
	var got []string
	for _, d := range e.takeAll(s, 2, "the messages whose AckWait ended") {
		got = append(got, d.Message().ID)
		e.ack(d)
	}
	slices.Sort(got)
	if want := []string{msgs[1].ID, msgs[2].ID}; !slices.Equal(got, want) {
		t.Errorf("at the end of the first AckWait, messages %q came back, want %q", got, want)
	}
	e.none(s, "the renewed delivery is held")
	e.ack(a)
}
