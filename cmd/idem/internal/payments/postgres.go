package payments

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
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

// pgStorage is storage on an idempg database: writes go through DB.WithTx
// (joining the idempotency key's transaction when there is one), reads
// through the pool.
//
// Every write locks the account's row first (SELECT … FOR UPDATE), so
// writes to one account are serialised whatever the isolation level, and
// the checks made under the lock still hold when the row is written.
type pgStorage struct {
	db *idempg.DB
	// outbox, when set, receives each payment's event in the payment's
	// transaction.
	outbox idem.Outbox
}

func (s *pgStorage) setOutbox(ob idem.Outbox) { s.outbox = ob }

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

// write runs fn in WithTx. A failure to begin (fn never ran) wrote
// nothing and is transient; a failure after fn succeeded is the commit's,
// and is marked with errOutcomeUnknown: after a failed commit nobody knows
// whether it happened.
func (s *pgStorage) write(ctx context.Context, fn func(ctx context.Context, tx pgx.Tx) error) error {
	var ran bool
	var fnErr error
	err := s.db.WithTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		ran = true
		fnErr = fn(ctx, tx)
		return fnErr
	})
	switch {
	case err == nil || fnErr != nil:
		return err
	case !ran:
		return pgErr("begin", err)
	default:
		return fmt.Errorf("%w: %w", errOutcomeUnknown, err)
	}
}

// pgArgs are o's column values: NULLs for none.
// pgWindow is o.since and o.until as parameters: NULLs (matching nothing)
// when unset.
func (o origin) pgWindow() (since, until any) {
	if o.none() || o.since.IsZero() {
		return nil, nil
	}
	return pgTime(o.since), pgTime(o.until)
}

func (o origin) pgArgs() (key, claimedAt any) {
	if o.none() {
		return nil, nil
	}
	return o.key, pgTime(o.claimedAt)
}

func (s *pgStorage) CreateAccount(ctx context.Context, a Account) error {
	return s.write(ctx, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx,
			`INSERT INTO accounts (id, tenant, balance, currency, created_at) VALUES ($1, $2, $3, $4, $5)`,
			a.ID, a.Tenant, a.Balance, a.Currency, pgTime(a.CreatedAt))
		if err != nil {
			return pgErr("insert account", err)
		}
		return injectBeforeCommit(ctx)
	})
}

func (s *pgStorage) Account(ctx context.Context, tenant, id string) (Account, error) {
	a := Account{ID: id, Tenant: tenant}
	err := s.db.Pool().QueryRow(ctx,
		`SELECT balance, currency, created_at FROM accounts WHERE id = $1 AND tenant = $2`,
		id, tenant).Scan(&a.Balance, &a.Currency, &a.CreatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return Account{}, ErrAccountNotFound
	}
	if err != nil {
		return Account{}, pgErr("read account", err)
	}
	a.CreatedAt = a.CreatedAt.UTC()
	return a, nil
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
	  AND NOT EXISTS (SELECT 1 FROM payments q WHERE q.tenant = $2 AND q.idempotency_key = $9
		AND q.key_claimed_at > $11 AND q.key_claimed_at < $12 AND q.key_claimed_at <> $10)
	RETURNING id),
i AS (
	INSERT INTO payments (id, tenant, account_id, amount, currency, description, status, created_at, idempotency_key, key_claimed_at)
	SELECT $1, $2, d.id, $4, $5, $6, $7, $8, $9, $10 FROM d
	ON CONFLICT ON CONSTRAINT payments_idempotency DO NOTHING
	RETURNING 1)
