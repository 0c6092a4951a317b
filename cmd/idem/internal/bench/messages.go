package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consumer"
	"github.com/idem-go/idem/outbox"
)

// MessagesOptions configures Messages. The zero value of every field means
// its default; a broker whose URL is empty is not measured.
type MessagesOptions struct {
	// PostgresURL is the PostgreSQL to measure, e.g.
	// postgres://postgres@127.0.0.1:5432/test. Each measurement works in a
	// schema of its own, dropped afterwards. Without it, SQLite alone is
	// measured (and holds the brokers' inboxes).
	PostgresURL string
	// NATSURL is a NATS server with JetStream to measure, e.g.
	// nats://127.0.0.1:4222. Its streams are made for the run and deleted.
	NATSURL string
	// AMQPURL is a RabbitMQ to measure, e.g.
	// amqp://guest:guest@127.0.0.1:5672/. Its queues and exchanges are made
	// for the run and deleted.
	AMQPURL string
	// KafkaSeeds are the brokers of a Kafka to measure (HOST:PORT each).
	// Its topics are made for the run and deleted.
	KafkaSeeds []string
	// Dir holds the SQLite files, each removed after its measurement.
	// Defaults to a temporary directory of its own.
	Dir string
	// Messages is the number of messages of each measurement. Defaults to
	// 20,000.
	Messages int
	// Keys is the number of ordering keys the messages are spread over, as
	// the payment events are over accounts. Defaults to 100.
	Keys int
	// Rounds is how many times every measurement runs, in turn, so that a
	// machine's drift hits them alike; the median counts. Defaults to 3.
	Rounds int
	// Only, when not empty, names the measurements to run (as in their
	// RESULT lines, e.g. "idem-consumer-pg"); the others are skipped.
	Only []string
	// Out receives a progress line per measurement. Defaults to io.Discard.
	Out io.Writer
	// Results receives every figure as it is measured, as a line
	// RESULT,<name>,<metric>,<value>,<unit>. Defaults to io.Discard.
	Results io.Writer
}

// Figure is one quantity measured in every round.
type Figure struct {
	Name, Metric, Unit string
	// Values holds one value per round, in order.
	Values []float64
}

