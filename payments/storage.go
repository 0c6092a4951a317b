package payments

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
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
	// Probe writes one row and commits it durably, as every payment's
	// commit must: it fails, or does not return, when the database cannot
	// commit (a full, read-only or stalled disk; a database that refuses
	// writes).
	Probe(ctx context.Context) error

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

	// settle adds the events' payments to their tenants' settlements, in
	// the transaction ctx carries (the settlement consumer's inbox
	// rows'): one statement reads the payments and marks those not
	// settled yet as settled (on SQLite, a batch with events whose
	// payment it did not mark reads those payments once more), and one
	// statement per tenant and currency adds the ones it marked. A payment is added at most once, whatever
	// its events' IDs: an event of a payment settled already (by an
	// earlier batch, or by an event before it in this one) adds nothing,
	// and its index is returned in already. Returns an *eventError naming
	// the first event whose payment is unknown or disagrees with it (a
	// permanent error, idem.Permanent), having settled and marked nothing.
	settle(ctx context.Context, evs []PaymentEvent) (already []int, err error)

	// settlement reads the tenant's settlement in the currency of its
	// first account; zero values when it has none.
	settlement(ctx context.Context, tenant string) (Settlement, error)
}

// eventError is the failure of one event of a batch being settled.
type eventError struct {
	index int
	err   error
}

func (e *eventError) Error() string { return e.err.Error() }
func (e *eventError) Unwrap() error { return e.err }

// settlementTotal is what a batch adds to one tenant's settlement in one
// currency: the sum of the payments it settled, and how many.
type settlementTotal struct {
	tenant, currency string
	total, events    int64
}

// settledPayment is a payment as settle's read-and-mark found it.
type settledPayment struct {
	tenant, currency string
	amount           int64
	// marked: this batch marked it settled, so this batch adds it.
	marked bool
}

// settlementTotals checks each event against its stored payment, found by
// find, and sums the payments the batch marked per tenant and currency, in
// that order (the order in which the upsert locks the rows, so that
// concurrent batches never wait for each other in a cycle). A payment the
// batch did not mark, or that an earlier event of the batch added
// already, adds nothing: its event's index is in already.
func settlementTotals(evs []PaymentEvent, find func(id string) (settledPayment, bool)) (totals []settlementTotal, already []int, err error) {
	sums := make(map[[2]string]*settlementTotal)
	added := make(map[string]bool, len(evs))
	for i, ev := range evs {
		p, ok := find(ev.PaymentID)
		if !ok || p.tenant != ev.Tenant {
			return nil, nil, &eventError{i, idem.Permanent(fmt.Errorf("event %s: %w: %s", ev.EventID, ErrPaymentNotFound, ev.PaymentID))}
		}
		if err := checkEvent(ev, p.amount, p.currency); err != nil {
			return nil, nil, &eventError{i, err}
		}
		if !p.marked || added[ev.PaymentID] {
			already = append(already, i)
			continue
		}
		added[ev.PaymentID] = true
		k := [2]string{ev.Tenant, p.currency}
		if sums[k] == nil {
			sums[k] = &settlementTotal{tenant: ev.Tenant, currency: p.currency}
		}
		sums[k].total += p.amount
		sums[k].events++
	}
	totals = make([]settlementTotal, 0, len(sums))
	for _, st := range sums {
		totals = append(totals, *st)
	}
	slices.SortFunc(totals, func(a, b settlementTotal) int {
		return cmp.Or(strings.Compare(a.tenant, b.tenant), strings.Compare(a.currency, b.currency))
	})
	return totals, already, nil
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
