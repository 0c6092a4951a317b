package idemtest_test

import (
	"context"
	"errors"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemtest"
)

// brokenCase runs one of the message suites on an implementation that is
// wrong in one way, and names the subtest that must catch it ("" for a
// correct implementation, on which the suite must pass).
type brokenCase struct {
	wantFail string
	run      func(t *testing.T)
}

const brokenMessagingEnv = "IDEMTEST_BROKEN_MESSAGING"

// brokenMessaging gathers the broken implementations of every message
// suite, by name.
func brokenMessaging() map[string]brokenCase {
	all := make(map[string]brokenCase)
	for _, m := range []map[string]brokenCase{brokenTransports, brokenInboxes, brokenOutboxes, brokenDeadLetters, brokenLedgers} {
		maps.Copy(all, m)
	}
	return all
}

// TestBrokenMessaging runs the suite named by IDEMTEST_BROKEN_MESSAGING on
// its broken implementation. TestSuitesCatchBrokenMessaging runs it in a
// child process, because a failing suite fails the test that runs it.
func TestBrokenMessaging(t *testing.T) {
	name := os.Getenv(brokenMessagingEnv)
	if name == "" {
		t.Skip("run by TestSuitesCatchBrokenMessaging")
	}
	b, ok := brokenMessaging()[name]
	if !ok {
		t.Fatalf("no broken implementation %q", name)
	}
	b.run(t)
}

func TestSuitesCatchBrokenMessaging(t *testing.T) {
	t.Parallel()
	if os.Getenv(brokenMessagingEnv) != "" {
		t.Skip("inside a child process")
	}
	for name, b := range brokenMessaging() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cmd := exec.CommandContext(t.Context(), os.Args[0],
				"-test.run=^TestBrokenMessaging$", "-test.v", "-test.count=1", "-test.timeout=2m")
			cmd.Env = append(os.Environ(), brokenMessagingEnv+"="+name)
			out, err := cmd.CombinedOutput()
			if b.wantFail == "" {
				if err != nil {
					t.Fatalf("the suite failed a correct implementation: %v\n%s", err, out)
				}
				return
			}
			if err == nil {
				t.Fatalf("the suite passed an implementation that %s\n%s", name, out)
			}
			if want := "--- FAIL: TestBrokenMessaging/" + b.wantFail + " "; !strings.Contains(string(out), want) {
				t.Errorf("subtest %s did not fail; output:\n%s", b.wantFail, out)
			}
		})
	}
}

var transportFeatures = idemtest.TransportFeatures{
	DelayedNack:     true,
	AttemptCount:    true,
	AckWait:         true,
	InProgress:      true,
	Term:            true,
	OrderedPerTopic: true,
}

// brokenTransport is the reference transport with its messages,
// subscriptions or deliveries altered.
type brokenTransport struct {
	*idemmem.Transport
	publish   func(idem.Message) idem.Message
	subscribe func(idem.Subscription) idem.Subscription
	delivery  func(idem.Delivery) idem.Delivery
	// newDelivery, if set, makes each subtest's delivery func (for
	// alterations with a state of their own per subtest); only
	// realTimeTransportCase reads it.
	newDelivery func() func(idem.Delivery) idem.Delivery
	// renew, if set, makes the streams idem.BatchRenewer with it as
	// InProgressBatch; br is the in-memory stream's. Their deliveries are
	// the in-memory stream's, unaltered; afterNext, if set, runs after
	// each of their Nexts that returns one.
	renew     func(br idem.BatchRenewer, ctx context.Context, ds []idem.Delivery) ([]int, error)
	afterNext func()
	// renewHeld, if set, makes the streams idem.BatchRenewer that renew,
	// with the deliveries of each InProgressBatch, every delivery their
	// Next has handed out (overRenewer).
	renewHeld bool
}

func (b brokenTransport) Publish(ctx context.Context, msgs ...idem.Message) error {
	if b.publish != nil {
		msgs = append([]idem.Message(nil), msgs...)
		for i := range msgs {
			msgs[i] = b.publish(msgs[i])
		}
	}
	return b.Transport.Publish(ctx, msgs...)
}

