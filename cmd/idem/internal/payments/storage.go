package payments

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
)

// storage is the seam between the HTTP layer and a database: SQLite
// (sqliteStorage) and PostgreSQL (pgStorage) implement it, both with the
// logic of sqlStorage, which is written once.
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

	// AccountPayments returns one page of the account's payments, newest
	// first by (created_at, id), and whether there are more beyond it in
	// the direction walked (see listPage). Returns ErrAccountNotFound when
	// the account does not exist or belongs to another tenant, and a
	// *FieldError matching ErrInvalidCursor when the cursor names no
	// payment of the account.
	AccountPayments(ctx context.Context, tenant, accountID string, pg listPage) ([]Payment, bool, error)

	// AccountDeposits is AccountPayments for the account's deposits.
	AccountDeposits(ctx context.Context, tenant, accountID string, pg listPage) ([]Deposit, bool, error)

	// CreateRefund credits the account of the payment rf.PaymentID by
	// rf.Amount (by what is left to refund of the payment when it is 0),
	// raises the payment's refunded total, records rf with its event, all
	// in one transaction, and returns the recorded refund; when o already
	// made a refund, it returns that one and credits nothing. The refunds
	// of a payment never sum past it, whatever the concurrency: the
	// refunded total is raised by a conditional UPDATE of the payment's
	// row. Returns ErrPaymentNotFound, ErrRefundExceedsPayment,
	// ErrBalanceOverflow or ErrKeyConflict (o's refund is of another
	// payment or amount); each having written nothing.
	CreateRefund(ctx context.Context, rf Refund, o origin) (Refund, error)

	// Refund returns the tenant's refund. Returns ErrRefundNotFound when it
	// does not exist or belongs to another tenant.
	Refund(ctx context.Context, tenant, id string) (Refund, error)

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
	// statement per tenant and currency adds the ones it marked; refund
	// events are read and marked the same way, on the refunds, and
	// subtract. A payment (a refund) is added at most once, whatever
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

// listPage asks for one page of a list ordered newest first: up to limit
// items older than startingAfter, or up to limit items newer than
// endingBefore (still answered newest first), or the newest limit items
// when neither is set. The "more" a list returns says whether items exist
// beyond the page in the direction walked, as Stripe's has_more does.
type listPage struct {
	limit         int
	startingAfter string
	endingBefore  string
}

// cursor is the ID the page starts from, the name of its parameter, and
// whether the walk goes towards newer items.
func (pg listPage) cursor() (id, field string, newer bool) {
	if pg.endingBefore != "" {
		return pg.endingBefore, "ending_before", true
	}
	return pg.startingAfter, "starting_after", false
}

// unknownCursor is the refusal of a cursor that names no item of the list.
func unknownCursor(field, what string) error {
	return &FieldError{Field: field, Reason: "names no " + what + " of this account", Err: ErrInvalidCursor}
}

// trimPage cuts a page read with limit+1 rows to limit, and puts a page
// read towards newer items (oldest first) back in newest-first order.
func trimPage[T any](list []T, pg listPage) ([]T, bool) {
	more := len(list) > pg.limit
	if more {
		list = list[:pg.limit]
	}
	if _, _, newer := pg.cursor(); newer {
		slices.Reverse(list)
	}
	return list, more
}

// eventError is the failure of one event of a batch being settled.
type eventError struct {
	index int
	err   error
}

func (e *eventError) Error() string { return e.err.Error() }
func (e *eventError) Unwrap() error { return e.err }

// settlementTotal is what a batch adds to one tenant's settlement in one
// currency: the sum of the payments it settled less the refunds it
// settled, how many payments and how many refunds.
type settlementTotal struct {
	tenant, currency       string
	total, events, refunds int64
}

// settledPayment is a payment (or a refund) as settle's read-and-mark
// found it.
type settledPayment struct {
	tenant, currency string
	amount           int64
	// marked: this batch marked it settled, so this batch adds it.
	marked bool
}

