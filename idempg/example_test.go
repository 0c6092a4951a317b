package idempg_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idempg"
)

// exampleURL is the PostgreSQL the examples run against: IDEM_POSTGRES_URL,
// or the local default.
func exampleURL() string {
	if u := os.Getenv("IDEM_POSTGRES_URL"); u != "" {
		return u
	}
	return defaultPostgresURL
}

// exampleSchema returns a schema name of its own for an example run.
func exampleSchema() string {
	b := make([]byte, 6)
	rand.Read(b)
	return "idempg_example_" + hex.EncodeToString(b)
}

// A payment handler writes the payment and completes the idempotency key in
// one PostgreSQL transaction; the duplicate request is answered from the
// stored response and charges nothing.
func Example() {
	ctx := context.Background()
	db, err := idempg.Open(ctx, exampleURL(), &idempg.Config{Schema: exampleSchema()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer db.Close()
	defer db.Pool().Exec(ctx, `DROP SCHEMA `+pgx.Identifier{db.Schema()}.Sanitize()+` CASCADE`)

	// The application's own table lives in the same schema as the keys.
	err = db.Migrate(ctx, "payments", fstest.MapFS{
		"0001_payments.sql": {Data: []byte(`CREATE TABLE payments (id text PRIMARY KEY, amount bigint NOT NULL);`)},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	store, err := idempg.NewStore(ctx, db)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer store.Close()

	req := idem.ClaimRequest{
		Scope:       "merchant-7",
		Key:         "order-42",
		Fingerprint: idem.NewFingerprint("POST", "/payments", "", "application/json", []byte(`{"amount":1250}`)),
		Lease:       30 * time.Second,
		TTL:         24 * time.Hour,
	}
	charge := func(ctx context.Context) (idem.Response, bool, error) {
		// The handler reaches CompleteTx's transaction through WithTx.
		err := db.WithTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO payments (id, amount) VALUES ($1, $2)`, "pay_1", 1250)
			return err
		})
		if err != nil {
			return idem.Response{}, false, err
		}
		return idem.Response{Status: 201, Body: []byte(`{"id":"pay_1"}`)}, true, nil
	}

	for attempt := 1; attempt <= 2; attempt++ {
		claim, err := store.Claim(ctx, req)
		if err != nil {
			fmt.Println(err)
			return
		}
		switch claim.Outcome {
		case idem.Acquired:
			ref := idem.Ref{Scope: req.Scope, Key: req.Key, Token: claim.Token}
			kept, err := store.CompleteTx(ctx, ref, charge)
			fmt.Printf("attempt %d: charged, kept=%v err=%v\n", attempt, kept, err)
		case idem.Completed:
			resp := claim.Record.Response
			fmt.Printf("attempt %d: replayed %d %s\n", attempt, resp.Status, resp.Body)
		}
	}

	var n int
	if err := db.Pool().QueryRow(ctx, `SELECT count(*) FROM payments`).Scan(&n); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("payments:", n)
	// Output:
	// attempt 1: charged, kept=true err=<nil>
	// attempt 2: replayed 201 {"id":"pay_1"}
	// payments: 1
}

// ClaimTx claims the key in the payment's own transaction: a handler that
// fails leaves no trace, not even the claim, so the retry runs at once; the
// one that succeeds commits claim, payment and answer together, and the
// duplicate after it replays the answer.
func ExampleStore_ClaimTx() {
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
	store, err := idempg.NewStore(ctx, db)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer store.Close()

	req := idem.ClaimRequest{
		Scope:       "merchant-7",
		Key:         "order-42",
		Fingerprint: idem.NewFingerprint("POST", "/payments", "", "application/json", []byte(`{"amount":1250}`)),
		Lease:       30 * time.Second,
		TTL:         24 * time.Hour,
	}
	providerDown := true
	charge := func(ctx context.Context, c idem.Claim) (idem.Response, bool, error) {
		err := db.WithTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO payments (id, amount) VALUES ($1, $2)`, "pay_1", 1250)
			return err
		})
		if err != nil {
			return idem.Response{}, false, err
		}
		if providerDown {
			providerDown = false
			return idem.Response{Status: 503}, false, nil // not kept: rolled back, claim included
		}
		return idem.Response{Status: 201, Body: []byte(`{"id":"pay_1"}`)}, true, nil
	}
	for attempt := 1; attempt <= 3; attempt++ {
		claim, kept, err := store.ClaimTx(ctx, req, 5*time.Second, charge)
		switch {
		case err != nil:
			fmt.Println(err)
			return
		case claim.Outcome == idem.Acquired:
			fmt.Printf("attempt %d: ran, kept=%v\n", attempt, kept)
		case claim.Outcome == idem.Completed:
			fmt.Printf("attempt %d: replayed %d %s\n", attempt, claim.Record.Response.Status, claim.Record.Response.Body)
		}
	}
	var n int
	if err := db.Pool().QueryRow(ctx, `SELECT count(*) FROM payments`).Scan(&n); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("payments:", n)
	// Output:
	// attempt 1: ran, kept=false
	// attempt 2: ran, kept=true
	// attempt 3: replayed 201 {"id":"pay_1"}
	// payments: 1
}

// WithTx on its own commits when fn returns nil and rolls back otherwise;
// nested calls with the context it passes join the same transaction.
func ExampleDB_WithTx() {
	ctx := context.Background()
	db, err := idempg.Open(ctx, exampleURL(), &idempg.Config{Schema: exampleSchema()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer db.Close()
	defer db.Pool().Exec(ctx, `DROP SCHEMA `+pgx.Identifier{db.Schema()}.Sanitize()+` CASCADE`)
	if _, err := db.Pool().Exec(ctx, `CREATE TABLE ledger (entry text)`); err != nil {
		fmt.Println(err)
		return
	}

	record := func(ctx context.Context, entry string) error {
		return db.WithTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO ledger (entry) VALUES ($1)`, entry)
			return err
		})
	}
	err = db.WithTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		if err := record(ctx, "debit"); err != nil {
			return err
		}
		return record(ctx, "credit")
	})
	fmt.Println("transfer:", err)

	err = db.WithTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		if err := record(ctx, "debit"); err != nil {
			return err
		}
		return fmt.Errorf("credit refused")
	})
	fmt.Println("refused transfer:", err)

	var n int
	_ = db.Pool().QueryRow(ctx, `SELECT count(*) FROM ledger`).Scan(&n)
	fmt.Println("ledger entries:", n)
	// Output:
	// transfer: <nil>
	// refused transfer: credit refused
	// ledger entries: 2
}
