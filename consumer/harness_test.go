package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consumer"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/internal/eventually"
)

const topic = "payments.succeeded"

// waitLimit bounds every wait of these tests: a wait that has not ended by
// then is a failure, not a slow machine.
const waitLimit = 20 * time.Second

// fakeTimers are idem.Timers driven by a manual clock: Advance moves
// the clock and fires the timers that are due.
type fakeTimers struct {
	clock *idemmem.Clock

	mu      sync.Mutex
	seq     int
	pending map[int]fakeTimer
}

type fakeTimer struct {
	at time.Time
	d  time.Duration
	f  func()
}

func newFakeTimers(clock *idemmem.Clock) *fakeTimers {
	return &fakeTimers{clock: clock, pending: make(map[int]fakeTimer)}
}

func (ft *fakeTimers) AfterFunc(d time.Duration, f func()) func() bool {
	ft.mu.Lock()
	defer ft.mu.Unlock()
	ft.seq++
	id := ft.seq
	ft.pending[id] = fakeTimer{at: ft.clock.Now().Add(d), d: d, f: f}
	return func() bool {
		ft.mu.Lock()
		defer ft.mu.Unlock()
		_, ok := ft.pending[id]
		delete(ft.pending, id)
		return ok
	}
}

// Advance moves the clock by d and fires, in order, the timers then due.
func (ft *fakeTimers) Advance(d time.Duration) {
	ft.clock.Advance(d)
	now := ft.clock.Now()
	ft.mu.Lock()
	var due []fakeTimer
	for id, t := range ft.pending {
		if !t.at.After(now) {
			due = append(due, t)
			delete(ft.pending, id)
		}
	}
	ft.mu.Unlock()
	sort.Slice(due, func(i, j int) bool { return due[i].at.Before(due[j].at) })
	for _, t := range due {
		go t.f()
	}
}

// Pending counts the timers set for exactly d that have not fired.
func (ft *fakeTimers) Pending(d time.Duration) int {
	ft.mu.Lock()
	defer ft.mu.Unlock()
	n := 0
	for _, t := range ft.pending {
		if t.d == d {
			n++
		}
	}
	return n
}

// recorder wraps a Subscriber and writes down what the consumer does with
// each delivery, by message ID.
type recorder struct {
	idem.Subscriber

	mu  sync.Mutex
	ops map[string][]string
	// taken counts deliveries handed to the consumer.
	taken int
	// asked holds the max of each NextBatch call.
	asked []int
	// nackGate, when set, holds every Nack (once noted) until it is
	// closed.
	nackGate chan struct{}
	// ackGate, when set (with holdAcks), holds every acknowledgement
	// (once noted) until it is closed.
	ackGate chan struct{}
	// acksAfterTx, when set, keeps a batch's acknowledgements out of the
	// inbox's transaction, as a transport that cannot join it does.
	acksAfterTx bool
	// hold, when set, holds the first call of Next or NextBatch that
	// begins once hold.after deliveries have been taken (holdNext).
	hold *nextHold
	// renewals, when set before the consumer subscribes, makes its
	// streams idem.BatchRenewer (renewStream), which write their calls
	// down there.
	renewals *renewals
}

// nextHold is a call of Next held by holdNext.
type nextHold struct {
	after    int
	asked    chan struct{}
	released chan struct{}
	once     sync.Once
}

// holdNext holds the first call of Next (or NextBatch) that begins once
// after deliveries have been taken, until the returned release is called
// (or the call's context ends). asked is closed when that call begins: the
// consumer asks for more only once it has put the deliveries it took in
// memory (behind their keys), so asked says they are there, where Taken
// says only that the transport handed them out.
func (r *recorder) holdNext(after int) (asked <-chan struct{}, release func()) {
	h := &nextHold{after: after, asked: make(chan struct{}), released: make(chan struct{})}
	r.mu.Lock()
	r.hold = h
	r.mu.Unlock()
	return h.asked, func() { h.once.Do(func() { close(h.released) }) }
}

