package idemtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
)

// TransportFeatures says what a transport supports beyond what every
// transport must do, so that TestTransport checks only what the transport
// promises. A feature left false is skipped with the reason, not failed.
type TransportFeatures struct {
	// DelayedNack: Nack's delay is honoured; the message comes back after
	// it and not before. Without it, the suite only checks that a Nack
	// brings the message back.
	DelayedNack bool
	// AttemptCount: Attempt counts every delivery of a message to a
	// consumer name, across subscriptions, so it survives a consumer's
	// restart. Without it, the suite only checks that a first delivery is
	// attempt 1.
	AttemptCount bool
	// AckWait: a delivery left unsettled for Subscription.AckWait is
	// delivered again.
	AckWait bool
	// InProgress: InProgress holds a delivery for another AckWait. Checked
	// only together with AckWait.
	InProgress bool
	// Term: Term settles a delivery for good. Without it, the suite does
	// not call Term.
	Term bool
	// OrderedPerTopic: a consumer receives one topic's messages in the
	// order they were published (redeliveries aside).
	OrderedPerTopic bool
	// CountsPrefetched: the broker counts as an attempt every delivery to
	// the consumer's buffer, also one the consumer never took from it
	// before its stream closed (RabbitMQ's prefetch: the message goes back
	// to the queue with its delivery count raised). The suite then does
	// not check that interrupted Nexts leave the attempt count alone, only
	// that they leave nothing held.
	CountsPrefetched bool
	// RealTime: the transport runs on real time, as a broker does, and
	// cannot be moved by the suite's Clock. The suite passes
	// idem.SystemClock to the constructor, and waits, with deadlines, for
	// delays and AckWaits to end.
	RealTime bool
	// Tick is, in RealTime mode, the unit of the suite's waits: Nack delays
	// and AckWaits are two Ticks, and a message that must not arrive is
	// waited for during one Tick. It must be long enough for the transport
	// to deliver a message that is due. Defaults to 500ms. Unused without
	// RealTime.
	Tick time.Duration
}

// TestTransport runs the conformance suite of idem.Publisher and
// idem.Subscriber as subtests of t: a byte-exact round trip of ID, topic,
// key, headers and payload; Ack and Term settle, and a settled delivery
// refuses a second settlement; Nack, AckWait and a closed
// stream bring a message back to the same consumer name, with its attempt
// count; InProgress holds it; two consumer names each get every message;
// order per topic; Next honours its context and Close; invalid messages and
// subscriptions are refused with idem.ErrInvalidArgument; 1,000 messages
// all arrive; a Next cancelled a moment after it starts, again and again,
// leaves nothing held and counts no attempt nobody received. When the
// streams are idem.BatchStream, it also checks NextBatch (at most max, in
// order, each message once per hand-out) and AckBatch (one call settles a
// batch; stale deliveries are passed over, not refused). When they are
// idem.BatchRenewer, it checks InProgressBatch: one call holds every
// delivery for another AckWait, reports by index those settled or handed
// out again (and renews the others of the call all the same), and, on the
// manual clock, one whose AckWait has just ended with no Next since,
// renews no delivery left out of the call, refuses a delivery of another
// stream with idem.ErrInvalidArgument, renewing nothing, and does nothing
// when empty. Delivery is at least once, so the
// suite tolerates duplicates wherever the contract does.
//
// newTransport is called once per subtest, from that subtest's goroutine,
// and returns the publishing and subscribing sides of one transport (often
// the same value), reading the time from clock. It should register any
// cleanup with t.Cleanup. Subtests run in parallel. On a shared broker they
// stay apart by their names: topics are "idemtest.<run>.<word>", consumer
// names "<word>-<run>" and message IDs begin with "<run>-", where run is
// eight hexadecimal digits drawn per subtest, so a stream or exchange bound
// to "idemtest.>" or "idemtest.#" serves them all and a broker's
// de-duplication window never mistakes one subtest's message for another's.
//
// Subscriptions are always made before the messages they should receive are
// published, since some brokers (RabbitMQ) route a message only to the
// queues that exist when it is published.
//
// Without f.RealTime, time moves only when the suite moves the Clock, so a
// transport must take every "now" from it; a transport that waits on its
// own timers should look at the clock again at least every few
// milliseconds. A message that must not arrive is waited for during 100ms
// of real time.
func TestTransport(t *testing.T, f TransportFeatures, newTransport func(t *testing.T, clock idem.Clock) (idem.Publisher, idem.Subscriber)) {
	t.Helper()
	for _, tc := range transportTests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if tc.needs != nil {
				if why := tc.needs(f); why != "" {
					t.Skip(why)
				}
			}
			tc.run(t, newTransportEnv(t, f, newTransport))
		})
	}
}

