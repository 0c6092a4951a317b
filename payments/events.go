package payments

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consumer"
	"github.com/idem-go/idem/deadletter"
	"github.com/idem-go/idem/idemsqlite"
	"github.com/idem-go/idem/outbox"
)

// Names of the payment events and of their consumer.
const (
	// EventPaymentSucceeded is the type of the event every payment emits.
	EventPaymentSucceeded = "payment.succeeded"
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
	EventID    string    `json:"event_id"`
	Type       string    `json:"type"`
	PaymentID  string    `json:"payment_id"`
	Tenant     string    `json:"tenant"`
	AccountID  string    `json:"account_id"`
	Amount     int64     `json:"amount"`
	Currency   string    `json:"currency"`
	OccurredAt time.Time `json:"occurred_at"`
}

// Settlement is a tenant's settled total: what GET /v1/settlement answers.
type Settlement struct {
	Currency string `json:"currency"`
	Total    int64  `json:"total"`
	Events   int64  `json:"events"`
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

// pipeline is the messaging half of the service on SQLite: the relay from
// the outbox to the embedded transport, and the settlement consumer.
type pipeline struct {
	db        *idemsqlite.DB
	outbox    *idemsqlite.Outbox
	transport *idemsqlite.Transport
	inbox     *idemsqlite.Inbox
	letters   *idemsqlite.DeadLetters
	relay     *outbox.Relay
	consumer  *consumer.Consumer
	faults    bool
	logger    *slog.Logger

	stop context.CancelFunc
	wg   sync.WaitGroup
}

// newPipeline opens the message stores on db and builds the relay and the
// consumer; start runs them.
func newPipeline(ctx context.Context, db *idemsqlite.DB, c *Config) (*pipeline, error) {
	ob, err := idemsqlite.NewOutbox(ctx, db, &idemsqlite.OutboxConfig{Clock: c.Clock})
	if err != nil {
		return nil, fmt.Errorf("payments: outbox: %w", err)
	}
	tr, err := idemsqlite.NewTransport(ctx, db, &idemsqlite.TransportConfig{Poll: c.TransportPoll})
	if err != nil {
		return nil, fmt.Errorf("payments: transport: %w", err)
	}
	inbox, err := idemsqlite.NewInbox(ctx, db)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("payments: inbox: %w", err), tr.Close())
	}
	letters, err := idemsqlite.NewDeadLetters(ctx, db, &idemsqlite.DeadLettersConfig{Clock: c.Clock})
	if err != nil {
		return nil, errors.Join(fmt.Errorf("payments: dead letters: %w", err), tr.Close())
	}
	ledger, err := idemsqlite.NewLedger(ctx, db)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("payments: ledger: %w", err), tr.Close())
	}
	relay, err := outbox.New(&outbox.Config{Outbox: ob, Publisher: tr, Logger: c.Logger})
	if err != nil {
		return nil, errors.Join(fmt.Errorf("payments: relay: %w", err), tr.Close())
	}
	cons, err := consumer.New(&consumer.Config{
		Name:        SettlementConsumer,
		Topic:       TopicPaymentSucceeded,
		Subscriber:  tr,
		Inbox:       inbox,
		DeadLetters: letters,
		Ledger:      ledger,
		DedupKey:    eventDedupKey,
		Retry:       idem.RetryPolicy{MaxAttempts: c.MaxAttempts, Base: c.RetryBase, Cap: c.RetryCap},
		InTx: func(ctx context.Context, fn func(ctx context.Context) error) error {
			return db.WithTx(ctx, func(ctx context.Context, _ *sql.Tx) error { return fn(ctx) })
		},
		Clock:  c.Clock,
		Logger: c.Logger,
	})
	if err != nil {
		return nil, errors.Join(fmt.Errorf("payments: settlement consumer: %w", err), tr.Close())
	}
	return &pipeline{db: db, outbox: ob, transport: tr, inbox: inbox, letters: letters, relay: relay, consumer: cons,
		faults: c.Faults, logger: c.Logger}, nil
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
		if err := p.relay.Run(ctx); err != nil {
			p.logger.Error("payments: the outbox relay stopped", "err", err)
		}
	}()
	go func() {
		defer p.wg.Done()
		if err := p.consumer.Run(ctx, p.settle); err != nil {
			p.logger.Error("payments: the settlement consumer stopped", "err", err)
		}
	}()
}