// asking is called as a call of Next or NextBatch begins: it holds the
// call holdNext asked for.
func (r *recorder) asking(ctx context.Context) error {
	r.mu.Lock()
	h := r.hold
	if h == nil || r.taken < h.after {
		r.mu.Unlock()
		return nil
	}
	r.hold = nil
	r.mu.Unlock()
	close(h.asked)
	select {
	case <-h.released:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// waitAsked waits for asked (holdNext), failing the test after waitLimit.
func waitAsked(t *testing.T, what string, asked <-chan struct{}) {
	t.Helper()
	waitClosed(t, what, asked)
}

// waitClosed waits for ch to be closed (a signal: a handler began, the
// consumer asked for more), failing the test after waitLimit.
func waitClosed(t *testing.T, what string, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(waitLimit):
		t.Fatalf("%s: not within %s", what, waitLimit)
	}
}

func (r *recorder) Subscribe(ctx context.Context, sub idem.Subscription) (idem.Stream, error) {
	s, err := r.Subscriber.Subscribe(ctx, sub)
	if err != nil {
		return nil, err
	}
	if r.renewals != nil {
		return &renewStream{recStream{Stream: s, r: r}, r.renewals}, nil
	}
	return &recStream{Stream: s, r: r}, nil
}

func (r *recorder) note(id, op string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ops == nil {
		r.ops = make(map[string][]string)
	}
	r.ops[id] = append(r.ops[id], op)
}

// holdAcks holds every acknowledgement from now on, until the returned
// release is called.
func (r *recorder) holdAcks() (release func()) {
	gate := make(chan struct{})
	r.mu.Lock()
	r.ackGate = gate
	r.mu.Unlock()
	return func() { close(gate) }
}

func (r *recorder) waitAckGate() {
	r.mu.Lock()
	gate := r.ackGate
	r.mu.Unlock()
	if gate != nil {
		<-gate
	}
}

// Ops returns what was done with the deliveries of message id, in order.
func (r *recorder) Ops(id string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.ops[id])
}

func (r *recorder) Taken() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.taken
}

type recStream struct {
	idem.Stream
	r *recorder
}

func (s *recStream) Next(ctx context.Context) (idem.Delivery, error) {
	if err := s.r.asking(ctx); err != nil {
		return nil, err
	}
	return s.next(ctx)
}

func (s *recStream) next(ctx context.Context) (idem.Delivery, error) {
	d, err := s.Stream.Next(ctx)
	if err != nil {
		return nil, err
	}
	s.r.mu.Lock()
	s.r.taken++
	s.r.mu.Unlock()
	s.r.note(d.Message().ID, "deliver")
	return &recDelivery{Delivery: d, r: s.r}, nil
}

// NextBatch, AckBatch and AcksInTx pass batches through when the stream
// takes them, so that the consumer's batch path is what is recorded.
func (s *recStream) NextBatch(ctx context.Context, max int) ([]idem.Delivery, error) {
	s.r.mu.Lock()
	s.r.asked = append(s.r.asked, max)
	s.r.mu.Unlock()
	if err := s.r.asking(ctx); err != nil {
		return nil, err
	}
	bs, ok := s.Stream.(idem.BatchStream)
	if !ok {
		d, err := s.next(ctx)
		if err != nil {
			return nil, err
		}
		return []idem.Delivery{d}, nil
	}
	ds, err := bs.NextBatch(ctx, max)
	if err != nil {
		return nil, err
	}
	s.r.mu.Lock()
	s.r.taken += len(ds)
	s.r.mu.Unlock()
	for i, d := range ds {
		s.r.note(d.Message().ID, "deliver")
		ds[i] = &recDelivery{Delivery: d, r: s.r}
	}
	return ds, nil
}

func (s *recStream) AckBatch(ctx context.Context, ds []idem.Delivery) (int, error) {
	bs, ok := s.Stream.(idem.BatchStream)
	inner := make([]idem.Delivery, len(ds))
	for i, d := range ds {
		rd := d.(*recDelivery)
		if !ok {
			if err := rd.Ack(ctx); err != nil {
				return i, err
			}
			continue
		}
		rd.r.note(d.Message().ID, "ack")
		inner[i] = rd.Delivery
	}
	if !ok {
		return len(ds), nil
	}
	s.r.waitAckGate()
	return bs.AckBatch(ctx, inner)
}

func (s *recStream) AcksInTx(ctx context.Context) bool {
	bs, ok := s.Stream.(idem.BatchStream)
	return ok && !s.r.acksAfterTx && bs.AcksInTx(ctx)
}

type recDelivery struct {
	idem.Delivery
	r *recorder
}

func (d *recDelivery) Ack(ctx context.Context) error {
	d.r.note(d.Message().ID, "ack")
	d.r.waitAckGate()
	return d.Delivery.Ack(ctx)
}

func (d *recDelivery) Nack(ctx context.Context, delay time.Duration) error {
	d.r.note(d.Message().ID, "nack "+delay.String())
	if d.r.nackGate != nil {
		<-d.r.nackGate
	}
	return d.Delivery.Nack(ctx, delay)
}

func (d *recDelivery) Term(ctx context.Context) error {
	d.r.note(d.Message().ID, "term")
	return d.Delivery.Term(ctx)
}

func (d *recDelivery) InProgress(ctx context.Context) error {
	d.r.note(d.Message().ID, "in-progress")
	return d.Delivery.InProgress(ctx)
}