// Median is the median of the rounds' values.
func (f Figure) Median() float64 {
	v := slices.Clone(f.Values)
	slices.Sort(v)
	if len(v) == 0 {
		return 0
	}
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

// point is one measured value.
type point struct {
	name, metric string
	value        float64
	unit         string
}

// measurement is one thing Messages measures: run makes one round of it,
// from a fresh world, and returns its figures.
type measurement struct {
	name string
	run  func(ctx context.Context, o *MessagesOptions) ([]point, error)
}

// Messages measures the message half on every backend it is given, against
// the hand-written minimum of each, and returns every figure, in the order
// first measured:
//
//   - idem-consumer-<backend> (msgs_per_s): consumer.Consumer with its
//     defaults on the backend's transport, de-duplicating by message ID in
//     the inbox and incrementing a counter (the row of the message's key)
//     in the inbox's transaction, over a backlog of Messages messages;
//     idem-consumer-batch-<backend> is the same with a BatchHandler that
//     increments the counters in one statement per batch;
//   - minimum-consumer-<backend> (msgs_per_s): the same work written by
//     hand, one transaction per message, with as many workers as the
//     consumer's Concurrency;
//   - idem-transport-<backend> (take_ack_per_s): one stream taking and
//     acknowledging the backlog in batches, with no inbox and no effect;
//   - idem-relay-<backend> (publish_per_s): outbox.Relay moving an outbox
//     of Messages entries to the transport;
//   - idem-pipeline-<backend> (payments_per_s, settled_per_s): the payment
//     service in process, paid Messages/4 times by 16 clients; settled_per_s
//     counts from the first payment to the last settlement.
//
// Every round runs every measurement once, in turn.
func Messages(ctx context.Context, opts *MessagesOptions) ([]Figure, error) {
	o := MessagesOptions{}
	if opts != nil {
		o = *opts
	}
	if o.Messages <= 0 {
		o.Messages = 20000
	}
	if o.Keys <= 0 {
		o.Keys = 100
	}
	if o.Rounds <= 0 {
		o.Rounds = 3
	}
	if o.Out == nil {
		o.Out = io.Discard
	}
	if o.Results == nil {
		o.Results = io.Discard
	}
	if o.Dir == "" {
		dir, err := makeTempDir()
		if err != nil {
			return nil, err
		}
		defer removeAll(dir)
		o.Dir = dir
	}
	ms := messageMeasurements(&o)
	if len(o.Only) > 0 {
		ms = slices.DeleteFunc(ms, func(m measurement) bool { return !slices.Contains(o.Only, m.name) })
		if len(ms) == 0 {
			return nil, fmt.Errorf("bench: no measurement is named %s", strings.Join(o.Only, ", "))
		}
	}
	var order []string
	figures := make(map[string]*Figure)
	for round := 1; round <= o.Rounds; round++ {
		for _, m := range ms {
			fmt.Fprintf(o.Out, "round %d of %d: %s, %d messages\n", round, o.Rounds, m.name, o.Messages)
			began := time.Now()
			pts, err := m.run(ctx, &o)
			if err != nil {
				return collect(order, figures), fmt.Errorf("bench: %s: %w", m.name, err)
			}
			for _, p := range pts {
				fmt.Fprintf(o.Results, "RESULT,%s,%s,%.1f,%s\n", p.name, p.metric, p.value, p.unit)
				k := p.name + "," + p.metric
				f := figures[k]
				if f == nil {
					f = &Figure{Name: p.name, Metric: p.metric, Unit: p.unit}
					figures[k] = f
					order = append(order, k)
				}
				f.Values = append(f.Values, p.value)
			}
			fmt.Fprintf(o.Out, "  done in %s\n", time.Since(began).Round(10*time.Millisecond))
		}
	}
	return collect(order, figures), nil
}

func collect(order []string, figures map[string]*Figure) []Figure {
	out := make([]Figure, 0, len(order))
	for _, k := range order {
		out = append(out, *figures[k])
	}
	return out
}

// messageMeasurements lists what Messages measures for o's backends.
func messageMeasurements(o *MessagesOptions) []measurement {
	var ms []measurement
	var inboxes backend
	if o.PostgresURL != "" {
		pg := postgresBackend(o.PostgresURL)
		ms = append(ms, backendMeasurements(pg)...)
		inboxes = pg
	}
	sq := sqliteBackend(o.Dir)
	ms = append(ms, backendMeasurements(sq)...)
	if inboxes.name == "" {
		inboxes = sq
	}
	if o.NATSURL != "" {
		ms = append(ms, brokerMeasurements(natsBroker(o.NATSURL), inboxes)...)
	}
	if o.AMQPURL != "" {
		ms = append(ms, brokerMeasurements(amqpBroker(o.AMQPURL), inboxes)...)
	}
	if len(o.KafkaSeeds) > 0 {
		ms = append(ms, brokerMeasurements(kafkaBroker(o.KafkaSeeds), inboxes)...)
	}
	return ms
}

// backend is a database the message half runs on: its own transport,
// inbox, dead letters, ledger and outbox, the counters the consumers
// increment, and the hand-written minimum.
type backend struct {
	name string
	open func(ctx context.Context) (*world, error)
}

// world is one fresh backend: everything a measurement needs, and how to
// get rid of it.
type world struct {
	transport idem.Publisher
	sub       idem.Subscriber
	outbox    idem.Outbox
	inbox     idem.Inbox
	letters   idem.DeadLetters
	ledger    idem.Ledger
	inTx      func(ctx context.Context, fn func(context.Context) error) error
	// incr adds n to the counter of key, in the transaction ctx carries;
	// incrAll adds one per key listed, in one statement.
	incr    func(ctx context.Context, key string) error
	incrAll func(ctx context.Context, keys []string) error
	// check verifies that every counter and the inbox add up to n.
	check func(ctx context.Context, consumer string, n int) error
	// byHand applies one message as the hand-written minimum does: one
	// transaction that records it in the inbox of consumer and increments
	// its key's counter when the inbox had not seen it.
	byHand func(ctx context.Context, consumer, id, key string) error
	// minimum is the hand-written consumer over a queue of its own holding
	// msgs; it returns once every message is applied.
	minimum func(ctx context.Context, msgs []idem.Message, workers int) (time.Duration, error)
	// pipeline runs the payment service on the backend.
	pipeline func(ctx context.Context, payments int) (pipelineFigures, error)
	close    func()
}

func backendMeasurements(b backend) []measurement {
	return []measurement{
		{"idem-consumer-" + b.name, func(ctx context.Context, o *MessagesOptions) ([]point, error) {
			return measureConsumer(ctx, o, b, "idem-consumer-"+b.name, false)
		}},
		{"minimum-consumer-" + b.name, func(ctx context.Context, o *MessagesOptions) ([]point, error) {
			return measureMinimum(ctx, o, b, "minimum-consumer-"+b.name)
		}},
		{"idem-consumer-batch-" + b.name, func(ctx context.Context, o *MessagesOptions) ([]point, error) {
			return measureConsumer(ctx, o, b, "idem-consumer-batch-"+b.name, true)
		}},
		{"idem-transport-" + b.name, func(ctx context.Context, o *MessagesOptions) ([]point, error) {
			return measureTransport(ctx, o, b, "idem-transport-"+b.name)
		}},
		{"idem-relay-" + b.name, func(ctx context.Context, o *MessagesOptions) ([]point, error) {
			return measureRelay(ctx, o, b, "idem-relay-"+b.name)
		}},
		{"idem-pipeline-" + b.name, func(ctx context.Context, o *MessagesOptions) ([]point, error) {
			return measurePipeline(ctx, o, b, "idem-pipeline-"+b.name)
		}},
	}
}

const benchTopic = "bench.payments.succeeded"

// backlog returns the measurement's messages, spread over o.Keys keys.
func backlog(o *MessagesOptions, run string) []idem.Message {
	msgs := make([]idem.Message, o.Messages)
	for i := range msgs {
		id := fmt.Sprintf("%s-evt-%d", run, i)
		msgs[i] = idem.Message{
			ID:      id,
			Topic:   benchTopic,
			Key:     counterKey(i % o.Keys),
			Payload: fmt.Appendf(nil, `{"event_id":%q,"amount":1250}`, id),
		}
	}
	return msgs
}

func counterKey(i int) string { return fmt.Sprintf("acct-%d", i) }

// publishAll publishes msgs in calls of 1,000.
func publishAll(ctx context.Context, p idem.Publisher, msgs []idem.Message) error {
	for i := 0; i < len(msgs); i += 1000 {
		if err := p.Publish(ctx, msgs[i:min(i+1000, len(msgs))]...); err != nil {
			return fmt.Errorf("publish: %w", err)
		}
	}
	return nil
}

// subscribeOnce makes sure the consumer name exists, so that what is
// published next is queued for it.
func subscribeOnce(ctx context.Context, sub idem.Subscriber, name string) error {
	s, err := sub.Subscribe(ctx, idem.Subscription{Topic: benchTopic, Consumer: name})
	if err != nil {
		return fmt.Errorf("subscribe: %w", err)
	}
	return s.Close()
}

func rate(n int, d time.Duration) float64 { return float64(n) / d.Seconds() }

// measureConsumer runs a consumer with its defaults over a published
// backlog and times it until every message is processed.
func measureConsumer(ctx context.Context, o *MessagesOptions, b backend, name string, batch bool) ([]point, error) {
	w, err := b.open(ctx)
	if err != nil {
		return nil, err
	}
	defer w.close()
	const consumerName = "settlement"
	if err := subscribeOnce(ctx, w.sub, consumerName); err != nil {
		return nil, err
	}
	msgs := backlog(o, randomID())
	if err := publishAll(ctx, w.transport, msgs); err != nil {
		return nil, err
	}
	d, err := runConsumer(ctx, w, w.sub, consumerName, len(msgs), batch)
	if err != nil {
		return nil, err
	}
	if err := w.check(ctx, consumerName, len(msgs)); err != nil {
		return nil, err
	}
	return []point{{name, "msgs_per_s", rate(len(msgs), d), "msgs/s"}}, nil
}

// runConsumer runs a consumer of sub on w's stores until n messages are
// processed, and returns how long that took.
func runConsumer(ctx context.Context, w *world, sub idem.Subscriber, name string, n int, batch bool) (time.Duration, error) {
	c, err := consumer.New(&consumer.Config{
		Name:        name,
		Topic:       benchTopic,
		Subscriber:  sub,
		Inbox:       w.inbox,
		DeadLetters: w.letters,
		Ledger:      w.ledger,
		InTx:        w.inTx,
	})
	if err != nil {
		return 0, err
	}
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	ran := make(chan error, 1)
	began := time.Now()
	go func() {
		if batch {
			ran <- c.RunBatch(rctx, func(ctx context.Context, msgs []idem.Message) error {
				keys := make([]string, len(msgs))
				for i, m := range msgs {
					keys[i] = m.Key
				}
				return w.incrAll(ctx, keys)
			})
			return
		}
		ran <- c.Run(rctx, func(ctx context.Context, m idem.Message) error { return w.incr(ctx, m.Key) })
	}()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(10 * time.Minute)
	for c.Stats().Processed < int64(n) {
		select {
		case <-tick.C:
		case err := <-ran:
			return 0, fmt.Errorf("the consumer stopped after %d of %d messages: %v", c.Stats().Processed, n, err)
		case <-deadline:
			return 0, fmt.Errorf("%d of %d messages processed after 10 minutes", c.Stats().Processed, n)
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	d := time.Since(began)
	stop()
	if err := <-ran; err != nil {
		return 0, err
	}
	if st := c.Stats(); st.Processed != int64(n) || st.DeadLettered != 0 {
		return 0, fmt.Errorf("consumer stats %+v, want %d processed", st, n)
	}
	return d, nil
}

// measureMinimum runs the backend's hand-written consumer over the same
// backlog, with the consumer's default concurrency.
func measureMinimum(ctx context.Context, o *MessagesOptions, b backend, name string) ([]point, error) {
	w, err := b.open(ctx)
	if err != nil {
		return nil, err
	}
	defer w.close()
	msgs := backlog(o, randomID())
	d, err := w.minimum(ctx, msgs, defaultConcurrency)
	if err != nil {
		return nil, err
	}
	if err := w.check(ctx, minimumConsumer, len(msgs)); err != nil {
		return nil, err
	}
	return []point{{name, "msgs_per_s", rate(len(msgs), d), "msgs/s"}}, nil
}

// defaultConcurrency is consumer.Config.Concurrency's default, the
// hand-written minimum's number of workers.
const defaultConcurrency = 4

// minimumConsumer is the inbox's consumer name for the hand-written
// minimum.
const minimumConsumer = "minimum"

// measureTransport takes and acknowledges a published backlog with one
// stream, in batches of 100 where the stream takes batches.
func measureTransport(ctx context.Context, o *MessagesOptions, b backend, name string) ([]point, error) {
	w, err := b.open(ctx)
	if err != nil {
		return nil, err
	}
	defer w.close()
	d, err := takeAndAck(ctx, w.transport, w.sub, backlog(o, randomID()))
	if err != nil {
		return nil, err
	}
	return []point{{name, "take_ack_per_s", rate(o.Messages, d), "msgs/s"}}, nil
}

// takeAndAck publishes msgs, then times one stream taking and
// acknowledging them all.
func takeAndAck(ctx context.Context, pub idem.Publisher, sub idem.Subscriber, msgs []idem.Message) (time.Duration, error) {
	s, err := sub.Subscribe(ctx, idem.Subscription{Topic: benchTopic, Consumer: "take-ack"})
	if err != nil {
		return 0, err
	}
	defer s.Close()
	if err := publishAll(ctx, pub, msgs); err != nil {
		return 0, err
	}
	seen := make(map[string]bool, len(msgs))
	began := time.Now()
	bs, batched := s.(idem.BatchStream)
	for len(seen) < len(msgs) {
		nctx, cancel := context.WithTimeout(ctx, time.Minute)
		var ds []idem.Delivery
		if batched {
			ds, err = bs.NextBatch(nctx, 100)
		} else {
			var d idem.Delivery
			if d, err = s.Next(nctx); err == nil {
				ds = []idem.Delivery{d}
			}
		}
		cancel()
		if err != nil {
			return 0, fmt.Errorf("after %d of %d messages: %w", len(seen), len(msgs), err)
		}
		if batched {
			_, err = bs.AckBatch(ctx, ds)
		} else {
			err = ds[0].Ack(ctx)
		}
		if err != nil {
			return 0, fmt.Errorf("ack: %w", err)
		}
		for _, d := range ds {
			seen[d.Message().ID] = true
		}
	}
	return time.Since(began), nil
}

// measureRelay moves an outbox of o.Messages entries to the transport with
// outbox.Relay's defaults, and checks that a subscriber has them all.
func measureRelay(ctx context.Context, o *MessagesOptions, b backend, name string) ([]point, error) {
	w, err := b.open(ctx)
	if err != nil {
		return nil, err
	}
	defer w.close()
	s, err := w.sub.Subscribe(ctx, idem.Subscription{Topic: benchTopic, Consumer: "relayed"})
	if err != nil {
		return nil, err
	}
	defer s.Close()
	msgs := backlog(o, randomID())
	for i := 0; i < len(msgs); i += 1000 {
		if err := w.outbox.Add(ctx, msgs[i:min(i+1000, len(msgs))]...); err != nil {
			return nil, fmt.Errorf("outbox add: %w", err)
		}
	}
	relay, err := outbox.New(&outbox.Config{Outbox: w.outbox, Publisher: w.transport})
	if err != nil {
		return nil, err
	}
	began := time.Now()
	for moved := 0; moved < len(msgs); {
		n, err := relay.Flush(ctx)
		if err != nil {
			return nil, err
		}
		if n == 0 {
			return nil, fmt.Errorf("the relay moved %d of %d entries, then found none", moved, len(msgs))
		}
		moved += n
	}
	d := time.Since(began)
	bs, ok := s.(idem.BatchStream)
	if !ok {
		return nil, errors.New("the transport's stream takes no batches")
	}
	seen := make(map[string]bool, len(msgs))
	for len(seen) < len(msgs) {
		nctx, cancel := context.WithTimeout(ctx, time.Minute)
		ds, err := bs.NextBatch(nctx, 1000)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("reading back the relayed messages, %d of %d: %w", len(seen), len(msgs), err)
		}
		for _, d := range ds {
			seen[d.Message().ID] = true
		}
		if _, err := bs.AckBatch(ctx, ds); err != nil {
			return nil, err
		}
	}
	return []point{{name, "publish_per_s", rate(len(msgs), d), "msgs/s"}}, nil
}

// pipelineFigures is what one run of the payment service measured.
type pipelineFigures struct {
	payments int
	// paid is how long the payments took; settled how long from the first
	// payment until the last one was settled.
	paid, settled time.Duration
}

func measurePipeline(ctx context.Context, o *MessagesOptions, b backend, name string) ([]point, error) {
	w, err := b.open(ctx)
	if err != nil {
		return nil, err
	}
	defer w.close()
	f, err := w.pipeline(ctx, max(o.Messages/4, 1))
	if err != nil {
		return nil, err
	}
	return []point{
		{name, "payments_per_s", rate(f.payments, f.paid), "payments/s"},
		{name, "settled_per_s", rate(f.payments, f.settled), "payments/s"},
		{name, "lag_ms", float64((f.settled - f.paid).Microseconds()) / 1000, "ms"},
	}, nil
}

// PrintFigures writes the figures' medians as a table, then the ratios of
// each idem figure to the hand-written minimum measured beside it.
func PrintFigures(w io.Writer, fs []Figure) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "name\tmetric\tmedian\tmin\tmax\tunit\t")
	for _, f := range fs {
		fmt.Fprintf(tw, "%s\t%s\t%.0f\t%.0f\t%.0f\t%s\t\n", f.Name, f.Metric, f.Median(), slices.Min(f.Values), slices.Max(f.Values), f.Unit)
	}
	tw.Flush()
	byName := make(map[string]Figure)
	for _, f := range fs {
		byName[f.Name+","+f.Metric] = f
	}
	var lines []string
	for _, f := range fs {
		if !strings.HasPrefix(f.Name, "idem-consumer-") {
			continue
		}
		backend := strings.TrimPrefix(strings.TrimPrefix(f.Name, "idem-consumer-"), "batch-")
		if m, ok := byName["minimum-consumer-"+backend+","+f.Metric]; ok && m.Median() > 0 {
			lines = append(lines, fmt.Sprintf("%s / minimum-consumer-%s: %.2fx", f.Name, backend, f.Median()/m.Median()))
		}
	}
	sort.Strings(lines)
	for _, l := range lines {
		fmt.Fprintln(w, l)
	}
}

// closers gathers what a world must close, in reverse order.
type closers struct {
	mu  sync.Mutex
	fns []func()
}

func (c *closers) add(fn func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.fns = append(c.fns, fn)
}

func (c *closers) close() {
	c.mu.Lock()
	fns := c.fns
	c.fns = nil
	c.mu.Unlock()
	for i := len(fns) - 1; i >= 0; i-- {
		fns[i]()
	}
}
