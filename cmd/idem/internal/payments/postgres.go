package payments

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idempg"
)

//go:embed pgmigrations/*.sql
var pgMigrationFiles embed.FS

// MigratePostgres applies the service's own migrations (accounts, payments,
// deposits, settlements) and the message tables' (outbox, inbox, dead
// letters, ledger, the embedded transport) to db's schema, for tools that
// prepare a database without running the service. It is idempotent and safe to run from several
// processes at once (idempg.DB.Migrate serialises them). New does the same,
// and idempg.NewStore migrates the idempotency keys' tables.
func MigratePostgres(ctx context.Context, db *idempg.DB) error {
	if db == nil {
		return fmt.Errorf("%w: Postgres is required", ErrConfig)
	}
	if err := migratePostgres(ctx, db); err != nil {
		return fmt.Errorf("payments: migrate: %w", err)
	}
	// The message tables are migrated by their stores' constructors.
	if _, err := pgMessaging(ctx, db, &Config{}); err != nil {
		return fmt.Errorf("payments: migrate the message tables: %w", err)
	}
	tr, err := idempg.NewTransport(ctx, db, nil)
	if err != nil {
		return fmt.Errorf("payments: migrate the transport's tables: %w", err)
	}
	return tr.Close()
}

func migratePostgres(ctx context.Context, db *idempg.DB) error {
	sub, err := fs.Sub(pgMigrationFiles, "pgmigrations")
	if err != nil {
		return err
	}
	return db.Migrate(ctx, migrationComponent, sub)
}

// pgStorage is storage on an idempg database: sqlStorage in PostgreSQL's
// dialect (writes through DB.WithTx, joining the idempotency key's
// transaction when there is one; reads through the pool), with its own
// CreatePayment, Probe and steps of settle.
//
// Every write locks the rows it checks before it checks them (SELECT … FOR
// UPDATE; a payment's debit locks its account's), so writes to one account
// are serialised whatever the isolation level, and the checks made under
// the lock still hold when the rows are written.
type pgStorage struct {
	sqlStorage
	db *idempg.DB
}

var _ storage = (*pgStorage)(nil)

func newPGStorage(db *idempg.DB) *pgStorage {
	return &pgStorage{
		sqlStorage: sqlStorage{d: pgDialect{db}, sql: &pgStatements, reads: pgRunner{db.Pool()}},
		db:         db,
	}
}

