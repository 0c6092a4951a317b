package idemamqp

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idem-go/idem"
)

type stream struct {
	t     *Transport
	sub   idem.Subscription
	queue string

	// mu guards gen, which start replaces after the channel died.
	mu  sync.Mutex
	gen *channelGen

	closeOnce sync.Once
	done      chan struct{}
}

// maxPrefetch is the largest prefetch AMQP can say (a short), and
// maxBuffered the most deliveries a stream holds ready to hand out beside
// the library's own buffer.
const (
	maxPrefetch = 1<<16 - 1
	maxBuffered = 1024
)

// channelGen is one AMQP channel of a stream, and the deliveries it
// brought.
type channelGen struct {
	ch *amqp.Channel
	// conn is the connection ch is on; dropped is set when the transport
	// abandons it (see Transport.abandon): its deliveries waiting in
	// buffered are then not handed out, since their acknowledgements could
	// only fail, and the broker delivers them again once the connection has
	// closed.
	conn    *amqp.Connection
	dropped atomic.Bool
	// buffered holds the channel's deliveries as they arrive, so that
	// NextBatch can take at once those already there; it is closed when
	// the channel's deliveries end.
	buffered chan *amqp.Delivery

	// settleMu is held while a settlement of the channel is sent and
	// recorded, so that an ack with multiple set, which settles every
	// unsettled delivery of the channel up to its tag, covers exactly the
	// deliveries it is meant to.
	settleMu sync.Mutex
	// unsettled holds the tags of the channel's deliveries not settled,
	// handed out or not: no more than the prefetch of each queue.
	unsettled map[uint64]struct{}
	// received is the lowest delivery tag not recorded yet, and ahead the
	// tags above it recorded already. The channel numbers its deliveries
	// 1, 2, 3... across its consumers, but those of one consumer can be
	// recorded before a lower tag of the other's: no ack with multiple
	// set may reach a tag not recorded, which nobody has seen.
	received uint64
	ahead    map[uint64]struct{}
}

// forward moves the deliveries of sources, the channel's consumers, into
// g.buffered, recording each as unsettled first, until they end or the
// stream closes; g.buffered is closed once every source has ended. A
// source that ends alone (the broker cancelled its consumer: its queue was
// deleted) closes the channel, so that the stream subscribes anew and
// declares the queues again, as it does when the channel dies.
func (g *channelGen) forward(sources []<-chan amqp.Delivery, done <-chan struct{}) {
	var wg sync.WaitGroup
	for _, deliveries := range sources {
		wg.Go(func() {
			defer func() { _ = g.ch.Close() }()
			for d := range deliveries {
				g.record(d.DeliveryTag)
				select {
				case g.buffered <- &d:
				case <-done:
					return
				}
			}
		})
	}
	go func() {
		wg.Wait()
		close(g.buffered)
	}()
}

// gone reports whether g's deliveries can no longer be settled: the
// channel closed (the broker requeued what it held unsettled), or the
// transport dropped its connection, which is closing.
func (g *channelGen) gone() bool {
	return g.dropped.Load() || g.ch.IsClosed()
}

// record notes tag as delivered and not settled.
func (g *channelGen) record(tag uint64) {
	g.settleMu.Lock()
	defer g.settleMu.Unlock()
	g.unsettled[tag] = struct{}{}
	if tag != g.received {
		g.ahead[tag] = struct{}{}
		return
	}
	g.received++
	for {
		if _, ok := g.ahead[g.received]; !ok {
			return
		}
		delete(g.ahead, g.received)
		g.received++
	}
}

// settle sends one settlement of tag with fn and records it.
func (g *channelGen) settle(tag uint64, fn func() error) error {
	g.settleMu.Lock()
	defer g.settleMu.Unlock()
	if err := fn(); err != nil {
		return err
	}
	delete(g.unsettled, tag)
	return nil
}