var transportTests = []struct {
	name string
	// needs returns why the test cannot run on a transport with f, or "".
	needs func(f TransportFeatures) string
	run   func(t *testing.T, e *transportEnv)
}{
	{"RoundTrip", nil, testRoundTrip},
	{"AckSettles", nil, testAckSettles},
	{"NackRedelivers", nil, testNackRedelivers},
	{"NackDelay", needs("DelayedNack", func(f TransportFeatures) bool { return f.DelayedNack }), testNackDelay},
	{"AckWait", needs("AckWait", func(f TransportFeatures) bool { return f.AckWait }), testAckWait},
	{"InProgress", needs("AckWait and InProgress", func(f TransportFeatures) bool { return f.AckWait && f.InProgress }), testInProgress},
	{"TermSettles", needs("Term", func(f TransportFeatures) bool { return f.Term }), testTermSettles},
	{"SettledIsStale", nil, testSettledIsStale},
	{"ExpiredIsStale", needs("AckWait", func(f TransportFeatures) bool { return f.AckWait }), testExpiredIsStale},
	{"NackNegative", nil, testNackNegative},
	{"Durable", nil, testDurable},
	{"TwoConsumers", nil, testTwoConsumers},
	{"OrderedPerTopic", needs("OrderedPerTopic", func(f TransportFeatures) bool { return f.OrderedPerTopic }), testOrderedPerTopic},
	{"NextContext", nil, testNextContext},
	{"NextClose", nil, testNextClose},
	{"Invalid", nil, testInvalidMessages},
	{"Many", nil, testManyMessages},
	{"NextInterrupted", nil, testNextInterrupted},
	{"BatchTakeAndAck", nil, testBatchTakeAndAck},
	{"BatchAckPassesOverStale", nil, testBatchAckPassesOverStale},
	{"BatchInvalid", nil, testBatchStreamInvalid},
	{"BatchRenew", needs("AckWait and InProgress", func(f TransportFeatures) bool { return f.AckWait && f.InProgress }), testBatchRenew},
	{"BatchRenewStale", needs("AckWait and InProgress", func(f TransportFeatures) bool { return f.AckWait && f.InProgress }), testBatchRenewStale},
	{"BatchRenewInvalid", nil, testBatchRenewInvalid},
	{"BatchRenewBounds", needs("AckWait and InProgress", func(f TransportFeatures) bool { return f.AckWait && f.InProgress }), testBatchRenewBounds},
}

func needs(feature string, has func(TransportFeatures) bool) func(TransportFeatures) string {
	return func(f TransportFeatures) string {
		if has(f) {
			return ""
		}
		return "the transport does not declare TransportFeatures." + feature
	}
}

// transportEnv is one subtest's transport, clock and names.
type transportEnv struct {
	t   *testing.T
	ctx context.Context
	f   TransportFeatures
	// clock is nil in RealTime mode.
	clock *idemmem.Clock
	pub   idem.Publisher
	sub   idem.Subscriber
	// run tells this subtest's topics, consumers and IDs apart from other
	// subtests' on a shared broker.
	run string

	nackDelay, ackWait, quiet time.Duration
}

func newTransportEnv(t *testing.T, f TransportFeatures, newTransport func(*testing.T, idem.Clock) (idem.Publisher, idem.Subscriber)) *transportEnv {
	t.Helper()
	e := &transportEnv{t: t, ctx: t.Context(), f: f, run: fmt.Sprintf("%08x", rand.Uint32())}
	var clock idem.Clock
	if f.RealTime {
		tick := f.Tick
		if tick <= 0 {
			tick = 500 * time.Millisecond
		}
		e.nackDelay, e.ackWait, e.quiet = 2*tick, 2*tick, tick
		clock = idem.SystemClock{}
	} else {
		e.nackDelay, e.ackWait, e.quiet = 10*time.Second, 30*time.Second, 100*time.Millisecond
		e.clock = idemmem.NewClock(Start)
		clock = e.clock
	}
	e.pub, e.sub = newTransport(t, clock)
	if e.pub == nil || e.sub == nil {
		t.Fatal("newTransport returned a nil Publisher or Subscriber")
	}
	return e
}

func (e *transportEnv) topic(word string) string    { return "idemtest." + e.run + "." + word }
func (e *transportEnv) consumer(word string) string { return word + "-" + e.run }

// msg returns message i of topic, one of e.topic's, with an ID unique to
// the subtest.
func (e *transportEnv) msg(topic string, i int) idem.Message {
	return idem.Message{
		ID:      fmt.Sprintf("%s-%s-%d", e.run, strings.TrimPrefix(topic, e.topic("")), i),
		Topic:   topic,
		Payload: fmt.Appendf(nil, "payload %d", i),
	}
}

func (e *transportEnv) now() time.Time {
	if e.clock != nil {
		return e.clock.Now()
	}
	return time.Now()
}

