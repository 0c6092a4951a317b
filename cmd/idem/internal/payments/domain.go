package payments

import (
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Account is a tenant's balance in one currency. Balance is in minor units
// (cents, won) and never negative.
type Account struct {
	ID        string    `json:"id"`
	Tenant    string    `json:"-"`
	Balance   int64     `json:"balance"`
	Currency  string    `json:"currency"`
	CreatedAt time.Time `json:"created_at"`
}

// Payment is one charge against an account.
type Payment struct {
	ID          string `json:"id"`
	Tenant      string `json:"-"`
	AccountID   string `json:"account_id"`
	Amount      int64  `json:"amount"`
	Currency    string `json:"currency"`
	Description string `json:"description"`
	Status      string `json:"status"`
	// ChargeID is the card network's charge that paid for the payment,
	// when the service charges cards (Config.Acquirer).
	ChargeID  string    `json:"charge_id,omitempty"`
	CreatedAt time.Time `json:"created_at"`
}

// Deposit is money added to an account. Balance is the account's balance
// right after the deposit.
type Deposit struct {
	ID        string    `json:"id"`
	Tenant    string    `json:"-"`
	AccountID string    `json:"account_id"`
	Amount    int64     `json:"amount"`
	Balance   int64     `json:"balance"`
	CreatedAt time.Time `json:"created_at"`
}

// StatusSucceeded is the status of every recorded payment: a payment that
// cannot be made is refused, not recorded as failed.
const StatusSucceeded = "succeeded"

// MaxDescriptionLen is the longest payment description accepted, in bytes.
const MaxDescriptionLen = 1000

var (
	// ErrAccountNotFound: the account does not exist or belongs to another
	// tenant (the two are indistinguishable on purpose).
	ErrAccountNotFound = errors.New("payments: account not found")
	// ErrPaymentNotFound: the payment does not exist or belongs to another
	// tenant.
	ErrPaymentNotFound = errors.New("payments: payment not found")
	// ErrInsufficientFunds: the account's balance is smaller than the
	// payment. Deterministic, so the idempotency layer stores and replays it.
	ErrInsufficientFunds = errors.New("payments: insufficient funds")
	// ErrCurrencyMismatch: the payment's currency is not the account's.
	ErrCurrencyMismatch = errors.New("payments: currency does not match the account")
	// ErrBalanceOverflow: a deposit would take the balance past what an
	// int64 holds.
	ErrBalanceOverflow = errors.New("payments: balance would overflow")
	// ErrInvalidRequest is matched by every *FieldError.
	ErrInvalidRequest = errors.New("payments: invalid request")
	// ErrInvalidAmount: an amount that is not a positive integer (or a
	// negative opening balance).
	ErrInvalidAmount = errors.New("payments: invalid amount")
	// ErrInvalidCurrency: a currency that is not three upper-case letters.
	ErrInvalidCurrency = errors.New("payments: invalid currency")
	// ErrKeyConflict: the idempotency key's earlier execution recorded a
	// payment (or deposit) with another account, amount or currency than
	// this one asks for. The key store's fingerprint normally refuses such a
	// request first; this is the database's own check, for a re-run that
	// the key store let through.
	ErrKeyConflict = errors.New("payments: this idempotency key already recorded a different operation")
	// ErrTransient is matched by failures worth retrying: the work was rolled
	// back and the same request may succeed later.
	ErrTransient = errors.New("payments: transient failure")
)

// FieldError says which field of a request is wrong and why. It matches
// ErrInvalidRequest and, through Unwrap, the more specific Err.
type FieldError struct {
	Field  string
	Reason string
	Err    error
}

func (e *FieldError) Error() string { return e.Field + " " + e.Reason }

// Is makes errors.Is(err, ErrInvalidRequest) true.
func (e *FieldError) Is(target error) bool { return target == ErrInvalidRequest }

// Unwrap returns the specific sentinel, if any.
func (e *FieldError) Unwrap() error { return e.Err }

// validateCurrency checks an ISO 4217-shaped code: three upper-case ASCII
// letters. Whether the code is assigned is not checked; the lab does not
// convert between currencies, it only refuses to mix them.
func validateCurrency(field, c string) error {
	if len(c) != 3 {
		return &FieldError{Field: field, Reason: fmt.Sprintf("must be three upper-case letters, got %q", c), Err: ErrInvalidCurrency}
	}
	for i := 0; i < len(c); i++ {
		if c[i] < 'A' || c[i] > 'Z' {
			return &FieldError{Field: field, Reason: fmt.Sprintf("must be three upper-case letters, got %q", c), Err: ErrInvalidCurrency}
		}
	}
	return nil
}

// validateAmount checks an amount of money moved: a positive integer of
// minor units.
func validateAmount(field string, n int64) error {
	if n <= 0 {
		return &FieldError{Field: field, Reason: fmt.Sprintf("must be a positive integer of minor units, got %d", n), Err: ErrInvalidAmount}
	}
	return nil
}

// validateDescription keeps descriptions printable and bounded, so they can
// be shown and logged safely.
func validateDescription(d string) error {
	if len(d) > MaxDescriptionLen {
		return &FieldError{Field: "description", Reason: fmt.Sprintf("must be at most %d bytes, got %d", MaxDescriptionLen, len(d))}
	}
	for _, r := range d {
		if r < 0x20 || r == 0x7f || r == '\uFFFD' {
			return &FieldError{Field: "description", Reason: "must not contain control characters or invalid UTF-8"}
		}
	}
	return nil
}

// newID returns prefix followed by 128 random bits in lower-case base32, so
// IDs are unguessable and never collide in practice.
func newID(prefix string) string {
	return prefix + strings.ToLower(rand.Text())
}

// Refund gives part or all of a payment back to the payment's account.
// The refunds of one payment never sum past its amount.
type Refund struct {
	ID        string    `json:"id"`
	Tenant    string    `json:"-"`
	PaymentID string    `json:"payment_id"`
	AccountID string    `json:"account_id"`
	Amount    int64     `json:"amount"`
	Currency  string    `json:"currency"`
	Reason    string    `json:"reason"`
	Status    string    `json:"status"`
	CreatedAt time.Time `json:"created_at"`
}

var (
	// ErrRefundNotFound: the refund does not exist or belongs to another
	// tenant.
	ErrRefundNotFound = errors.New("payments: refund not found")
	// ErrRefundExceedsPayment: the refund would take the payment's refunds
	// past its amount (or the payment is refunded in full already).
	// Deterministic, so the idempotency layer stores and replays it.
	ErrRefundExceedsPayment = errors.New("payments: the refunds would exceed the payment")
	// ErrInvalidCursor: a list's starting_after or ending_before that is
	// malformed or names no item of the list (another tenant's, another
	// account's, another kind of object). Matched with ErrInvalidRequest
	// through the *FieldError that carries it.
	ErrInvalidCursor = errors.New("payments: invalid cursor")
)

// validateReason keeps a refund's reason printable and bounded, like a
// payment's description.
func validateReason(r string) error {
	if err := validateDescription(r); err != nil {
		var fe *FieldError
		if errors.As(err, &fe) {
			return &FieldError{Field: "reason", Reason: fe.Reason, Err: fe.Err}
		}
		return err
	}
	return nil
}
