package torture

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemamqp"
	"github.com/idem-go/idem/idemkafka"
	"github.com/idem-go/idem/idemnats"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/idemsqlite"
)

// The topic the events are published on, and the consumer's name: its
// durable subscription, inbox rows and dead letters.
const (
	messagesTopic    = "torture.events"
	messagesConsumer = "torture"
)

// siteSpec says where a message torture runs: the broker, the database of
// the inbox and the effects, and the names of the run's own on them. The
// run passes it to each consumer process, as JSON, so it holds only what
// both sides can rebuild a site from.
type siteSpec struct {
	// Broker is "sqlite", "pg", "nats", "amqp" or "kafka"; BrokerURL its
	// URL, for the brokers.
	Broker    string `json:"broker"`
	BrokerURL string `json:"broker_url,omitempty"`
	// KafkaSession is the consumers' session timeout on Kafka.
	KafkaSession time.Duration `json:"kafka_session,omitempty"`
	// DB is "sqlite" or "pg": SQLite is the file SQLite, PostgreSQL the
	// server at PostgresURL, in schema Schema.
	DB          string `json:"db"`
	SQLite      string `json:"sqlite,omitempty"`
	PostgresURL string `json:"postgres_url,omitempty"`
	// Namespace names the run's stream or exchange and queues, and its
	// PostgreSQL schema.
	Namespace string `json:"namespace"`
}

func (s siteSpec) schema() string      { return "idem_torture_msgs_" + s.Namespace }
func (s siteSpec) natsStream() string  { return "IDEMTORTURE_" + strings.ToUpper(s.Namespace) }
func (s siteSpec) natsSubject() string { return "idemtorture" + s.Namespace }
func (s siteSpec) amqpPrefix() string  { return "idemtorture-" + s.Namespace }
func (s siteSpec) kafkaPrefix() string { return "idemtorture-" + s.Namespace + "." }

// effect is one row the consumers' handler writes: an event applied.
type effect struct{ event, key, seq int64 }

// site is a message torture's broker and database, opened.
type site struct {
	spec    siteSpec
	pub     idem.Publisher
	sub     idem.Subscriber
	inbox   idem.Inbox
	letters idem.DeadLetters
	ledger  idem.Ledger
	inTx    func(ctx context.Context, fn func(ctx context.Context) error) error
	// apply writes effects in the transaction ctx carries.
	apply func(ctx context.Context, effects []effect) error
	// query runs a query of the checks and scans its one row.
	query func(ctx context.Context, q string, dest ...any) error
	// rows runs a query of the checks and calls each for every row.
	rows func(ctx context.Context, q string, each func(scan func(dest ...any) error) error) error
	// close closes what the site opened; forget also deletes what the run
	// made on the broker (its stream, or exchange and queues).
	closers []func()
	forget  func(ctx context.Context) error
}

func (s *site) close() {
	for i := len(s.closers) - 1; i >= 0; i-- {
		s.closers[i]()
	}
	s.closers = nil
}

// The effects table: n orders the effects as they were applied (SQLite has
// one writer at a time; on PostgreSQL an aggregate's next event is applied
// only once its mark, committed with the previous one, is seen), and the
// index on event serves the checks.
const (
	sqliteEffects = `CREATE TABLE IF NOT EXISTS torture_effects (
	n INTEGER PRIMARY KEY AUTOINCREMENT, event INTEGER NOT NULL, key INTEGER NOT NULL, seq INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS torture_effects_event ON torture_effects (event);`
	pgEffects = `CREATE TABLE IF NOT EXISTS torture_effects (
	n bigserial PRIMARY KEY, event bigint NOT NULL, key bigint NOT NULL, seq bigint NOT NULL);
CREATE INDEX IF NOT EXISTS torture_effects_event ON torture_effects (event);`
)