func (e *transportEnv) subscribe(topic, consumer string) idem.Stream {
	e.t.Helper()
	s, err := e.sub.Subscribe(e.ctx, idem.Subscription{Topic: topic, Consumer: consumer, AckWait: e.ackWait})
	if err != nil {
		e.t.Fatalf("Subscribe(%q, %q): %v", topic, consumer, err)
	}
	e.t.Cleanup(func() { _ = s.Close() })
	return s
}

func (e *transportEnv) publish(msgs ...idem.Message) {
	e.t.Helper()
	if err := e.pub.Publish(e.ctx, msgs...); err != nil {
		e.t.Fatalf("Publish(%d messages): %v", len(msgs), err)
	}
}

// next returns the stream's next delivery, waiting up to waitLimit.
func (e *transportEnv) next(s idem.Stream, what string) idem.Delivery {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.ctx, waitLimit)
	defer cancel()
	d, err := s.Next(ctx)
	if err != nil {
		e.t.Fatalf("Next, waiting for %s: %v", what, err)
	}
	if d == nil {
		e.t.Fatalf("Next, waiting for %s: a nil Delivery and no error", what)
	}
	return d
}

// nextID is next, and checks the delivery's message ID and, when the
// transport counts attempts or wantAttempt is 1, its attempt.
func (e *transportEnv) nextID(s idem.Stream, id string, wantAttempt int) idem.Delivery {
	e.t.Helper()
	d := e.next(s, id)
	if got := d.Message().ID; got != id {
		e.t.Fatalf("Next = message %q (attempt %d), want %q", got, d.Attempt(), id)
	}
	if (wantAttempt == 1 || e.f.AttemptCount) && d.Attempt() != wantAttempt {
		e.t.Errorf("message %q: Attempt = %d, want %d", id, d.Attempt(), wantAttempt)
	}
	if d.Attempt() < 1 {
		e.t.Errorf("message %q: Attempt = %d, want at least 1", id, d.Attempt())
	}
	return d
}

// noneUntil fails if s delivers anything before deadline.
func (e *transportEnv) noneUntil(s idem.Stream, deadline time.Time, why string) {
	e.t.Helper()
	ctx, cancel := context.WithDeadline(e.ctx, deadline)
	defer cancel()
	d, err := s.Next(ctx)
	switch {
	case err == nil:
		e.t.Fatalf("Next = message %q (attempt %d), want nothing: %s", d.Message().ID, d.Attempt(), why)
	case !errors.Is(err, context.DeadlineExceeded):
		e.t.Fatalf("Next, expecting nothing (%s): %v, want context.DeadlineExceeded", why, err)
	}
}

// none fails if s delivers anything in the quiet time.
func (e *transportEnv) none(s idem.Stream, why string) {
	e.t.Helper()
	e.noneUntil(s, time.Now().Add(e.quiet), why)
}

