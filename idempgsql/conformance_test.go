// This file runs every conformance suite of idemtest that idempgsql
// qualifies for, on each driver: TestStore, TestMiddleware (in the
// same-transaction form), TestWithTx, TestTxEffects and TestRecoverer
// (Store), TestInbox
// (Inbox) and TestOutbox (Outbox), on the suites' manual clock.

package idempgsql_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idempgsql"
	"github.com/idem-go/idem/idemtest"
)

func TestStore(t *testing.T) {
	t.Parallel()
	eachDriver(t, func(t *testing.T, driver string) {
		idemtest.TestStore(t, func(t *testing.T, clock idem.Clock) idem.Store {
			return newStore(t, openDB(t, driver, idempgsql.Config{Clock: clock}))
		})
	})
}

func TestMiddleware(t *testing.T) {
	t.Parallel()
	eachDriver(t, func(t *testing.T, driver string) {
		idemtest.TestMiddleware(t, func(t *testing.T, clock idem.Clock) idem.Store {
			return newStore(t, openDB(t, driver, idempgsql.Config{Clock: clock}))
		})
	})
}

func TestFace(t *testing.T) {
	t.Parallel()
	eachDriver(t, func(t *testing.T, driver string) {
		idemtest.TestFace(t, idemtest.HTTP, func(t *testing.T, clock idem.Clock) idem.Store {
			return newStore(t, openDB(t, driver, idempgsql.Config{Clock: clock}))
		})
	})
}

// txRunner is DB.WithTx as idemtest.TestWithTx takes it.
type txRunner struct{ db *idempgsql.DB }

func (r txRunner) WithTx(ctx context.Context, fn func(context.Context) error) error {
	return r.db.WithTx(ctx, func(ctx context.Context, _ *sql.Tx) error { return fn(ctx) })
}

func TestWithTx(t *testing.T) {
	t.Parallel()
	eachDriver(t, func(t *testing.T, driver string) {
		idemtest.TestWithTx(t, func(t *testing.T, clock idem.Clock) (idemtest.TxRunner, idem.Store, idemtest.InboxEffects) {
			db := openDB(t, driver, idempgsql.Config{Clock: clock})
			return txRunner{db}, newStore(t, db), newEffects(t, db)
		})
	})
}

func TestTxEffects(t *testing.T) {
	t.Parallel()
	eachDriver(t, func(t *testing.T, driver string) {
		idemtest.TestTxEffects(t, func(t *testing.T, clock idem.Clock) (idem.TxStore, idemtest.InboxEffects) {
			db := openDB(t, driver, idempgsql.Config{Clock: clock})
			return newStore(t, db), newEffects(t, db)
		})
	})
}

func TestRecoverer(t *testing.T) {
	t.Parallel()
	eachDriver(t, func(t *testing.T, driver string) {
		idemtest.TestRecoverer(t, func(t *testing.T, clock idem.Clock) (idem.Recoverer, idemtest.TxRunner, idemtest.InboxEffects) {
			db := openDB(t, driver, idempgsql.Config{Clock: clock})
			return newStore(t, db), txRunner{db}, newEffects(t, db)
		})
	})
}

func TestInbox(t *testing.T) {
	t.Parallel()
	eachDriver(t, func(t *testing.T, driver string) {
		idemtest.TestInbox(t, func(t *testing.T) (idem.Inbox, idemtest.InboxEffects) {
			db := openDB(t, driver, idempgsql.Config{})
			return newInbox(t, db), newEffects(t, db)
		})
	})
}

func TestOutbox(t *testing.T) {
	t.Parallel()
	eachDriver(t, func(t *testing.T, driver string) {
		idemtest.TestOutbox(t, func(t *testing.T, clock idem.Clock) idem.Outbox {
			o, err := idempgsql.NewOutbox(t.Context(), openDB(t, driver, idempgsql.Config{}), &idempgsql.OutboxConfig{Clock: clock})
			if err != nil {
				t.Fatal(err)
			}
			return o
		})
	})
}
