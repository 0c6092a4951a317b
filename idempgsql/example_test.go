package idempgsql_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing/fstest"
	"time"

	_ "github.com/lib/pq"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idempgsql"
)

// exampleSQL opens the test database with driver, its connections on a
// schema of their own, and returns it with a function that drops the
// schema and closes it. A real service opens its *sql.DB once, with its
// own connection string.
func exampleSQL(driver string) (*sql.DB, func()) {
	b := make([]byte, 6)
	rand.Read(b)
	schema := "idempgsql_example_" + hex.EncodeToString(b)
	admin, err := sql.Open(driver, postgresURL())
	if err != nil {
		panic(err)
	}
	if _, err := admin.Exec(`CREATE SCHEMA ` + schema); err != nil {
		panic(err)
	}
	sep := "?"
	if strings.Contains(postgresURL(), "?") {
		sep = "&"
	}
	db, err := sql.Open(driver, postgresURL()+sep+"search_path="+schema)
	if err != nil {
		panic(err)
	}
	return db, func() {
		db.Close()
		admin.Exec(`DROP SCHEMA ` + schema + ` CASCADE`)
		admin.Close()
	}
}

// The middleware over a handler whose order row commits with the key's
// record, through lib/pq: a retried request replays the first answer, and
// the order is written once.
func Example() {
	sqldb, done := exampleSQL("postgres")
	defer done()

	ctx := context.Background()
	db, err := idempgsql.NewDB(ctx, sqldb, nil)
	if err != nil {
		panic(err)
	}
	// The application's tables live beside idem's, migrated under the
	// application's own name (an embed.FS in a real service).
	err = db.Migrate(ctx, "shop", fstest.MapFS{
		"0001_orders.sql": {Data: []byte(`CREATE TABLE orders (id bigint GENERATED ALWAYS AS IDENTITY, item text NOT NULL);`)},
	})
	if err != nil {
		panic(err)
	}
	store, err := idempgsql.NewStore(ctx, db)
	if err != nil {
		panic(err)
	}
	// One shop, one scope; a service with tenants scopes keys by tenant.
	keys, err := idemhttp.New(&idemhttp.Config{Store: store, SharedScope: true})
	if err != nil {
		panic(err)
	}

	createOrder := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		item, _ := io.ReadAll(r.Body)
		var id int64
		// r.Context() carries the transaction that will keep this answer:
		// WithTx joins it, so the order commits with the key's record.
		err := db.WithTx(r.Context(), func(ctx context.Context, tx *sql.Tx) error {
			return tx.QueryRowContext(ctx, `INSERT INTO orders (item) VALUES ($1) RETURNING id`, string(item)).Scan(&id)
		})
		if err != nil {
			http.Error(w, "the order was not taken", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "order %d: %s", id, item)
	})
	srv := httptest.NewServer(keys.Handler(createOrder))
	defer srv.Close()

	for range 2 { // the second is the client's retry after a lost answer
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("a teapot"))
		req.Header.Set("Idempotency-Key", "7c0e2b58-8f49-4c1e-9a0b-2f1d3c4e5a6b")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Printf("%d %s (replayed: %q)\n", resp.StatusCode, body, resp.Header.Get("Idempotent-Replayed"))
	}
	var orders int
	if err := sqldb.QueryRow(`SELECT count(*) FROM orders`).Scan(&orders); err != nil {
		panic(err)
	}
	fmt.Println("orders:", orders)
	// Output:
	// 201 order 1: a teapot (replayed: "")
	// 201 order 1: a teapot (replayed: "true")
	// orders: 1
}

// A transaction the application began itself (here with database/sql; an
// ORM's *sql.Tx is joined the same way) carries the outbox entry that
// announces its write: both commit, or neither.
func ExampleDB_JoinTx() {
	sqldb, done := exampleSQL("pgx")
	defer done()

	ctx := context.Background()
	db, err := idempgsql.NewDB(ctx, sqldb, nil)
	if err != nil {
		panic(err)
	}
	outbox, err := idempgsql.NewOutbox(ctx, db, nil)
	if err != nil {
		panic(err)
	}
	if _, err := sqldb.Exec(`CREATE TABLE orders (id text PRIMARY KEY, item text NOT NULL)`); err != nil {
		panic(err)
	}

	place := func(id, item string, fail bool) error {
		tx, err := sqldb.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		if _, err := tx.ExecContext(ctx, `INSERT INTO orders (id, item) VALUES ($1, $2)`, id, item); err != nil {
			return err
		}
		err = outbox.Add(db.JoinTx(ctx, tx), idem.Message{ID: "order-created-" + id, Topic: "orders.created", Key: id, Payload: []byte(item)})
		if err != nil {
			return err
		}
		if fail {
			return errors.New("the card was declined") // rolls back the order and its announcement
		}
		return tx.Commit()
	}
	fmt.Println(place("o-1", "a teapot", false))
	fmt.Println(place("o-2", "a kettle", true))

	entries, err := outbox.Claim(ctx, "relay-1", 10, time.Minute)
	if err != nil {
		panic(err)
	}
	for _, e := range entries {
		fmt.Printf("to publish: %s %s %q\n", e.Message.Topic, e.Message.ID, e.Message.Payload)
	}
	// Output:
	// <nil>
	// the card was declined
	// to publish: orders.created order-created-o-1 "a teapot"
}

