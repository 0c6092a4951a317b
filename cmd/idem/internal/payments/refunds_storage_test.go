package payments

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// TestStorageRefundsOncePerOriginAndSettlesThemOnce checks, on each
// storage, that a re-run of a refund's origin (the two-store case, where no
// key transaction guards it) credits nothing, and that settlement
// subtracts each refund once, however many events announce it.
func TestStorageRefundsOncePerOriginAndSettlesThemOnce(t *testing.T) {
	t.Parallel()
	for name, open := range storagesForTest() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			st := open(t)
			ctx := context.Background()
			t0 := time.Date(2025, 3, 1, 9, 0, 0, 0, time.UTC)
			a := Account{ID: newID("acct_"), Tenant: "t1", Balance: 1_000, Currency: "KRW", CreatedAt: t0}
			if err := st.CreateAccount(ctx, a); err != nil {
				t.Fatal(err)
			}
			p, err := st.CreatePayment(ctx, Payment{ID: newID("pay_"), Tenant: "t1", AccountID: a.ID, Amount: 600, Currency: "KRW",
				Status: StatusSucceeded, CreatedAt: t0}, origin{})
			if err != nil {
				t.Fatal(err)
			}
			o := origin{key: "r1", claimedAt: t0}
			rf := Refund{ID: newID("re_"), Tenant: "t1", PaymentID: p.ID, Amount: 250, Status: StatusSucceeded, CreatedAt: t0}
			first, err := st.CreateRefund(ctx, rf, o)
			if err != nil || first.ID != rf.ID || first.AccountID != a.ID || first.Currency != "KRW" {
				t.Fatalf("refund = %+v, %v", first, err)
			}
			again := rf
			again.ID = newID("re_")
			if got, err := st.CreateRefund(ctx, again, o); err != nil || got.ID != first.ID {
				t.Fatalf("the re-run of the origin = %+v, %v; want the first refund", got, err)
			}
			other := again
			other.Amount = 1
			if _, err := st.CreateRefund(ctx, other, o); !errors.Is(err, ErrKeyConflict) {
				t.Fatalf("the origin with another amount: %v, want ErrKeyConflict", err)
			}
			if _, err := st.CreateRefund(ctx, Refund{ID: newID("re_"), Tenant: "t2", PaymentID: p.ID, Status: StatusSucceeded, CreatedAt: t0}, origin{}); !errors.Is(err, ErrPaymentNotFound) {
				t.Fatalf("another tenant's refund: %v, want ErrPaymentNotFound", err)
			}
			if got, err := st.Account(ctx, "t1", a.ID); err != nil || got.Balance != 650 {
				t.Fatalf("balance = %d, %v; want 650 (one refund of 250)", got.Balance, err)
			}

			ev := func(id, typ string, amount int64) PaymentEvent {
				e := PaymentEvent{EventID: id, Type: typ, PaymentID: p.ID, Tenant: "t1", AccountID: a.ID, Amount: amount, Currency: "KRW"}
				if typ == EventRefundSucceeded {
					e.RefundID = first.ID
				}
				return e
			}
			already, err := st.settle(ctx, []PaymentEvent{
				ev("e1", EventPaymentSucceeded, 600), ev("e2", EventRefundSucceeded, 250), ev("e3", EventRefundSucceeded, 250)})
			if err != nil || len(already) != 1 || already[0] != 2 {
				t.Fatalf("settle = %v, %v; want the second refund event to add nothing", already, err)
			}
			if already, err := st.settle(ctx, []PaymentEvent{ev("e4", EventRefundSucceeded, 250)}); err != nil || len(already) != 1 {
				t.Fatalf("a later event of the settled refund = %v, %v; want it to add nothing", already, err)
			}
			if s, err := st.settlement(ctx, "t1"); err != nil || s != (Settlement{Currency: "KRW", Total: 350, Events: 1, Refunds: 1}) {
				t.Fatalf("settlement = %+v, %v; want 350 KRW, one payment and one refund", s, err)
			}
			ghost := ev("e5", EventRefundSucceeded, 250)
			ghost.RefundID = "re_ghost"
			var ee *eventError
			if _, err := st.settle(ctx, []PaymentEvent{ghost}); !errors.As(err, &ee) || !errors.Is(err, ErrRefundNotFound) || !idem.IsPermanent(err) {
				t.Fatalf("an event of an unknown refund: %v, want a permanent ErrRefundNotFound", err)
			}
		})
	}
}