// settlementTotals checks each event against its stored payment or
// refund, found by find, and sums what the batch marked per tenant and
// currency, in that order (the order in which the upsert locks the rows,
// so that concurrent batches never wait for each other in a cycle): a
// payment adds its amount, a refund subtracts its own. One the batch did
// not mark, or that an earlier event of the batch added already, adds
// nothing: its event's index is in already.
func settlementTotals(evs []PaymentEvent, find func(ev PaymentEvent) (settledPayment, bool)) (totals []settlementTotal, already []int, err error) {
	sums := make(map[[2]string]*settlementTotal)
	added := make(map[[2]string]bool, len(evs))
	for i, ev := range evs {
		p, ok := find(ev)
		if !ok || p.tenant != ev.Tenant {
			if ev.isRefund() {
				return nil, nil, &eventError{i, idem.Permanent(fmt.Errorf("event %s: %w: %s", ev.EventID, ErrRefundNotFound, ev.RefundID))}
			}
			return nil, nil, &eventError{i, idem.Permanent(fmt.Errorf("event %s: %w: %s", ev.EventID, ErrPaymentNotFound, ev.PaymentID))}
		}
		if err := checkEvent(ev, p.amount, p.currency); err != nil {
			return nil, nil, &eventError{i, err}
		}
		kind := EventPaymentSucceeded
		if ev.isRefund() {
			kind = EventRefundSucceeded
		}
		subject := [2]string{kind, ev.subject()}
		if !p.marked || added[subject] {
			already = append(already, i)
			continue
		}
		added[subject] = true
		k := [2]string{ev.Tenant, p.currency}
		if sums[k] == nil {
			sums[k] = &settlementTotal{tenant: ev.Tenant, currency: p.currency}
		}
		if ev.isRefund() {
			sums[k].total -= p.amount
			sums[k].refunds++
		} else {
			sums[k].total += p.amount
			sums[k].events++
		}
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

// splitEvents returns the IDs of the payments and of the refunds that evs
// announce.
func splitEvents(evs []PaymentEvent) (payments, refunds []string) {
	payments, refunds = []string{}, []string{}
	for _, ev := range evs {
		if ev.isRefund() {
			refunds = append(refunds, ev.RefundID)
		} else {
			payments = append(payments, ev.PaymentID)
		}
	}
	return payments, refunds
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
//
// The key a row keeps is never the client's: it is the execution's key
// when the service seals keys (Config.KeySecret: an HMAC of tenant and
// key, "hk1_…"), and otherwise the execution's DownstreamKey named
// "payments", "origin" (a SHA-256 of tenant and key, "idg1_…"), which is
// the same for every execution of the logical request, before and after
// `idem keys seal`. Rows made before the service kept digests hold the
// execution's key as it was (the client's key, when nothing was sealed);
// they are still found through alt until `idem keys seal` rewrites them.
type origin struct {
	key string
	// alt is the other form a row of this origin may keep: the
	// execution's key, when key is its digest. Looked up, never written.
	alt       string
	claimedAt time.Time
	// since and until, when set, widen the match to every claim of the key
	// between them: claimedAt less and plus the key's TTL. A payment made
	// under another claim of the key within its TTL, before this one or
	// after, is the same logical request's. They are set when the keys live
	// apart from the money (Config.Keys): a key store that fails over, or
	// restarts without its data, can lose a claim, and a retry then claims
	// the key anew with a new claim time, while the lost claim's execution
	// may still be running: whichever of the two commits second must find
	// the other's payment, the earlier claim's as well as the later's.
	since, until time.Time
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
	o := origin{key: string(ex.Key), alt: string(ex.Key), claimedAt: ex.ClaimedAt}
	if !idemhttp.IsSealedKey(ex.Key) {
		o.key = originDigest(ex)
	}
	return o
}

// originDigest is what a row keeps of an execution's key that the service
// did not seal: a digest of the tenant and the client's key, never the key.
func originDigest(ex idemhttp.Execution) string {
	return ex.DownstreamKey("payments", "origin")
}

// lookupAlt is alt as a parameter of the look-ups: key itself when there
// is no other form, so that "IN (key, alt)" matches key alone.
func (o origin) lookupAlt() string {
	if o.alt == "" {
		return o.key
	}
	return o.alt
}

// samePayment reports whether an existing payment is the one p asks for, as
// far as money goes: the description is not compared.
func samePayment(existing, p Payment) bool {
	return existing.AccountID == p.AccountID && existing.Amount == p.Amount && existing.Currency == p.Currency
}

func sameDeposit(existing, d Deposit) bool {
	return existing.AccountID == d.AccountID && existing.Amount == d.Amount
}

// refundRefusal settles rf's amount (what is left of the payment when none
// was asked for) and says why it cannot be refunded from a payment of paid
// with refunded given back already, to an account holding balance; or nil.
func refundRefusal(rf *Refund, paid, refunded, balance int64) error {
	left := paid - refunded
	if rf.Amount == 0 {
		rf.Amount = left
	}
	switch {
	case rf.Amount <= 0 || rf.Amount > left:
		return ErrRefundExceedsPayment
	case balance > math.MaxInt64-rf.Amount:
		return ErrBalanceOverflow
	}
	return nil
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

// existingRefund is the answer to a refund whose origin already made one:
// that refund, or ErrKeyConflict when it is of another payment, or of
// another amount than the one asked for.
func existingRefund(existing Refund, paymentID string, requested int64) (Refund, error) {
	if existing.PaymentID != paymentID || (requested != 0 && existing.Amount != requested) {
		return Refund{}, ErrKeyConflict
	}
	return existing, nil
}
