package idemsqlite_test

import (
	"context"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// ClaimTx writes a new key's record once, completed, with the work's
// writes: the transaction holds the writer, so it reads the key, and
// inserts the record at the end instead of inserting it in flight first
// and updating it. A key that exists is claimed as Claim claims it: taken
// over in flight, then completed by an update.
func TestClaimTxWritesTheRecordOnce(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	migratePayments(t, db)
	s := newStore(t, db, nil)
	ctx := t.Context()
	if _, err := db.Writer().ExecContext(ctx, `CREATE TABLE key_updates (n INTEGER NOT NULL);
		CREATE TRIGGER count_key_updates AFTER UPDATE ON idem_keys BEGIN INSERT INTO key_updates VALUES (1); END;`); err != nil {
		t.Fatal(err)
	}
	updates := func() int {
		t.Helper()
		var n int
		if err := db.Reader().QueryRowContext(ctx, `SELECT count(*) FROM key_updates`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	req := idem.ClaimRequest{Scope: "merchant", Key: "order-1", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour, Unseen: true}
	var seen idem.Claim
	c, kept, err := s.ClaimTx(ctx, req, time.Second, func(ctx context.Context, c idem.Claim) (idem.Response, bool, error) {
		seen = c
		if err := insertPayment(ctx, db, "pay_1"); err != nil {
			return idem.Response{}, false, err
		}
		return idem.Response{Status: 201, Body: []byte("pay_1")}, true, nil
	})
	if err != nil || !kept || c.Outcome != idem.Acquired || seen.Token != c.Token {
		t.Fatalf("ClaimTx = %+v, %v, %v", c, kept, err)
	}
	rec, err := s.Get(ctx, req.Scope, req.Key)
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != idem.StateCompleted || rec.Token != c.Token || string(rec.Response.Body) != "pay_1" ||
		!rec.CreatedAt.Equal(c.Record.CreatedAt) || !rec.ExpiresAt.Equal(c.Record.ExpiresAt) || !rec.LeaseExpiresAt.Equal(c.Record.LeaseExpiresAt) {
		t.Errorf("record %+v does not match the claim %+v", rec, c.Record)
	}
	if n := updates(); n != 0 {
		t.Errorf("%d updates of idem_keys for a new key, want 0", n)
	}

	// A key in flight under Claim whose lease ended is taken over, then
	// completed: two updates.
	held := req
	held.Key, held.Lease = "order-2", time.Nanosecond
	if c, err := s.Claim(ctx, held); err != nil || c.Outcome != idem.Acquired {
		t.Fatalf("Claim = %v, %v", c.Outcome, err)
	}
	held.Lease = time.Minute
	c, kept, err = s.ClaimTx(ctx, held, time.Second, func(ctx context.Context, c idem.Claim) (idem.Response, bool, error) {
		return idem.Response{Status: 201}, true, nil
	})
	if err != nil || !kept || !c.TookOver {
		t.Fatalf("ClaimTx of an ended lease = %+v, %v, %v; want taken over and kept", c, kept, err)
	}
	if n := updates(); n != 2 {
		t.Errorf("%d updates after the takeover, want 2", n)
	}
}
