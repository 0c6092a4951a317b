package payments

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consumer"
	"github.com/idem-go/idem/deadletter"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/idemprom"
	"github.com/idem-go/idem/idemsqlite"
	"github.com/idem-go/idem/outbox"
)

// Names of the payment events and of their consumer.
const (
	// EventPaymentSucceeded is the type of the event every payment emits.
	EventPaymentSucceeded = "payment.succeeded"
	// EventRefundSucceeded is the type of the event every refund emits. It
	// travels on TopicPaymentSucceeded too, keyed by the account like the
	// payment's, so that one consumer settles both in the account's order.
	EventRefundSucceeded = "refund.succeeded"
	// TopicPaymentSucceeded is the topic it is published on.
	TopicPaymentSucceeded = "payments.succeeded"
	// SettlementConsumer is the name of the consumer that settles it.
	SettlementConsumer = "settlement"
)

// Defaults of the settlement consumer's retries.
const (
	DefaultMaxAttempts = 10
)

// PaymentEvent is the body of a payment.succeeded event, as JSON. Its
// EventID is also the transport message ID and the settlement consumer's
// de-duplication key.
type PaymentEvent struct {
	EventID   string `json:"event_id"`
	Type      string `json:"type"`
	PaymentID string `json:"payment_id"`
	// RefundID is set on refund.succeeded events only: the refund whose
	// amount the settlement subtracts.
	RefundID   string    `json:"refund_id,omitempty"`
	Tenant     string    `json:"tenant"`
	AccountID  string    `json:"account_id"`
	Amount     int64     `json:"amount"`
	Currency   string    `json:"currency"`
	OccurredAt time.Time `json:"occurred_at"`
}

// Settlement is a tenant's settled total: what GET /v1/settlement answers.
type Settlement struct {
	Currency string `json:"currency"`
	// Total is the sum of the amounts of the payments settled.
	Total int64 `json:"total"`
	// Events is how many payments were settled: each counts once, however
	// many events announced it.
	Events int64 `json:"events"`
	// Refunds is how many refunds were settled; their amounts are
	// subtracted from Total.
	Refunds int64 `json:"refunds"`
}

// paymentEvent is the outbox message announcing p, under a fresh event ID.
// Its key is the account, so one account's events are settled in order.
func paymentEvent(p Payment) (idem.Message, error) {
	ev := PaymentEvent{
		EventID:    newID("evt_"),
		Type:       EventPaymentSucceeded,
		PaymentID:  p.ID,
		Tenant:     p.Tenant,
		AccountID:  p.AccountID,
		Amount:     p.Amount,
		Currency:   p.Currency,
		OccurredAt: p.CreatedAt.UTC(),
	}
	body, err := json.Marshal(ev)
	if err != nil {
		return idem.Message{}, fmt.Errorf("encode event: %w", err)
	}
	return idem.Message{
		ID:      ev.EventID,
		Topic:   TopicPaymentSucceeded,
		Key:     p.AccountID,
		Headers: map[string]string{"Content-Type": "application/json"},
		Payload: body,
		Time:    p.CreatedAt,
	}, nil
}

// refundEvent is the outbox message announcing rf, under a fresh event ID,
// on the payments' topic and with the account as its key.
func refundEvent(rf Refund) (idem.Message, error) {
	ev := PaymentEvent{
		EventID:    newID("evt_"),
		Type:       EventRefundSucceeded,
		PaymentID:  rf.PaymentID,
		RefundID:   rf.ID,
		Tenant:     rf.Tenant,
		AccountID:  rf.AccountID,
		Amount:     rf.Amount,
		Currency:   rf.Currency,
		OccurredAt: rf.CreatedAt.UTC(),
	}
	body, err := json.Marshal(ev)
	if err != nil {
		return idem.Message{}, fmt.Errorf("encode event: %w", err)
	}
	return idem.Message{
		ID:      ev.EventID,
		Topic:   TopicPaymentSucceeded,
		Key:     rf.AccountID,
		Headers: map[string]string{"Content-Type": "application/json"},
		Payload: body,
		Time:    rf.CreatedAt,
	}, nil
}

