package payments_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/acquirer"
	"github.com/idem-go/idem/cmd/idem/internal/payments"
	"github.com/idem-go/idem/idemsqlite"
)

// listHook is a card network client's transport that runs before and after
// every read of the charges' list, and keeps every charge the list handed
// out: a test places payments between Reconcile's reads with it, at the
// moment it chooses.
type listHook struct {
	before, after func()
	mu            sync.Mutex
	seen          []acquirer.Charge
}

func (h *listHook) RoundTrip(r *http.Request) (*http.Response, error) {
	list := r.Method == http.MethodGet && r.URL.Path == "/v1/charges"
	if list && h.before != nil {
		h.before()
		h.before = nil
	}
	resp, err := http.DefaultTransport.RoundTrip(r)
	if err != nil || !list {
		return resp, err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	resp.Body = io.NopCloser(bytes.NewReader(body))
	var page acquirer.ChargeList
	if err := json.Unmarshal(body, &page); err == nil {
		h.mu.Lock()
		h.seen = append(h.seen, page.Data...)
		h.mu.Unlock()
	}
	if h.after != nil {
		h.after()
		h.after = nil
	}
	return resp, nil
}

// Payments made while Reconcile reads are never differences, whichever of
// its reads they fall between: one is made just before the network's
// charges are read (its charge is in them, its payment was not read yet),
// one just after (its payment is committed before Reconcile could have
// read it last).
func TestReconcileLivePaymentsBetweenReads(t *testing.T) {
	t.Parallel()
	forEachBackend(t, []backend{onSQLite, onPostgres}, func(t *testing.T, on backend) {
		var (
			net    *acquirer.Client
			netURL string
		)
		e := newEnvOn(t, on, func(c *payments.Config) { net, netURL = cardNetworkAt(t, c) })
		since := time.Now().Add(-time.Hour)
		if e.clock != nil {
			since = e.clock.Now().Add(-time.Hour)
		}
		acct := e.createAccount(keyA, 10_000, "EUR")
		e.expect(req{method: "POST", path: "/v1/payments", idemKey: "before", body: payBody(acct.ID, 100, "EUR")}, http.StatusCreated)
		hook := &listHook{
			before: func() {
				e.expect(req{method: "POST", path: "/v1/payments", idemKey: "between-1", body: payBody(acct.ID, 200, "EUR")}, http.StatusCreated)
			},
			after: func() {
				e.expect(req{method: "POST", path: "/v1/payments", idemKey: "between-2", body: payBody(acct.ID, 300, "EUR")}, http.StatusCreated)
			},
		}
		reader := readerOf(t, netURL, hook)
		rec, err := payments.Reconcile(t.Context(), e.cfg.DB, e.cfg.Postgres, reader, since, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(rec.Differences) != 0 {
			t.Fatalf("payments made during the reads: %v; want no difference", rec.Differences)
		}
		if rec.Payments < 1 || rec.Charges < rec.Payments {
			t.Fatalf("reconciled %d payments, %d charges; want at least the one made before", rec.Payments, rec.Charges)
		}
		// Run again, after the load: everything agrees, all three counted.
		rec, err = payments.Reconcile(t.Context(), e.cfg.DB, e.cfg.Postgres, net, since, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(rec.Differences) != 0 || rec.Payments != 3 || rec.Charges != 3 {
			t.Fatalf("after the load: %+v; want 3 payments, 3 charges, no difference", rec)
		}
	})
}

// readerOf is a client of the card network at url through hook.
func readerOf(t *testing.T, url string, hook http.RoundTripper) *acquirer.Client {
	t.Helper()
	c, err := acquirer.NewClient(acquirer.ClientConfig{URL: url, APIKey: "net-key", Transport: hook})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// --since is honoured at the card network: charges made before it, less
// the key horizon in which a double charge may pair an earlier charge with
// a later one, are not handed to Reconcile at all, however many there are.
func TestReconcileSinceAtTheNetwork(t *testing.T) {
	t.Parallel()
	clock := &manualClock{now: time.Date(2025, 3, 1, 9, 0, 0, 0, time.UTC)}
	adb, err := idemsqlite.Open(filepath.Join(t.TempDir(), "acquirer.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { adb.Close() })
	srv, err := acquirer.New(t.Context(), acquirer.Config{DB: adb, APIKey: "net-key", Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	charger, err := acquirer.NewClient(acquirer.ClientConfig{URL: hs.URL, APIKey: "net-key"})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"old-1", "old-2"} {
		if _, err := charger.Charge(t.Context(), k, acquirer.ChargeRequest{Amount: 100, Currency: "EUR", Reference: "acct-old"}); err != nil {
			t.Fatal(err)
		}
	}
	clock.Advance(48 * time.Hour)
	if _, err := charger.Charge(t.Context(), "new-1", acquirer.ChargeRequest{Amount: 100, Currency: "EUR", Reference: "acct-new"}); err != nil {
		t.Fatal(err)
	}
	db := migratedSQLite(t)
	since := clock.Now().Add(-time.Hour)
	hook := &listHook{}
	rec, err := payments.Reconcile(t.Context(), db, nil, readerOf(t, hs.URL, hook), since, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range hook.seen {
		if c.CreatedAt.Before(since.Add(-payments.DefaultKeyHorizon - time.Hour)) {
			t.Errorf("the network handed over charge %s of %s, before --since %s", c.ID, c.CreatedAt, since)
		}
	}
	if rec.Charges != 1 || len(rec.Differences) != 1 || rec.Differences[0].Kind != payments.DiffChargeWithoutPayment {
		t.Fatalf("reconciliation since %s: %+v; want the one new charge, which no payment records", since, rec)
	}
}

// migratedSQLite is a payments database with its schema and no payment.
func migratedSQLite(t *testing.T) *idemsqlite.DB {
	t.Helper()
	db, err := idemsqlite.Open(filepath.Join(t.TempDir(), "payments.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := payments.Migrate(t.Context(), db); err != nil {
		t.Fatal(err)
	}
	return db
}

// Reconcile is a read-only audit: a database whose schema is not there gets
// a clear error, and is left without it.
func TestReconcileNeverMigrates(t *testing.T) {
	t.Parallel()
	db, err := idemsqlite.Open(filepath.Join(t.TempDir(), "bare.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	var cfg payments.Config
	net := cardNetwork(t, &cfg)
	_, err = payments.Reconcile(t.Context(), db, nil, net, time.Time{}, nil)
	if err == nil || !strings.Contains(err.Error(), "idem migrate") {
		t.Fatalf("reconcile of a database never migrated: %v; want an error that says to migrate it", err)
	}
	var n int
	if err := db.Reader().QueryRow(`SELECT count(*) FROM sqlite_master WHERE name = 'payments'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatal("reconcile created the payments table")
	}
}

// cardNetworkAt is cardNetwork, and the network's URL.
func cardNetworkAt(t *testing.T, cfg *payments.Config) (*acquirer.Client, string) {
	t.Helper()
	db, err := idemsqlite.Open(filepath.Join(t.TempDir(), "acquirer.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	srv, err := acquirer.New(t.Context(), acquirer.Config{DB: db, APIKey: "net-key"})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	c, err := acquirer.NewClient(acquirer.ClientConfig{URL: hs.URL, APIKey: "net-key"})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Acquirer = c
	return c, hs.URL
}

// The console's formatter of the lab's recovery points says what a
// payment stopped after its charge is: its ID, amount, account and tenant,
// and the digest the card network names it by, never the client's key.
func TestShowPointOfAStoppedPayment(t *testing.T) {
	t.Parallel()
	var crashes crashCounter
	var net *acquirer.Client
	e := newEnv(t, func(c *payments.Config) {
		net = cardNetwork(t, c)
		c.Crash = crashes.crash
		c.KeyLease = time.Second
	})
	acct := e.createAccount(keyA, 10_000, "EUR")
	q := req{method: "POST", path: "/v1/payments", idemKey: "stopped-secret-key", fault: "crash-after-charge", body: payBody(acct.ID, 200, "EUR")}
	if _, err := e.sendAlone(q); err == nil {
		t.Fatal("crash-after-charge answered")
	}
	e.clock.Advance(2 * time.Second)
	rs, ok := e.keys.(idem.Recoverer)
	if !ok {
		t.Fatalf("the key store %T keeps no recovery points", e.keys)
	}
	recs, err := rs.Abandoned(t.Context(), 10)
	if err != nil || len(recs) != 1 {
		t.Fatalf("abandoned: %v, %v; want the stopped payment", recs, err)
	}
	fields, err := payments.ShowPoint(nil)(t.Context(), recs[0])
	if err != nil {
		t.Fatal(err)
	}
	shown := map[string]string{}
	for _, f := range fields {
		shown[f.Name] = f.Value
		if strings.Contains(f.Value, "stopped-secret-key") {
			t.Errorf("field %s shows the client's key: %q", f.Name, f.Value)
		}
	}
	if shown["amount"] != "200 EUR" || shown["account"] != acct.ID || !strings.HasPrefix(shown["payment"], "pay_") ||
		!strings.HasPrefix(shown["card network's key digest"], "ck1_") || shown["tenant"] == "" {
		t.Fatalf("shown %v; want the payment, 200 EUR, account %s, its tenant and key digest", shown, acct.ID)
	}
	// Given the card network, the page shows its answer: the charge made
	// under the payment's key before the crash.
	fields, err = payments.ShowPointAt(nil, net)(t.Context(), recs[0])
	if err != nil {
		t.Fatal(err)
	}
	if got := fields[len(fields)-1]; got.Name != "card network's answer" || !strings.HasPrefix(got.Value, "charged: charge ") || !strings.Contains(got.Value, " of 200 EUR at ") {
		t.Fatalf("the card network's answer: %+v; want the one charge of 200 EUR", got)
	}
}

// What Reconcile holds stays bounded by its window however long the
// history: over a history many times the window, with a difference of
// every kind in it and a payment whose charge is far from it in time (its
// charge is then asked for alone), it holds at most a few windows at once,
// and finds what a window as long as the history finds, streamed to
// OnDifference when that is set.
func TestReconcileMemoryBounded(t *testing.T) {
	t.Parallel()
	forEachBackend(t, []backend{onSQLite, onPostgres}, func(t *testing.T, on backend) {
		var net *acquirer.Client
		e := newEnvOn(t, on, func(c *payments.Config) { net = clockedCardNetwork(t, c, c.Clock) })
		acct := e.createAccount(keyA, 10_000_000, "EUR")
		const n, window = 160, 10
		var ids []string
		for i := range n {
			r := e.expect(req{method: "POST", path: "/v1/payments", idemKey: fmt.Sprintf("p-%d", i), body: payBody(acct.ID, int64(100+i%7), "EUR")}, http.StatusCreated)
			ids = append(ids, decode[payment](t, r).ID)
			e.clock.Advance(37 * time.Second)
			switch i {
			case 5: // p-5 charged again, beside the service: charged twice, and a charge no payment records
				meta := map[string]string{"tenant": tenantA, payments.MetaKeyDigest: payments.ClientKeyDigest(tenantA, "p-5")}
				if _, err := net.Charge(t.Context(), "again-p-5", acquirer.ChargeRequest{Amount: 105, Currency: "EUR", Reference: acct.ID, Metadata: meta}); err != nil {
					t.Fatal(err)
				}
			case n / 2: // a charge of no payment
				meta := map[string]string{"tenant": tenantA, payments.MetaKeyDigest: payments.ClientKeyDigest(tenantA, "nobody")}
				if _, err := net.Charge(t.Context(), "stray", acquirer.ChargeRequest{Amount: 999, Currency: "EUR", Reference: acct.ID, Metadata: meta}); err != nil {
					t.Fatal(err)
				}
			}
		}
		// A payment recording a charge the network does not have (and its
		// own charge left without a payment), one of another amount than
		// its charge, and one stamped two hours before its charge.
		e.exec(t, `UPDATE payments SET charge_id = 'ch_gone' WHERE id = `+e.param(1), ids[n/3])
		e.exec(t, `UPDATE payments SET amount = amount + 1 WHERE id = `+e.param(1), ids[2*n/3])
		e.exec(t, `UPDATE payments SET created_at = `+e.param(1)+` WHERE id = `+e.param(2), e.timeArg(e.clock.Now().Add(-time.Duration(n)*37*time.Second+10*time.Second-2*time.Hour)), ids[1])

		since := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
		whole, err := payments.Reconcile(t.Context(), e.cfg.DB, e.cfg.Postgres, net, since, &payments.ReconcileOptions{Window: 100_000})
		if err != nil {
			t.Fatal(err)
		}
		var streamed []payments.Difference
		bounded, err := payments.Reconcile(t.Context(), e.cfg.DB, e.cfg.Postgres, net, since, &payments.ReconcileOptions{Window: window,
			OnDifference: func(d payments.Difference) error { streamed = append(streamed, d); return nil }})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%d payments, %d charges: the whole history held %d at its peak, a window of %d held %d", bounded.Payments, bounded.Charges, whole.PeakHeld, window, bounded.PeakHeld)
		if bounded.Charges < 10*window || bounded.Payments != n {
			t.Fatalf("a history of %d payments and %d charges; want %d payments, more than ten windows", bounded.Payments, bounded.Charges, n)
		}
		if bounded.PeakHeld > 4*window || bounded.PeakHeld == 0 {
			t.Errorf("held %d at once with a window of %d; want at most %d", bounded.PeakHeld, window, 4*window)
		}
		if whole.PeakHeld < n {
			t.Errorf("the whole history held %d at once; want all %d payments (the count counts nothing)", whole.PeakHeld, n)
		}
		if len(bounded.Differences) != 0 || bounded.DifferenceCount != len(streamed) {
			t.Errorf("with OnDifference: %d differences kept, %d counted, %d streamed; want none kept, every one streamed", len(bounded.Differences), bounded.DifferenceCount, len(streamed))
		}
		if got, want := sortedDiffs(streamed), sortedDiffs(whole.Differences); !slices.Equal(got, want) {
			t.Errorf("a window of %d found\n%s\nthe whole history\n%s", window, strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
		if bounded.Payments != whole.Payments || bounded.Charges != whole.Charges || len(bounded.Pending) != len(whole.Pending) {
			t.Errorf("a window compared %d payments, %d charges, %d pending; the whole history %d, %d, %d",
				bounded.Payments, bounded.Charges, len(bounded.Pending), whole.Payments, whole.Charges, len(whole.Pending))
		}
		kinds := map[string]int{}
		for _, d := range whole.Differences {
			kinds[d.Kind]++
		}
		want := map[string]int{payments.DiffChargeWithoutPayment: 3, payments.DiffChargedTwice: 1, payments.DiffPaymentWithoutCharge: 1, payments.DiffAmount: 1}
		if !maps.Equal(kinds, want) {
			t.Errorf("differences by kind %v; want %v:\n%s", kinds, want, strings.Join(sortedDiffs(whole.Differences), "\n"))
		}
	})
}

func sortedDiffs(ds []payments.Difference) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = d.String()
	}
	slices.Sort(out)
	return out
}

// clockedCardNetwork is cardNetwork on clock: the service's, so that both
// sides stamp their rows with one time.
func clockedCardNetwork(t *testing.T, cfg *payments.Config, clock idem.Clock) *acquirer.Client {
	t.Helper()
	db, err := idemsqlite.Open(filepath.Join(t.TempDir(), "acquirer.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	srv, err := acquirer.New(t.Context(), acquirer.Config{DB: db, APIKey: "net-key", Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	c, err := acquirer.NewClient(acquirer.ClientConfig{URL: hs.URL, APIKey: "net-key"})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Acquirer = c
	return c
}

// exec runs a statement on the service's database, beside the service.
func (e *env) exec(t *testing.T, q string, args ...any) {
	t.Helper()
	var err error
	if e.cfg.DB != nil {
		_, err = e.cfg.DB.Writer().ExecContext(t.Context(), q, args...)
	} else {
		_, err = e.cfg.Postgres.Pool().Exec(t.Context(), q, args...)
	}
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

// param is the placeholder of a statement's nth parameter on e's database.
func (e *env) param(n int) string {
	if e.cfg.DB != nil {
		return "?"
	}
	return fmt.Sprintf("$%d", n)
}

// timeArg is t as e's database keeps a payment's time.
func (e *env) timeArg(t time.Time) any {
	if e.cfg.DB != nil {
		return t.UTC().Format("2006-01-02T15:04:05.000000000Z")
	}
	return t
}

// A window is a bound on what Reconcile holds, not an amount it takes up
// front: the largest one on a history of one payment holds that payment.
func TestReconcileWindowIsNotAllocatedUpFront(t *testing.T) {
	t.Parallel()
	forEachBackend(t, []backend{onSQLite, onPostgres}, func(t *testing.T, on backend) {
		var net *acquirer.Client
		e := newEnvOn(t, on, func(c *payments.Config) { net = clockedCardNetwork(t, c, c.Clock) })
		acct := e.createAccount(keyA, 10_000, "EUR")
		e.expect(req{method: "POST", path: "/v1/payments", idemKey: "p-1", body: payBody(acct.ID, 100, "EUR")}, http.StatusCreated)
		rec, err := payments.Reconcile(t.Context(), e.cfg.DB, e.cfg.Postgres, net, time.Time{}, &payments.ReconcileOptions{Window: math.MaxInt})
		if err != nil {
			t.Fatal(err)
		}
		if rec.Payments != 1 || rec.Charges != 1 || rec.DifferenceCount != 0 || rec.PeakHeld > 2 {
			t.Errorf("compared %d payments and %d charges, %d differences, holding %d; want 1, 1, none, at most 2", rec.Payments, rec.Charges, rec.DifferenceCount, rec.PeakHeld)
		}
	})
}