// pgStatements is sqlStorage's SQL for PostgreSQL: numbered placeholders,
// times as timestamptz, upserts on the named constraints, and the rows a
// write checks locked (FOR UPDATE) before it checks them.
var pgStatements = statements{
	param: func(n int) string { return "$" + strconv.Itoa(n) },

	insertAccount:  `INSERT INTO accounts (id, tenant, balance, currency, created_at) VALUES ($1, $2, $3, $4, $5)`,
	readAccount:    `SELECT balance, currency, created_at FROM accounts WHERE id = $1 AND tenant = $2`,
	accountExists:  `SELECT 1 FROM accounts WHERE id = $1 AND tenant = $2`,
	firstCurrency:  `SELECT currency FROM accounts WHERE tenant = $1 ORDER BY created_at, id LIMIT 1`,
	readSettlement: `SELECT total, events, refunds FROM settlements WHERE tenant = $1 AND currency = $2`,

	readPayment: `SELECT ` + paymentColumns + ` FROM payments WHERE id = $1 AND tenant = $2`,
	chargedPage: `SELECT ` + paymentColumns + ` FROM payments WHERE charge_id IS NOT NULL
		 AND (created_at > $1 OR (created_at = $1 AND id > $2)) AND seq <= $3
		 ORDER BY created_at, id LIMIT $4`,
	lastPayment: `SELECT coalesce(max(seq), 0) FROM payments`,
	recordersOf: `SELECT id, charge_id FROM payments WHERE charge_id = ANY($1::text[])`,
	committedOf: `SELECT id FROM payments WHERE id = ANY($1::text[])`,
	idList:      func(ids []string) (any, error) { return ids, nil },
	paymentOf: `SELECT ` + paymentColumns + ` FROM payments WHERE tenant = $1 AND idempotency_key IN ($2, $3)
		 AND (key_claimed_at = $4 OR (key_claimed_at > $5 AND key_claimed_at < $6))
		 ORDER BY key_claimed_at LIMIT 1`,
	depositOf: `SELECT ` + depositColumns + ` FROM deposits WHERE tenant = $1 AND idempotency_key IN ($2, $3)
		 AND (key_claimed_at = $4 OR (key_claimed_at > $5 AND key_claimed_at < $6))
		 ORDER BY key_claimed_at LIMIT 1`,
	refundOf: `SELECT ` + refundColumns + ` FROM refunds WHERE tenant = $1 AND idempotency_key IN ($2, $3)
		 AND (key_claimed_at = $4 OR (key_claimed_at > $5 AND key_claimed_at < $6))
		 ORDER BY key_claimed_at LIMIT 1`,

	depositAccount: `SELECT balance FROM accounts WHERE id = $1 AND tenant = $2 FOR UPDATE`,
	insertDeposit: `INSERT INTO deposits (id, tenant, account_id, amount, balance_after, created_at, idempotency_key, key_claimed_at)
			 VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
			 ON CONFLICT ON CONSTRAINT deposits_idempotency DO NOTHING`,
	creditDeposit: `UPDATE accounts SET balance = balance + $1 WHERE id = $2 AND tenant = $3 AND balance <= $4 RETURNING balance`,

	refundPayment: `SELECT account_id, amount, refunded, currency FROM payments WHERE id = $1 AND tenant = $2 FOR UPDATE`,
	refundAccount: `SELECT balance FROM accounts WHERE id = $1 AND tenant = $2 FOR UPDATE`,
	insertRefund: `INSERT INTO refunds (id, tenant, payment_id, account_id, amount, currency, reason, status, created_at, idempotency_key, key_claimed_at)
			 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
			 ON CONFLICT ON CONSTRAINT refunds_idempotency DO NOTHING`,
	raiseRefunded: `UPDATE payments SET refunded = refunded + $1 WHERE id = $2 AND tenant = $3 AND refunded + $4 <= amount`,
	creditRefund:  `UPDATE accounts SET balance = balance + $1 WHERE id = $2 AND tenant = $3`,
	readRefund:    `SELECT ` + refundColumns + ` FROM refunds WHERE id = $1 AND tenant = $2`,
}

// pgDialect is how sqlStorage runs on an idempg database.
type pgDialect struct{ db *idempg.DB }

func (d pgDialect) withTx(ctx context.Context, fn func(ctx context.Context, r runner) error) error {
	return d.db.WithTx(ctx, func(ctx context.Context, tx pgx.Tx) error { return fn(ctx, pgRunner{tx}) })
}

func (pgDialect) beginFailed(err error) error { return pgErr("begin", err) }

func (d pgDialect) readSnapshot(ctx context.Context, fn func(r runner) error) error {
	tx, err := d.db.Pool().BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return pgErr("begin read", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // read-only; nothing to undo
	return fn(pgRunner{tx})
}

func (pgDialect) wrap(op string, err error) error { return pgErr(op, err) }

func (pgDialect) timeArg(t time.Time) any { return pgTime(t) }

func (pgDialect) kept(t time.Time) time.Time { return pgTime(t) }

// pgQuerier is what a pgx.Tx and a *pgxpool.Pool have in common.
type pgQuerier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// pgRunner is runner on a pgx transaction or pool.
type pgRunner struct{ q pgQuerier }

func (r pgRunner) exec(ctx context.Context, query string, args ...any) (int64, error) {
	tag, err := r.q.Exec(ctx, query, args...)
	return tag.RowsAffected(), err
}

func (r pgRunner) queryRow(ctx context.Context, query string, args ...any) row {
	return r.q.QueryRow(ctx, query, args...)
}

func (r pgRunner) query(ctx context.Context, query string, args ...any) (rows, error) {
	return r.q.Query(ctx, query, args...)
}

// pgTime is the time PostgreSQL keeps of t: timestamptz has microseconds.
// Answers are built from it, so a payment reads back exactly as it was
// answered.
func pgTime(t time.Time) time.Time { return t.UTC().Truncate(time.Microsecond) }

// pgErr wraps an error from pgx. Failures of the connection or the server
// (as opposed to an error in the statement) also match ErrTransient: the
// statement's transaction cannot have committed, so the request may be
// retried.
func pgErr(op string, err error) error {
	if isTransientPG(err) {
		return fmt.Errorf("%s: %w", op, errors.Join(err, ErrTransient))
	}
	return fmt.Errorf("%s: %w", op, err)
}

func isTransientPG(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch {
		case strings.HasPrefix(pe.Code, "08"): // connection exception
			return true
		case pe.Code == "40001", pe.Code == "40P01": // serialization failure, deadlock
			return true
		case strings.HasPrefix(pe.Code, "57P"): // shutdown, crash, cannot connect now
			return true
		case pe.Code == "53300": // too many connections
			return true
		}
		return false
	}
	if errors.Is(err, pgx.ErrNoRows) || errors.Is(err, pgx.ErrTooManyRows) {
		return false
	}
	// Not an answer from the server: the connection failed, was closed
	// under the statement, or timed out.
	var ce *pgconn.ConnectError
	var ne net.Error
	return errors.As(err, &ce) || errors.As(err, &ne) || pgconn.SafeToRetry(err) || pgconn.Timeout(err) ||
		errors.Is(err, pgconn.ErrConnClosed) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
}