// isRefund reports whether ev announces a refund rather than a payment.
func (ev PaymentEvent) isRefund() bool { return ev.Type == EventRefundSucceeded }

// subject is the ID of what ev announces: its refund or its payment.
func (ev PaymentEvent) subject() string {
	if ev.isRefund() {
		return ev.RefundID
	}
	return ev.PaymentID
}

// Transport carries payment events from the outbox relay to the
// settlement consumer: a broker (an *idemnats.Transport or an
// *idemamqp.Transport) or the database's own embedded transport.
type Transport interface {
	idem.Publisher
	idem.Subscriber
}

// purgeableInbox is an inbox whose old rows can be deleted.
type purgeableInbox interface {
	idem.Inbox
	PurgeInbox(ctx context.Context, olderThan time.Time, limit int) (int, error)
}

// embeddedTransport is a database's own transport.
type embeddedTransport interface {
	Transport
	Purge(ctx context.Context, olderThan time.Time, limit int) (int, error)
	Close() error
}

// messaging is the message half of one database: the stores the pipeline
// is built from, and how to run a function in one of its transactions.
type messaging struct {
	outbox  idem.Outbox
	inbox   purgeableInbox
	letters idem.DeadLetters
	ledger  idem.Ledger
	inTx    func(ctx context.Context, fn func(ctx context.Context) error) error
	// newEmbedded opens the database's own transport, used when no broker
	// is configured.
	newEmbedded func(ctx context.Context) (embeddedTransport, error)
}

// pipeline is the messaging half of the service: the relay from the outbox
// to the transport, and the settlement consumer.
type pipeline struct {
	msgs      messaging
	transport Transport
	// embedded is the database's transport when it carries the events;
	// nil when a broker does.
	embedded embeddedTransport
	relay    *outbox.Relay
	consumer *consumer.Consumer
	// relayObs and consumerObs are the relay's and the consumer's
	// histograms.
	relayObs    *idemprom.RelayObserver
	consumerObs *idemprom.ConsumerObserver
	store       storage
	faults      bool
	crash       func()
	logger      *slog.Logger

	stop context.CancelFunc
	wg   sync.WaitGroup
}

// newPipeline builds the relay and the consumer on the database's message
// stores and c.Broker (or the database's embedded transport); start runs
// them.
func newPipeline(ctx context.Context, store storage, msgs messaging, c *Config) (*pipeline, error) {
	p := &pipeline{msgs: msgs, store: store, faults: c.Faults, crash: c.Crash, logger: c.Logger}
	if c.Broker != nil {
		p.transport = c.Broker
	} else {
		tr, err := msgs.newEmbedded(ctx)
		if err != nil {
			return nil, fmt.Errorf("payments: transport: %w", err)
		}
		p.transport, p.embedded = tr, tr
	}
	p.relayObs = idemprom.NewRelayObserver(outboxName)
	p.consumerObs = idemprom.NewConsumerObserver(SettlementConsumer)
	relay, err := outbox.New(&outbox.Config{Outbox: msgs.outbox, Publisher: p.transport, Logger: c.Logger,
		Observer: outbox.Observers(p.relayObs, c.Observers.relay())})
	if err != nil {
		return nil, errors.Join(fmt.Errorf("payments: relay: %w", err), p.closeTransport())
	}
	var inbox idem.Inbox = msgs.inbox
	if c.Faults {
		ci := crashingInbox{Inbox: msgs.inbox, crash: p.crashAfterSettle}
		inbox = &ci
		if bi, ok := msgs.inbox.(idem.BatchInbox); ok {
			inbox = &crashingBatchInbox{crashingInbox: ci, batch: bi}
		}
	}
	cons, err := consumer.New(&consumer.Config{
		Name:        SettlementConsumer,
		Topic:       TopicPaymentSucceeded,
		Subscriber:  p.transport,
		Inbox:       inbox,
		DeadLetters: msgs.letters,
		Ledger:      msgs.ledger,
		DedupKey:    eventDedupKey,
		Retry:       idem.RetryPolicy{MaxAttempts: c.MaxAttempts, Base: c.RetryBase, Cap: c.RetryCap},
		InTx:        msgs.inTx,
		AckWait:     c.AckWait,
		Clock:       c.Clock,
		Observer:    consumer.Observers(p.consumerObs, c.Observers.consumer()),
		Logger:      c.Logger,
	})
	if err != nil {
		return nil, errors.Join(fmt.Errorf("payments: settlement consumer: %w", err), p.closeTransport())
	}
	p.relay, p.consumer = relay, cons
	return p, nil
}

