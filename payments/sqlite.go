package payments

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"time"

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
}

// Migrate applies the service's own migrations (accounts, payments,
// deposits) to db, for tools that prepare a database without running the
// service. New does the same, and idemsqlite.NewStore migrates the
// idempotency keys' tables.
func Migrate(ctx context.Context, db *idemsqlite.DB) error {
	if db == nil {
		return fmt.Errorf("%w: DB is required", ErrConfig)
	}
	if err := migrateSQLite(ctx, db); err != nil {
		return fmt.Errorf("payments: migrate: %w", err)
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

func (s *sqliteStorage) CreateAccount(ctx context.Context, a Account) error {
	return s.db.WithTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
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
func (s *sqliteStorage) CreatePayment(ctx context.Context, p Payment) error {
	var refusal error
	err := s.db.WithTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		var balance int64
		var currency string
		err := tx.QueryRowContext(ctx,
			`SELECT balance, currency FROM accounts WHERE id = ? AND tenant = ?`,
			p.AccountID, p.Tenant).Scan(&balance, &currency)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			refusal = ErrAccountNotFound
			return nil
		case err != nil:
			return fmt.Errorf("read account: %w", err)
		case currency != p.Currency:
			refusal = &FieldError{Field: "currency",
				Reason: fmt.Sprintf("is %s but the account holds %s", p.Currency, currency),
				Err:    ErrCurrencyMismatch}
			return nil
		case balance < p.Amount:
			refusal = ErrInsufficientFunds
			return nil
		}
		// The balance condition repeats the check above inside the write
		// itself, so no interleaving of requests can take it below zero.
		res, err := tx.ExecContext(ctx,
			`UPDATE accounts SET balance = balance - ? WHERE id = ? AND tenant = ? AND balance >= ?`,
			p.Amount, p.AccountID, p.Tenant, p.Amount)
		if err != nil {
			return fmt.Errorf("debit account: %w", err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return fmt.Errorf("debit account: %w", err)
		}
		if n != 1 {
			refusal = ErrInsufficientFunds
			return nil
		}
		_, err = tx.ExecContext(ctx,
			`INSERT INTO payments (id, tenant, account_id, amount, currency, description, status, created_at)
			 VALUES (?, ?, ?, ?, ?, ?, ?, ?)`,
			p.ID, p.Tenant, p.AccountID, p.Amount, p.Currency, p.Description, p.Status, formatTime(p.CreatedAt))
		if err != nil {
			return fmt.Errorf("insert payment: %w", err)
		}
		return injectBeforeCommit(ctx)
	})
	if err != nil {
		return err
	}
	return refusal
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

func (s *sqliteStorage) AccountPayments(ctx context.Context, tenant, accountID string, limit int) ([]Payment, bool, error) {
	// One read transaction, so the account check and the list see the same
	// snapshot.
	tx, err := s.db.Reader().BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
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
	rows, err := tx.QueryContext(ctx,
		`SELECT `+paymentColumns+` FROM payments WHERE account_id = ? AND tenant = ?
		 ORDER BY created_at DESC, rowid DESC LIMIT ?`, accountID, tenant, limit+1)
	if err != nil {
		return nil, false, fmt.Errorf("list payments: %w", err)
	}
	defer rows.Close()
	list := []Payment{}
	for rows.Next() {
		p, err := scanPayment(rows)
		if err != nil {
			return nil, false, fmt.Errorf("list payments: %w", err)
		}
		list = append(list, p)
	}
	if err := rows.Err(); err != nil {
		return nil, false, fmt.Errorf("list payments: %w", err)
	}
	more := len(list) > limit
	if more {
		list = list[:limit]
	}
	return list, more, nil
}

// CreateDeposit refuses like CreatePayment: nil from the transaction
// function, the refusal after it.
func (s *sqliteStorage) CreateDeposit(ctx context.Context, d Deposit) (int64, error) {
	var refusal error
	var balance int64
	err := s.db.WithTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		err := tx.QueryRowContext(ctx,
			`SELECT balance FROM accounts WHERE id = ? AND tenant = ?`, d.AccountID, d.Tenant).Scan(&balance)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			refusal = ErrAccountNotFound
			return nil
		case err != nil:
			return fmt.Errorf("read account: %w", err)
		case balance > math.MaxInt64-d.Amount:
			refusal = ErrBalanceOverflow
			return nil
		}
		err = tx.QueryRowContext(ctx,
			`UPDATE accounts SET balance = balance + ? WHERE id = ? AND tenant = ? AND balance <= ? RETURNING balance`,
			d.Amount, d.AccountID, d.Tenant, math.MaxInt64-d.Amount).Scan(&balance)
		if errors.Is(err, sql.ErrNoRows) {
			refusal = ErrBalanceOverflow
			return nil
		}
		if err != nil {
			return fmt.Errorf("credit account: %w", err)
		}
		_, err = tx.ExecContext(ctx,
			`INSERT INTO deposits (id, tenant, account_id, amount, balance_after, created_at) VALUES (?, ?, ?, ?, ?, ?)`,
			d.ID, d.Tenant, d.AccountID, d.Amount, balance, formatTime(d.CreatedAt))
		if err != nil {
			return fmt.Errorf("insert deposit: %w", err)
		}
		return injectBeforeCommit(ctx)
	})
	if err != nil {
		return 0, err
	}
	if refusal != nil {
		return 0, refusal
	}
	return balance, nil
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

func (s *sqliteStorage) Ping(ctx context.Context) error {
	var one int
	if err := s.db.Reader().QueryRowContext(ctx, `SELECT 1`).Scan(&one); err != nil {
		return fmt.Errorf("ping: %w", err)
	}
	return nil
}
