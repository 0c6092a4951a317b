package idemsqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemsqlite"
)

func TestOutboxAddJoinsCallersTx(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := openMessagesDB(t)
	o, err := idemsqlite.NewOutbox(ctx, db, nil)
	if err != nil {
		t.Fatal(err)
	}
	m := func(id string) idem.Message { return idem.Message{ID: id, Topic: "payments.succeeded"} }
	rollback := errors.New("roll back")
	err = db.WithTx(ctx, func(ctx context.Context, _ *sql.Tx) error {
		if err := o.Add(ctx, m("rolled-back")); err != nil {
			return err
		}
		return rollback
	})
	if !errors.Is(err, rollback) {
		t.Fatalf("WithTx = %v, want the rollback", err)
	}
	err = db.WithTx(ctx, func(ctx context.Context, _ *sql.Tx) error { return o.Add(ctx, m("committed")) })
	if err != nil {
		t.Fatal(err)
	}
	got, err := o.Claim(ctx, "r", 10, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Message.ID != "committed" {
		t.Errorf("Claim = %+v, want only the committed entry", got)
	}
}