// openSite opens the database and the broker of spec, and creates what
// is missing: the stores' tables, the effects table, the stream or
// exchange. The broker's transport logs to logger (nil: nowhere).
func openSite(ctx context.Context, spec siteSpec, logger *slog.Logger) (_ *site, err error) {
	s := &site{spec: spec}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	var sq *idemsqlite.DB
	var pg *idempg.DB
	switch spec.DB {
	case "sqlite":
		if sq, err = idemsqlite.Open(spec.SQLite, nil); err != nil {
			return nil, err
		}
		s.closers = append(s.closers, func() { sq.Close() })
		if _, err := sq.Writer().ExecContext(ctx, sqliteEffects); err != nil {
			return nil, fmt.Errorf("creating the effects table: %w", err)
		}
		if err := s.sqliteStores(ctx, sq); err != nil {
			return nil, err
		}
	case "pg":
		if pg, err = idempg.Open(ctx, spec.PostgresURL, &idempg.Config{Schema: spec.schema(), MaxConns: 8}); err != nil {
			return nil, err
		}
		s.closers = append(s.closers, pg.Close)
		if _, err := pg.Pool().Exec(ctx, pgEffects); err != nil {
			return nil, fmt.Errorf("creating the effects table: %w", err)
		}
		if err := s.pgStores(ctx, pg); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("torture: no database %q", spec.DB)
	}
	s.forget = func(context.Context) error { return nil }
	switch spec.Broker {
	case "sqlite":
		if sq == nil {
			return nil, errors.New("torture: the SQLite transport needs the SQLite database")
		}
		tr, err := idemsqlite.NewTransport(ctx, sq, nil)
		if err != nil {
			return nil, err
		}
		s.closers = append(s.closers, func() { tr.Close() })
		s.pub, s.sub = tr, tr
	case "pg":
		if pg == nil {
			return nil, errors.New("torture: the PostgreSQL transport needs the PostgreSQL database")
		}
		tr, err := idempg.NewTransport(ctx, pg, nil)
		if err != nil {
			return nil, err
		}
		s.closers = append(s.closers, func() { tr.Close() })
		s.pub, s.sub = tr, tr
	case "nats":
		tr, err := idemnats.Open(ctx, spec.BrokerURL, &idemnats.Config{Stream: spec.natsStream(), SubjectPrefix: spec.natsSubject()})
		if err != nil {
			return nil, err
		}
		s.closers = append(s.closers, func() { tr.Close() })
		s.pub, s.sub = tr, tr
		s.forget = func(ctx context.Context) error { return deleteStream(ctx, spec.BrokerURL, spec.natsStream()) }
	case "amqp":
		tr, err := idemamqp.Open(ctx, spec.BrokerURL, &idemamqp.Config{
			Exchange:    spec.amqpPrefix(),
			QueuePrefix: spec.amqpPrefix(),
			// Above the consumer's MaxDeliveries, so that the consumer,
			// which records every attempt, decides when a message is dead,
			// on RabbitMQ 4 (20 unless set) as on 3 (unlimited).
			DeliveryLimit: 1000,
			// A message no queue is bound to is refused, not dropped.
			Mandatory: true,
			Logger:    logger,
		})
		if err != nil {
			return nil, err
		}
		s.closers = append(s.closers, func() { tr.Close() })
		s.pub, s.sub = tr, tr
		s.forget = func(ctx context.Context) error {
			if err := tr.DeleteQueues(ctx); err != nil {
				return fmt.Errorf("deleting the queues %s.*: %w", spec.amqpPrefix(), err)
			}
			return deleteExchange(spec.BrokerURL, spec.amqpPrefix())
		}
	case "kafka":
		seeds, err := idemkafka.ParseURL(spec.BrokerURL)
		if err != nil {
			return nil, err
		}
		tr, err := idemkafka.Open(ctx, seeds, &idemkafka.Config{
			TopicPrefix:    spec.kafkaPrefix(),
			SessionTimeout: spec.KafkaSession,
			RevokeWait:     spec.KafkaSession,
			Logger:         logger,
		})
		if err != nil {
			return nil, err
		}
		s.closers = append(s.closers, func() { tr.Close() })
		s.pub, s.sub = tr, tr
		s.forget = func(ctx context.Context) error { return deleteKafkaTopic(ctx, seeds, spec.kafkaPrefix()+messagesTopic) }
	default:
		return nil, fmt.Errorf("torture: no broker %q", spec.Broker)
	}
	return s, nil
}

func (s *site) sqliteStores(ctx context.Context, db *idemsqlite.DB) (err error) {
	if s.inbox, err = idemsqlite.NewInbox(ctx, db); err != nil {
		return err
	}
	if s.letters, err = idemsqlite.NewDeadLetters(ctx, db, nil); err != nil {
		return err
	}
	if s.ledger, err = idemsqlite.NewLedger(ctx, db); err != nil {
		return err
	}
	s.inTx = func(ctx context.Context, fn func(context.Context) error) error {
		return db.WithTx(ctx, func(ctx context.Context, _ *sql.Tx) error { return fn(ctx) })
	}
	s.apply = func(ctx context.Context, effects []effect) error {
		return db.WithTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
			for _, e := range effects {
				if _, err := tx.ExecContext(ctx, `INSERT INTO torture_effects (event, key, seq) VALUES (?, ?, ?)`, e.event, e.key, e.seq); err != nil {
					return err
				}
			}
			return nil
		})
	}
	s.query = func(ctx context.Context, q string, dest ...any) error {
		return db.Reader().QueryRowContext(ctx, q).Scan(dest...)
	}
	s.rows = func(ctx context.Context, q string, each func(func(...any) error) error) error {
		rows, err := db.Reader().QueryContext(ctx, q)
		if err != nil {
			return err
		}
		defer rows.Close()
		return scanRows(rows, each)
	}
	return nil
}