// The inbox records a message in the transaction of its effect: the
// redelivery of a message already applied changes nothing.
func ExampleInbox() {
	sqldb, done := exampleSQL("postgres")
	defer done()

	ctx := context.Background()
	db, err := idempgsql.NewDB(ctx, sqldb, nil)
	if err != nil {
		panic(err)
	}
	inbox, err := idempgsql.NewInbox(ctx, db)
	if err != nil {
		panic(err)
	}
	if _, err := sqldb.Exec(`CREATE TABLE totals (tenant text PRIMARY KEY, total bigint NOT NULL)`); err != nil {
		panic(err)
	}

	apply := func(eventID string, amount int64) error {
		return inbox.Process(ctx, "settlement", eventID, func(ctx context.Context) error {
			return db.WithTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
				_, err := tx.ExecContext(ctx, `INSERT INTO totals (tenant, total) VALUES ('acme', $1)
					ON CONFLICT (tenant) DO UPDATE SET total = totals.total + excluded.total`, amount)
				return err // commits with the inbox row, or neither does
			})
		})
	}
	fmt.Println(apply("evt-1", 1250))
	fmt.Println(apply("evt-1", 1250)) // redelivered
	fmt.Println(apply("evt-2", 300))

	var total int64
	if err := sqldb.QueryRow(`SELECT total FROM totals WHERE tenant = 'acme'`).Scan(&total); err != nil {
		panic(err)
	}
	fmt.Println("total:", total)
	// Output:
	// <nil>
	// idem: duplicate: already processed
	// <nil>
	// total: 1550
}

// Inbox.Process in the application's own transaction, with a handler that
// processes a second message whose handler fails: the second's writes and
// row are rolled back to its savepoint, the first's commit with the
// application's transaction, and the failed message runs again when it is
// delivered again.
func ExampleInbox_Process() {
	sqldb, done := exampleSQL("pgx")
	defer done()

	ctx := context.Background()
	db, err := idempgsql.NewDB(ctx, sqldb, nil)
	if err != nil {
		panic(err)
	}
	inbox, err := idempgsql.NewInbox(ctx, db)
	if err != nil {
		panic(err)
	}
	if _, err := sqldb.Exec(`CREATE TABLE applied (event text PRIMARY KEY)`); err != nil {
		panic(err)
	}
	apply := func(event string) func(ctx context.Context) error {
		return func(ctx context.Context) error {
			return db.WithTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
				_, err := tx.ExecContext(ctx, `INSERT INTO applied (event) VALUES ($1)`, event)
				return err
			})
		}
	}

	tx, err := sqldb.BeginTx(ctx, nil) // the ORM's transaction
	if err != nil {
		panic(err)
	}
	ctx = db.JoinTx(ctx, tx)
	err = inbox.Process(ctx, "shipping", "order-placed", func(ctx context.Context) error {
		if err := apply("order-placed")(ctx); err != nil {
			return err
		}
		// A message this one leads to, handled in the same transaction
		// with the handler's context; it fails.
		err := inbox.Process(ctx, "shipping", "label-printed", func(ctx context.Context) error {
			if err := apply("label-printed")(ctx); err != nil {
				return err
			}
			return errors.New("the printer is out of paper")
		})
		fmt.Println("label-printed:", err)
		return nil // order-placed goes on without it
	})
	fmt.Println("order-placed:", err)
	if err := tx.Commit(); err != nil {
		panic(err)
	}

	rows, err := sqldb.Query(`SELECT event FROM applied ORDER BY event`)
	if err != nil {
		panic(err)
	}
	defer rows.Close()
	for rows.Next() {
		var event string
		rows.Scan(&event)
		fmt.Println("applied:", event)
	}
	// The failed message, delivered again, runs again.
	fmt.Println("label-printed again:", inbox.Process(context.Background(), "shipping", "label-printed", apply("label-printed")))
	// Output:
	// label-printed: the printer is out of paper
	// order-placed: <nil>
	// applied: order-placed
	// label-printed again: <nil>
}

// Classified in a consumer's handler: a unique violation is permanent, so
// the consumer dead-letters the message at once; a serialization failure
// or a deadlock stays transient, and is retried.
func ExampleClassified() {
	sqldb, done := exampleSQL("postgres")
	defer done()

	if _, err := sqldb.Exec(`CREATE TABLE orders (id text PRIMARY KEY)`); err != nil {
		panic(err)
	}
	insert := func(id string) error {
		_, err := sqldb.Exec(`INSERT INTO orders (id) VALUES ($1)`, id)
		return idempgsql.Classified(err)
	}
	fmt.Println(insert("o-1"))
	err := insert("o-1")
	fmt.Println(idempgsql.SQLState(err), idem.Classify(err))
	_, err = sqldb.Exec(`DO $$ BEGIN RAISE EXCEPTION 'deadlock' USING ERRCODE = '40P01'; END $$`)
	fmt.Println(idempgsql.SQLState(err), idem.Classify(idempgsql.Classified(err)))
	// Output:
	// <nil>
	// 23505 permanent
	// 40P01 transient
}
