package payments

import (
	"context"
	"database/sql"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
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

// sqliteStorage is storage on an idemsqlite database: writes go through
// DB.WithTx (joining the idempotency key's transaction when there is one),
// reads through the read-only pool.
type sqliteStorage struct {
	db *idemsqlite.DB
	// outbox, when set, receives each payment's event in the payment's
	// transaction.
	outbox idem.Outbox
	// prepared holds the hot paths' statements (sqliteHot), prepared on
	// the writer once: every payment runs them while it holds the single
	// writer, where parsing their text again would delay every write.
	prepared map[string]*sql.Stmt
}

// The statements of a payment and of a settlement, prepared once.
const (
	sqlPaymentAccount = `SELECT balance, currency FROM accounts WHERE id = ? AND tenant = ?`
	sqlInsertPayment  = `INSERT INTO payments (id, tenant, account_id, amount, currency, description, status, created_at, idempotency_key, key_claimed_at)
			 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
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

// newSQLiteStorage returns the storage on db, migrated already, with its
// hot statements prepared.
func newSQLiteStorage(ctx context.Context, db *idemsqlite.DB) (*sqliteStorage, error) {
	s := &sqliteStorage{db: db, prepared: make(map[string]*sql.Stmt, len(sqliteHot))}
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

func (s *sqliteStorage) setOutbox(ob idem.Outbox) { s.outbox = ob }

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

// write runs fn in WithTx. A failure to begin (fn never ran) wrote
// nothing and is transient; a failure after fn succeeded is the commit's,
// and is marked with errOutcomeUnknown: after a failed commit nobody knows
// whether it happened.
func (s *sqliteStorage) write(ctx context.Context, fn func(ctx context.Context, tx *sql.Tx) error) error {
	var ran bool
	var fnErr error
	err := s.db.WithTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		ran = true
		fnErr = fn(ctx, tx)
		return fnErr
	})
	switch {
	case err == nil || fnErr != nil:
		return err
	case !ran:
		return fmt.Errorf("begin: %w", errors.Join(err, ErrTransient))
	default:
		return fmt.Errorf("%w: %w", errOutcomeUnknown, err)
	}
}

func formatTime(t time.Time) string { return t.UTC().Format(timeLayout) }

func parseTime(s string) (time.Time, error) {
	t, err := time.Parse(timeLayout, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("stored time %q: %w", s, err)
	}
	return t, nil
}

func (s *sqliteStorage) CreateAccount(ctx context.Context, a Account) error {
	return s.write(ctx, func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx,
			`INSERT INTO accounts (id, tenant, balance, currency, created_at) VALUES (?, ?, ?, ?, ?)`,
			a.ID, a.Tenant, a.Balance, a.Currency, formatTime(a.CreatedAt))
		if err != nil {
			return fmt.Errorf("insert account: %w", err)
		}
		return injectBeforeCommit(ctx)
	})
}

func (s *sqliteStorage) Account(ctx context.Context, tenant, id string) (Account, error) {
	a := Account{ID: id, Tenant: tenant}
	var created string
	err := s.db.Reader().QueryRowContext(ctx,
		`SELECT balance, currency, created_at FROM accounts WHERE id = ? AND tenant = ?`,
		id, tenant).Scan(&a.Balance, &a.Currency, &created)
	if errors.Is(err, sql.ErrNoRows) {
		return Account{}, ErrAccountNotFound
	}
	if err != nil {
		return Account{}, fmt.Errorf("read account: %w", err)
	}
	if a.CreatedAt, err = parseTime(created); err != nil {
		return Account{}, err
	}
	return a, nil
}

// CreatePayment refuses (not found, currency, funds) by returning nil from
// the transaction function and the refusal after it: a refusal has written
// nothing, and under the idempotency middleware the enclosing transaction
// must still commit so that the 402 or 404 answer is stored with the key.
//
// The order matters. The payment row is inserted before the debit, and
// its unique constraint on the origin is what decides: a row that is
// already there means an earlier execution of the same origin paid, and
// its payment is the answer, with nothing debited. That payment is looked
// for only when the constraint says so, or when the checks would refuse
// (a re-run must answer with its own payment rather than with a 402 caused
// by its own debit): the common path pays for no look-up.
func (s *sqliteStorage) CreatePayment(ctx context.Context, p Payment, o origin) (Payment, error) {
	var refusal error
	var out Payment
	err := s.write(ctx, func(ctx context.Context, tx *sql.Tx) error {
		refusal, out = nil, Payment{}
		var balance int64
		var currency string
		err := s.stmt(ctx, tx, sqlPaymentAccount).QueryRowContext(ctx, p.AccountID, p.Tenant).Scan(&balance, &currency)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			refusal = ErrAccountNotFound
			return nil
		case err != nil:
			return fmt.Errorf("read account: %w", err)
		}
		if check := paymentRefusal(p, balance, currency); check != nil {
			existing, found, err := s.paymentOf(ctx, tx, p.Tenant, o)
			switch {
			case err != nil:
				return err
			case found:
				out, refusal = existingPayment(existing, p)
			default:
				refusal = check
			}
			return nil
		}
		if !o.since.IsZero() {
			// The keys live apart: a claim they lost may have paid.
			existing, found, err := s.paymentOf(ctx, tx, p.Tenant, o)
			if err != nil {
				return err
			}
			if found {
				out, refusal = existingPayment(existing, p)
				return nil
			}
		}
		key, claimedAt := o.sqliteArgs()
		res, err := s.stmt(ctx, tx, sqlInsertPayment).ExecContext(ctx,
			p.ID, p.Tenant, p.AccountID, p.Amount, p.Currency, p.Description, p.Status, formatTime(p.CreatedAt), key, claimedAt)
		if err != nil {
			return fmt.Errorf("insert payment: %w", err)
		}
		if n, err := res.RowsAffected(); err != nil {
			return fmt.Errorf("insert payment: %w", err)
		} else if n != 1 {
			existing, found, err := s.paymentOf(ctx, tx, p.Tenant, o)
			if err != nil {
				return err
			}
			if !found {
				return errors.New("insert payment: conflict on the idempotency origin, but no payment has it")
			}
			out, refusal = existingPayment(existing, p)
			return nil
		}
		// The balance condition repeats the check above inside the write
		// itself, so no interleaving of requests can take it below zero.
		res, err = s.stmt(ctx, tx, sqlDebit).ExecContext(ctx, p.Amount, p.AccountID, p.Tenant, p.Amount)
		if err != nil {
			return fmt.Errorf("debit account: %w", err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return fmt.Errorf("debit account: %w", err)
		}
		if n != 1 {
			// Only possible if something wrote the balance between the check
			// and here, which the single writer rules out; failing undoes
			// the payment row with the rest.
			return errors.New("debit account: the balance changed during the transaction")
		}
		// The event commits with the payment, or neither does; a payment
		// re-found through its origin (above) wrote none, so it announces
		// nothing twice.
		if s.outbox != nil {
			msg, err := paymentEvent(p)
			if err != nil {
				return err
			}
			noteEvent(ctx)
			if err := s.outbox.Add(ctx, msg); err != nil {
				return fmt.Errorf("outbox: %w", err)
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

// paymentRefusal is why p cannot be paid from an account holding balance
// in currency, or nil.
func paymentRefusal(p Payment, balance int64, currency string) error {
	switch {
	case currency != p.Currency:
		return &FieldError{Field: "currency",
			Reason: fmt.Sprintf("is %s but the account holds %s", p.Currency, currency),
			Err:    ErrCurrencyMismatch}
	case balance < p.Amount:
		return ErrInsufficientFunds
	}
	return nil
}

// existingPayment is the answer to a payment whose origin already made one:
// that payment, or ErrKeyConflict when it is not the same payment.
func existingPayment(existing, p Payment) (Payment, error) {
	if !samePayment(existing, p) {
		return Payment{}, ErrKeyConflict
	}
	return existing, nil
}

func existingDeposit(existing, d Deposit) (Deposit, error) {
	if !sameDeposit(existing, d) {
		return Deposit{}, ErrKeyConflict
	}
	return existing, nil
}

// sqliteArgs are o's column values: NULLs for none.
func (o origin) sqliteArgs() (key, claimedAt any) {
	if o.none() {
		return nil, nil
	}
	return o.key, formatTime(o.claimedAt)
}

// sqliteWindow is o.since and o.until as parameters: NULLs (matching
// nothing) when unset.
func (o origin) sqliteWindow() (since, until any) {
	if o.none() || o.since.IsZero() {
		return nil, nil
	}
	return formatTime(o.since), formatTime(o.until)
}

// paymentOf returns the payment o made, if any.
func (s *sqliteStorage) paymentOf(ctx context.Context, tx *sql.Tx, tenant string, o origin) (Payment, bool, error) {
	if o.none() {
		return Payment{}, false, nil
	}
	key, claimedAt := o.sqliteArgs()
	since, until := o.sqliteWindow()
	// The earliest: with origin.since, the payment of the first claim of
	// the logical request, whichever committed first. The single writer
	// orders two executions of it, so the second sees the first's payment.
	p, err := scanPayment(tx.QueryRowContext(ctx,
		`SELECT `+paymentColumns+` FROM payments WHERE tenant = ? AND idempotency_key = ?
		 AND (key_claimed_at = ? OR (key_claimed_at > ? AND key_claimed_at < ?))
		 ORDER BY key_claimed_at LIMIT 1`,
		tenant, key, claimedAt, since, until))
	if errors.Is(err, sql.ErrNoRows) {
		return Payment{}, false, nil
	}
	if err != nil {
		return Payment{}, false, fmt.Errorf("read the payment of the idempotency key: %w", err)
	}
	return p, true, nil
}

const paymentColumns = `id, tenant, account_id, amount, currency, description, status, created_at`

func scanPayment(row interface{ Scan(...any) error }) (Payment, error) {
	var p Payment
	var created string
	if err := row.Scan(&p.ID, &p.Tenant, &p.AccountID, &p.Amount, &p.Currency, &p.Description, &p.Status, &created); err != nil {
		return Payment{}, err
	}
	t, err := parseTime(created)
	if err != nil {
		return Payment{}, err
	}
	p.CreatedAt = t
	return p, nil
}

func (s *sqliteStorage) Payment(ctx context.Context, tenant, id string) (Payment, error) {
	p, err := scanPayment(s.db.Reader().QueryRowContext(ctx,
		`SELECT `+paymentColumns+` FROM payments WHERE id = ? AND tenant = ?`, id, tenant))
	if errors.Is(err, sql.ErrNoRows) {
		return Payment{}, ErrPaymentNotFound
	}
	if err != nil {
		return Payment{}, fmt.Errorf("read payment: %w", err)
	}
	return p, nil
}

func (s *sqliteStorage) AccountPayments(ctx context.Context, tenant, accountID string, pg listPage) ([]Payment, bool, error) {
	return sqliteList(ctx, s.db, "payments", paymentColumns, "payment", scanPayment, tenant, accountID, pg)
}

func (s *sqliteStorage) AccountDeposits(ctx context.Context, tenant, accountID string, pg listPage) ([]Deposit, bool, error) {
	return sqliteList(ctx, s.db, "deposits", depositColumns, "deposit", scanDeposit, tenant, accountID, pg)
}

const depositColumns = `id, tenant, account_id, amount, balance_after, created_at`

func scanDeposit(row interface{ Scan(...any) error }) (Deposit, error) {
	var d Deposit
	var created string
	if err := row.Scan(&d.ID, &d.Tenant, &d.AccountID, &d.Amount, &d.Balance, &created); err != nil {
		return Deposit{}, err
	}
	t, err := parseTime(created)
	if err != nil {
		return Deposit{}, err
	}
	d.CreatedAt = t
	return d, nil
}

// sqliteList reads one page of the account's rows of table (payments or
// deposits), newest first by (created_at, id): stored times are
// fixed-width text, so they compare in time order.
func sqliteList[T any](ctx context.Context, db *idemsqlite.DB, table, columns, what string,
	scan func(interface{ Scan(...any) error }) (T, error), tenant, accountID string, pg listPage) ([]T, bool, error) {
	// One read transaction, so the account check, the cursor and the list
	// see the same snapshot.
	tx, err := db.Reader().BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, false, fmt.Errorf("begin read: %w", err)
	}
	defer tx.Rollback() //nolint:errcheck // read-only; nothing to undo
	var one int
	err = tx.QueryRowContext(ctx, `SELECT 1 FROM accounts WHERE id = ? AND tenant = ?`, accountID, tenant).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, false, ErrAccountNotFound
	}
	if err != nil {
		return nil, false, fmt.Errorf("read account: %w", err)
	}
	query := `SELECT ` + columns + ` FROM ` + table + ` WHERE account_id = ? AND tenant = ?`
	args := []any{accountID, tenant}
	order := ` ORDER BY created_at DESC, id DESC`
	if id, field, newer := pg.cursor(); id != "" {
		var created string
		err := tx.QueryRowContext(ctx, `SELECT created_at FROM `+table+` WHERE id = ? AND tenant = ? AND account_id = ?`,
			id, tenant, accountID).Scan(&created)
		if errors.Is(err, sql.ErrNoRows) {
			return nil, false, unknownCursor(field, what)
		}
		if err != nil {
			return nil, false, fmt.Errorf("read the cursor: %w", err)
		}
		if newer {
			query += ` AND (created_at, id) > (?, ?)`
			order = ` ORDER BY created_at, id`
		} else {
			query += ` AND (created_at, id) < (?, ?)`
		}
		args = append(args, created, id)
	}
	rows, err := tx.QueryContext(ctx, query+order+` LIMIT ?`, append(args, pg.limit+1)...)
	if err != nil {
		return nil, false, fmt.Errorf("list %s: %w", table, err)
	}
	defer rows.Close()
	list := []T{}
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, false, fmt.Errorf("list %s: %w", table, err)
		}
		list = append(list, v)
	}
	if err := rows.Err(); err != nil {
		return nil, false, fmt.Errorf("list %s: %w", table, err)
	}
	list, more := trimPage(list, pg)
	return list, more, nil
}

// CreateDeposit refuses like CreatePayment, and orders its steps the same
// way: the deposit of the same origin first, then the insert, then the
// credit.
func (s *sqliteStorage) CreateDeposit(ctx context.Context, d Deposit, o origin) (Deposit, error) {
	var refusal error
	var out Deposit
	err := s.write(ctx, func(ctx context.Context, tx *sql.Tx) error {
		refusal, out = nil, Deposit{}
		var balance int64
		err := tx.QueryRowContext(ctx,
			`SELECT balance FROM accounts WHERE id = ? AND tenant = ?`, d.AccountID, d.Tenant).Scan(&balance)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			refusal = ErrAccountNotFound
			return nil
		case err != nil:
			return fmt.Errorf("read account: %w", err)
		}
		if existing, found, err := s.depositOf(ctx, tx, d.Tenant, o); err != nil {
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
		key, claimedAt := o.sqliteArgs()
		res, err := tx.ExecContext(ctx,
			`INSERT INTO deposits (id, tenant, account_id, amount, balance_after, created_at, idempotency_key, key_claimed_at)
			 VALUES (?, ?, ?, ?, ?, ?, ?, ?)
			 ON CONFLICT (tenant, idempotency_key, key_claimed_at) DO NOTHING`,
			d.ID, d.Tenant, d.AccountID, d.Amount, d.Balance, formatTime(d.CreatedAt), key, claimedAt)
		if err != nil {
			return fmt.Errorf("insert deposit: %w", err)
		}
		if n, err := res.RowsAffected(); err != nil {
			return fmt.Errorf("insert deposit: %w", err)
		} else if n != 1 {
			existing, found, err := s.depositOf(ctx, tx, d.Tenant, o)
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
		err = tx.QueryRowContext(ctx,
			`UPDATE accounts SET balance = balance + ? WHERE id = ? AND tenant = ? AND balance <= ? RETURNING balance`,
			d.Amount, d.AccountID, d.Tenant, math.MaxInt64-d.Amount).Scan(&after)
		if err != nil {
			return fmt.Errorf("credit account: %w", err)
		}
		if after != d.Balance {
			return fmt.Errorf("credit account: the balance changed during the transaction (%d, expected %d)", after, d.Balance)
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

// depositOf returns the deposit o made, if any.
func (s *sqliteStorage) depositOf(ctx context.Context, tx *sql.Tx, tenant string, o origin) (Deposit, bool, error) {
	if o.none() {
		return Deposit{}, false, nil
	}
	key, claimedAt := o.sqliteArgs()
	since, until := o.sqliteWindow()
	d := Deposit{Tenant: tenant}
	var created string
	err := tx.QueryRowContext(ctx,
		`SELECT id, account_id, amount, balance_after, created_at FROM deposits
		 WHERE tenant = ? AND idempotency_key = ?
		   AND (key_claimed_at = ? OR (key_claimed_at > ? AND key_claimed_at < ?))
		 ORDER BY key_claimed_at LIMIT 1`,
		tenant, key, claimedAt, since, until).Scan(&d.ID, &d.AccountID, &d.Amount, &d.Balance, &created)
	if errors.Is(err, sql.ErrNoRows) {
		return Deposit{}, false, nil
	}
	if err != nil {
		return Deposit{}, false, fmt.Errorf("read the deposit of the idempotency key: %w", err)
	}
	if d.CreatedAt, err = parseTime(created); err != nil {
		return Deposit{}, false, err
	}
	return d, true, nil
}

// Counts reads the totals from the database rather than counting in
// memory, so the metrics show what was committed, including what another
// process (or an unsafe run) wrote.
func (s *sqliteStorage) Counts(ctx context.Context) (accounts, payments, deposits int64, err error) {
	err = s.db.Reader().QueryRowContext(ctx,
		`SELECT (SELECT COUNT(*) FROM accounts), (SELECT COUNT(*) FROM payments), (SELECT COUNT(*) FROM deposits)`).
		Scan(&accounts, &payments, &deposits)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("count rows: %w", err)
	}
	return accounts, payments, deposits, nil
}

func (s *sqliteStorage) Probe(ctx context.Context) error {
	_, err := s.db.Writer().ExecContext(ctx, `INSERT INTO health_probe (id, written_at) VALUES (1, ?)
		ON CONFLICT (id) DO UPDATE SET written_at = excluded.written_at`, time.Now().UnixNano())
	if err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	return nil
}

func (s *sqliteStorage) Ping(ctx context.Context) error {
	var one int
	if err := s.db.Reader().QueryRowContext(ctx, `SELECT 1`).Scan(&one); err != nil {
		return fmt.Errorf("ping: %w", err)
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

// settle implements storage on SQLite: one UPDATE … RETURNING that marks
// the batch's unsettled payments settled and reads them, and one upsert per
// tenant and currency the batch touches. SQLite's RETURNING gives only the
// rows it changed, so an event whose payment it did not mark (settled
// already, or unknown) costs one more read, of those payments only: the
// common batch, of new payments, pays for none.
func (s *sqliteStorage) settle(ctx context.Context, evs []PaymentEvent) ([]int, error) {
	var already []int
	err := s.db.WithTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		payIDs, refundIDs := splitEvents(evs)
		payments, err := s.markSettled(ctx, tx, "payments", payIDs)
		if err != nil {
			return err
		}
		refunds, err := s.markSettled(ctx, tx, "refunds", refundIDs)
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
		add := s.stmt(ctx, tx, sqlAddSettlement)
		for _, t := range totals {
			_, err = add.ExecContext(ctx, t.tenant, t.currency, t.total, t.events, t.refunds)
			if err != nil {
				return fmt.Errorf("settle: %w", err)
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

// markSettled marks the rows of table (payments or refunds) with ids
// settled, where they were not, and returns every one of them found, with
// whether this call marked it.
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

// settlement reads the tenant's settlement in the currency of its first
// account; zero values when it has none.
func (s *sqliteStorage) settlement(ctx context.Context, tenant string) (Settlement, error) {
	var st Settlement
	err := s.db.Reader().QueryRowContext(ctx,
		`SELECT currency FROM accounts WHERE tenant = ? ORDER BY created_at, rowid LIMIT 1`, tenant).Scan(&st.Currency)
	if errors.Is(err, sql.ErrNoRows) {
		return Settlement{}, nil
	}
	if err != nil {
		return Settlement{}, fmt.Errorf("read accounts: %w", err)
	}
	err = s.db.Reader().QueryRowContext(ctx,
		`SELECT total, events, refunds FROM settlements WHERE tenant = ? AND currency = ?`, tenant, st.Currency).Scan(&st.Total, &st.Events, &st.Refunds)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return Settlement{}, fmt.Errorf("read settlement: %w", err)
	}
	return st, nil
}

// CreateRefund orders its steps like CreateDeposit: the payment, the
// refund of the same origin, the checks, the insert (the constraint on the
// origin decides), then the conditional raise of the payment's refunded
// total and the credit. Refusals return nil from the transaction function,
// as CreatePayment's do, so the key's transaction still commits them.
func (s *sqliteStorage) CreateRefund(ctx context.Context, rf Refund, o origin) (Refund, error) {
	var refusal error
	var out Refund
	requested := rf.Amount
	err := s.write(ctx, func(ctx context.Context, tx *sql.Tx) error {
		refusal, out, rf.Amount = nil, Refund{}, requested
		var paid, refunded, balance int64
		err := tx.QueryRowContext(ctx,
			`SELECT p.account_id, p.amount, p.refunded, p.currency, a.balance FROM payments p JOIN accounts a ON a.id = p.account_id
			 WHERE p.id = ? AND p.tenant = ?`, rf.PaymentID, rf.Tenant).Scan(&rf.AccountID, &paid, &refunded, &rf.Currency, &balance)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			refusal = ErrPaymentNotFound
			return nil
		case err != nil:
			return fmt.Errorf("read payment: %w", err)
		}
		if existing, found, err := s.refundOf(ctx, tx, rf.Tenant, o); err != nil {
			return err
		} else if found {
			out, refusal = existingRefund(existing, rf.PaymentID, requested)
			return nil
		}
		if refusal = refundRefusal(&rf, paid, refunded, balance); refusal != nil {
			return nil
		}
		key, claimedAt := o.sqliteArgs()
		res, err := tx.ExecContext(ctx,
			`INSERT INTO refunds (id, tenant, payment_id, account_id, amount, currency, reason, status, created_at, idempotency_key, key_claimed_at)
			 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
			 ON CONFLICT (tenant, idempotency_key, key_claimed_at) DO NOTHING`,
			rf.ID, rf.Tenant, rf.PaymentID, rf.AccountID, rf.Amount, rf.Currency, rf.Reason, rf.Status, formatTime(rf.CreatedAt), key, claimedAt)
		if err != nil {
			return fmt.Errorf("insert refund: %w", err)
		}
		if n, err := res.RowsAffected(); err != nil {
			return fmt.Errorf("insert refund: %w", err)
		} else if n != 1 {
			existing, found, err := s.refundOf(ctx, tx, rf.Tenant, o)
			if err != nil {
				return err
			}
			if !found {
				return errors.New("insert refund: conflict on the idempotency origin, but no refund has it")
			}
			out, refusal = existingRefund(existing, rf.PaymentID, requested)
			return nil
		}
		// The condition repeats the check inside the write itself, so no
		// interleaving can take the refunds past the payment.
		res, err = tx.ExecContext(ctx,
			`UPDATE payments SET refunded = refunded + ? WHERE id = ? AND tenant = ? AND refunded + ? <= amount`,
			rf.Amount, rf.PaymentID, rf.Tenant, rf.Amount)
		if err != nil {
			return fmt.Errorf("raise the refunded total: %w", err)
		}
		if n, err := res.RowsAffected(); err != nil {
			return fmt.Errorf("raise the refunded total: %w", err)
		} else if n != 1 {
			return errors.New("raise the refunded total: the payment changed during the transaction")
		}
		if _, err := tx.ExecContext(ctx, `UPDATE accounts SET balance = balance + ? WHERE id = ? AND tenant = ?`,
			rf.Amount, rf.AccountID, rf.Tenant); err != nil {
			return fmt.Errorf("credit account: %w", err)
		}
		if s.outbox != nil {
			msg, err := refundEvent(rf)
			if err != nil {
				return err
			}
			noteEvent(ctx)
			if err := s.outbox.Add(ctx, msg); err != nil {
				return fmt.Errorf("outbox: %w", err)
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

const refundColumns = `id, tenant, payment_id, account_id, amount, currency, reason, status, created_at`

func scanRefund(row interface{ Scan(...any) error }) (Refund, error) {
	var rf Refund
	var created string
	if err := row.Scan(&rf.ID, &rf.Tenant, &rf.PaymentID, &rf.AccountID, &rf.Amount, &rf.Currency, &rf.Reason, &rf.Status, &created); err != nil {
		return Refund{}, err
	}
	t, err := parseTime(created)
	if err != nil {
		return Refund{}, err
	}
	rf.CreatedAt = t
	return rf, nil
}

// refundOf returns the refund o made, if any.
func (s *sqliteStorage) refundOf(ctx context.Context, tx *sql.Tx, tenant string, o origin) (Refund, bool, error) {
	if o.none() {
		return Refund{}, false, nil
	}
	key, claimedAt := o.sqliteArgs()
	since, until := o.sqliteWindow()
	rf, err := scanRefund(tx.QueryRowContext(ctx,
		`SELECT `+refundColumns+` FROM refunds WHERE tenant = ? AND idempotency_key = ?
		 AND (key_claimed_at = ? OR (key_claimed_at > ? AND key_claimed_at < ?))
		 ORDER BY key_claimed_at LIMIT 1`,
		tenant, key, claimedAt, since, until))
	if errors.Is(err, sql.ErrNoRows) {
		return Refund{}, false, nil
	}
	if err != nil {
		return Refund{}, false, fmt.Errorf("read the refund of the idempotency key: %w", err)
	}
	return rf, true, nil
}

func (s *sqliteStorage) Refund(ctx context.Context, tenant, id string) (Refund, error) {
	rf, err := scanRefund(s.db.Reader().QueryRowContext(ctx,
		`SELECT `+refundColumns+` FROM refunds WHERE id = ? AND tenant = ?`, id, tenant))
	if errors.Is(err, sql.ErrNoRows) {
		return Refund{}, ErrRefundNotFound
	}
	if err != nil {
		return Refund{}, fmt.Errorf("read refund: %w", err)
	}
	return rf, nil
}