// eventDedupKey is the body's event_id, so that a copy re-published under
// another transport ID is still caught. A body without one is permanent:
// no redelivery will give it one.
func eventDedupKey(m idem.Message) (string, error) {
	var ev struct {
		EventID string `json:"event_id"`
	}
	if err := json.Unmarshal(m.Payload, &ev); err != nil {
		return "", idem.Permanent(fmt.Errorf("malformed event: %w", err))
	}
	if ev.EventID == "" {
		return "", idem.Permanent(errors.New("malformed event: no event_id"))
	}
	return ev.EventID, nil
}

func (p *pipeline) start() {
	ctx, stop := context.WithCancel(context.Background())
	p.stop = stop
	p.wg.Add(2)
	go func() {
		defer p.wg.Done()
		// The settlement consumer's queue must exist before the first
		// event is published: a broker routes a message to the queues
		// that exist when it arrives, and a mandatory publish fails only
		// when there is none at all (another consumer's queue, say an
		// audit's, would take the event and settlement would never see
		// it). Until then the events wait in the outbox.
		select {
		case <-p.consumer.Subscribed():
		case <-ctx.Done():
			return
		}
		if err := p.relay.Run(ctx); err != nil {
			p.logger.Error("payments: the outbox relay stopped", "err", err)
		}
	}()
	go func() {
		defer p.wg.Done()
		if err := p.consumer.RunBatch(ctx, p.settle); err != nil {
			p.logger.Error("payments: the settlement consumer stopped", "err", err)
		}
	}()
}

// purgeOld deletes, in batches, the inbox rows recorded before horizon and
// the transport's messages published before it that every consumer has
// settled, and returns how many of each it deleted.
func (p *pipeline) purgeOld(ctx context.Context, horizon time.Time, batch int) (inbox, msgs int, err error) {
	for {
		n, err := p.msgs.inbox.PurgeInbox(ctx, horizon, batch)
		inbox += n
		if err != nil {
			return inbox, msgs, fmt.Errorf("purging inbox rows: %w", err)
		}
		if n < batch {
			break
		}
	}
	if p.embedded == nil {
		// A broker keeps and drops messages by its own rules.
		return inbox, 0, nil
	}
	for {
		n, err := p.embedded.Purge(ctx, horizon, batch)
		msgs += n
		if err != nil {
			return inbox, msgs, fmt.Errorf("purging settled messages: %w", err)
		}
		if n < batch {
			return inbox, msgs, nil
		}
	}
}

// close stops the relay and the consumer, waits for them, and closes the
// embedded transport (a broker is the caller's to close).
func (p *pipeline) close() error {
	if p.stop != nil {
		p.stop()
	}
	p.wg.Wait()
	return p.closeTransport()
}

func (p *pipeline) closeTransport() error {
	if p.embedded == nil {
		return nil
	}
	return p.embedded.Close()
}