// noneWhileHeld is none for a stream holding a delivery unsettled since
// held (a time no later than its handout): on real time its quiet wait
// ends by half the delivery's AckWait, so that the message cannot come
// back for its AckWait inside the wait, and the caller has the other half
// to settle it.
func (e *transportEnv) noneWhileHeld(s idem.Stream, held time.Time, why string) {
	e.t.Helper()
	if e.clock != nil {
		e.none(s, why)
		return
	}
	e.noneUntil(s, minTime(time.Now().Add(e.quiet), held.Add(e.ackWait/2)), why)
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// notBefore checks that s delivers nothing until d after from: the manual
// clock is moved to just before that, or, on real time, the suite waits
// until nine tenths of it (a broker may round its timers).
func (e *transportEnv) notBefore(s idem.Stream, from time.Time, d time.Duration, why string) {
	e.t.Helper()
	if e.clock != nil {
		e.clock.Set(from.Add(d - time.Millisecond))
		e.none(s, why)
		return
	}
	e.noneUntil(s, from.Add(d*9/10), why)
}

// after moves the manual clock to d after from; on real time it only
// checks, when the message comes, that as long has passed. Either way it
// returns the next delivery.
func (e *transportEnv) after(s idem.Stream, from time.Time, d time.Duration, what string) idem.Delivery {
	e.t.Helper()
	if e.clock != nil {
		if to := from.Add(d); e.clock.Now().Before(to) {
			e.clock.Set(to)
		}
		return e.next(s, what)
	}
	dl := e.next(s, what)
	if elapsed := time.Since(from); elapsed < d*9/10 {
		e.t.Errorf("%s came after %v, before its %v had passed", what, elapsed, d)
	}
	return dl
}

// passAckWait lets the AckWait of what was delivered by now end: the
// manual clock moves past it; real time needs no help, since the caller
// then waits up to waitLimit, longer than the suite's AckWait.
func (e *transportEnv) passAckWait() {
	if e.clock != nil {
		e.clock.Advance(e.ackWait + time.Millisecond)
	}
}

// noneThroughAckWait checks that s delivers nothing until the AckWait of
// what was delivered by now has ended.
func (e *transportEnv) noneThroughAckWait(s idem.Stream, why string) {
	e.t.Helper()
	if e.clock != nil {
		e.passAckWait()
		e.none(s, why)
		return
	}
	e.noneUntil(s, time.Now().Add(e.ackWait+e.quiet), why)
}

func (e *transportEnv) ack(d idem.Delivery) {
	e.t.Helper()
	if err := d.Ack(e.ctx); err != nil {
		e.t.Fatalf("Ack(%q): %v", d.Message().ID, err)
	}
}

// bound stops a loop that waits for n distinct messages when it has had
// ten deliveries for each: duplicates are allowed, a transport that hands
// out the same messages forever is not.
func (e *transportEnv) bound(deliveries, n, distinct int) {
	e.t.Helper()
	if deliveries > 10*n {
		e.t.Fatalf("%d deliveries brought only %d of %d distinct messages", deliveries, distinct, n)
	}
}

// messageDiff describes how got differs from want, or returns "". Nil and
// empty headers, and nil and empty payloads, count as equal. Times are
// compared only when withTime is set.
func messageDiff(got, want idem.Message, withTime bool) string {
	var diffs []string
	diff := func(field string, g, w any) {
		diffs = append(diffs, fmt.Sprintf("%s = %q, want %q", field, g, w))
	}
	if got.ID != want.ID {
		diff("ID", got.ID, want.ID)
	}
	if got.Topic != want.Topic {
		diff("Topic", got.Topic, want.Topic)
	}
	if got.Key != want.Key {
		diff("Key", got.Key, want.Key)
	}
	if len(got.Headers) != len(want.Headers) || !maps.Equal(got.Headers, want.Headers) {
		diffs = append(diffs, fmt.Sprintf("Headers = %q, want %q", got.Headers, want.Headers))
	}
	if !bytes.Equal(got.Payload, want.Payload) {
		diff("Payload", got.Payload, want.Payload)
	}
	if withTime && !got.Time.Equal(want.Time) {
		diffs = append(diffs, fmt.Sprintf("Time = %v, want %v", got.Time, want.Time))
	}
	return joinLines(diffs)
}

func testRoundTrip(t *testing.T, e *transportEnv) {
	topic := e.topic("orders")
	s := e.subscribe(topic, e.consumer("c"))
	full := idem.Message{
		ID:    e.run + "-full",
		Topic: topic,
		Key:   "order-7",
		Headers: map[string]string{
			"Idem-Fault":    "fail-times=3",
			"X-Empty":       "",
			"X-Unicode":     "ünïcødé ✓",
			"Content-Type":  "application/json",
			"X-Long-Header": string(bytes.Repeat([]byte("h"), 512)),
		},
		Payload: []byte("{\"amount\":1250}\x00\xff\xfe\n"),
	}
	bare := idem.Message{ID: e.run + "-bare", Topic: topic}
	big := idem.Message{ID: e.run + "-big", Topic: topic, Key: "k", Payload: bytes.Repeat([]byte{0, 1, 2, 0xff}, 16<<10)}
	wants := []idem.Message{full, bare, big}

	sent := make([]idem.Message, len(wants))
	for i, m := range wants {
		sent[i] = idem.Message{ID: m.ID, Topic: m.Topic, Key: m.Key, Headers: maps.Clone(m.Headers), Payload: bytes.Clone(m.Payload)}
	}
	e.publish(sent...)
	// A transport must not keep the caller's memory: changing it after
	// Publish changes nothing delivered.
	sent[0].Headers["Idem-Fault"] = "changed"
	sent[0].Payload[0] = '['

	// Each is acknowledged as it comes, what it carried kept for the
	// checks: held unsettled until the last came, the first could come
	// back, on real time, once its AckWait had passed.
	type arrived struct {
		msg     idem.Message
		attempt int
	}
	got := make(map[string]arrived)
	for deliveries := 0; len(got) < len(wants); deliveries++ {
		e.bound(deliveries, len(wants), len(got))
		d := e.next(s, "the published messages")
		if _, again := got[d.Message().ID]; !again {
			got[d.Message().ID] = arrived{d.Message(), d.Attempt()}
		}
		e.ack(d)
	}
	for _, want := range wants {
		a, ok := got[want.ID]
		if !ok {
			t.Errorf("message %q never arrived; got %v", want.ID, slices.Collect(maps.Keys(got)))
			continue
		}
		if diff := messageDiff(a.msg, want, false); diff != "" {
			t.Errorf("message %q differs:\n\t%s", want.ID, diff)
		}
		if a.attempt != 1 {
			t.Errorf("message %q: first delivery has Attempt = %d, want 1", want.ID, a.attempt)
		}
	}
}

func testAckSettles(t *testing.T, e *transportEnv) {
	topic, c := e.topic("orders"), e.consumer("c")
	s := e.subscribe(topic, c)
	m := e.msg(topic, 1)
	e.publish(m)
	e.ack(e.nextID(s, m.ID, 1))
	e.noneThroughAckWait(s, "an acknowledged message must not come back")
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}

	// The next incarnation of the consumer does not get it either: the
	// first thing it gets is a message published afterwards.
	s2 := e.subscribe(topic, c)
	marker := e.msg(topic, 2)
	e.publish(marker)
	e.ack(e.nextID(s2, marker.ID, 1))
}

