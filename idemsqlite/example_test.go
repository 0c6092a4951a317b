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

// A payment handler writes the payment and completes the idempotency key in
// one transaction; the duplicate request is answered from the stored
// response and charges nothing.
func Example() {
	dir, err := os.MkdirTemp("", "idemsqlite-example")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)

	ctx := context.Background()
	db, err := idemsqlite.Open(filepath.Join(dir, "payments.db"), nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer db.Close()

	// The application's own table lives in the same file as the keys.
	err = db.Migrate(ctx, "payments", fstest.MapFS{
		"0001_payments.sql": {Data: []byte(`CREATE TABLE payments (id TEXT PRIMARY KEY, amount INTEGER NOT NULL);`)},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	store, err := idemsqlite.NewStore(ctx, db, nil)
	if err != nil {
		fmt.Println(err)
		return
	}

	req := idem.ClaimRequest{
		Scope:       "merchant-7",
		Key:         "order-42",
		Fingerprint: idem.NewFingerprint("POST", "/payments", "", "application/json", []byte(`{"amount":1250}`)),
		Lease:       30 * time.Second,
		TTL:         24 * time.Hour,
	}
	charge := func(ctx context.Context) (idem.Response, bool, error) {
		// The handler reaches CompleteTx's transaction through WithTx.
		err := db.WithTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO payments (id, amount) VALUES (?, ?)`, "pay_1", 1250)
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
	if err := db.Reader().QueryRowContext(ctx, `SELECT count(*) FROM payments`).Scan(&n); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("payments:", n)
	// Output:
	// attempt 1: charged, kept=true err=<nil>
	// attempt 2: replayed 201 {"id":"pay_1"}
	// payments: 1
}

// WithTx on its own commits when fn returns nil and rolls back otherwise;
// nested calls with the context it passes join the same transaction.
func ExampleDB_WithTx() {
	dir, err := os.MkdirTemp("", "idemsqlite-example")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	ctx := context.Background()
	db, err := idemsqlite.Open(filepath.Join(dir, "app.db"), nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer db.Close()
	if _, err := db.Writer().ExecContext(ctx, `CREATE TABLE ledger (entry TEXT)`); err != nil {
		fmt.Println(err)
		return
	}

	record := func(ctx context.Context, entry string) error {
		return db.WithTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO ledger (entry) VALUES (?)`, entry)
			return err
		})
	}
	err = db.WithTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		if err := record(ctx, "debit"); err != nil {
			return err
		}
		return record(ctx, "credit")
	})
	fmt.Println("transfer:", err)

	err = db.WithTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		if err := record(ctx, "debit"); err != nil {
			return err
		}
		return fmt.Errorf("credit refused")
	})
	fmt.Println("refused transfer:", err)

	var n int
	_ = db.Reader().QueryRowContext(ctx, `SELECT count(*) FROM ledger`).Scan(&n)
	fmt.Println("ledger entries:", n)
	// Output:
	// transfer: <nil>
	// refused transfer: credit refused
	// ledger entries: 2
}

// An application's own statement, run in every transaction of a hot path,
// is prepared once, before serving, and bound to each transaction with
// StmtContext: the single writer never parses its text again.
func ExampleDB_Prepare() {
	dir, err := os.MkdirTemp("", "idemsqlite-example")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(dir)
	ctx := context.Background()
	db, err := idemsqlite.Open(filepath.Join(dir, "ledger.db"), nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer db.Close()
	if _, err := db.Writer().ExecContext(ctx, `CREATE TABLE entries (id INTEGER PRIMARY KEY, amount INTEGER NOT NULL)`); err != nil {
		fmt.Println(err)
		return
	}
	insert, err := db.Prepare(ctx, `INSERT INTO entries (amount) VALUES (?)`)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer insert.Close()
	for _, amount := range []int{100, 250} {
		err := db.WithTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.StmtContext(ctx, insert).ExecContext(ctx, amount)
			return err
		})
		if err != nil {
			fmt.Println(err)
			return
		}
	}
	var total int
	if err := db.Reader().QueryRowContext(ctx, `SELECT sum(amount) FROM entries`).Scan(&total); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("total:", total)
	// Output: total: 350
}