SELECT (SELECT count(*) FROM d), (SELECT count(*) FROM i)`

// CreatePayment debits and records the payment with one statement
// (pgPaySQL), then adds its event to the outbox; those are all a payment
// costs on the common path. The rare paths look further: a debit refused
// is explained (account, currency, funds) after the origin's payment is
// looked for, since a re-run must answer with its own payment rather than
// a 402 caused by its own debit; a payment the constraint refused (another
// execution of the origin paid) gives its debit back in the same
// transaction and answers with that payment. Refusals return nil from the
// transaction function and the refusal after it, so the key's transaction
// still commits the refusal's answer. No statement may fail on purpose: in
// PostgreSQL a failed statement aborts the whole transaction, the key's
// included.
func (s *pgStorage) CreatePayment(ctx context.Context, p Payment, o origin) (Payment, error) {
	p.CreatedAt = pgTime(p.CreatedAt)
	var refusal error
	var out Payment
	err := s.write(ctx, func(ctx context.Context, tx pgx.Tx) error {
		refusal, out = nil, Payment{}
		key, claimedAt := o.pgArgs()
		since, until := o.pgWindow()
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
				return pgErr("lock the account", err)
			}
		}
		var debited, inserted int
		err := tx.QueryRow(ctx, pgPaySQL,
			p.ID, p.Tenant, p.AccountID, p.Amount, p.Currency, p.Description, p.Status, p.CreatedAt, key, claimedAt, since, until,
		).Scan(&debited, &inserted)
		if err != nil {
			return pgErr("pay", err)
		}
		switch {
		case debited == 0:
			out, refusal, err = s.refusePayment(ctx, tx, p, o)
			return err
		case inserted == 0:
			// Another execution of the same origin committed its payment
			// first: this debit is given back, and that payment answers.
			if _, err := tx.Exec(ctx, `UPDATE accounts SET balance = balance + $1 WHERE id = $2 AND tenant = $3`,
				p.Amount, p.AccountID, p.Tenant); err != nil {
				return pgErr("give the debit back", err)
			}
			existing, found, err := pgPaymentOf(ctx, tx, p.Tenant, o)
			if err != nil {
				return err
			}
			if !found {
				return errors.New("insert payment: conflict on the idempotency origin, but no payment has it")
			}
			out, refusal = existingPayment(existing, p)
			return nil
		}
		// The event commits with the payment, or neither does.
		if s.outbox != nil {
			msg, err := paymentEvent(p)
			if err != nil {
				return err
			}
			noteEvent(ctx)
			if err := s.outbox.Add(ctx, msg); err != nil {
				return pgErr("outbox", err)
			}
		}
		out = p
		return injectBeforeCommit(ctx)
	})
	if err != nil {
		return Payment{}, err
	}
	if refusal != nil {
		return Payment{}, refusal
	}
	return out, nil
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
	existing, found, err := pgPaymentOf(ctx, tx, p.Tenant, o)
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

const pgPaymentColumns = `id, tenant, account_id, amount, currency, description, status, created_at`

func scanPGPayment(row pgx.Row) (Payment, error) {
	var p Payment
	if err := row.Scan(&p.ID, &p.Tenant, &p.AccountID, &p.Amount, &p.Currency, &p.Description, &p.Status, &p.CreatedAt); err != nil {
		return Payment{}, err
	}
	p.CreatedAt = p.CreatedAt.UTC()
	return p, nil
}

// pgPaymentOf returns the payment o made, if any.
func pgPaymentOf(ctx context.Context, tx pgx.Tx, tenant string, o origin) (Payment, bool, error) {
	if o.none() {
		return Payment{}, false, nil
	}
	key, claimedAt := o.pgArgs()
	since, until := o.pgWindow()
	// The earliest: with origin.since, the payment of the first claim of
	// the logical request, whichever committed first.
	p, err := scanPGPayment(tx.QueryRow(ctx,
		`SELECT `+pgPaymentColumns+` FROM payments WHERE tenant = $1 AND idempotency_key = $2
		 AND (key_claimed_at = $3 OR (key_claimed_at > $4 AND key_claimed_at < $5))
		 ORDER BY key_claimed_at LIMIT 1`,
		tenant, key, claimedAt, since, until))
	if errors.Is(err, pgx.ErrNoRows) {
		return Payment{}, false, nil
	}
	if err != nil {
		return Payment{}, false, pgErr("read the payment of the idempotency key", err)
	}
	return p, true, nil
}

func (s *pgStorage) Payment(ctx context.Context, tenant, id string) (Payment, error) {
	p, err := scanPGPayment(s.db.Pool().QueryRow(ctx,
		`SELECT `+pgPaymentColumns+` FROM payments WHERE id = $1 AND tenant = $2`, id, tenant))
	if errors.Is(err, pgx.ErrNoRows) {
		return Payment{}, ErrPaymentNotFound
	}
	if err != nil {
		return Payment{}, pgErr("read payment", err)
	}
	return p, nil
}

func (s *pgStorage) AccountPayments(ctx context.Context, tenant, accountID string, pg listPage) ([]Payment, bool, error) {
	return pgList(ctx, s.db, "payments", pgPaymentColumns, "payment", scanPGPayment, tenant, accountID, pg)
}

func (s *pgStorage) AccountDeposits(ctx context.Context, tenant, accountID string, pg listPage) ([]Deposit, bool, error) {
	return pgList(ctx, s.db, "deposits", depositColumns, "deposit", scanPGDeposit, tenant, accountID, pg)
}

func scanPGDeposit(row pgx.Row) (Deposit, error) {
	var d Deposit
	if err := row.Scan(&d.ID, &d.Tenant, &d.AccountID, &d.Amount, &d.Balance, &d.CreatedAt); err != nil {
		return Deposit{}, err
	}
	d.CreatedAt = d.CreatedAt.UTC()
	return d, nil
}

// pgList reads one page of the account's rows of table (payments or
// deposits), newest first by (created_at, id).
func pgList[T any](ctx context.Context, db *idempg.DB, table, columns, what string,
	scan func(pgx.Row) (T, error), tenant, accountID string, pg listPage) ([]T, bool, error) {
	// One snapshot for the account check, the cursor and the list.
	tx, err := db.Pool().BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, false, pgErr("begin read", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // read-only; nothing to undo
	var one int
	err = tx.QueryRow(ctx, `SELECT 1 FROM accounts WHERE id = $1 AND tenant = $2`, accountID, tenant).Scan(&one)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, false, ErrAccountNotFound
	}
	if err != nil {
		return nil, false, pgErr("read account", err)
	}
	query := `SELECT ` + columns + ` FROM ` + table + ` WHERE account_id = $1 AND tenant = $2`
	args := []any{accountID, tenant}
	order := ` ORDER BY created_at DESC, id DESC`
	if id, field, newer := pg.cursor(); id != "" {
		var created time.Time
		err := tx.QueryRow(ctx, `SELECT created_at FROM `+table+` WHERE id = $1 AND tenant = $2 AND account_id = $3`,
			id, tenant, accountID).Scan(&created)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, false, unknownCursor(field, what)
		}
		if err != nil {
			return nil, false, pgErr("read the cursor", err)
		}
		if newer {
			query += ` AND (created_at, id) > ($3, $4)`
			order = ` ORDER BY created_at, id`
		} else {
			query += ` AND (created_at, id) < ($3, $4)`
		}
		args = append(args, created, id)
	}
	args = append(args, pg.limit+1)
	rows, err := tx.Query(ctx, query+order+` LIMIT $`+strconv.Itoa(len(args)), args...)
	if err != nil {
		return nil, false, pgErr("list "+table, err)
	}
	defer rows.Close()
	list := []T{}
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, false, pgErr("list "+table, err)
		}
		list = append(list, v)
	}
	if err := rows.Err(); err != nil {
		return nil, false, pgErr("list "+table, err)
	}
	list, more := trimPage(list, pg)
	return list, more, nil
}

// CreateDeposit orders its steps like CreatePayment: lock, look-up, check,
// insert (the constraint decides), credit.
func (s *pgStorage) CreateDeposit(ctx context.Context, d Deposit, o origin) (Deposit, error) {
	d.CreatedAt = pgTime(d.CreatedAt)
	var refusal error
	var out Deposit
	err := s.write(ctx, func(ctx context.Context, tx pgx.Tx) error {
		refusal, out = nil, Deposit{}
		var balance int64
		err := tx.QueryRow(ctx,
			`SELECT balance FROM accounts WHERE id = $1 AND tenant = $2 FOR UPDATE`, d.AccountID, d.Tenant).Scan(&balance)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			refusal = ErrAccountNotFound
			return nil
		case err != nil:
			return pgErr("lock account", err)
		}
		if existing, found, err := pgDepositOf(ctx, tx, d.Tenant, o); err != nil {
			return err
		} else if found {
			out, refusal = existingDeposit(existing, d)
			return nil
		}
		if balance > math.MaxInt64-d.Amount {
			refusal = ErrBalanceOverflow
			return nil
		}
		d.Balance = balance + d.Amount
		key, claimedAt := o.pgArgs()
		tag, err := tx.Exec(ctx,
			`INSERT INTO deposits (id, tenant, account_id, amount, balance_after, created_at, idempotency_key, key_claimed_at)
			 VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
			 ON CONFLICT ON CONSTRAINT deposits_idempotency DO NOTHING`,
			d.ID, d.Tenant, d.AccountID, d.Amount, d.Balance, d.CreatedAt, key, claimedAt)
		if err != nil {
			return pgErr("insert deposit", err)
		}
		if tag.RowsAffected() != 1 {
			existing, found, err := pgDepositOf(ctx, tx, d.Tenant, o)
			if err != nil {
				return err
			}
			if !found {
				return errors.New("insert deposit: conflict on the idempotency origin, but no deposit has it")
			}
			out, refusal = existingDeposit(existing, d)
			return nil
		}
		var after int64
		err = tx.QueryRow(ctx,
			`UPDATE accounts SET balance = balance + $1 WHERE id = $2 AND tenant = $3 AND balance <= $4 RETURNING balance`,
			d.Amount, d.AccountID, d.Tenant, math.MaxInt64-d.Amount).Scan(&after)
		if err != nil {
			return pgErr("credit account", err)
		}
		if after != d.Balance {
			return fmt.Errorf("credit account: the balance changed under the row lock (%d, expected %d)", after, d.Balance)
		}
		out = d
		return injectBeforeCommit(ctx)
	})
	if err != nil {
		return Deposit{}, err
	}
	if refusal != nil {
		return Deposit{}, refusal
	}
	return out, nil
}

// pgDepositOf returns the deposit o made, if any.
func pgDepositOf(ctx context.Context, tx pgx.Tx, tenant string, o origin) (Deposit, bool, error) {
	if o.none() {
		return Deposit{}, false, nil
	}
	key, claimedAt := o.pgArgs()
	since, until := o.pgWindow()
	d := Deposit{Tenant: tenant}
	err := tx.QueryRow(ctx,
		`SELECT id, account_id, amount, balance_after, created_at FROM deposits
		 WHERE tenant = $1 AND idempotency_key = $2
		   AND (key_claimed_at = $3 OR (key_claimed_at > $4 AND key_claimed_at < $5))
		 ORDER BY key_claimed_at LIMIT 1`,
		tenant, key, claimedAt, since, until).Scan(&d.ID, &d.AccountID, &d.Amount, &d.Balance, &d.CreatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return Deposit{}, false, nil
	}
	if err != nil {
		return Deposit{}, false, pgErr("read the deposit of the idempotency key", err)
	}
	d.CreatedAt = d.CreatedAt.UTC()
	return d, true, nil
}

func (s *pgStorage) Counts(ctx context.Context) (accounts, payments, deposits int64, err error) {
	err = s.db.Pool().QueryRow(ctx,
		`SELECT (SELECT count(*) FROM accounts), (SELECT count(*) FROM payments), (SELECT count(*) FROM deposits)`).
		Scan(&accounts, &payments, &deposits)
	if err != nil {
		return 0, 0, 0, pgErr("count rows", err)
	}
	return accounts, payments, deposits, nil
}

func (s *pgStorage) Probe(ctx context.Context) error {
	_, err := s.db.Pool().Exec(ctx, `INSERT INTO health_probe (id, written_at) VALUES (1, clock_timestamp())
		ON CONFLICT (id) DO UPDATE SET written_at = excluded.written_at`)
	if err != nil {
		return pgErr("probe", err)
	}
	return nil
}

func (s *pgStorage) Ping(ctx context.Context) error {
	var one int
	if err := s.db.Pool().QueryRow(ctx, `SELECT 1`).Scan(&one); err != nil {
		return pgErr("ping", err)
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

// settle implements storage on PostgreSQL: one statement that reads the
// events' payments and marks those not settled yet as settled, and one
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
// The statement's outer SELECT sees every payment of the batch as it was
// before the UPDATE, which tells a settled payment from an unknown one.
func (s *pgStorage) settle(ctx context.Context, evs []PaymentEvent) ([]int, error) {
	var already []int
	err := s.db.WithTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		payIDs, refundIDs := splitEvents(evs)
		payments, err := pgMarkSettled(ctx, tx, "payments", payIDs)
		if err != nil {
			return err
		}
		refunds, err := pgMarkSettled(ctx, tx, "refunds", refundIDs)
		if err != nil {
			return err
		}
		totals, skipped, err := settlementTotals(evs, func(ev PaymentEvent) (settledPayment, bool) {
			found := payments
			if ev.isRefund() {
				found = refunds
			}
			p, ok := found[ev.subject()]
			return p, ok
		})
		if err != nil {
			return err
		}
		if len(totals) > 0 {
			tenants, currencies := make([]string, len(totals)), make([]string, len(totals))
			sums, counts, refunds := make([]int64, len(totals)), make([]int64, len(totals)), make([]int64, len(totals))
			for i, t := range totals {
				tenants[i], currencies[i], sums[i], counts[i], refunds[i] = t.tenant, t.currency, t.total, t.events, t.refunds
			}
			_, err = tx.Exec(ctx, `INSERT INTO settlements (tenant, currency, total, events, refunds)
				SELECT t, c, s, n, r FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[], $5::bigint[]) WITH ORDINALITY AS u(t, c, s, n, r, o) ORDER BY o
				ON CONFLICT (tenant, currency) DO UPDATE SET total = settlements.total + excluded.total, events = settlements.events + excluded.events,
					refunds = settlements.refunds + excluded.refunds`,
				tenants, currencies, sums, counts, refunds)
			if err != nil {
				return pgErr("settle", err)
			}
		}
		already = skipped
		return nil
	})
	if err != nil {
		return nil, err
	}
	return already, nil
}

// pgMarkSettled marks the rows of table (payments or refunds) with ids
// settled, where they were not, in id order, and returns every one of them
// found, with whether this call marked it. The statement's outer SELECT
// sees the rows as they were before the UPDATE, which tells a settled one
// from an unknown one.
func pgMarkSettled(ctx context.Context, tx pgx.Tx, table string, ids []string) (map[string]settledPayment, error) {
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

func (s *pgStorage) settlement(ctx context.Context, tenant string) (Settlement, error) {
	var st Settlement
	err := s.db.Pool().QueryRow(ctx,
		`SELECT currency FROM accounts WHERE tenant = $1 ORDER BY created_at, id LIMIT 1`, tenant).Scan(&st.Currency)
	if errors.Is(err, pgx.ErrNoRows) {
		return Settlement{}, nil
	}
	if err != nil {
		return Settlement{}, pgErr("read accounts", err)
	}
	err = s.db.Pool().QueryRow(ctx,
		`SELECT total, events, refunds FROM settlements WHERE tenant = $1 AND currency = $2`, tenant, st.Currency).Scan(&st.Total, &st.Events, &st.Refunds)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return Settlement{}, pgErr("read settlement", err)
	}
	return st, nil
}

// CreateRefund locks the payment's row first (SELECT … FOR UPDATE), so the
// refunds of one payment are serialised and the remaining amount read
// under the lock still holds when the refunded total is raised; the raise
// repeats the check in its WHERE all the same. Then the account's row, in
// that order (payment, account), which no other write takes the other way
// round. Refusals return nil from the transaction function, as
// CreatePayment's do; no statement fails on purpose.
func (s *pgStorage) CreateRefund(ctx context.Context, rf Refund, o origin) (Refund, error) {
	rf.CreatedAt = pgTime(rf.CreatedAt)
	var refusal error
	var out Refund
	requested := rf.Amount
	err := s.write(ctx, func(ctx context.Context, tx pgx.Tx) error {
		refusal, out, rf.Amount = nil, Refund{}, requested
		var paid, refunded, balance int64
		err := tx.QueryRow(ctx,
			`SELECT account_id, amount, refunded, currency FROM payments WHERE id = $1 AND tenant = $2 FOR UPDATE`,
			rf.PaymentID, rf.Tenant).Scan(&rf.AccountID, &paid, &refunded, &rf.Currency)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			refusal = ErrPaymentNotFound
			return nil
		case err != nil:
			return pgErr("lock payment", err)
		}
		if err := tx.QueryRow(ctx, `SELECT balance FROM accounts WHERE id = $1 AND tenant = $2 FOR UPDATE`,
			rf.AccountID, rf.Tenant).Scan(&balance); err != nil {
			return pgErr("lock account", err)
		}
		if existing, found, err := pgRefundOf(ctx, tx, rf.Tenant, o); err != nil {
			return err
		} else if found {
			out, refusal = existingRefund(existing, rf.PaymentID, requested)
			return nil
		}
		if refusal = refundRefusal(&rf, paid, refunded, balance); refusal != nil {
			return nil
		}
		key, claimedAt := o.pgArgs()
		tag, err := tx.Exec(ctx,
			`INSERT INTO refunds (id, tenant, payment_id, account_id, amount, currency, reason, status, created_at, idempotency_key, key_claimed_at)
			 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
			 ON CONFLICT ON CONSTRAINT refunds_idempotency DO NOTHING`,
			rf.ID, rf.Tenant, rf.PaymentID, rf.AccountID, rf.Amount, rf.Currency, rf.Reason, rf.Status, rf.CreatedAt, key, claimedAt)
		if err != nil {
			return pgErr("insert refund", err)
		}
		if tag.RowsAffected() != 1 {
			existing, found, err := pgRefundOf(ctx, tx, rf.Tenant, o)
			if err != nil {
				return err
			}
			if !found {
				return errors.New("insert refund: conflict on the idempotency origin, but no refund has it")
			}
			out, refusal = existingRefund(existing, rf.PaymentID, requested)
			return nil
		}
		tag, err = tx.Exec(ctx,
			`UPDATE payments SET refunded = refunded + $1 WHERE id = $2 AND tenant = $3 AND refunded + $1 <= amount`,
			rf.Amount, rf.PaymentID, rf.Tenant)
		if err != nil {
			return pgErr("raise the refunded total", err)
		}
		if tag.RowsAffected() != 1 {
			return errors.New("raise the refunded total: the payment changed under its row lock")
		}
		if _, err := tx.Exec(ctx, `UPDATE accounts SET balance = balance + $1 WHERE id = $2 AND tenant = $3`,
			rf.Amount, rf.AccountID, rf.Tenant); err != nil {
			return pgErr("credit account", err)
		}
		if s.outbox != nil {
			msg, err := refundEvent(rf)
			if err != nil {
				return err
			}
			noteEvent(ctx)
			if err := s.outbox.Add(ctx, msg); err != nil {
				return pgErr("outbox", err)
			}
		}
		out = rf
		return injectBeforeCommit(ctx)
	})
	if err != nil {
		return Refund{}, err
	}
	if refusal != nil {
		return Refund{}, refusal
	}
	return out, nil
}

func scanPGRefund(row pgx.Row) (Refund, error) {
	var rf Refund
	if err := row.Scan(&rf.ID, &rf.Tenant, &rf.PaymentID, &rf.AccountID, &rf.Amount, &rf.Currency, &rf.Reason, &rf.Status, &rf.CreatedAt); err != nil {
		return Refund{}, err
	}
	rf.CreatedAt = rf.CreatedAt.UTC()
	return rf, nil
}

// pgRefundOf returns the refund o made, if any.
func pgRefundOf(ctx context.Context, tx pgx.Tx, tenant string, o origin) (Refund, bool, error) {
	if o.none() {
		return Refund{}, false, nil
	}
	key, claimedAt := o.pgArgs()
	since, until := o.pgWindow()
	rf, err := scanPGRefund(tx.QueryRow(ctx,
		`SELECT `+refundColumns+` FROM refunds WHERE tenant = $1 AND idempotency_key = $2
		 AND (key_claimed_at = $3 OR (key_claimed_at > $4 AND key_claimed_at < $5))
		 ORDER BY key_claimed_at LIMIT 1`,
		tenant, key, claimedAt, since, until))
	if errors.Is(err, pgx.ErrNoRows) {
		return Refund{}, false, nil
	}
	if err != nil {
		return Refund{}, false, pgErr("read the refund of the idempotency key", err)
	}
	return rf, true, nil
}

func (s *pgStorage) Refund(ctx context.Context, tenant, id string) (Refund, error) {
	rf, err := scanPGRefund(s.db.Pool().QueryRow(ctx,
		`SELECT `+refundColumns+` FROM refunds WHERE id = $1 AND tenant = $2`, id, tenant))
	if errors.Is(err, pgx.ErrNoRows) {
		return Refund{}, ErrRefundNotFound
	}
	if err != nil {
		return Refund{}, pgErr("read refund", err)
	}
	return rf, nil
}