func (s *site) pgStores(ctx context.Context, db *idempg.DB) (err error) {
	if s.inbox, err = idempg.NewInbox(ctx, db); err != nil {
		return err
	}
	if s.letters, err = idempg.NewDeadLetters(ctx, db, nil); err != nil {
		return err
	}
	if s.ledger, err = idempg.NewLedger(ctx, db); err != nil {
		return err
	}
	s.inTx = func(ctx context.Context, fn func(context.Context) error) error {
		return db.WithTx(ctx, func(ctx context.Context, _ pgx.Tx) error { return fn(ctx) })
	}
	s.apply = func(ctx context.Context, effects []effect) error {
		events, keys, seqs := make([]int64, len(effects)), make([]int64, len(effects)), make([]int64, len(effects))
		for i, e := range effects {
			events[i], keys[i], seqs[i] = e.event, e.key, e.seq
		}
		return db.WithTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO torture_effects (event, key, seq)
				SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::bigint[])`, events, keys, seqs)
			return err
		})
	}
	s.query = func(ctx context.Context, q string, dest ...any) error {
		return db.Pool().QueryRow(ctx, q).Scan(dest...)
	}
	s.rows = func(ctx context.Context, q string, each func(func(...any) error) error) error {
		rows, err := db.Pool().Query(ctx, q)
		if err != nil {
			return err
		}
		defer rows.Close()
		return scanRows(rows, each)
	}
	return nil
}

// rowScanner is what database/sql's and pgx's rows share.
type rowScanner interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
}

// scanRows calls each for every row of rows.
func scanRows(rows rowScanner, each func(scan func(dest ...any) error) error) error {
	for rows.Next() {
		if err := each(rows.Scan); err != nil {
			return err
		}
	}
	return rows.Err()
}

// eventMessage is event i of a run with keys keys: its key is i%keys, its
// sequence number in that key (i/keys)+1, and its payload "event key
// seq". copyID gives a re-published copy a message ID of its own, which
// only the inbox catches; otherwise a copy shares the original's ID,
// which a broker's own de-duplication may catch first.
func eventMessage(i, keys int, copyID bool) idem.Message {
	key, seq := i%keys, i/keys+1
	id := "evt-" + strconv.Itoa(i)
	if copyID {
		id += "-again"
	}
	return idem.Message{
		ID:      id,
		Topic:   messagesTopic,
		Key:     "k" + strconv.Itoa(key),
		Payload: fmt.Appendf(nil, "%d %d %d", i, key, seq),
	}
}

// parseEvent reads an event's payload.
func parseEvent(m idem.Message) (effect, error) {
	f := strings.Fields(string(m.Payload))
	if len(f) != 3 {
		return effect{}, fmt.Errorf("payload %q: want \"event key seq\"", m.Payload)
	}
	var e effect
	for i, p := range []*int64{&e.event, &e.key, &e.seq} {
		n, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil || n < 0 {
			return effect{}, fmt.Errorf("payload %q: field %d is not a number", m.Payload, i+1)
		}
		*p = n
	}
	return e, nil
}

// deleteStream deletes a NATS stream of the run's own.
func deleteStream(ctx context.Context, url, stream string) error {
	nc, err := nats.Connect(url, nats.Timeout(10*time.Second))
	if err != nil {
		return fmt.Errorf("deleting the stream %s: %w", stream, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("deleting the stream %s: %w", stream, err)
	}
	if err := js.DeleteStream(ctx, stream); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("deleting the stream %s: %w", stream, err)
	}
	return nil
}

// deleteExchange deletes a RabbitMQ exchange of the run's own.
func deleteExchange(url, name string) error {
	conn, err := amqp.DialConfig(url, amqp.Config{Dial: amqp.DefaultDial(10 * time.Second)})
	if err != nil {
		return fmt.Errorf("deleting the exchange %s: %w", name, err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("deleting the exchange %s: %w", name, err)
	}
	if err := ch.ExchangeDelete(name, false, false); err != nil {
		return fmt.Errorf("deleting the exchange %s: %w", name, err)
	}
	return nil
}

func deleteKafkaTopic(ctx context.Context, seeds []string, topic string) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...))
	if err != nil {
		return err
	}
	defer cl.Close()
	res, err := kadm.NewClient(cl).DeleteTopic(ctx, topic)
	if err == nil {
		err = res.Err
	}
	if err != nil {
		return fmt.Errorf("deleting the topic %s: %w", topic, err)
	}
	return nil
}
