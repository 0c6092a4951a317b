package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"

	"github.com/idem-go/idem/cmd/idem/internal/payments"
	"github.com/idem-go/idem/idemamqp"
	"github.com/idem-go/idem/idemkafka"
	"github.com/idem-go/idem/idemnats"
	"github.com/idem-go/idem/internal/secreturl"
)

// defaultBrokerNamespace names what serve creates on a broker: NATS stream
// IDEM with subjects idem.>, RabbitMQ exchange idem and queues idem.*, or
// Kafka topics idem.*.
const defaultBrokerNamespace = "idem"

const supportedBrokers = "empty (the --db database), nats://HOST:PORT, amqp://USER:PASS@HOST:PORT/VHOST (amqps:// too) or kafka://HOST:PORT[,HOST:PORT]"

// brokerTarget is a parsed --broker value.
type brokerTarget struct {
	kind  string // "nats", "amqp" or "kafka"
	url   string
	shown string
}

// parseBroker parses a --broker value. Like parseDB, it never echoes a
// secret: a password, a NATS token (nats://TOKEN@HOST) or a secret query
// parameter.
func parseBroker(s string) (brokerTarget, error) {
	scheme, _, ok := strings.Cut(s, "://")
	if !ok {
		return brokerTarget{}, errors.New("--broker needs a URL; supported: " + supportedBrokers)
	}
	var kind string
	switch strings.ToLower(scheme) {
	case "nats", "tls":
		kind = "nats"
	case "amqp", "amqps":
		kind = "amqp"
	case "kafka":
		// Brokers are a list, which net/url cannot parse; a Kafka URL
		// carries no secret (SASL is not configured through it).
		if _, err := idemkafka.ParseURL(s); err != nil {
			return brokerTarget{}, fmt.Errorf("--broker: %w", err)
		}
		return brokerTarget{kind: "kafka", url: s, shown: s}, nil
	default:
		if strings.ContainsAny(scheme, "@:/") {
			return brokerTarget{}, errors.New("--broker: unsupported broker; supported: " + supportedBrokers)
		}
		return brokerTarget{}, fmt.Errorf("--broker: unsupported broker scheme %q; supported: %s", scheme, supportedBrokers)
	}
	shown, err := secreturl.Redact(s)
	if err != nil {
		return brokerTarget{}, fmt.Errorf("--broker: %w", err)
	}
	return brokerTarget{kind: kind, url: s, shown: shown}, nil
}

var namespacePattern = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,62}$`)

// checkNamespace checks a --broker-namespace: it becomes a NATS stream name
// (upper-cased) and subject prefix, and a RabbitMQ exchange and queue
// prefix, so it keeps to what all four accept.
func checkNamespace(ns string) error {
	if !namespacePattern.MatchString(ns) {
		return fmt.Errorf("--broker-namespace %q: want a lower-case letter, then up to 62 lower-case letters, digits, '-' or '_'", ns)
	}
	return nil
}

// openedBroker is a broker transport and how to close it.
type openedBroker struct {
	payments.Transport
	close func() error
	shown string
}

// Unwrap returns the broker's transport, for what only some transports
// tell (idemprom.StreamStatser).
func (b *openedBroker) Unwrap() payments.Transport { return b.Transport }

// openBroker connects to the broker a --broker value names and makes sure
// its stream, or exchange, exists. The settlement consumer's subscription
// carries --ack-wait (payments.Config.AckWait).
// Settings of the broker that could drop a message are logged to logger.
func openBroker(ctx context.Context, raw, namespace string, logger *slog.Logger) (*openedBroker, error) {
	t, err := parseBroker(raw)
	if err != nil {
		return nil, err
	}
	switch t.kind {
	case "nats":
		tr, err := idemnats.Open(ctx, t.url, &idemnats.Config{
			Stream:        strings.ToUpper(strings.ReplaceAll(namespace, "-", "_")),
			SubjectPrefix: namespace,
			Logger:        logger,
		})
		if err != nil {
			return nil, fmt.Errorf("opening NATS JetStream at %s: %w", t.shown, secreturl.Scrub(err, t.url))
		}
		return &openedBroker{Transport: tr, close: tr.Close, shown: t.shown}, nil
	case "kafka":
		seeds, err := idemkafka.ParseURL(t.url)
		if err != nil {
			return nil, err
		}
		tr, err := idemkafka.Open(ctx, seeds, &idemkafka.Config{
			TopicPrefix: namespace + ".",
			Logger:      logger,
		})
		if err != nil {
			return nil, fmt.Errorf("opening Kafka at %s: %w", t.shown, err)
		}
		// The topic exists before the pipeline starts, so that its
		// settings are checked (and, under --strict, refused) before the
		// first event, as a NATS stream's are.
		if err := tr.EnsureTopics(ctx, payments.TopicPaymentSucceeded); err != nil {
			tr.Close()
			return nil, fmt.Errorf("opening Kafka at %s: %w", t.shown, err)
		}
		return &openedBroker{Transport: tr, close: tr.Close, shown: t.shown}, nil
	default:
		tr, err := idemamqp.Open(ctx, t.url, &idemamqp.Config{
			Exchange:    namespace,
			QueuePrefix: namespace,
			// The relay starts once the settlement consumer has declared
			// its queue (see payments); should no queue be bound at all
			// (deleted by hand), the relay keeps the event rather than
			// RabbitMQ dropping it.
			Mandatory: true,
			Logger:    logger,
		})
		if err != nil {
			return nil, fmt.Errorf("opening RabbitMQ at %s: %w", t.shown, secreturl.Scrub(err, t.url))
		}
		return &openedBroker{Transport: tr, close: tr.Close, shown: t.shown}, nil
	}
}