// pgPaySQL debits the account and records the payment in one statement: it
// returns how many accounts it debited (0 when the account is missing, in
// another currency or short of funds; nothing is written then) and how many
// payments it inserted (0 when the payment's origin already made one: the
// unique constraint decides, after waiting for any transaction that is
// inserting it). The debit's row lock orders concurrent payments of one
// account, and its balance condition keeps the balance from going below
// zero whatever the interleaving.
const pgPaySQL = `WITH d AS (
	UPDATE accounts SET balance = balance - $4
	WHERE id = $3 AND tenant = $2 AND currency = $5 AND balance >= $4
	  AND NOT EXISTS (SELECT 1 FROM payments q WHERE q.tenant = $2 AND q.idempotency_key IN ($9, $14)
		AND q.key_claimed_at > $11 AND q.key_claimed_at < $12 AND (q.key_claimed_at <> $10 OR q.idempotency_key <> $9))
	RETURNING id),
i AS (
	INSERT INTO payments (id, tenant, account_id, amount, currency, description, status, created_at, idempotency_key, key_claimed_at, charge_id)
	SELECT $1, $2, d.id, $4, $5, $6, $7, $8, $9, $10, $13 FROM d
	ON CONFLICT ON CONSTRAINT payments_idempotency DO NOTHING
	RETURNING 1)
SELECT (SELECT count(*) FROM d), (SELECT count(*) FROM i)`

// CreatePayment is PostgreSQL's own rather than sqlStorage's: where
// SQLite's runs several statements, each costing nothing but its parse,
// here each statement is a round trip, so the payment is debited and
// recorded with one (pgPaySQL), and its event added to the outbox; those
// are all a payment costs on the common path. The rare paths look further:
// a debit refused is explained (account, currency, funds) after the
// origin's payment is looked for, since a re-run must answer with its own
// payment rather than a 402 caused by its own debit; a payment the
// constraint refused (another execution of the origin paid) gives its
// debit back in the same transaction and answers with that payment.
// Refusals have written nothing, and the key's transaction still commits
// them (writeWork). No statement may fail on purpose: in PostgreSQL a
// failed statement aborts the whole transaction, the key's included.
func (s *pgStorage) CreatePayment(ctx context.Context, p Payment, o origin) (Payment, error) {
	p.CreatedAt = pgTime(p.CreatedAt)
	var w writeWork[Payment]
	err := s.db.WithTx(ctx, func(ctx context.Context, tx pgx.Tx) error { return w.done(s.pay(ctx, tx, p, o)) })
	return w.outcome(err, s.d.beginFailed)
}