func (b brokenTransport) Subscribe(ctx context.Context, sub idem.Subscription) (idem.Stream, error) {
	if b.subscribe != nil {
		sub = b.subscribe(sub)
	}
	s, err := b.Transport.Subscribe(ctx, sub)
	if err == nil && b.renewHeld {
		return &overRenewer{BatchRenewer: s.(idem.BatchRenewer)}, nil
	}
	if err == nil && b.renew != nil {
		return brokenRenewer{s.(idem.BatchRenewer), b.renew, b.afterNext}, nil
	}
	if err != nil || b.delivery == nil {
		return s, err
	}
	return brokenStream{s, b.delivery}, nil
}

type brokenRenewer struct {
	idem.BatchRenewer
	renew     func(br idem.BatchRenewer, ctx context.Context, ds []idem.Delivery) ([]int, error)
	afterNext func()
}

func (s brokenRenewer) Next(ctx context.Context) (idem.Delivery, error) {
	d, err := s.BatchRenewer.Next(ctx)
	if err == nil && s.afterNext != nil {
		s.afterNext()
	}
	return d, err
}

func (s brokenRenewer) InProgressBatch(ctx context.Context, ds []idem.Delivery) ([]int, error) {
	return s.renew(s.BatchRenewer, ctx, ds)
}

// overRenewer renews, with the deliveries of each InProgressBatch, every
// delivery its Next has handed out: those the caller left out of the call
// too, which keeps a delivery the caller stopped renewing from ever coming
// back. It answers for the call's deliveries alone.
type overRenewer struct {
	idem.BatchRenewer
	mu     sync.Mutex
	handed []idem.Delivery
}

func (s *overRenewer) Next(ctx context.Context) (idem.Delivery, error) {
	d, err := s.BatchRenewer.Next(ctx)
	if err == nil {
		s.mu.Lock()
		s.handed = append(s.handed, d)
		s.mu.Unlock()
	}
	return d, err
}

func (s *overRenewer) InProgressBatch(ctx context.Context, ds []idem.Delivery) ([]int, error) {
	if len(ds) == 0 {
		return s.BatchRenewer.InProgressBatch(ctx, ds)
	}
	s.mu.Lock()
	all := append(slices.Clone(ds), s.handed...)
	s.mu.Unlock()
	stale, err := s.BatchRenewer.InProgressBatch(ctx, all)
	if err != nil {
		return nil, err
	}
	var own []int
	for _, i := range stale {
		if i < len(ds) {
			own = append(own, i)
		}
	}
	return own, nil
}

type brokenStream struct {
	idem.Stream
	delivery func(idem.Delivery) idem.Delivery
}

func (s brokenStream) Next(ctx context.Context) (idem.Delivery, error) {
	d, err := s.Stream.Next(ctx)
	if err != nil {
		return nil, err
	}
	return s.delivery(d), nil
}

type nackNoDelay struct{ idem.Delivery }

func (d nackNoDelay) Nack(ctx context.Context, _ time.Duration) error { return d.Delivery.Nack(ctx, 0) }

type deliveryDropsHeaders struct{ idem.Delivery }

func (d deliveryDropsHeaders) Message() idem.Message {
	m := d.Delivery.Message()
	m.Headers = nil
	return m
}

type ackRequeues struct{ idem.Delivery }

func (d ackRequeues) Ack(ctx context.Context) error { return d.Delivery.Nack(ctx, 0) }

type termRequeues struct{ idem.Delivery }

func (d termRequeues) Term(ctx context.Context) error { return d.Delivery.Nack(ctx, 0) }

type attemptAlwaysOne struct{ idem.Delivery }

func (attemptAlwaysOne) Attempt() int { return 1 }

type inProgressNoop struct{ idem.Delivery }

func (inProgressNoop) InProgress(context.Context) error { return nil }

// staleSwallowed reports a settlement of a delivery settled already as
// made, as idemkafka's deliveries did.
type staleSwallowed struct{ idem.Delivery }

func swallowStale(err error) error {
	if errors.Is(err, idemmem.ErrStaleDelivery) {
		return nil
	}
	return err
}