// settle applies a batch of payment events: it marks their payments
// settled and adds those it marked to the tenants' settlement totals, in
// the transaction of the consumer's inbox rows (ctx carries it), in one
// statement for the batch and one per tenant and currency (storage's
// settle). An event of a payment settled already adds nothing and is
// logged. A malformed event, or one of an unknown payment, is permanent,
// and named
// (consumer.ItemError), so that its batch-mates are settled without it.
// With Config.Faults, the header Idem-Fault: fail-times=N fails an event's
// first N attempts transiently.
func (p *pipeline) settle(ctx context.Context, msgs []idem.Message) error {
	infos, _ := consumer.BatchInfoFromContext(ctx)
	evs := make([]PaymentEvent, len(msgs))
	crash := false
	for i, m := range msgs {
		if p.faults {
			if n, ok := failTimes(m.Headers[HeaderFault]); ok && i < len(infos) && infos[i].Attempt <= n {
				return &consumer.ItemError{Index: i, Err: fmt.Errorf("injected fault fail-times=%d: attempt %d fails", n, infos[i].Attempt)}
			}
			crash = crash || hasFault(m.Headers[HeaderFault], faultCrashAfterSettle)
		}
		if err := json.Unmarshal(m.Payload, &evs[i]); err != nil {
			return &consumer.ItemError{Index: i, Err: idem.Permanent(fmt.Errorf("malformed event: %w", err))}
		}
		if ev := evs[i]; ev.EventID == "" || ev.PaymentID == "" || ev.Tenant == "" {
			return &consumer.ItemError{Index: i, Err: idem.Permanent(errors.New("malformed event: event_id, payment_id and tenant are required"))}
		}
		if ev := evs[i]; ev.isRefund() && ev.RefundID == "" {
			return &consumer.ItemError{Index: i, Err: idem.Permanent(errors.New("malformed event: a refund's event requires refund_id"))}
		}
	}
	already, err := p.store.settle(ctx, evs)
	if err != nil {
		var ee *eventError
		if errors.As(err, &ee) {
			return &consumer.ItemError{Index: ee.index, Err: ee.err}
		}
		return err
	}
	for _, i := range already {
		// Not a redelivery (the inbox absorbs those before settle runs)
		// but another event, under an ID of its own, for a payment that
		// was settled: a producer announced it twice.
		p.logger.WarnContext(ctx, "payments: an event of a payment settled already adds nothing to the settlement",
			"event", evs[i].EventID, "payment", evs[i].PaymentID)
	}
	if crash {
		armCrash(ctx)
	}
	return nil
}

// faultCrashAfterSettle, in an event's Idem-Fault header, kills the
// process once the event's settlement and inbox row have committed and
// before the transport hears of it: the moment a consumer crash leaves a
// message applied and not acknowledged. The transport delivers it again
// after the restart, and the inbox must absorb it.
const faultCrashAfterSettle = "crash-after-settle"

// hasFault reports whether the comma-separated faults of v name fault.
func hasFault(v, fault string) bool {
	for item := range strings.SplitSeq(v, ",") {
		if strings.TrimSpace(item) == fault {
			return true
		}
	}
	return false
}

type crashArmKey struct{}

// armCrash asks the crashingInbox around this attempt to crash once its
// transaction commits.
func armCrash(ctx context.Context) {
	if armed, ok := ctx.Value(crashArmKey{}).(*bool); ok {
		*armed = true
	}
}

// crashingInbox runs crash-after-settle: it lets an attempt's handler arm
// a crash, and fires it once the inbox row and the handler's writes have
// committed, before the consumer acknowledges the message.
type crashingInbox struct {
	idem.Inbox
	crash func()
}

func (c *crashingInbox) Process(ctx context.Context, consumer, dedupKey string, fn func(ctx context.Context) error) error {
	armed := new(bool)
	err := c.Inbox.Process(context.WithValue(ctx, crashArmKey{}, armed), consumer, dedupKey, fn)
	if err == nil && *armed {
		c.crash()
	}
	return err
}

// crashingBatchInbox is crashingInbox for an inbox that records batches:
// the crash fires once the whole batch has committed.
type crashingBatchInbox struct {
	crashingInbox
	batch idem.BatchInbox
}

func (c *crashingBatchInbox) ProcessBatch(ctx context.Context, consumer string, keys []string, fn func(context.Context, []bool) error) error {
	armed := new(bool)
	err := c.batch.ProcessBatch(context.WithValue(ctx, crashArmKey{}, armed), consumer, keys, fn)
	if err == nil && *armed {
		c.crash()
	}
	return err
}