func testNackRedelivers(t *testing.T, e *transportEnv) {
	topic := e.topic("orders")
	s := e.subscribe(topic, e.consumer("c"))
	m := e.msg(topic, 1)
	e.publish(m)
	if err := e.nextID(s, m.ID, 1).Nack(e.ctx, 0); err != nil {
		t.Fatalf("Nack: %v", err)
	}
	e.ack(e.nextID(s, m.ID, 2))
	e.none(s, "the redelivery was acknowledged")
}

func testNackDelay(t *testing.T, e *transportEnv) {
	topic := e.topic("orders")
	s := e.subscribe(topic, e.consumer("c"))
	m1, m2 := e.msg(topic, 1), e.msg(topic, 2)
	e.publish(m1, m2)
	d := e.nextID(s, m1.ID, 1)
	from := e.now()
	if err := d.Nack(e.ctx, e.nackDelay); err != nil {
		t.Fatalf("Nack(%v): %v", e.nackDelay, err)
	}
	// A message waiting for its retry does not hold up the next one.
	e.ack(e.nextID(s, m2.ID, 1))
	e.notBefore(s, from, e.nackDelay, "the Nack delay has not passed")
	e.ack(e.after(s, from, e.nackDelay, "the Nacked message"))
}

func testAckWait(t *testing.T, e *transportEnv) {
	topic := e.topic("orders")
	s := e.subscribe(topic, e.consumer("c"))
	m := e.msg(topic, 1)
	e.publish(m)
	// The AckWait begins when the transport hands the message out, which
	// is before Next returns it: the waits count from before the Next.
	// Counted from its return, on real time, a Next that took a tenth of
	// the AckWait would have the message back inside the quiet wait.
	from := e.now()
	e.nextID(s, m.ID, 1) // and never settled
	e.notBefore(s, from, e.ackWait, "the AckWait has not passed")
	d := e.after(s, from, e.ackWait, "the message whose AckWait ended")
	if d.Message().ID != m.ID {
		t.Fatalf("Next = %q, want %q again", d.Message().ID, m.ID)
	}
	if e.f.AttemptCount && d.Attempt() != 2 {
		t.Errorf("Attempt = %d after AckWait, want 2", d.Attempt())
	}
	e.ack(d)
}

func testInProgress(t *testing.T, e *transportEnv) {
	e.untilDecided("InProgress", func(topic, consumer string, try int) bool {
		s := e.subscribe(topic, consumer)
		m := e.msg(topic, 1)
		e.publish(m)
		held := e.now() // the AckWait begins no earlier: the Next is yet to hand it out
		d := e.nextID(s, m.ID, 1)
		e.notBefore(s, held, e.ackWait*3/4, "the AckWait has not passed")
		asked := e.now()
		if err := d.InProgress(e.ctx); err != nil {
			if e.pastAckWait(try, "InProgress", err, held) {
				_ = s.Close()
				return false
			}
			t.Fatalf("InProgress: %v", err)
		}
		// The delivery is held for a whole AckWait from InProgress
		// (counted from before the call: the transport renews no
		// earlier), beyond where the first AckWait ended...
		e.notBefore(s, asked, e.ackWait, "InProgress holds the delivery for another AckWait")
		// ...and no longer.
		again := e.after(s, asked, e.ackWait, "the message after the AckWait that InProgress started")
		if again.Message().ID != m.ID {
			t.Fatalf("Next = %q, want %q again", again.Message().ID, m.ID)
		}
		e.ack(again)
		return true
	})
}

// undecidedTries bounds the runs of a real-time scenario that a machine
// too slow to reach the transport within an AckWait leaves undecided.
const undecidedTries = 3

