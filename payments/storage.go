package payments

import "context"

// storage is the seam between the HTTP layer and a database, so that another
// backend (PostgreSQL) can be added beside SQLite without touching the API.
//
// Every write runs in one transaction that joins the transaction carried by
// ctx, when there is one: under the idempotency middleware that is the key's
// own transaction, so the effect and the stored answer commit together.
// Before committing, a write calls injectBeforeCommit(ctx) so the
// fail-before-commit fault can roll it back.
type storage interface {
	// CreateAccount inserts a, which is complete (ID, tenant, time).
	CreateAccount(ctx context.Context, a Account) error

	// Account returns the tenant's account. Returns ErrAccountNotFound when
	// it does not exist or belongs to another tenant.
	Account(ctx context.Context, tenant, id string) (Account, error)

	// CreatePayment debits p.AccountID by p.Amount and records p, atomically.
	// Returns ErrAccountNotFound, ErrCurrencyMismatch (a *FieldError) or
	// ErrInsufficientFunds having written nothing. The balance can never go
	// negative, even when calls race without any idempotency protection.
	CreatePayment(ctx context.Context, p Payment) error

	// Payment returns the tenant's payment. Returns ErrPaymentNotFound when
	// it does not exist or belongs to another tenant.
	Payment(ctx context.Context, tenant, id string) (Payment, error)

	// AccountPayments returns up to limit of the account's payments, newest
	// first, and whether there are more. Returns ErrAccountNotFound when the
	// account does not exist or belongs to another tenant.
	AccountPayments(ctx context.Context, tenant, accountID string, limit int) ([]Payment, bool, error)

	// CreateDeposit credits d.AccountID by d.Amount, records d and returns
	// the balance after it. Returns ErrAccountNotFound or ErrBalanceOverflow
	// having written nothing.
	CreateDeposit(ctx context.Context, d Deposit) (balance int64, err error)

	// Counts returns how many accounts, payments and deposits are recorded,
	// for the metrics.
	Counts(ctx context.Context) (accounts, payments, deposits int64, err error)

	// Ping checks that the database answers.
	Ping(ctx context.Context) error
}