func (p *pipeline) crashAfterSettle() {
	p.logger.Warn("payments: crash-after-settle: killing the process after the settlement committed, before the message is acknowledged")
	p.crash()
}

// checkEvent refuses, as permanent, an event that disagrees with the
// stored payment (amount and currency): the payment is the truth, and an
// event that differs was tampered with or is not this payment's.
func checkEvent(ev PaymentEvent, amount int64, currency string) error {
	if amount != ev.Amount || currency != ev.Currency {
		return idem.Permanent(fmt.Errorf("event %s disagrees with payment %s (%d %s recorded)", ev.EventID, ev.PaymentID, amount, currency))
	}
	return nil
}

// failTimes reads "fail-times=N" among the comma-separated faults of v.
func failTimes(v string) (int, bool) {
	for item := range strings.SplitSeq(v, ",") {
		name, val, ok := strings.Cut(strings.TrimSpace(item), "=")
		if !ok || strings.TrimSpace(name) != "fail-times" {
			continue
		}
		n, err := strconv.Atoi(strings.TrimSpace(val))
		if err != nil || n < 0 {
			return 0, false
		}
		return n, true
	}
	return 0, false
}

// getSettlement answers GET /v1/settlement.
func (s *Service) getSettlement(w http.ResponseWriter, r *http.Request) {
	st, err := s.store.settlement(r.Context(), tenantFrom(r.Context()))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, st)
}

// wakeRelay wraps the payments endpoint: once its answer is written, the
// payment (and its event) has committed, with the key, so the relay is
// woken to publish at once rather than at its next poll. Only an answer
// for which an event was written wakes it: a replay, a refusal or a
// failure has nothing to publish.
func (s *Service) wakeRelay(next http.Handler) http.Handler {
	if s.pipeline == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var wrote atomic.Bool
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), eventWrittenKey{}, &wrote)))
		if wrote.Load() {
			s.pipeline.relay.Wake()
		}
	})
}

type eventWrittenKey struct{}

// noteEvent tells wakeRelay, through ctx, that the request wrote an event
// to the outbox.
func noteEvent(ctx context.Context) {
	if wrote, ok := ctx.Value(eventWrittenKey{}).(*atomic.Bool); ok {
		wrote.Store(true)
	}
}

// Observers are what a Service's middlewares, settlement consumer and
// outbox relay report to, beside the service's own Prometheus histograms
// (tracing, say: package idemotel implements each). Every field is
// optional.
type Observers struct {
	// Middleware returns the observer of the idempotency middleware named
	// name ("payments", "deposits", "refunds", "accounts"), or nil.
	Middleware func(name string) idemhttp.Observer
	// Consumer observes the settlement consumer.
	Consumer consumer.Observer
	// Relay observes the outbox relay.
	Relay outbox.Observer
	// Message is called with each event as it is written to the outbox,
	// in the transaction of the request that caused it and with that
	// request's context (its handler's), to add headers to it; the outbox,
	// the relay and the transport carry them to the settlement consumer.
	// idemotel's Tracing.Inject writes the W3C traceparent there, so that
	// a settlement continues the trace of its payment.
	Message func(ctx context.Context, m *idem.Message)
}

func (o *Observers) middleware(name string) idemhttp.Observer {
	if o == nil || o.Middleware == nil {
		return nil
	}
	return o.Middleware(name)
}

func (o *Observers) consumer() consumer.Observer {
	if o == nil {
		return nil
	}
	return o.Consumer
}

func (o *Observers) relay() outbox.Observer {
	if o == nil {
		return nil
	}
	return o.Relay
}

// outbox returns ob, or ob adding headers to every message with Message.
func (o *Observers) outbox(ob idem.Outbox) idem.Outbox {
	if o == nil || o.Message == nil {
		return ob
	}
	return &headerOutbox{Outbox: ob, message: o.Message}
}