// ackAll acknowledges ds, deliveries of g: with one basic.ack with
// multiple set for those below the lowest unsettled tag not among them,
// when there are several, and one basic.ack each for the others. It
// reports which it acknowledged.
func (g *channelGen) ackAll(ds []*delivery) ([]bool, error) {
	acked := make([]bool, len(ds))
	g.settleMu.Lock()
	defer g.settleMu.Unlock()
	mine := make(map[uint64]bool, len(ds))
	for _, d := range ds {
		mine[d.d.DeliveryTag] = true
	}
	if top := multipleUpTo(g.unsettled, mine, g.received); top > 0 {
		if err := g.ch.Ack(top, true); err != nil {
			return acked, err
		}
		for i, d := range ds {
			if tag := d.d.DeliveryTag; tag <= top {
				acked[i] = true
				delete(g.unsettled, tag)
			}
		}
	}
	for i, d := range ds {
		if acked[i] {
			continue
		}
		tag := d.d.DeliveryTag
		if err := g.ch.Ack(tag, false); err != nil {
			return acked, err
		}
		acked[i] = true
		delete(g.unsettled, tag)
	}
	return acked, nil
}

// multipleUpTo returns the tag up to which an ack with multiple set
// settles exactly tags of mine: the highest of mine below the lowest
// unsettled tag not of mine and below received, the lowest tag not
// recorded yet, when at least two of mine are below them; otherwise 0,
// and one ack each is as few frames.
func multipleUpTo(unsettled map[uint64]struct{}, mine map[uint64]bool, received uint64) uint64 {
	other := received
	for tag := range unsettled {
		if !mine[tag] && tag < other {
			other = tag
		}
	}
	var top uint64
	covered := 0
	for tag := range mine {
		if tag < other {
			covered++
			top = max(top, tag)
		}
	}
	if covered < 2 {
		return 0
	}
	return top
}

// start declares and binds the queue and starts consuming on a new
// channel.
func (s *stream) start(ctx context.Context) error {
	ch, conn, err := s.t.channelOn(ctx)
	if err != nil {
		return err
	}
	fail := func(what string, err error) error {
		_ = ch.Close()
		return fmt.Errorf("idemamqp: subscribe %q: %s: %w", s.sub.Consumer, what, err)
	}
	// Quorum queues: the queue a message given up past the delivery limit
	// goes to exists before the queue that sends it there.
	queues := []string{s.queue}
	if !s.t.cfg.ClassicQueues {
		limit := limitQueue(s.queue)
		if _, err := ch.QueueDeclare(limit, true, false, false, false, limitQueueArgs()); err != nil {
			return fail("declare queue "+limit, err)
		}
		s.t.noteQueue(limit)
		queues = append(queues, limit)
	}
	if ch, err = s.t.declareQueue(ctx, ch, s.queue); err != nil {
		return fmt.Errorf("idemamqp: subscribe %q: declare queue %s: %w", s.sub.Consumer, s.queue, err)
	}
	s.t.noteQueue(s.queue)
	if s.t.cfg.ClassicQueues && len(s.t.urls) > 1 {
		s.t.warn(ctx, &Warning{Queue: s.queue, Problem: ErrNotReplicated,
			Fix: "leave idemamqp.Config.ClassicQueues unset, so that consumers' queues are quorum queues, replicated on every node (a new consumer name, or the queue deleted once drained)"})
	}
	if err := ch.QueueBind(s.queue, s.sub.Topic, s.t.cfg.Exchange, false, nil); err != nil {
		return fail("bind queue "+s.queue, err)
	}
	prefetch := min(s.sub.MaxInFlight, maxPrefetch)
	if err := ch.Qos(prefetch, 0, false); err != nil {
		return fail("qos", err)
	}
	// Consume, not ConsumeWithContext: the consumer outlives the context
	// of the call that started it, and a cancel racing Close would
	// confuse the channel's replies. The limit queue is consumed on the
	// same channel, with the same prefetch, and its deliveries are handed
	// out with the others.
	var sources []<-chan amqp.Delivery
	for _, q := range queues {
		deliveries, err := ch.Consume(q, "", false, false, false, false, nil)
		if err != nil {
			return fail("consume "+q, err)
		}
		sources = append(sources, deliveries)
	}
	gen := &channelGen{
		ch:        ch,
		conn:      conn,
		buffered:  make(chan *amqp.Delivery, min(prefetch, maxBuffered)),
		unsettled: make(map[uint64]struct{}),
		received:  1,
		ahead:     make(map[uint64]struct{}),
	}
	gen.forward(sources, s.done)
	s.mu.Lock()
	s.gen = gen
	s.mu.Unlock()
	return nil
}

