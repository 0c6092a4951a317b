package idemsqlite_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/idem-go/idem/idemsqlite"
)

// WriterState tells a watchdog how long the writer's turn has been held
// and who waits for it: nothing while the writer is free; while a
// transaction holds it, a time that grows, and the callers queued behind
// it; nothing again once it has ended.
func TestWriterStateTellsHowLongTheWriterIsHeld(t *testing.T) {
	db := openDB(t)
	migratePayments(t, db)
	if ws := db.WriterState(); ws != (idemsqlite.WriterState{}) {
		t.Fatalf("the writer free: %+v; want the zero WriterState", ws)
	}
	wrote, release, held := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	go func() {
		held <- db.WithTx(t.Context(), func(ctx context.Context, tx *sql.Tx) error {
			if _, err := tx.ExecContext(ctx, `INSERT INTO payments (id, amount) VALUES ('holder', 1)`); err != nil {
				return err
			}
			close(wrote)
			<-release
			return nil
		})
	}()
	<-wrote
	first := db.WriterState()
	if first.Held <= 0 || first.Waiting != 0 {
		t.Fatalf("one transaction holding the writer: %+v; want Held > 0, nobody waiting", first)
	}
	queued := make(chan error, 1)
	go func() { queued <- insertPayment(t.Context(), db, "queued") }()
	idemsqlite.WaitingForWriter(t, db, 1)
	second := db.WriterState()
	if second.Held <= first.Held || second.Waiting != 1 {
		t.Fatalf("then, one more waiting: %+v; want Held past %v, one waiting", second, first.Held)
	}
	close(release)
	for _, c := range []chan error{held, queued} {
		if err := <-c; err != nil {
			t.Fatal(err)
		}
	}
	if ws := db.WriterState(); ws != (idemsqlite.WriterState{}) {
		t.Fatalf("the writer free again: %+v; want the zero WriterState", ws)
	}
}
