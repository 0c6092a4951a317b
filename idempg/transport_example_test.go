package idempg_test

import (
	"context"
	"fmt"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idempg"
)

// Without a broker, PostgreSQL is the transport. A service that has no
// outbox publishes in the transaction of its effect: the payment and its
// event commit together. A consumer gets the event, fails once, and gets it
// again with its stored attempt count.
func ExampleTransport() {
	ctx := context.Background()
	db, err := idempg.Open(ctx, exampleURL(), &idempg.Config{Schema: exampleSchema()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer db.Close()
	defer db.Pool().Exec(ctx, `DROP SCHEMA `+pgx.Identifier{db.Schema()}.Sanitize()+` CASCADE`)

	err = db.Migrate(ctx, "payments", fstest.MapFS{
		"0001_payments.sql": {Data: []byte(`CREATE TABLE payments (id text PRIMARY KEY, amount bigint NOT NULL);`)},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	transport, err := idempg.NewTransport(ctx, db, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer transport.Close()

	stream, err := transport.Subscribe(ctx, idem.Subscription{Topic: "payments.succeeded", Consumer: "settlement"})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer stream.Close()

	err = db.WithTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO payments (id, amount) VALUES ('pay_1', 1250)`); err != nil {
			return err
		}
		// Joins the transaction: the event exists only if the payment does.
		return transport.Publish(ctx, idem.Message{
			ID: "evt-1", Topic: "payments.succeeded", Key: "acct-1",
			Payload: []byte(`{"event_id":"evt-1","amount":1250}`),
		})
	})
	if err != nil {
		fmt.Println(err)
		return
	}

	for {
		nctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		d, err := stream.Next(nctx)
		cancel()
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("%s, attempt %d\n", d.Message().ID, d.Attempt())
		if d.Attempt() == 1 {
			_ = d.Nack(ctx, 0) // a transient failure: deliver it again
			continue
		}
		_ = d.Ack(ctx)
		break
	}
	// Output:
	// evt-1, attempt 1
	// evt-1, attempt 2
}