func (d staleSwallowed) Ack(ctx context.Context) error { return swallowStale(d.Delivery.Ack(ctx)) }
func (d staleSwallowed) Term(ctx context.Context) error {
	return swallowStale(d.Delivery.Term(ctx))
}
func (d staleSwallowed) Nack(ctx context.Context, delay time.Duration) error {
	return swallowStale(d.Delivery.Nack(ctx, delay))
}
func (d staleSwallowed) InProgress(ctx context.Context) error {
	return swallowStale(d.Delivery.InProgress(ctx))
}

// staleUnmarked answers a stale delivery with an error of its own that
// does not match idem.ErrStaleDelivery.
type staleUnmarked struct{ idem.Delivery }

func unmarkStale(err error) error {
	if errors.Is(err, idemmem.ErrStaleDelivery) {
		return errors.New("delivery gone")
	}
	return err
}

func (d staleUnmarked) Ack(ctx context.Context) error { return unmarkStale(d.Delivery.Ack(ctx)) }
func (d staleUnmarked) Term(ctx context.Context) error {
	return unmarkStale(d.Delivery.Term(ctx))
}
func (d staleUnmarked) Nack(ctx context.Context, delay time.Duration) error {
	return unmarkStale(d.Delivery.Nack(ctx, delay))
}
func (d staleUnmarked) InProgress(ctx context.Context) error {
	return unmarkStale(d.Delivery.InProgress(ctx))
}

// nackNegativeAsZero treats a negative Nack delay as none, as idemmem
// and the database transports did.
type nackNegativeAsZero struct{ idem.Delivery }

func (d nackNegativeAsZero) Nack(ctx context.Context, delay time.Duration) error {
	return d.Delivery.Nack(ctx, max(delay, 0))
}

func transportCase(wantFail string, b brokenTransport) brokenCase {
	return brokenCase{wantFail, func(t *testing.T) {
		idemtest.TestTransport(t, transportFeatures, func(t *testing.T, clock idem.Clock) (idem.Publisher, idem.Subscriber) {
			b := b
			b.Transport = idemmem.NewTransport(&idemmem.TransportConfig{Clock: clock, Poll: time.Millisecond})
			t.Cleanup(func() { _ = b.Close() })
			return b, b
		})
	}}
}

// inProgressStale ends the delivery early: InProgress answers stale, as a
// transport would whose AckWait ran short.
type inProgressStale struct{ idem.Delivery }

func (inProgressStale) InProgress(context.Context) error { return idemmem.ErrStaleDelivery }

// realTimeTransportCase runs the suite on real time, where a stale answer
// past the AckWait decides nothing: one within it still fails.
func realTimeTransportCase(wantFail string, b brokenTransport) brokenCase {
	return brokenCase{wantFail, func(t *testing.T) {
		f := transportFeatures
		f.RealTime, f.Tick = true, 50*time.Millisecond
		idemtest.TestTransport(t, f, func(t *testing.T, clock idem.Clock) (idem.Publisher, idem.Subscriber) {
			b := b
			if b.newDelivery != nil {
				b.delivery = b.newDelivery()
			}
			b.Transport = idemmem.NewTransport(&idemmem.TransportConfig{Clock: clock})
			t.Cleanup(func() { _ = b.Close() })
			return b, b
		})
	}}
}

// inProgressStaleOnce answers its subtest's first InProgress that the
// transport made as stale, early, within the AckWait: a retry would pass,
// and the suite must fail it all the same.
type inProgressStaleOnce struct {
	idem.Delivery
	lied *atomic.Bool
}

func (d inProgressStaleOnce) InProgress(ctx context.Context) error {
	err := d.Delivery.InProgress(ctx)
	if err == nil && d.lied.CompareAndSwap(false, true) {
		return idemmem.ErrStaleDelivery
	}
	return err
}

