package payments_test

import (
	"context"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/acquirer"
	"github.com/idem-go/idem/cmd/idem/internal/payments"
	"github.com/idem-go/idem/idemhttp"
)

// With the keys in a store that keeps no recovery points (Redis), a key in
// flight names its logical payment by its scope (the tenant) and key (the
// client's): a charge made for it that no payment records is pending
// within the bound of the key's claim, an unknown outcome past it; once
// the key left flight with the charge still unrecorded, the charge is one
// without its payment. A sealed key names none that can be read: counted,
// and its charge is a difference. A key in flight without a charge is no
// payment at the network: not listed.
func TestReconcileKeysInFlightWithoutPoints(t *testing.T) {
	t.Parallel()
	db := migratedSQLite(t)
	net, _ := cardNetworkAt(t, &payments.Config{})
	ch, err := net.Charge(t.Context(), "net-key-1", acquirer.ChargeRequest{Amount: 1000, Currency: "EUR", Reference: "acct_1",
		Metadata: map[string]string{"tenant": "acme", payments.MetaKeyDigest: payments.ClientKeyDigest("acme", "pay-1")}})
	if err != nil {
		t.Fatal(err)
	}
	claimed := time.Now().Add(-time.Second)
	key := func(k idem.Key) idem.Record {
		return idem.Record{Scope: "acme", Key: k, State: idem.StateInFlight, Fingerprint: "fp", CreatedAt: claimed}
	}
	run := func(bound time.Duration, listings func(n int) []idem.Record) *payments.Reconciliation {
		t.Helper()
		var n atomic.Int32
		rec, err := payments.Reconcile(t.Context(), db, nil, net, time.Time{}, &payments.ReconcileOptions{Bound: bound,
			InFlight: func(context.Context) ([]idem.Record, error) { return listings(int(n.Add(1))), nil }})
		if err != nil {
			t.Fatal(err)
		}
		return rec
	}
	always := func(int) []idem.Record { return []idem.Record{key("pay-1"), key("deposit-7")} }

	rec := run(time.Minute, always)
	if len(rec.Differences) != 0 || len(rec.Pending) != 1 {
		t.Fatalf("within the bound: %+v; want the charge pending alone", rec)
	}
	if p := rec.Pending[0]; p.Payment != "" || p.Point != "" || p.Amount != 1000 || p.Currency != "EUR" || !slices.Equal(p.Charges, []string{ch.ID}) ||
		p.KeyDigest != payments.ClientKeyDigest("acme", "pay-1") || p.Age < time.Second {
		t.Fatalf("pending: %+v; want the charge's amount, its ID, the key's digest and an age from the claim", p)
	}
	if rec := run(time.Millisecond, always); len(rec.Pending) != 0 || rec.DifferenceCount != 1 || rec.Differences[0].Kind != payments.DiffUnknownOutcome {
		t.Fatalf("past the bound: %+v; want one unknown outcome", rec)
	}
	// In flight while the page is read, gone at the end: a charge without
	// its payment.
	gone := func(n int) []idem.Record {
		if n == 1 {
			return always(n)
		}
		return nil
	}
	if rec := run(time.Minute, gone); len(rec.Pending) != 0 || rec.DifferenceCount != 1 || rec.Differences[0].Kind != payments.DiffChargeWithoutPayment {
		t.Fatalf("the key left flight: %+v; want a charge without its payment", rec)
	}
	sealed := func(int) []idem.Record {
		return []idem.Record{key(idemhttp.SealKey([]byte("0123456789abcdef0123"), "acme", "pay-1"))}
	}
	if rec := run(time.Minute, sealed); rec.SealedInFlight != 1 || rec.DifferenceCount != 1 || rec.Differences[0].Kind != payments.DiffChargeWithoutPayment {
		t.Fatalf("a sealed key: %+v; want it counted, and the charge without its payment", rec)
	}
}
