package idemsqlite_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemsqlite"
	"github.com/idem-go/idem/idemtest"
)

// Prepared statements belong to their DB: after Close, the components
// built on it fail cleanly instead of using them, and components built on
// the file opened again prepare their own and find everything committed
// before.
func TestStatementsAcrossReopen(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "idem.db")
	clock := idemmem.NewClock(idemtest.Start)
	req := idem.ClaimRequest{Key: "k", Fingerprint: "v1:x", Lease: time.Minute, TTL: time.Hour}
	sub := idem.Subscription{Topic: "payments", Consumer: "c", AckWait: time.Hour}

	open := func() (*idemsqlite.DB, *idemsqlite.Store, *idemsqlite.Inbox, *idemsqlite.Transport) {
		t.Helper()
		db, err := idemsqlite.Open(path, nil)
		if err != nil {
			t.Fatal(err)
		}
		store, err := idemsqlite.NewStore(ctx, db, &idemsqlite.StoreConfig{Clock: clock})
		if err != nil {
			t.Fatal(err)
		}
		in, err := idemsqlite.NewInbox(ctx, db)
		if err != nil {
			t.Fatal(err)
		}
		tr, err := idemsqlite.NewTransport(ctx, db, &idemsqlite.TransportConfig{Clock: clock, Poll: 5 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		return db, store, in, tr
	}

	db, store, in, tr := open()
	c, err := store.Claim(ctx, req)
	if err != nil || c.Outcome != idem.Acquired {
		t.Fatalf("Claim = %+v, %v", c, err)
	}
	if err := store.Complete(ctx, idem.Ref{Key: "k", Token: c.Token}, idem.Response{Status: 201}); err != nil {
		t.Fatal(err)
	}
	if err := in.ProcessBatch(ctx, "c", []string{"a", "b"}, func(context.Context, []bool) error { return nil }); err != nil {
		t.Fatal(err)
	}
	s, err := tr.Subscribe(ctx, sub)
	if err != nil {
		t.Fatal(err)
	}
	if err := tr.Publish(ctx, idem.Message{ID: "m-1", Topic: "payments"}, idem.Message{ID: "m-2", Topic: "payments"}); err != nil {
		t.Fatal(err)
	}
	if d := next(t, s); d.Message().ID != "m-1" {
		t.Fatalf("Next = %s, want m-1", d.Message().ID)
	}
	// The process "stops": m-1 stays held, m-2 was never handed out.
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Claim(ctx, idem.ClaimRequest{Key: "k2", Fingerprint: "v1:x", Lease: time.Minute, TTL: time.Hour}); err == nil {
		t.Error("Claim on a closed DB succeeded")
	}
	if _, err := store.Get(ctx, "", "k"); err == nil || errors.Is(err, idem.ErrNotFound) {
		t.Errorf("Get on a closed DB = %v, want the DB's failure", err)
	}
	if err := in.ProcessBatch(ctx, "c", []string{"x"}, func(context.Context, []bool) error { return nil }); err == nil {
		t.Error("ProcessBatch on a closed DB succeeded")
	}
	if err := tr.Publish(ctx, idem.Message{ID: "m-3", Topic: "payments"}); err == nil {
		t.Error("Publish on a closed DB succeeded")
	}
	tr.Close()

	db, store, in, tr = open()
	defer db.Close()
	defer tr.Close()
	if c, err := store.Claim(ctx, req); err != nil || c.Outcome != idem.Completed {
		t.Errorf("Claim after reopening = %+v, %v; want the completed record", c, err)
	}
	var fresh []bool
	if err := in.ProcessBatch(ctx, "c", []string{"a", "x"}, func(_ context.Context, f []bool) error { fresh = f; return nil }); err != nil {
		t.Fatal(err)
	}
	if len(fresh) != 2 || fresh[0] || !fresh[1] {
		t.Errorf("fresh after reopening = %v, want [false true]", fresh)
	}
	s, err = tr.Subscribe(ctx, sub)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// m-1 is held by a stream of the closed DB for an hour: m-2 comes.
	d := next(t, s)
	if d.Message().ID != "m-2" || d.Attempt() != 1 {
		t.Errorf("Next after reopening = %s attempt %d, want m-2 attempt 1", d.Message().ID, d.Attempt())
	}
	if err := d.Ack(ctx); err != nil {
		t.Fatal(err)
	}
}