// untilDecided runs a scenario that calls a delivery within its AckWait,
// on a topic and a consumer name of its own each time, until it decides
// (returns true), at most undecidedTries times; a try that decides
// nothing closes its stream. On real time a transport rightly answers a
// call that reaches it past the AckWait as stale, and a machine under
// load can take that long between two calls; a scenario that saw that
// (pastAckWait) decided nothing, and runs again.
func (e *transportEnv) untilDecided(what string, scenario func(topic, consumer string, try int) (decided bool)) {
	e.t.Helper()
	for try := 1; ; try++ {
		topic, consumer := e.topic("orders"), e.consumer("c")
		if try > 1 {
			// A topic and a consumer name of its own: a transport that
			// keys its consumers by name alone must not hand the
			// abandoned try's message to this one.
			topic, consumer = e.topic(fmt.Sprintf("orders-try%d", try)), e.consumer(fmt.Sprintf("c-try%d", try))
		}
		if scenario(topic, consumer, try) {
			return
		}
		if try == undecidedTries {
			e.t.Fatalf("%s: a call reached the transport past its delivery's AckWait of %v in each of %d tries: this machine is too slow for the suite's Tick", what, e.ackWait, try)
		}
	}
}

// pastAckWait says whether err, a call's answer just returned, decides
// nothing: on real time, a stale delivery once the AckWait has passed
// since begun, a time no later than the transport handed the delivery
// out (nine tenths of it, as notBefore allows: a broker may round its
// timers). A stale answer sooner is the transport's fault, and the
// caller fails the test.
func (e *transportEnv) pastAckWait(try int, call string, err error, begun time.Time) bool {
	e.t.Helper()
	took := time.Since(begun)
	if e.clock != nil || !errors.Is(err, idem.ErrStaleDelivery) || took < e.ackWait*9/10 {
		return false
	}
	e.t.Logf("try %d: %s answered %v %v after the delivery could begin, past the AckWait of %v: undecided, trying again", try, call, err, took.Round(time.Millisecond), e.ackWait)
	return true
}

func testTermSettles(t *testing.T, e *transportEnv) {
	topic, c := e.topic("orders"), e.consumer("c")
	s := e.subscribe(topic, c)
	m := e.msg(topic, 1)
	e.publish(m)
	if err := e.nextID(s, m.ID, 1).Term(e.ctx); err != nil {
		t.Fatalf("Term: %v", err)
	}
	e.noneThroughAckWait(s, "a terminated message must not come back")
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	s2 := e.subscribe(topic, c)
	marker := e.msg(topic, 2)
	e.publish(marker)
	e.ack(e.nextID(s2, marker.ID, 1))
}

// testSettledIsStale: a delivery settled once no longer stands for its
// message. Settling it again, or InProgress, returns an error that
// matches idem.ErrStaleDelivery (the transport's own wraps it, so that a
// consumer can tell a delivery gone from a transport failing, whatever
// the transport) and changes nothing: an acknowledged
// message does not come back, and a caller is never told that a
// settlement counting for nothing was made.
func testSettledIsStale(t *testing.T, e *transportEnv) {
	topic, c := e.topic("orders"), e.consumer("c")
	s := e.subscribe(topic, c)
	m := e.msg(topic, 1)
	e.publish(m)
	d := e.nextID(s, m.ID, 1)
	e.ack(d)
	again := []struct {
		name string
		call func() error
	}{
		{"Ack", func() error { return d.Ack(e.ctx) }},
		{"Nack", func() error { return d.Nack(e.ctx, 0) }},
		{"InProgress", func() error { return d.InProgress(e.ctx) }},
	}
	if e.f.Term {
		again = append(again, struct {
			name string
			call func() error
		}{"Term", func() error { return d.Term(e.ctx) }})
	}
	for _, a := range again {
		if err := a.call(); !errors.Is(err, idem.ErrStaleDelivery) {
			t.Errorf("%s of a delivery acknowledged already = %v, want an error that matches idem.ErrStaleDelivery", a.name, err)
		}
	}
	// The Nack changed nothing: the first thing the consumer gets is a
	// message published afterwards.
	marker := e.msg(topic, 2)
	e.publish(marker)
	e.ack(e.nextID(s, marker.ID, 1))
	e.none(s, "an acknowledged message must not come back")
}