// harness is one consumer's world: a manual clock, the in-memory transport
// and stores, and a recorder of settlements.
type harness struct {
	t       *testing.T
	clock   *idemmem.Clock
	timers  *fakeTimers
	tr      *idemmem.Transport
	rec     *recorder
	inbox   *idemmem.Inbox
	dls     *idemmem.DeadLetters
	ledger  *idemmem.Ledger
	applied *idemmem.Counters
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	clock := idemmem.NewClock(time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC))
	tr := idemmem.NewTransport(&idemmem.TransportConfig{Clock: clock, Poll: time.Millisecond})
	t.Cleanup(func() { _ = tr.Close() })
	return &harness{
		t:       t,
		clock:   clock,
		timers:  newFakeTimers(clock),
		tr:      tr,
		rec:     &recorder{Subscriber: tr},
		inbox:   idemmem.NewInbox(),
		dls:     idemmem.NewDeadLetters(&idemmem.DeadLettersConfig{Clock: clock}),
		ledger:  idemmem.NewLedger(),
		applied: &idemmem.Counters{},
	}
}

// config returns a Config on the harness's world, with a retry policy whose
// every delay is exactly one second.
func (h *harness) config() *consumer.Config {
	return &consumer.Config{
		Name:        "settlement",
		Topic:       topic,
		Subscriber:  h.rec,
		Inbox:       h.inbox,
		DeadLetters: h.dls,
		Ledger:      h.ledger,
		Retry:       idem.RetryPolicy{MaxAttempts: 5, Base: time.Second, Cap: time.Second, Jitter: idem.NoJitter},
		InTx:        idemmem.Transact,
		Clock:       h.clock,
		Timers:      h.timers,
		BatchSize:   batchSize,
	}
}

// start runs a consumer made from cfg until the returned stop is called
// (or the test ends), and checks that Run then returns nil.
func (h *harness) start(cfg *consumer.Config, handler consumer.Handler) (*consumer.Consumer, func()) {
	h.t.Helper()
	c, err := consumer.New(cfg)
	if err != nil {
		h.t.Fatalf("New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, handler) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					h.t.Errorf("Run returned %v after cancel, want nil", err)
				}
			case <-time.After(waitLimit):
				h.t.Errorf("Run did not return within %s of cancel", waitLimit)
			}
		})
	}
	h.t.Cleanup(stop)
	return c, stop
}

func (h *harness) publish(msgs ...idem.Message) {
	h.t.Helper()
	for i := range msgs {
		if msgs[i].Topic == "" {
			msgs[i].Topic = topic
		}
	}
	if err := h.tr.Publish(context.Background(), msgs...); err != nil {
		h.t.Fatalf("Publish: %v", err)
	}
}

// apply is the non-idempotent effect the handlers make: an increment that
// joins the inbox's transaction.
func (h *harness) apply(ctx context.Context, m idem.Message) error {
	return h.applied.Add(ctx, m.ID, 1)
}

// waitFor polls cond until it holds, failing the test after waitLimit.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	eventually.True(t, waitLimit, what, cond)
}

// advanceUntil moves the clock by step, again and again, until cond holds,
// failing the test after waitLimit.
func (h *harness) advanceUntil(what string, step time.Duration, cond func() bool) {
	h.t.Helper()
	deadline := time.Now().Add(waitLimit)
	for !cond() {
		if time.Now().After(deadline) {
			h.t.Fatalf("timed out advancing the clock until %s", what)
		}
		h.timers.Advance(step)
		time.Sleep(time.Millisecond)
	}
}

func (h *harness) letters() []idem.DeadLetter {
	h.t.Helper()
	dls, err := h.dls.List(context.Background(), idem.DeadLetterFilter{})
	if err != nil {
		h.t.Fatalf("List dead letters: %v", err)
	}
	return dls
}

// attemptsCounter counts a handler's calls per message ID, and signals each.
type attemptsCounter struct {
	mu    sync.Mutex
	calls map[string]int
	seen  map[string][]int // the Info.Attempt of each call
}

func (a *attemptsCounter) add(ctx context.Context, m idem.Message) int {
	info, _ := consumer.InfoFromContext(ctx)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.calls == nil {
		a.calls, a.seen = make(map[string]int), make(map[string][]int)
	}
	a.calls[m.ID]++
	a.seen[m.ID] = append(a.seen[m.ID], info.Attempt)
	return info.Attempt
}

func (a *attemptsCounter) Calls(id string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.calls[id]
}

func (a *attemptsCounter) Seen(id string) []int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.seen[id])
}

var errFlaky = errors.New("dependency unavailable")

func msg(id, key string) idem.Message {
	return idem.Message{ID: id, Key: key, Payload: fmt.Appendf(nil, `{"id":%q}`, id)}
}
