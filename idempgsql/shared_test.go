package idempgsql_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/idempgsql"
)

// idempg and idempgsql work on one schema at once: a key claimed through
// one is claimed for the other, a completion through database/sql wakes a
// duplicate waiting through idempg's LISTEN, and an outbox entry added in
// an application's *sql.Tx is leased by idempg's relay.
func TestSharedWithIdempg(t *testing.T) {
	t.Parallel()
	eachDriver(t, func(t *testing.T, driver string) {
		ctx := t.Context()
		sqlDB := openDB(t, driver, idempgsql.Config{})
		sqlStore, err := idempgsql.NewStore(ctx, sqlDB)
		if err != nil {
			t.Fatal(err)
		}
		pool, err := pgxpool.New(ctx, withParam(pgURL(t), "search_path="+sqlDB.Schema()+"&pool_max_conns=2"))
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		pgDB, err := idempg.NewDB(ctx, pool, nil)
		if err != nil {
			t.Fatal(err)
		}
		pgStore, err := idempg.NewStore(ctx, pgDB)
		if err != nil {
			t.Fatal(err)
		}
		defer pgStore.Close()

		req := idem.ClaimRequest{Scope: "s", Key: "k", Fingerprint: "f", Lease: time.Minute, TTL: time.Hour}
		first, err := sqlStore.Claim(ctx, req)
		if err != nil || first.Outcome != idem.Acquired {
			t.Fatalf("Claim through database/sql = %v, %v", first.Outcome, err)
		}
		if c, err := pgStore.Claim(ctx, req); err != nil || c.Outcome != idem.InFlight {
			t.Fatalf("Claim through pgx of the held key = %v, %v; want in flight", c.Outcome, err)
		}

		// A duplicate waits through idempg; the completion through
		// database/sql wakes it.
		woke := make(chan error, 1)
		go func() {
			wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			for {
				c, err := pgStore.Claim(wctx, req)
				if err != nil || c.Outcome != idem.InFlight {
					woke <- err
					return
				}
				if err := pgStore.WaitChange(wctx, req.Scope, req.Key); err != nil {
					woke <- err
					return
				}
			}
		}()
		ref := idem.Ref{Scope: req.Scope, Key: req.Key, Token: first.Token}
		if err := sqlStore.Complete(ctx, ref, idem.Response{Status: 201, Body: []byte("made")}); err != nil {
			t.Fatal(err)
		}
		if err := <-woke; err != nil {
			t.Fatalf("the waiting duplicate: %v", err)
		}
		rec, err := pgStore.Get(ctx, req.Scope, req.Key)
		if err != nil || rec.State != idem.StateCompleted || string(rec.Response.Body) != "made" || rec.Response.Status != 201 {
			t.Fatalf("Get through pgx = %+v, %v", rec, err)
		}

		// The outbox: added in an application's transaction, leased by
		// idempg's outbox.
		sqlOutbox, err := idempgsql.NewOutbox(ctx, sqlDB, nil)
		if err != nil {
			t.Fatal(err)
		}
		tx, err := sqlDB.SQL().BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		msg := idem.Message{ID: "e1", Topic: "orders", Key: "o-1", Headers: map[string]string{"h": "v"}, Payload: []byte("p")}
		if err := sqlOutbox.Add(sqlDB.JoinTx(ctx, tx), msg); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		pgOutbox, err := idempg.NewOutbox(ctx, pgDB, nil)
		if err != nil {
			t.Fatal(err)
		}
		entries, err := pgOutbox.Claim(ctx, "relay", 10, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if len(entries) != 1 || entries[0].Message.ID != "e1" || entries[0].Message.Headers["h"] != "v" || string(entries[0].Message.Payload) != "p" {
			t.Fatalf("idempg's relay leased %+v", entries)
		}
	})
}