// startRetrying is start, set up again on a new connection (after 50ms,
// then 100ms, then 150ms) when the broker failed it (brokerHiccup).
func (s *stream) startRetrying(ctx context.Context) error {
	for attempt := 1; ; attempt++ {
		err := s.start(ctx)
		if err == nil || attempt == startAttempts || !brokerHiccup(err) {
			return err
		}
		wait := time.NewTimer(time.Duration(attempt) * 50 * time.Millisecond)
		select {
		case <-wait.C:
		case <-ctx.Done():
			wait.Stop()
			return errors.Join(err, ctx.Err())
		}
	}
}

// Next implements idem.Stream. When the channel or the connection died,
// Next subscribes again once (dialling again if needed); the broker has
// put the messages the old channel held back in the queue.
func (s *stream) Next(ctx context.Context) (idem.Delivery, error) {
	ds, err := s.take(ctx, 1)
	if err != nil {
		return nil, err
	}
	return ds[0], nil
}

// NextBatch implements idem.BatchStream: it waits for a delivery as Next
// does, then takes the others the broker has already sent (within the
// prefetch), up to max, without waiting for more. Returns an
// *idem.ArgumentError when max is below 1.
func (s *stream) NextBatch(ctx context.Context, max int) ([]idem.Delivery, error) {
	if max < 1 {
		return nil, &idem.ArgumentError{Field: "max", Reason: "must be at least 1"}
	}
	return s.take(ctx, max)
}

// AcksInTx implements idem.BatchStream: a broker cannot join a database
// transaction.
func (s *stream) AcksInTx(context.Context) bool { return false }

// take waits for a delivery and takes up to max of those there.
func (s *stream) take(ctx context.Context, max int) ([]idem.Delivery, error) {
	restarted := false
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		select {
		case <-s.done:
			return nil, idem.ErrClosed
		default:
		}
		s.mu.Lock()
		gen := s.gen
		s.mu.Unlock()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-s.done:
			return nil, idem.ErrClosed
		case d, ok := <-gen.buffered:
			if ok && gen.dropped.Load() {
				continue // see channelGen.dropped
			}
			if ok {
				ds := []idem.Delivery{s.handOut(gen, d)}
				for len(ds) < max {
					select {
					case d, ok := <-gen.buffered:
						if ok {
							ds = append(ds, s.handOut(gen, d))
							continue
						}
					default:
					}
					break
				}
				return ds, nil
			}
		}
		// The deliveries ended: the stream was closed, or the AMQP
		// channel died.
		select {
		case <-s.done:
			return nil, idem.ErrClosed
		default:
		}
		if restarted {
			return nil, fmt.Errorf("idemamqp: next: the channel closed again after subscribing anew: %w", amqp.ErrClosed)
		}
		restarted = true
		if err := s.startRetrying(ctx); err != nil {
			return nil, fmt.Errorf("idemamqp: next: the channel closed, subscribing anew: %w", err)
		}
	}
}

func (s *stream) handOut(gen *channelGen, d *amqp.Delivery) idem.Delivery {
	dd := s.delivery(*d)
	dd.gen = gen
	return dd
}