// purgeOld deletes, in batches, the inbox rows recorded before horizon and
// the transport's messages published before it that every consumer has
// settled, and returns how many of each it deleted.
func (p *pipeline) purgeOld(ctx context.Context, horizon time.Time, batch int) (inbox, msgs int, err error) {
	for {
		n, err := p.inbox.PurgeInbox(ctx, horizon, batch)
		inbox += n
		if err != nil {
			return inbox, msgs, fmt.Errorf("purging inbox rows: %w", err)
		}
		if n < batch {
			break
		}
	}
	for {
		n, err := p.transport.Purge(ctx, horizon, batch)
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
// transport.
func (p *pipeline) close() error {
	if p.stop != nil {
		p.stop()
	}
	p.wg.Wait()
	return p.transport.Close()
}

// settle applies one payment event: it adds the amount to the tenant's
// settlement total, in the transaction of the consumer's inbox row (ctx
// carries it). Malformed events and events of unknown payments are
// permanent. With Config.Faults, the header Idem-Fault: fail-times=N fails
// the first N attempts transiently.
func (p *pipeline) settle(ctx context.Context, m idem.Message) error {
	if p.faults {
		if n, ok := failTimes(m.Headers[HeaderFault]); ok {
			info, _ := consumer.InfoFromContext(ctx)
			if info.Attempt <= n {
				return fmt.Errorf("injected fault fail-times=%d: attempt %d fails", n, info.Attempt)
			}
		}
	}
	var ev PaymentEvent
	if err := json.Unmarshal(m.Payload, &ev); err != nil {
		return idem.Permanent(fmt.Errorf("malformed event: %w", err))
	}
	if ev.EventID == "" || ev.PaymentID == "" || ev.Tenant == "" {
		return idem.Permanent(errors.New("malformed event: event_id, payment_id and tenant are required"))
	}
	return p.db.WithTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		var amount int64
		var currency string
		err := tx.QueryRowContext(ctx, `SELECT amount, currency FROM payments WHERE id = ? AND tenant = ?`,
			ev.PaymentID, ev.Tenant).Scan(&amount, &currency)
		if errors.Is(err, sql.ErrNoRows) {
			return idem.Permanent(fmt.Errorf("event %s: %w: %s", ev.EventID, ErrPaymentNotFound, ev.PaymentID))
		}
		if err != nil {
			return fmt.Errorf("read payment: %w", err)
		}
		// The stored payment is the truth; an event that disagrees with it
		// was tampered with or is not this payment's.
		if amount != ev.Amount || currency != ev.Currency {
			return idem.Permanent(fmt.Errorf("event %s disagrees with payment %s (%d %s recorded)", ev.EventID, ev.PaymentID, amount, currency))
		}
		_, err = tx.ExecContext(ctx, `INSERT INTO settlements (tenant, currency, total, events) VALUES (?, ?, ?, 1)
			ON CONFLICT (tenant, currency) DO UPDATE SET total = total + excluded.total, events = events + 1`,
			ev.Tenant, currency, amount)
		if err != nil {
			return fmt.Errorf("settle: %w", err)
		}
		return nil
	})
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

// settlement reads the tenant's settlement in the currency of its first
// account; zero values when it has none.
func (p *pipeline) settlement(ctx context.Context, tenant string) (Settlement, error) {
	var s Settlement
	err := p.db.Reader().QueryRowContext(ctx,
		`SELECT currency FROM accounts WHERE tenant = ? ORDER BY created_at, rowid LIMIT 1`, tenant).Scan(&s.Currency)
	if errors.Is(err, sql.ErrNoRows) {
		return Settlement{}, nil
	}
	if err != nil {
		return Settlement{}, fmt.Errorf("read accounts: %w", err)
	}
	err = p.db.Reader().QueryRowContext(ctx,
		`SELECT total, events FROM settlements WHERE tenant = ? AND currency = ?`, tenant, s.Currency).Scan(&s.Total, &s.Events)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return Settlement{}, fmt.Errorf("read settlement: %w", err)
	}
	return s, nil
}

// getSettlement answers GET /v1/settlement.
func (s *Service) getSettlement(w http.ResponseWriter, r *http.Request) {
	if s.pipeline == nil {
		writeProblem(w, http.StatusNotImplemented, "events-unavailable", "Events unavailable",
			errEventsUnavailable.Error(), nil)
		return
	}
	st, err := s.pipeline.settlement(r.Context(), tenantFrom(r.Context()))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, st)
}

