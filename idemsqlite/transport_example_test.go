package idemsqlite_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"testing/fstest"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemsqlite"
)

// Without a broker, the database is the transport. A service that has no
// outbox publishes in the transaction of its effect: the payment and its
// event commit together. A consumer gets the event, fails once, and gets it
// again with its stored attempt count.
func ExampleTransport() {
	dir, err := os.MkdirTemp("", "idemsqlite-transport")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)

	ctx := context.Background()
	db, err := idemsqlite.Open(filepath.Join(dir, "idem.db"), nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer db.Close()
	err = db.Migrate(ctx, "payments", fstest.MapFS{
		"0001_payments.sql": {Data: []byte(`CREATE TABLE payments (id TEXT PRIMARY KEY, amount INTEGER NOT NULL);`)},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	transport, err := idemsqlite.NewTransport(ctx, db, nil)
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

	err = db.WithTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO payments (id, amount) VALUES ('pay_1', 1250)`); err != nil {
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

// With the outbox and the transport in one file, the relay's pass is one
// transaction: MoveOutbox takes the oldest entries out of the outbox and
// appends them to the transport's log, so none is published twice. A
// consumer then takes them in a batch, and acknowledges the batch at once.
func ExampleTransport_MoveOutbox() {
	dir, err := os.MkdirTemp("", "idemsqlite-move")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)

	ctx := context.Background()
	db, err := idemsqlite.Open(filepath.Join(dir, "idem.db"), nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer db.Close()
	outbox, err := idemsqlite.NewOutbox(ctx, db, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	transport, err := idemsqlite.NewTransport(ctx, db, nil)
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

	for _, id := range []string{"evt-1", "evt-2", "evt-3"} {
		// In the service, each in the transaction of its payment.
		if err := outbox.Add(ctx, idem.Message{ID: id, Topic: "payments.succeeded"}); err != nil {
			fmt.Println(err)
			return
		}
	}
	moved, ok, err := transport.MoveOutbox(ctx, outbox, 100)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("moved", moved, ok)

	batches := stream.(idem.BatchStream)
	var ds []idem.Delivery
	for len(ds) < moved {
		nctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		more, err := batches.NextBatch(nctx, 10)
		cancel()
		if err != nil {
			fmt.Println(err)
			return
		}
		ds = append(ds, more...)
	}
	for _, d := range ds {
		fmt.Println(d.Message().ID)
	}
	acked, err := batches.AckBatch(ctx, ds)
	fmt.Println("acknowledged", acked, err)
	// Output:
	// moved 3 true
	// evt-1
	// evt-2
	// evt-3
	// acknowledged 3 <nil>
}
