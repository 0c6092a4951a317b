package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/idem-go/idem/cmd/idem/internal/payments"
	"github.com/idem-go/idem/idemamqp"
	"github.com/idem-go/idem/idemkafka"
	"github.com/idem-go/idem/idemnats"
	"github.com/idem-go/idem/idemredis"
)

// A guarantee idem gives on a replicated store or broker can rest on a
// setting of the server's: a claim acknowledged by a Redis master is lost in
// a failover unless replicas confirm it; a commit on a PostgreSQL primary is
// lost with it unless a standby has it; a queue without a dead-letter
// target drops what keeps failing. serve asks each what its settings leave
// open, once everything is open, and logs each finding; with --strict it
// refuses to serve while any is left.

// guaranteeGaps returns the findings of the database, the key store and
// the broker, each a sentence saying what can happen and what mends it.
// fromBroker counts those of the broker, which its transport has logged
// already. An error means a server could not be asked.
func guaranteeGaps(ctx context.Context, db *database, keys *idemredis.Store, broker *openedBroker) (gaps []string, fromBroker int, err error) {
	var errs []error
	if db != nil && db.pg != nil {
		ws, err := db.pg.Warnings(ctx)
		if err != nil {
			errs = append(errs, fmt.Errorf("asking PostgreSQL how it replicates: %w", err))
		}
		for _, w := range ws {
			gaps = append(gaps, "PostgreSQL: "+w.Error())
		}
	}
	if keys != nil {
		ws, err := keys.Warnings(ctx)
		if err != nil {
			errs = append(errs, fmt.Errorf("asking Redis how it replicates: %w", err))
		}
		for _, w := range ws {
			gaps = append(gaps, "Redis: "+w.Error())
		}
	}
	if broker != nil {
		switch tr := broker.Transport.(type) {
		case *idemnats.Transport:
			for _, w := range tr.Warnings() {
				gaps = append(gaps, "NATS: "+w.Error())
				fromBroker++
			}
		case *idemamqp.Transport:
			for _, w := range tr.Warnings() {
				gaps = append(gaps, "RabbitMQ: "+w.Error())
				fromBroker++
			}
		case *idemkafka.Transport:
			// openBroker made sure the topic exists, and logged its
			// settings.
			ws, err := tr.Warnings(ctx, payments.TopicPaymentSucceeded)
			if err != nil {
				errs = append(errs, fmt.Errorf("asking Kafka for the settings of its topic: %w", err))
			}
			for _, w := range ws {
				gaps = append(gaps, "Kafka: "+w.Error())
				fromBroker++
			}
		}
	}
	return gaps, fromBroker, errors.Join(errs...)
}

// checkGuarantees logs what guaranteeGaps finds and, with strict, refuses
// when anything is found or cannot be checked.
func checkGuarantees(ctx context.Context, logger *slog.Logger, strict bool, db *database, keys *idemredis.Store, broker *openedBroker) error {
	gaps, fromBroker, err := guaranteeGaps(ctx, db, keys, broker)
	if err != nil {
		if strict {
			return fmt.Errorf("--strict: could not check the servers' settings: %w", err)
		}
		logger.Warn("could not check the servers' settings that guarantees rest on", "err", err)
	}
	// What no client can check (NATS's sync_interval) is said once, and
	// not refused: it holds for every NATS deployment, clustered or not.
	if broker != nil {
		if tr, ok := broker.Transport.(*idemnats.Transport); ok {
			for _, w := range tr.DurabilityWarnings() {
				logger.Info("a guarantee rests on a server setting no client can read", "finding", "NATS: "+w.Error())
			}
		}
	}
	// The broker's findings were logged when its transport met them.
	for _, g := range gaps[:len(gaps)-fromBroker] {
		logger.Warn("a guarantee rests on a setting the server lacks", "finding", g)
	}
	if strict && len(gaps) > 0 {
		return fmt.Errorf("--strict: refusing to serve until the servers' settings close these gaps:\n  %s", strings.Join(gaps, "\n  "))
	}
	return nil
}