// pay is CreatePayment's work, in tx.
func (s *pgStorage) pay(ctx context.Context, tx pgx.Tx, p Payment, o origin) (Payment, error, error) {
	key, claimedAt := o.args(s.d)
	since, until := o.window(s.d)
	if since != nil {
		// Another claim of the same logical request (the key store lost
		// one) may be paying at this moment. The account's row lock
		// orders the two; taken in a statement of its own, it makes
		// sure that the payment's statement, whose snapshot is taken
		// after it, sees the other's payment if that committed first.
		// Inside the statement, the look-back is a subquery, which
		// PostgreSQL re-checks after a wait for a row lock only as
		// far as its EvalPlanQual rules go. It costs a round trip,
		// only when the keys live apart.
		if _, err := tx.Exec(ctx, `SELECT 1 FROM accounts WHERE id = $1 AND tenant = $2 FOR UPDATE`, p.AccountID, p.Tenant); err != nil {
			return Payment{}, nil, pgErr("lock the account", err)
		}
	}
	description, err := s.text.seal(colDescription, p.Tenant, p.ID, p.Description)
	if err != nil {
		return Payment{}, nil, err
	}
	var debited, inserted int
	err = tx.QueryRow(ctx, pgPaySQL,
		p.ID, p.Tenant, p.AccountID, p.Amount, p.Currency, description, p.Status, p.CreatedAt, key, claimedAt, since, until,
		optional(p.ChargeID), o.lookupAlt(),
	).Scan(&debited, &inserted)
	if err != nil {
		return Payment{}, nil, pgErr("pay", err)
	}
	switch {
	case debited == 0:
		return s.refusePayment(ctx, tx, p, o)
	case inserted == 0:
		// Another execution of the same origin committed its payment
		// first: this debit is given back, and that payment answers.
		if _, err := tx.Exec(ctx, `UPDATE accounts SET balance = balance + $1 WHERE id = $2 AND tenant = $3`,
			p.Amount, p.AccountID, p.Tenant); err != nil {
			return Payment{}, nil, pgErr("give the debit back", err)
		}
		existing, found, err := s.paymentOf(ctx, pgRunner{tx}, p.Tenant, o)
		if err != nil {
			return Payment{}, nil, err
		}
		if !found {
			return Payment{}, nil, errors.New("insert payment: conflict on the idempotency origin, but no payment has it")
		}
		out, refusal := existingPayment(existing, p)
		return out, refusal, nil
	}
	if err := s.announce(ctx, func() (idem.Message, error) { return paymentEvent(p) }); err != nil {
		return Payment{}, nil, err
	}
	return p, nil, injectBeforeCommit(ctx)
}

// refusePayment says why p's debit was refused, unless p's origin paid
// already, whose payment it then returns.
func (s *pgStorage) refusePayment(ctx context.Context, tx pgx.Tx, p Payment, o origin) (out Payment, refusal, err error) {
	var balance int64
	var currency string
	err = tx.QueryRow(ctx, `SELECT balance, currency FROM accounts WHERE id = $1 AND tenant = $2`,
		p.AccountID, p.Tenant).Scan(&balance, &currency)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Payment{}, ErrAccountNotFound, nil
	case err != nil:
		return Payment{}, nil, pgErr("read account", err)
	}
	existing, found, err := s.paymentOf(ctx, pgRunner{tx}, p.Tenant, o)
	switch {
	case err != nil:
		return Payment{}, nil, err
	case found:
		out, refusal = existingPayment(existing, p)
		return out, refusal, nil
	}
	if refusal = paymentRefusal(p, balance, currency); refusal != nil {
		return Payment{}, refusal, nil
	}
	// The balance was enough by the time it was read: another payment's
	// refund, say. The client retries.
	return Payment{}, nil, fmt.Errorf("debit account: refused, then enough: %w", ErrTransient)
}

// Probe is PostgreSQL's own: it writes through the pool, outside any
// transaction, with the server's clock (clock_timestamp()).
func (s *pgStorage) Probe(ctx context.Context) error {
	_, err := s.db.Pool().Exec(ctx, `INSERT INTO health_probe (id, written_at) VALUES (1, clock_timestamp())
		ON CONFLICT (id) DO UPDATE SET written_at = excluded.written_at`)
	if err != nil {
		return pgErr("probe", err)
	}
	return nil
}