// AckBatch implements idem.BatchStream with as few frames as it can: the
// deliveries of ds on one channel that are all its unsettled deliveries
// up to a delivery tag (handed out or waiting in the client) take one
// basic.ack with multiple set, for that tag; the others one basic.ack
// each. basic.ack has no answer: as Ack, AckBatch returns once the frames
// are written. Deliveries settled already, and those of a channel that
// has died (whose messages the broker put back in the queue, to be
// delivered again), are passed over. Deliveries of another stream are
// refused with an error matching idem.ErrInvalidArgument.
func (s *stream) AckBatch(ctx context.Context, ds []idem.Delivery) (int, error) {
	if len(ds) == 0 {
		return 0, nil
	}
	own := make([]*delivery, len(ds))
	for i, d := range ds {
		ad, ok := d.(*delivery)
		if !ok || ad.s != s {
			return 0, &idem.ArgumentError{Field: "ds", Reason: fmt.Sprintf("delivery %d is not of this stream", i)}
		}
		own[i] = ad
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	var gens []*channelGen
	byGen := make(map[*channelGen][]*delivery)
	for _, d := range own {
		if d.gen.gone() || d.claim("ack") != nil {
			continue
		}
		if byGen[d.gen] == nil {
			gens = append(gens, d.gen)
		}
		byGen[d.gen] = append(byGen[d.gen], d)
	}
	n := 0
	var errs []error
	for _, gen := range gens {
		group := byGen[gen]
		acked, err := gen.ackAll(group)
		for i, d := range group {
			d.release(acked[i])
			if acked[i] {
				n++
			}
		}
		if err != nil && !errors.Is(err, amqp.ErrClosed) {
			// A channel that died meanwhile put its messages back: its
			// deliveries are passed over, like those found dead above.
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return n, fmt.Errorf("idemamqp: ack: %w", errors.Join(errs...))
	}
	return n, nil
}

// Close implements idem.Stream: closing the channel makes the broker put
// the messages it holds unsettled back in the queue at once.
func (s *stream) Close() error {
	s.closeOnce.Do(func() {
		close(s.done)
		s.mu.Lock()
		gen := s.gen
		s.mu.Unlock()
		if gen != nil {
			_ = gen.ch.Close()
		}
		s.t.mu.Lock()
		delete(s.t.streams, s)
		s.t.mu.Unlock()
	})
	return nil
}

func (s *stream) delivery(d amqp.Delivery) *delivery {
	m := idem.Message{ID: d.MessageId, Topic: d.RoutingKey, Time: d.Timestamp, Payload: d.Body}
	prior := 0
	for k, v := range d.Headers {
		switch k {
		case HeaderKey:
			m.Key = headerString(v)
			continue
		case HeaderTime:
			if tm, err := time.Parse(time.RFC3339Nano, headerString(v)); err == nil {
				m.Time = tm
			}
			continue
		case HeaderTopic:
			m.Topic = headerString(v)
			continue
		case HeaderAttempts:
			prior, _ = strconv.Atoi(headerString(v))
			continue
		}
		if reserved(k) {
			continue
		}
		if m.Headers == nil {
			m.Headers = make(map[string]string)
		}
		m.Headers[k] = headerString(v)
	}
	attempt := prior + 1
	if n, ok := headerInt(d.Headers[headerDeliveryCount]); ok {
		attempt += n
	} else if d.Redelivered && s.t.cfg.ClassicQueues {
		// A classic queue only says the message was delivered before.
		attempt++
	}
	topic, givenUp := s.deaths(d.Headers[headerDeath])
	if _, ok := d.Headers[HeaderTopic]; !ok && topic != "" {
		m.Topic = topic
	}
	if givenUp > 0 {
		// The count of the queue that gave the message up does not travel
		// with it: it had every delivery its limit allows.
		limit := s.t.cfg.DeliveryLimit
		if limit == 0 {
			limit = brokerDeliveryLimit
		}
		attempt += givenUp * (limit + 1)
	}
	return &delivery{s: s, d: d, m: m, attempt: attempt}
}

// deaths reads the x-death header of a message dead-lettered from the
// consumer's queue into its limit queue: the topic it was routed by, and
// how many times the queue gave it up past its delivery limit.
func (s *stream) deaths(v any) (topic string, givenUp int) {
	entries, _ := v.([]any)
	for _, e := range entries {
		death, ok := e.(amqp.Table)
		if !ok || headerString(death["queue"]) != s.queue {
			continue
		}
		if keys, _ := death["routing-keys"].([]any); len(keys) > 0 && topic == "" {
			topic = headerString(keys[0])
		}
		if headerString(death["reason"]) == deathReasonDeliveryLimit {
			n, _ := headerInt(death["count"])
			givenUp += max(n, 1)
		}
	}
	return topic, givenUp
}

func headerString(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case []byte:
		return string(v)
	case nil:
		return ""
	default:
		return fmt.Sprint(v)
	}
}

func headerInt(v any) (int, bool) {
	switch v := v.(type) {
	case int64:
		return int(v), true
	case int32:
		return int(v), true
	case int16:
		return int(v), true
	case int8:
		return int(v), true
	case int:
		return v, true
	case uint8:
		return int(v), true
	case uint16:
		return int(v), true
	case uint32:
		return int(v), true
	}
	return 0, false
}
