package payments

import (
	"context"
	"errors"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
)

// storage is the seam between the HTTP layer and a database: SQLite
// (sqliteStorage) and PostgreSQL (pgStorage) implement it.
//
// Every write runs in one transaction that joins the transaction carried by
// ctx, when there is one: under the idempotency middleware's
// same-transaction form that is the key's own transaction, so the effect and
// the stored answer commit together. Before committing, a write calls
// injectBeforeCommit(ctx) so the fail-before-commit fault can roll it back.
//
// Payments and deposits record the execution of the idempotency key that
// made them (an origin) under a unique constraint on (tenant,
// idempotency_key, key_claimed_at). A write whose origin already made a row
// writes nothing and returns that row: this is what keeps a re-run of a key
// from charging twice when the key lives in another store than the money
// (see the package documentation, "Two stores").
type storage interface {
	// CreateAccount inserts a, which is complete (ID, tenant, time).
	CreateAccount(ctx context.Context, a Account) error

	// Account returns the tenant's account. Returns ErrAccountNotFound when
	// it does not exist or belongs to another tenant.
	Account(ctx context.Context, tenant, id string) (Account, error)

	// CreatePayment debits p.AccountID by p.Amount and records p, atomically,
	// and returns the recorded payment: p itself, or, when o already made a
	// payment, that payment, with nothing debited. Returns ErrKeyConflict
	// when o's payment has another account, amount or currency, and
	// ErrAccountNotFound, ErrCurrencyMismatch (a *FieldError) or
	// ErrInsufficientFunds; each having written nothing. The balance can
	// never go negative, even when calls race without any idempotency
	// protection.
	CreatePayment(ctx context.Context, p Payment, o origin) (Payment, error)

	// Payment returns the tenant's payment. Returns ErrPaymentNotFound when
	// it does not exist or belongs to another tenant.
	Payment(ctx context.Context, tenant, id string) (Payment, error)

	// AccountPayments returns up to limit of the account's payments, newest
	// first, and whether there are more. Returns ErrAccountNotFound when the
	// account does not exist or belongs to another tenant.
	AccountPayments(ctx context.Context, tenant, accountID string, limit int) ([]Payment, bool, error)

	// CreateDeposit credits d.AccountID by d.Amount, records d and returns
	// it with the balance after it; when o already made a deposit, it
	// returns that one and credits nothing. Returns ErrKeyConflict when o's
	// deposit has another account or amount, ErrAccountNotFound or
	// ErrBalanceOverflow; each having written nothing.
	CreateDeposit(ctx context.Context, d Deposit, o origin) (Deposit, error)

	// Counts returns how many accounts, payments and deposits are recorded,
	// for the metrics.
	Counts(ctx context.Context) (accounts, payments, deposits int64, err error)

	// Ping checks that the database answers.
	Ping(ctx context.Context) error

	// setOutbox makes CreatePayment add each payment's event to ob, in the
	// payment's transaction.
	setOutbox(ob idem.Outbox)

	// settle adds ev's amount to its tenant's settlement, in the
	// transaction ctx carries (the settlement consumer's inbox row's).
	// Returns a permanent error (idem.Permanent) when ev's payment is
	// unknown or disagrees with it.
	settle(ctx context.Context, ev PaymentEvent) error

	// settlement reads the tenant's settlement in the currency of its
	// first account; zero values when it has none.
	settlement(ctx context.Context, tenant string) (Settlement, error)
}

// errOutcomeUnknown marks a failed write whose transaction failed to begin
// or to commit, rather than failing in one of its statements: after a
// failed commit (a connection lost while committing) the write may or may
// not have happened.
var errOutcomeUnknown = errors.New("the write's transaction failed to begin or commit: it may or may not have happened")

// origin names the execution of an idempotency key that makes a write: the
// key and its claim time (idemhttp.Execution.ClaimedAt), the same for every
// execution of one logical request and new once the key expired and was
// claimed again. The tenant is the key's scope and is recorded anyway. The
// zero origin means none: unsafe mode and requests without a key, whose
// writes are never de-duplicated.
type origin struct {
	key       string
	claimedAt time.Time
}

func (o origin) none() bool { return o.key == "" }

// originFrom returns the origin of the protected request ctx belongs to, or
// none. A key store that does not report a claim time gives none too: a
// constraint on the key alone would wrongly match a later, legitimate reuse
// of the key after it expired.
func originFrom(ctx context.Context) origin {
	ex, ok := idemhttp.ExecutionFromContext(ctx)
	if !ok || ex.Key == "" || ex.ClaimedAt.IsZero() {
		return origin{}
	}
	return origin{key: string(ex.Key), claimedAt: ex.ClaimedAt}
}

// samePayment reports whether an existing payment is the one p asks for, as
// far as money goes: the description is not compared.
func samePayment(existing, p Payment) bool {
	return existing.AccountID == p.AccountID && existing.Amount == p.Amount && existing.Currency == p.Currency
}

func sameDeposit(existing, d Deposit) bool {
	return existing.AccountID == d.AccountID && existing.Amount == d.Amount
}