// testExpiredIsStale: a delivery whose AckWait ended, and whose message
// was delivered again since, no longer stands for it. InProgress and the
// settlements return an error that matches idem.ErrStaleDelivery and
// change nothing: the later delivery still settles the message. This is
// how a consumer that was slow (a long retry, a stalled process) learns
// that the message is no longer its own, and so must neither dead-letter
// it nor park its key.
func testExpiredIsStale(t *testing.T, e *transportEnv) {
	e.untilDecided("ExpiredIsStale", func(topic, consumer string, try int) bool {
		s := e.subscribe(topic, consumer)
		m := e.msg(topic, 1)
		e.publish(m)
		from := e.now()               // the AckWait begins no earlier than the Next
		first := e.nextID(s, m.ID, 1) // and never settled
		second := e.after(s, from, e.ackWait, "the message whose AckWait ended")
		if second.Message().ID != m.ID {
			t.Fatalf("Next = %q, want %q again", second.Message().ID, m.ID)
		}
		calls := []struct {
			name string
			call func() error
		}{
			{"InProgress", func() error { return first.InProgress(e.ctx) }},
			{"Nack", func() error { return first.Nack(e.ctx, 0) }},
			{"Ack", func() error { return first.Ack(e.ctx) }},
		}
		if e.f.Term {
			calls = append(calls, struct {
				name string
				call func() error
			}{"Term", func() error { return first.Term(e.ctx) }})
		}
		for _, c := range calls {
			if err := c.call(); !errors.Is(err, idem.ErrStaleDelivery) {
				t.Errorf("%s of a delivery whose message was delivered again since = %v, want an error that matches idem.ErrStaleDelivery", c.name, err)
			}
		}
		// The later delivery still holds the message: the stale calls
		// changed nothing. It was handed out once the first's AckWait
		// had passed, no earlier than an AckWait after from.
		if err := second.InProgress(e.ctx); err != nil {
			if e.pastAckWait(try, "InProgress of the later delivery", err, from.Add(e.ackWait)) {
				_ = s.Close()
				return false
			}
			t.Errorf("InProgress of the later delivery = %v, want nil", err)
		}
		e.ack(second)
		marker := e.msg(topic, 2)
		e.publish(marker)
		e.ack(e.nextID(s, marker.ID, 1))
		e.none(s, "the message was acknowledged by its later delivery")
		return true
	})
}

// testNackNegative: a negative Nack delay is refused with an
// idem.ErrInvalidArgument (idem.ValidateNackDelay), on every transport
// alike, and changes nothing: the delivery stays unsettled, and its Ack
// then settles it.
func testNackNegative(t *testing.T, e *transportEnv) {
	topic := e.topic("orders")
	s := e.subscribe(topic, e.consumer("c"))
	m := e.msg(topic, 1)
	e.publish(m)
	held := e.now() // the AckWait begins no earlier
	d := e.nextID(s, m.ID, 1)
	if err := d.Nack(e.ctx, -time.Second); !errors.Is(err, idem.ErrInvalidArgument) {
		t.Errorf("Nack(-1s) = %v, want idem.ErrInvalidArgument", err)
	}
	e.noneWhileHeld(s, held, "a refused Nack must not give the message back")
	e.ack(d)
	marker := e.msg(topic, 2)
	e.publish(marker)
	e.ack(e.nextID(s, marker.ID, 1))
	e.none(s, "the message was acknowledged after the refused Nack")
}

func testDurable(t *testing.T, e *transportEnv) {
	topic, c := e.topic("orders"), e.consumer("c")
	s := e.subscribe(topic, c)
	m := e.msg(topic, 1)
	e.publish(m)
	e.nextID(s, m.ID, 1) // and never settled
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	// Some transports give an unsettled message back when its stream
	// closes, others when its AckWait ends: allow for both.
	e.passAckWait()
	s2 := e.subscribe(topic, c)
	e.ack(e.nextID(s2, m.ID, 2))
	e.none(s2, "the redelivery was acknowledged")
}

func testTwoConsumers(t *testing.T, e *transportEnv) {
	const n = 10
	topic := e.topic("orders")
	streams := map[string]idem.Stream{
		"a": e.subscribe(topic, e.consumer("a")),
		"b": e.subscribe(topic, e.consumer("b")),
	}
	want := make(map[string]bool)
	var msgs []idem.Message
	for i := range n {
		m := e.msg(topic, i)
		msgs = append(msgs, m)
		want[m.ID] = true
	}
	e.publish(msgs...)
	for name, s := range streams {
		got := make(map[string]bool)
		for deliveries := 0; len(got) < n; deliveries++ {
			e.bound(deliveries, n, len(got))
			d := e.next(s, fmt.Sprintf("consumer %s's message %d of %d", name, len(got)+1, n))
			id := d.Message().ID
			if !want[id] {
				t.Fatalf("consumer %s got message %q, which was not published", name, id)
			}
			got[id] = true
			e.ack(d)
		}
	}
}

func testOrderedPerTopic(t *testing.T, e *transportEnv) {
	const n = 40
	topic, other := e.topic("orders"), e.topic("other")
	s := e.subscribe(topic, e.consumer("c"))
	var msgs []idem.Message
	for i := range n {
		msgs = append(msgs, e.msg(topic, i))
	}
	// Half in one call, half one by one, with another topic's messages in
	// between.
	e.publish(msgs[:n/2]...)
	for i, m := range msgs[n/2:] {
		e.publish(m, e.msg(other, i))
	}
	var order []string
	seen := make(map[string]bool)
	for deliveries := 0; len(order) < n; deliveries++ {
		e.bound(deliveries, n, len(order))
		d := e.next(s, fmt.Sprintf("message %d of %d", len(order)+1, n))
		if id := d.Message().ID; !seen[id] {
			seen[id] = true
			order = append(order, id)
		}
		e.ack(d)
	}
	for i, id := range order {
		if id != msgs[i].ID {
			t.Fatalf("message %d is %q, want %q; order received:\n\t%s", i, id, msgs[i].ID, joinLines(order))
		}
	}
}