var brokenTransports = map[string]brokenCase{
	"transport: in progress ends the delivery, on real time": realTimeTransportCase("InProgress", brokenTransport{
		delivery: func(d idem.Delivery) idem.Delivery { return inProgressStale{d} }}),
	"transport: in progress ends the delivery once, early, on real time": realTimeTransportCase("InProgress", brokenTransport{
		newDelivery: func() func(idem.Delivery) idem.Delivery {
			var lied atomic.Bool
			return func(d idem.Delivery) idem.Delivery { return inProgressStaleOnce{d, &lied} }
		}}),
	"transport: none": transportCase("", brokenTransport{}),
	"transport: in progress batch passes through": transportCase("", brokenTransport{
		renew: func(br idem.BatchRenewer, ctx context.Context, ds []idem.Delivery) ([]int, error) {
			return br.InProgressBatch(ctx, ds)
		}}),
	"transport: in progress batch renews every delivery the stream holds": transportCase("BatchRenewBounds", brokenTransport{renewHeld: true}),
	"transport: in progress batch renews nothing": transportCase("BatchRenew", brokenTransport{
		renew: func(idem.BatchRenewer, context.Context, []idem.Delivery) ([]int, error) { return nil, nil }}),
	"transport: in progress batch reports nothing stale": transportCase("BatchRenewStale", brokenTransport{
		renew: func(br idem.BatchRenewer, ctx context.Context, ds []idem.Delivery) ([]int, error) {
			_, err := br.InProgressBatch(ctx, ds)
			return nil, err
		}}),
	"transport: in progress batch renews none once one is stale": transportCase("BatchRenewStale", brokenTransport{
		renew: func(br idem.BatchRenewer, ctx context.Context, ds []idem.Delivery) ([]int, error) {
			for _, d := range ds {
				if err := d.InProgress(ctx); errors.Is(err, idem.ErrStaleDelivery) {
					return []int{0, 1}, nil
				}
			}
			return br.InProgressBatch(ctx, ds)
		}}),
	"transport: in progress batch renews what it can of a call it refuses": transportCase("BatchRenewInvalid", brokenTransport{
		renew: func(br idem.BatchRenewer, ctx context.Context, ds []idem.Delivery) ([]int, error) {
			for _, d := range ds {
				_ = d.InProgress(ctx)
			}
			return br.InProgressBatch(ctx, ds)
		}}),
	"transport: in progress batch answers an empty call with an empty slice": transportCase("BatchRenewInvalid", brokenTransport{
		renew: func(br idem.BatchRenewer, ctx context.Context, ds []idem.Delivery) ([]int, error) {
			if len(ds) == 0 {
				return []int{}, nil
			}
			return br.InProgressBatch(ctx, ds)
		}}),
	"transport: nack ignores its delay": transportCase("NackDelay", brokenTransport{
		delivery: func(d idem.Delivery) idem.Delivery { return nackNoDelay{d} }}),
	"transport: drops headers": transportCase("RoundTrip", brokenTransport{
		delivery: func(d idem.Delivery) idem.Delivery { return deliveryDropsHeaders{d} }}),
	"transport: ack does not settle": transportCase("AckSettles", brokenTransport{
		delivery: func(d idem.Delivery) idem.Delivery { return ackRequeues{d} }}),
	"transport: term does not settle": transportCase("TermSettles", brokenTransport{
		delivery: func(d idem.Delivery) idem.Delivery { return termRequeues{d} }}),
	"transport: a settled delivery settles again": transportCase("SettledIsStale", brokenTransport{
		delivery: func(d idem.Delivery) idem.Delivery { return staleSwallowed{d} }}),
	"transport: a stale delivery's error is its own": transportCase("SettledIsStale", brokenTransport{
		delivery: func(d idem.Delivery) idem.Delivery { return staleUnmarked{d} }}),
	"transport: a negative nack delay counts as zero": transportCase("NackNegative", brokenTransport{
		delivery: func(d idem.Delivery) idem.Delivery { return nackNegativeAsZero{d} }}),
	"transport: attempt always 1": transportCase("Durable", brokenTransport{
		delivery: func(d idem.Delivery) idem.Delivery { return attemptAlwaysOne{d} }}),
	"transport: in progress does nothing": transportCase("InProgress", brokenTransport{
		delivery: func(d idem.Delivery) idem.Delivery { return inProgressNoop{d} }}),
	"transport: accepts a message without ID": transportCase("Invalid", brokenTransport{
		publish: func(m idem.Message) idem.Message {
			if m.ID == "" {
				m.ID = "made-up"
			}
			return m
		}}),
	"transport: one queue for every consumer name": transportCase("TwoConsumers", brokenTransport{
		subscribe: func(s idem.Subscription) idem.Subscription {
			if s.Consumer != "" {
				s.Consumer = "shared"
			}
			return s
		}}),
}