// errEventsUnavailable answers /v1/settlement on PostgreSQL: events need
// the PostgreSQL outbox, not yet available.
var errEventsUnavailable = errors.New("payments: events need the PostgreSQL outbox, not yet available")

// wakeRelay wraps the payments endpoint: once its answer is written, the
// payment (and its event) has committed, with the key, so the relay is
// woken to publish at once rather than at its next poll.
func (s *Service) wakeRelay(next http.Handler) http.Handler {
	if s.pipeline == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(w, r)
		s.pipeline.relay.Wake()
	})
}

var (
	deadLettersDesc = prometheus.NewDesc("idem_dead_letters",
		"Dead letters waiting for a person (state dead), per consumer.", []string{"consumer"}, nil)
	deadLetterAgeDesc = prometheus.NewDesc("idem_dead_letter_oldest_age_seconds",
		"Age of the oldest waiting dead letter (since its first failure), per consumer.", []string{"consumer"}, nil)
	consumerMessagesDesc = prometheus.NewDesc("idem_consumer_messages_total",
		"Messages handled by the consumer since the service started, by outcome.", []string{"consumer", "outcome"}, nil)
)

// pipelineCollector exports the dead letters, read at each scrape, and the
// settlement consumer's counters.
type pipelineCollector struct {
	p      *pipeline
	clock  idem.Clock
	logger *slog.Logger
}

func (c *pipelineCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- deadLettersDesc
	ch <- deadLetterAgeDesc
	ch <- consumerMessagesDesc
}

func (c *pipelineCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	stats, err := c.p.letters.Stats(ctx)
	if err != nil {
		c.logger.Warn("payments: reading dead-letter stats for /metrics failed", "err", err)
	}
	now := c.clock.Now()
	seen := false
	for _, st := range stats {
		seen = seen || st.Consumer == SettlementConsumer
		ch <- prometheus.MustNewConstMetric(deadLettersDesc, prometheus.GaugeValue, float64(st.Count), st.Consumer)
		ch <- prometheus.MustNewConstMetric(deadLetterAgeDesc, prometheus.GaugeValue, max(now.Sub(st.Oldest).Seconds(), 0), st.Consumer)
	}
	if !seen && err == nil {
		// An explicit zero, so that an alert on the gauge has a series to
		// look at before the first letter.
		ch <- prometheus.MustNewConstMetric(deadLettersDesc, prometheus.GaugeValue, 0, SettlementConsumer)
		ch <- prometheus.MustNewConstMetric(deadLetterAgeDesc, prometheus.GaugeValue, 0, SettlementConsumer)
	}
	s := c.p.consumer.Stats()
	for _, o := range []struct {
		outcome string
		n       int64
	}{
		{"processed", s.Processed},
		{"duplicate", s.Duplicates},
		{"retried", s.Retried},
		{"dead_lettered", s.DeadLettered},
		{"parked", s.Parked},
	} {
		ch <- prometheus.MustNewConstMetric(consumerMessagesDesc, prometheus.CounterValue, float64(o.n), SettlementConsumer, o.outcome)
	}
}

// DeadLetterService returns the dead-letter service on db, the SQLite
// database a Service runs on: what `idem dlq` and tests act on the
// settlement consumer's dead letters through. Re-driven messages go to the
// service's outbox, in the transaction of the letter's change, and its
// relay publishes them (the service need not run in this process).
func DeadLetterService(ctx context.Context, db *idemsqlite.DB) (*deadletter.Service, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: DB is required", ErrConfig)
	}
	ob, err := idemsqlite.NewOutbox(ctx, db, nil)
	if err != nil {
		return nil, fmt.Errorf("payments: outbox: %w", err)
	}
	letters, err := idemsqlite.NewDeadLetters(ctx, db, nil)
	if err != nil {
		return nil, fmt.Errorf("payments: dead letters: %w", err)
	}
	ledger, err := idemsqlite.NewLedger(ctx, db)
	if err != nil {
		return nil, fmt.Errorf("payments: ledger: %w", err)
	}
	svc, err := deadletter.New(&deadletter.Config{
		DeadLetters: letters,
		Ledger:      ledger,
		Outbox:      ob,
		InTx: func(ctx context.Context, fn func(ctx context.Context) error) error {
			return db.WithTx(ctx, func(ctx context.Context, _ *sql.Tx) error { return fn(ctx) })
		},
	})
	if err != nil {
		return nil, fmt.Errorf("payments: dead-letter service: %w", err)
	}
	return svc, nil
}