func testNextContext(t *testing.T, e *transportEnv) {
	s := e.subscribe(e.topic("orders"), e.consumer("c"))
	cancelled, cancel := context.WithCancel(e.ctx)
	cancel()
	if d, err := s.Next(cancelled); !errors.Is(err, context.Canceled) {
		t.Errorf("Next(cancelled context) = %v, %v; want context.Canceled", d, err)
	}
	short, cancel := context.WithTimeout(e.ctx, e.quiet)
	defer cancel()
	if d, err := s.Next(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Next(context past its deadline) = %v, %v; want context.DeadlineExceeded", d, err)
	}
	// The stream still works after a Next gave up.
	m := e.msg(e.topic("orders"), 1)
	e.publish(m)
	e.ack(e.nextID(s, m.ID, 1))
}

func testNextClose(t *testing.T, e *transportEnv) {
	s := e.subscribe(e.topic("orders"), e.consumer("c"))
	var (
		wg  sync.WaitGroup
		err error
	)
	wg.Go(func() {
		ctx, cancel := context.WithTimeout(e.ctx, waitLimit)
		defer cancel()
		var d idem.Delivery
		if d, err = s.Next(ctx); err == nil {
			err = fmt.Errorf("got message %q", d.Message().ID)
		}
	})
	if cerr := s.Close(); cerr != nil {
		t.Errorf("Close: %v", cerr)
	}
	wg.Wait()
	if !errors.Is(err, idem.ErrClosed) {
		t.Errorf("Next blocked while Close was called = %v, want idem.ErrClosed", err)
	}
	ctx, cancel := context.WithTimeout(e.ctx, waitLimit)
	defer cancel()
	if d, err := s.Next(ctx); !errors.Is(err, idem.ErrClosed) {
		t.Errorf("Next after Close = %v, %v; want idem.ErrClosed", d, err)
	}
}

func testInvalidMessages(t *testing.T, e *transportEnv) {
	topic, c := e.topic("orders"), e.consumer("c")
	s := e.subscribe(topic, c)
	for _, tc := range []struct {
		name string
		m    idem.Message
	}{
		{"no ID", idem.Message{Topic: topic, Payload: []byte("x")}},
		{"no topic", idem.Message{ID: e.run + "-no-topic", Payload: []byte("x")}},
	} {
		if err := e.pub.Publish(e.ctx, tc.m); !errors.Is(err, idem.ErrInvalidArgument) {
			t.Errorf("Publish(message with %s) = %v, want idem.ErrInvalidArgument", tc.name, err)
		}
	}
	for _, tc := range []struct {
		name string
		sub  idem.Subscription
	}{
		{"no topic", idem.Subscription{Consumer: c}},
		{"no consumer", idem.Subscription{Topic: topic}},
	} {
		st, err := e.sub.Subscribe(e.ctx, tc.sub)
		if !errors.Is(err, idem.ErrInvalidArgument) {
			t.Errorf("Subscribe(subscription with %s) = %v, want idem.ErrInvalidArgument", tc.name, err)
		}
		if st != nil {
			_ = st.Close()
		}
	}
	// Nothing of the refused messages was published: the first thing the
	// consumer gets is the valid message that follows.
	m := e.msg(topic, 1)
	e.publish(m)
	e.ack(e.nextID(s, m.ID, 1))
}

func testManyMessages(t *testing.T, e *transportEnv) {
	const n, batch = 1000, 100
	topic := e.topic("orders")
	s := e.subscribe(topic, e.consumer("c"))
	want := make(map[string]bool, n)
	for b := 0; b < n; b += batch {
		var msgs []idem.Message
		for i := b; i < b+batch; i++ {
			m := e.msg(topic, i)
			m.Key = fmt.Sprintf("key-%d", i%7)
			want[m.ID] = true
			msgs = append(msgs, m)
		}
		e.publish(msgs...)
	}
	got := make(map[string]bool, n)
	for deliveries := 0; len(got) < n; deliveries++ {
		e.bound(deliveries, n, len(got))
		d := e.next(s, fmt.Sprintf("message %d of %d (%d deliveries so far)", len(got)+1, n, deliveries))
		id := d.Message().ID
		if !want[id] {
			t.Fatalf("got message %q, which was not published", id)
		}
		got[id] = true
		e.ack(d)
	}
}
