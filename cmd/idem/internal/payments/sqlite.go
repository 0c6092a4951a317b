package payments

import (
	"context"
	"database/sql"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemsqlite"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// migrationComponent names this package's migrations in idemsqlite's
// bookkeeping, apart from the idempotency store's own.
const migrationComponent = "payments"

// timeLayout is fixed-width, so stored times sort as text in time order.
const timeLayout = "2006-01-02T15:04:05.000000000Z"

// sqliteStorage is storage on an idemsqlite database: sqlStorage in
// SQLite's dialect (writes through DB.WithTx, joining the idempotency key's
// transaction when there is one; reads through the read-only pool), with
// its own CreatePayment, Probe and steps of settle.
type sqliteStorage struct {
	sqlStorage
	db *idemsqlite.DB
	// prepared holds the hot paths' statements (sqliteHot), prepared on
	// the writer once: every payment runs them while it holds the single
	// writer, where parsing their text again would delay every write.
	prepared map[string]*sql.Stmt
}

var _ storage = (*sqliteStorage)(nil)

// The statements of a payment and of a settlement, prepared once.
const (
	sqlPaymentAccount = `SELECT balance, currency FROM accounts WHERE id = ? AND tenant = ?`
	sqlInsertPayment  = `INSERT INTO payments (id, tenant, account_id, amount, currency, description, status, created_at, idempotency_key, key_claimed_at, charge_id)
			 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
			 ON CONFLICT (tenant, idempotency_key, key_claimed_at) DO NOTHING`
	sqlDebit         = `UPDATE accounts SET balance = balance - ? WHERE id = ? AND tenant = ? AND balance >= ?`
	sqlAddSettlement = `INSERT INTO settlements (tenant, currency, total, events, refunds) VALUES (?, ?, ?, ?, ?)
				ON CONFLICT (tenant, currency) DO UPDATE SET total = total + excluded.total, events = events + excluded.events,
					refunds = refunds + excluded.refunds`
)

// sqliteMarkSettledSQL and sqliteReadSettledSQL are the statements that
// mark, and read, the settled rows of table (payments or refunds).
func sqliteMarkSettledSQL(table string) string {
	return `UPDATE ` + table + ` SET settled = 1 WHERE id IN (SELECT value FROM json_each(?)) AND settled = 0
		 RETURNING id, tenant, amount, currency`
}

func sqliteReadSettledSQL(table string) string {
	return `SELECT id, tenant, amount, currency FROM ` + table + ` WHERE id IN (SELECT value FROM json_each(?))`
}

// sqliteHot are the statements newSQLiteStorage prepares.
var sqliteHot = []string{sqlPaymentAccount, sqlInsertPayment, sqlDebit, sqlAddSettlement,
	sqliteMarkSettledSQL("payments"), sqliteMarkSettledSQL("refunds"),
	sqliteReadSettledSQL("payments"), sqliteReadSettledSQL("refunds")}

// sqliteStatements is sqlStorage's SQL for SQLite: ? placeholders, times
// as text (timeLayout), upserts on the unique index's columns.
var sqliteStatements = statements{
	param: func(int) string { return "?" },

	insertAccount:  `INSERT INTO accounts (id, tenant, balance, currency, created_at) VALUES (?, ?, ?, ?, ?)`,
	readAccount:    `SELECT balance, currency, created_at FROM accounts WHERE id = ? AND tenant = ?`,
	accountExists:  `SELECT 1 FROM accounts WHERE id = ? AND tenant = ?`,
	firstCurrency:  `SELECT currency FROM accounts WHERE tenant = ? ORDER BY created_at, rowid LIMIT 1`,
	readSettlement: `SELECT total, events, refunds FROM settlements WHERE tenant = ? AND currency = ?`,

	readPayment: `SELECT ` + paymentColumns + ` FROM payments WHERE id = ? AND tenant = ?`,
	chargedPage: `SELECT ` + paymentColumns + ` FROM payments WHERE charge_id IS NOT NULL
		 AND (created_at > ?1 OR (created_at = ?1 AND id > ?2)) AND rowid <= ?3
		 ORDER BY created_at, id LIMIT ?4`,
	lastPayment: `SELECT coalesce(max(rowid), 0) FROM payments`,
	recordersOf: `SELECT id, charge_id FROM payments WHERE charge_id IN (SELECT value FROM json_each(?))`,
	committedOf: `SELECT id FROM payments WHERE id IN (SELECT value FROM json_each(?))`,
	idList: func(ids []string) (any, error) {
		b, err := json.Marshal(ids)
		return string(b), err
	},
	paymentOf: `SELECT ` + paymentColumns + ` FROM payments WHERE tenant = ? AND idempotency_key IN (?, ?)
		 AND (key_claimed_at = ? OR (key_claimed_at > ? AND key_claimed_at < ?))
		 ORDER BY key_claimed_at LIMIT 1`,
	depositOf: `SELECT ` + depositColumns + ` FROM deposits WHERE tenant = ? AND idempotency_key IN (?, ?)
		 AND (key_claimed_at = ? OR (key_claimed_at > ? AND key_claimed_at < ?))
		 ORDER BY key_claimed_at LIMIT 1`,
	refundOf: `SELECT ` + refundColumns + ` FROM refunds WHERE tenant = ? AND idempotency_key IN (?, ?)
		 AND (key_claimed_at = ? OR (key_claimed_at > ? AND key_claimed_at < ?))
		 ORDER BY key_claimed_at LIMIT 1`,

	depositAccount: `SELECT balance FROM accounts WHERE id = ? AND tenant = ?`,
	insertDeposit: `INSERT INTO deposits (id, tenant, account_id, amount, balance_after, created_at, idempotency_key, key_claimed_at)
			 VALUES (?, ?, ?, ?, ?, ?, ?, ?)
			 ON CONFLICT (tenant, idempotency_key, key_claimed_at) DO NOTHING`,
	creditDeposit: `UPDATE accounts SET balance = balance + ? WHERE id = ? AND tenant = ? AND balance <= ? RETURNING balance`,

	refundPayment: `SELECT p.account_id, p.amount, p.refunded, p.currency, a.balance FROM payments p JOIN accounts a ON a.id = p.account_id
			 WHERE p.id = ? AND p.tenant = ?`,
	insertRefund: `INSERT INTO refunds (id, tenant, payment_id, account_id, amount, currency, reason, status, created_at, idempotency_key, key_claimed_at)
			 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
			 ON CONFLICT (tenant, idempotency_key, key_claimed_at) DO NOTHING`,
	raiseRefunded: `UPDATE payments SET refunded = refunded + ? WHERE id = ? AND tenant = ? AND refunded + ? <= amount`,
	creditRefund:  `UPDATE accounts SET balance = balance + ? WHERE id = ? AND tenant = ?`,
	readRefund:    `SELECT ` + refundColumns + ` FROM refunds WHERE id = ? AND tenant = ?`,
}

// newSQLiteStorage returns the storage on db, migrated already, with its
// hot statements prepared.
func newSQLiteStorage(ctx context.Context, db *idemsqlite.DB) (*sqliteStorage, error) {
	s := &sqliteStorage{
		sqlStorage: sqlStorage{d: sqliteDialect{db}, sql: &sqliteStatements, reads: sqliteRunner[*sql.DB]{db.Reader()}},
		db:         db,
		prepared:   make(map[string]*sql.Stmt, len(sqliteHot)),
	}
	for _, q := range sqliteHot {
		stmt, err := db.Prepare(ctx, q)
		if err != nil {
			for _, p := range s.prepared {
				p.Close()
			}
			return nil, err
		}
		s.prepared[q] = stmt
	}
	return s, nil
}

// stmt returns query's prepared statement bound to tx; query is one of
// sqliteHot.
func (s *sqliteStorage) stmt(ctx context.Context, tx *sql.Tx, query string) *sql.Stmt {
	p, ok := s.prepared[query]
	if !ok {
		panic("payments: statement not prepared: " + query)
	}
	return tx.StmtContext(ctx, p)
}

// sqliteDialect is how sqlStorage runs on an idemsqlite database.
type sqliteDialect struct{ db *idemsqlite.DB }

func (d sqliteDialect) withTx(ctx context.Context, fn func(ctx context.Context, r runner) error) error {
	return d.db.WithTx(ctx, func(ctx context.Context, tx *sql.Tx) error { return fn(ctx, sqliteRunner[*sql.Tx]{tx}) })
}

// beginFailed: a write that could not begin (the writer busy past its
// timeout, say) wrote nothing, so its retry may run.
func (sqliteDialect) beginFailed(err error) error {
	return fmt.Errorf("begin: %w", errors.Join(err, ErrTransient))
}

func (d sqliteDialect) readSnapshot(ctx context.Context, fn func(r runner) error) error {
	tx, err := d.db.Reader().BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return fmt.Errorf("begin read: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // read-only; nothing to undo
	return fn(sqliteRunner[*sql.Tx]{tx})
}

func (sqliteDialect) wrap(op string, err error) error { return fmt.Errorf("%s: %w", op, err) }

func (sqliteDialect) timeArg(t time.Time) any { return formatTime(t) }

// kept is t itself: timeLayout keeps every nanosecond.
func (sqliteDialect) kept(t time.Time) time.Time { return t }

// sqlHandle is a database/sql transaction or pool.
type sqlHandle interface {
	*sql.Tx | *sql.DB
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// sqliteRunner is runner on a database/sql transaction or pool. It holds
// one pointer, so that making a runner of it allocates nothing.
type sqliteRunner[H sqlHandle] struct{ h H }

func (r sqliteRunner[H]) exec(ctx context.Context, query string, args ...any) (int64, error) {
	res, err := r.h.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func (r sqliteRunner[H]) queryRow(ctx context.Context, query string, args ...any) row {
	return r.h.QueryRowContext(ctx, query, args...)
}

func (r sqliteRunner[H]) query(ctx context.Context, query string, args ...any) (rows, error) {
	rs, err := r.h.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return sqliteRows{rs}, nil
}

// sqliteRows is *sql.Rows closed as pgx's rows are, without an error: a
// failure of the iteration shows in Err.
type sqliteRows struct{ *sql.Rows }

func (r sqliteRows) Close() { r.Rows.Close() } //nolint:errcheck // see Err

// Migrate applies the service's own migrations (accounts, payments,
// deposits, settlements) and the message tables' (outbox, transport, inbox,
// dead letters) to db, for tools that prepare a database without running
// the service. New does the same, and idemsqlite.NewStore migrates the
// idempotency keys' tables.
func Migrate(ctx context.Context, db *idemsqlite.DB) error {
	if db == nil {
		return fmt.Errorf("%w: DB is required", ErrConfig)
	}
	if err := migrateSQLite(ctx, db); err != nil {
		return fmt.Errorf("payments: migrate: %w", err)
	}
	// The message tables are migrated by their stores' constructors; one
	// of them migrates them all.
	if _, err := idemsqlite.NewOutbox(ctx, db, nil); err != nil {
		return fmt.Errorf("payments: migrate the message tables: %w", err)
	}
	return nil
}

func migrateSQLite(ctx context.Context, db *idemsqlite.DB) error {
	sub, err := fs.Sub(migrationFiles, "migrations")
	if err != nil {
		return err
	}
	return db.Migrate(ctx, migrationComponent, sub)
}

func formatTime(t time.Time) string { return t.UTC().Format(timeLayout) }

func parseTime(s string) (time.Time, error) {
	t, err := time.Parse(timeLayout, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("stored time %q: %w", s, err)
	}
	return t, nil
}

// CreatePayment is SQLite's own rather than sqlStorage's: a statement
// costs no round trip here, but each one holds the single writer, so a
// payment runs three short statements prepared once (sqliteHot), where
// PostgreSQL's pays in one statement to spare round trips.
//
// The order matters. The account is read and checked, then the payment row
// is inserted before the debit, and its unique constraint on the origin is
// what decides: a row that is already there means an earlier execution of
// the same origin paid, and its payment is the answer, with nothing
// debited. That payment is looked for only when the constraint says so,
// or when the checks would refuse (a re-run must answer with its own
// payment rather than with a 402 caused by its own debit): the common path
// pays for no look-up. Refusals (not found, currency, funds) have written
// nothing, and the key's transaction still commits them (writeWork).
func (s *sqliteStorage) CreatePayment(ctx context.Context, p Payment, o origin) (Payment, error) {
	var w writeWork[Payment]
	err := s.db.WithTx(ctx, func(ctx context.Context, tx *sql.Tx) error { return w.done(s.pay(ctx, tx, p, o)) })
	return w.outcome(err, s.d.beginFailed)
}

// pay is CreatePayment's work, in tx.
func (s *sqliteStorage) pay(ctx context.Context, tx *sql.Tx, p Payment, o origin) (Payment, error, error) {
	var balance int64
	var currency string
	err := s.stmt(ctx, tx, sqlPaymentAccount).QueryRowContext(ctx, p.AccountID, p.Tenant).Scan(&balance, &currency)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return Payment{}, ErrAccountNotFound, nil
	case err != nil:
		return Payment{}, nil, fmt.Errorf("read account: %w", err)
	}
	r := sqliteRunner[*sql.Tx]{tx}
	if check := paymentRefusal(p, balance, currency); check != nil {
		existing, found, err := s.paymentOf(ctx, r, p.Tenant, o)
		switch {
		case err != nil:
			return Payment{}, nil, err
		case found:
			out, refusal := existingPayment(existing, p)
			return out, refusal, nil
		}
		return Payment{}, check, nil
	}
	if !o.since.IsZero() {
		// The keys live apart: a claim they lost may have paid.
		existing, found, err := s.paymentOf(ctx, r, p.Tenant, o)
		if err != nil {
			return Payment{}, nil, err
		}
		if found {
			out, refusal := existingPayment(existing, p)
			return out, refusal, nil
		}
	}
	key, claimedAt := o.args(s.d)
	description, err := s.text.seal(colDescription, p.Tenant, p.ID, p.Description)
	if err != nil {
		return Payment{}, nil, err
	}
	res, err := s.stmt(ctx, tx, sqlInsertPayment).ExecContext(ctx,
		p.ID, p.Tenant, p.AccountID, p.Amount, p.Currency, description, p.Status, formatTime(p.CreatedAt), key, claimedAt, optional(p.ChargeID))
	if err != nil {
		return Payment{}, nil, fmt.Errorf("insert payment: %w", err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return Payment{}, nil, fmt.Errorf("insert payment: %w", err)
	} else if n != 1 {
		existing, found, err := s.paymentOf(ctx, r, p.Tenant, o)
		if err != nil {
			return Payment{}, nil, err
		}
		if !found {
			return Payment{}, nil, errors.New("insert payment: conflict on the idempotency origin, but no payment has it")
		}
		out, refusal := existingPayment(existing, p)
		return out, refusal, nil
	}
	// The balance condition repeats the check above inside the write
	// itself, so no interleaving of requests can take it below zero.
	res, err = s.stmt(ctx, tx, sqlDebit).ExecContext(ctx, p.Amount, p.AccountID, p.Tenant, p.Amount)
	if err != nil {
		return Payment{}, nil, fmt.Errorf("debit account: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return Payment{}, nil, fmt.Errorf("debit account: %w", err)
	}
	if n != 1 {
		// Only possible if something wrote the balance between the check
		// and here, which the single writer rules out; failing undoes
		// the payment row with the rest.
		return Payment{}, nil, errors.New("debit account: the balance changed during the transaction")
	}
	// A payment re-found through its origin (above) wrote no event, so
	// it announces nothing twice.
	if err := s.announce(ctx, func() (idem.Message, error) { return paymentEvent(p) }); err != nil {
		return Payment{}, nil, err
	}
	return p, nil, injectBeforeCommit(ctx)
}

// Probe is SQLite's own: it writes with this process's clock, where
// PostgreSQL's takes the server's. It writes in a synced transaction of
// idemsqlite's (WithTx), which takes its turn in the writer queue as every
// write of the store does: a write on db.Writer() directly would race the
// queue for the writer's one connection, which database/sql hands to a
// waiter chosen at random.
func (s *sqliteStorage) Probe(ctx context.Context) error {
	err := s.db.WithTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO health_probe (id, written_at) VALUES (1, ?)
			ON CONFLICT (id) DO UPDATE SET written_at = excluded.written_at`, time.Now().UnixNano())
		return err
	})
	if err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	return nil
}

// sqliteMessaging opens the message stores on db.
func sqliteMessaging(ctx context.Context, db *idemsqlite.DB, c *Config) (messaging, error) {
	ob, err := idemsqlite.NewOutbox(ctx, db, &idemsqlite.OutboxConfig{Clock: c.Clock})
	if err != nil {
		return messaging{}, fmt.Errorf("payments: outbox: %w", err)
	}
	inbox, err := idemsqlite.NewInbox(ctx, db)
	if err != nil {
		return messaging{}, fmt.Errorf("payments: inbox: %w", err)
	}
	letters, err := idemsqlite.NewDeadLetters(ctx, db, &idemsqlite.DeadLettersConfig{Clock: c.Clock})
	if err != nil {
		return messaging{}, fmt.Errorf("payments: dead letters: %w", err)
	}
	ledger, err := idemsqlite.NewLedger(ctx, db)
	if err != nil {
		return messaging{}, fmt.Errorf("payments: ledger: %w", err)
	}
	return messaging{
		outbox: ob, inbox: inbox, letters: letters, ledger: ledger,
		inTx: func(ctx context.Context, fn func(ctx context.Context) error) error {
			return db.WithTx(ctx, func(ctx context.Context, _ *sql.Tx) error { return fn(ctx) })
		},
		newEmbedded: func(ctx context.Context) (embeddedTransport, error) {
			return idemsqlite.NewTransport(ctx, db, &idemsqlite.TransportConfig{Poll: c.TransportPoll})
		},
	}, nil
}

// settle runs settleIn with SQLite's steps: one UPDATE … RETURNING that
// marks the batch's unsettled payments settled and reads them, and one
// upsert per tenant and currency the batch touches, each a statement
// prepared once. SQLite's RETURNING gives only the rows it changed, so an
// event whose payment it did not mark (settled already, or unknown) costs
// one more read, of those payments only: the common batch, of new
// payments, pays for none.
func (s *sqliteStorage) settle(ctx context.Context, evs []PaymentEvent) ([]int, error) {
	var already []int
	err := s.db.WithTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		var err error
		already, err = settleIn(ctx, s, tx, evs)
		return err
	})
	if err != nil {
		return nil, err
	}
	return already, nil
}

func (s *sqliteStorage) markSettled(ctx context.Context, tx *sql.Tx, table string, ids []string) (map[string]settledPayment, error) {
	found := make(map[string]settledPayment, len(ids))
	if len(ids) == 0 {
		return found, nil
	}
	if err := readSettled(ctx, s.stmt(ctx, tx, sqliteMarkSettledSQL(table)), found, true, ids); err != nil {
		return nil, fmt.Errorf("mark %s settled: %w", table, err)
	}
	var rest []string
	for _, id := range ids {
		if _, ok := found[id]; !ok {
			rest = append(rest, id)
		}
	}
	if len(rest) > 0 {
		if err := readSettled(ctx, s.stmt(ctx, tx, sqliteReadSettledSQL(table)), found, false, rest); err != nil {
			return nil, fmt.Errorf("read %s: %w", table, err)
		}
	}
	return found, nil
}

// readSettled runs query, which takes the payment IDs as a JSON array and
// returns id, tenant, amount and currency, and records each payment in
// found with marked.
func readSettled(ctx context.Context, query *sql.Stmt, found map[string]settledPayment, marked bool, ids []string) error {
	list, err := json.Marshal(ids)
	if err != nil {
		return err
	}
	rows, err := query.QueryContext(ctx, string(list))
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		p := settledPayment{marked: marked}
		if err := rows.Scan(&id, &p.tenant, &p.amount, &p.currency); err != nil {
			return err
		}
		found[id] = p
	}
	return rows.Err()
}

func (s *sqliteStorage) addSettlements(ctx context.Context, tx *sql.Tx, totals []settlementTotal) error {
	add := s.stmt(ctx, tx, sqlAddSettlement)
	for _, t := range totals {
		if _, err := add.ExecContext(ctx, t.tenant, t.currency, t.total, t.events, t.refunds); err != nil {
			return fmt.Errorf("settle: %w", err)
		}
	}
	return nil
}
