package idemsqlite

import (
	"context"
	"testing"
)

// WaitingForWriter returns once exactly n callers wait for db's writer
// (idemtest.WriterControl.Waiting).
func WaitingForWriter(t *testing.T, db *DB, n int) { queued(t, &db.queue, n) }

// CarriesTx reports whether ctx carries a transaction of db.
func CarriesTx(ctx context.Context, db *DB) bool { return db.carried(ctx) != nil }