// pgMessaging opens the message stores on db.
func pgMessaging(ctx context.Context, db *idempg.DB, c *Config) (messaging, error) {
	ob, err := idempg.NewOutbox(ctx, db, &idempg.OutboxConfig{Clock: c.Clock})
	if err != nil {
		return messaging{}, fmt.Errorf("payments: outbox: %w", err)
	}
	inbox, err := idempg.NewInbox(ctx, db)
	if err != nil {
		return messaging{}, fmt.Errorf("payments: inbox: %w", err)
	}
	letters, err := idempg.NewDeadLetters(ctx, db, &idempg.DeadLettersConfig{Clock: c.Clock})
	if err != nil {
		return messaging{}, fmt.Errorf("payments: dead letters: %w", err)
	}
	ledger, err := idempg.NewLedger(ctx, db)
	if err != nil {
		return messaging{}, fmt.Errorf("payments: ledger: %w", err)
	}
	return messaging{
		outbox: ob, inbox: inbox, letters: letters, ledger: ledger,
		inTx: func(ctx context.Context, fn func(ctx context.Context) error) error {
			return db.WithTx(ctx, func(ctx context.Context, _ pgx.Tx) error { return fn(ctx) })
		},
		newEmbedded: func(ctx context.Context) (embeddedTransport, error) {
			return idempg.NewTransport(ctx, db, &idempg.TransportConfig{Poll: c.TransportPoll})
		},
	}, nil
}

// settle runs settleIn with PostgreSQL's steps: one statement that reads
// the events' payments and marks those not settled yet as settled, and one
// upsert of every tenant's settlement the batch touches, in the
// settlements' key order.
//
// The marking locks the payments in id order, so that two batches holding
// events of the same payments (a second event, on another replica) never
// wait for each other in a cycle; under READ COMMITTED (idempg's default)
// the one that waits re-reads the row once the other commits, finds it
// settled, and leaves it; at a stricter level it fails with a
// serialization error instead, which is transient, and its retry finds the
// payment settled.
func (s *pgStorage) settle(ctx context.Context, evs []PaymentEvent) ([]int, error) {
	var already []int
	err := s.db.WithTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		var err error
		already, err = settleIn(ctx, s, tx, evs)
		return err
	})
	if err != nil {
		return nil, err
	}
	return already, nil
}

// markSettled marks in id order. The statement's outer SELECT sees the
// rows as they were before the UPDATE, which tells a settled one from an
// unknown one.
func (s *pgStorage) markSettled(ctx context.Context, tx pgx.Tx, table string, ids []string) (map[string]settledPayment, error) {
	found := make(map[string]settledPayment, len(ids))
	if len(ids) == 0 {
		return found, nil
	}
	rows, err := tx.Query(ctx, `WITH unsettled AS (
			SELECT id FROM `+table+` WHERE id = ANY($1::text[]) AND NOT settled ORDER BY id FOR UPDATE
		), marked AS (
			UPDATE `+table+` SET settled = true FROM unsettled WHERE `+table+`.id = unsettled.id RETURNING `+table+`.id
		)
		SELECT p.id, p.tenant, p.amount, p.currency, marked.id IS NOT NULL
		FROM `+table+` p LEFT JOIN marked ON marked.id = p.id
		WHERE p.id = ANY($1::text[])`, ids)
	if err != nil {
		return nil, pgErr("mark "+table+" settled", err)
	}
	var id string
	var p settledPayment
	if _, err := pgx.ForEachRow(rows, []any{&id, &p.tenant, &p.amount, &p.currency, &p.marked}, func() error {
		found[id] = p
		return nil
	}); err != nil {
		return nil, pgErr("mark "+table+" settled", err)
	}
	return found, nil
}

// addSettlements adds every total in one statement, unnesting one array
// per column, in the order given.
func (s *pgStorage) addSettlements(ctx context.Context, tx pgx.Tx, totals []settlementTotal) error {
	if len(totals) == 0 {
		return nil
	}
	tenants, currencies := make([]string, len(totals)), make([]string, len(totals))
	sums, counts, refunds := make([]int64, len(totals)), make([]int64, len(totals)), make([]int64, len(totals))
	for i, t := range totals {
		tenants[i], currencies[i], sums[i], counts[i], refunds[i] = t.tenant, t.currency, t.total, t.events, t.refunds
	}
	_, err := tx.Exec(ctx, `INSERT INTO settlements (tenant, currency, total, events, refunds)
		SELECT t, c, s, n, r FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[], $5::bigint[]) WITH ORDINALITY AS u(t, c, s, n, r, o) ORDER BY o
		ON CONFLICT (tenant, currency) DO UPDATE SET total = settlements.total + excluded.total, events = settlements.events + excluded.events,
			refunds = settlements.refunds + excluded.refunds`,
		tenants, currencies, sums, counts, refunds)
	if err != nil {
		return pgErr("settle", err)
	}
	return nil
}