// headerOutbox is an outbox whose Add lets message add headers first.
type headerOutbox struct {
	idem.Outbox
	message func(ctx context.Context, m *idem.Message)
}

func (h *headerOutbox) Add(ctx context.Context, msgs ...idem.Message) error {
	out := make([]idem.Message, len(msgs))
	for i, m := range msgs {
		// Its own map: the caller's message keeps its headers.
		m.Headers = maps.Clone(m.Headers)
		h.message(ctx, &m)
		out[i] = m
	}
	return h.Outbox.Add(ctx, out...)
}

// collectors are the pipeline's metrics: the settlement consumer's counts
// and histograms, the dead letters' gauges, the relay's counts and
// histograms and, where the transport and the outbox tell them, what the
// consumer's streams hold and the outbox's backlog.
func (p *pipeline) collectors(c *Config) ([]prometheus.Collector, error) {
	letters, err := idemprom.NewDeadLettersCollector(p.msgs.letters, &idemprom.DeadLettersConfig{
		Consumers: []string{SettlementConsumer}, Clock: c.Clock, Logger: c.Logger})
	if err != nil {
		return nil, fmt.Errorf("payments: metrics: %w", err)
	}
	cs := []prometheus.Collector{
		idemprom.NewConsumerCollector(SettlementConsumer, p.consumer), p.consumerObs, letters, p.relayObs,
	}
	// A transport that holds messages in the process's memory (Kafka's
	// streams) tells how many, and how long its partitions' positions
	// have stood still.
	t := p.transport
	if u, ok := t.(interface{ Unwrap() Transport }); ok {
		t = u.Unwrap()
	}
	if s, ok := t.(idemprom.StreamStatser); ok {
		cs = append(cs, idemprom.NewStreamCollector(SettlementConsumer, s, c.Clock))
	}
	if b, ok := p.msgs.outbox.(idemprom.Backlogger); ok {
		backlog, err := idemprom.NewOutboxCollector(outboxName, b, &idemprom.OutboxConfig{Clock: c.Clock, Logger: c.Logger})
		if err != nil {
			return nil, fmt.Errorf("payments: metrics: %w", err)
		}
		cs = append(cs, backlog)
	}
	return cs, nil
}

// outboxName labels the metrics of the service's outbox and its relay.
const outboxName = "payments"

// DeadLetterService returns the dead-letter service on db, the SQLite
// database a Service runs on: what `idem dlq` and tests act on the
// settlement consumer's dead letters through. Re-driven messages go to the
// service's outbox, in the transaction of the letter's change, and its
// relay publishes them (the service need not run in this process).
//
// They are re-published under new IDs (deadletter.SuffixIDs), which no
// broker's duplicate window drops; the settlement consumer de-duplicates
// by the body's event_id, which they keep.
func DeadLetterService(ctx context.Context, db *idemsqlite.DB) (*deadletter.Service, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: DB is required", ErrConfig)
	}
	msgs, err := sqliteMessaging(ctx, db, &Config{})
	if err != nil {
		return nil, err
	}
	return deadLetterService(msgs)
}

// DeadLetterServicePostgres is DeadLetterService for a Service on
// PostgreSQL.
func DeadLetterServicePostgres(ctx context.Context, db *idempg.DB) (*deadletter.Service, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: Postgres is required", ErrConfig)
	}
	msgs, err := pgMessaging(ctx, db, &Config{})
	if err != nil {
		return nil, err
	}
	return deadLetterService(msgs)
}

func deadLetterService(msgs messaging) (*deadletter.Service, error) {
	svc, err := deadletter.New(&deadletter.Config{
		DeadLetters: msgs.letters,
		Ledger:      msgs.ledger,
		Outbox:      msgs.outbox,
		InTx:        msgs.inTx,
		IDs:         deadletter.SuffixIDs,
	})
	if err != nil {
		return nil, fmt.Errorf("payments: dead-letter service: %w", err)
	}
	return svc, nil
}
