package payments_test

import (
	"net/http/httptest"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/idem-go/idem/cmd/idem/internal/acquirer"
	"github.com/idem-go/idem/cmd/idem/internal/payments"
	"github.com/idem-go/idem/idemsqlite"
)

// Two charges of one logical payment on either side of --since are a
// double charge: Reconcile looks back --key-horizon before since for the
// earlier charges of the logical payments it compares. Charges made
// before since are compared with nothing else: two of them both before
// it are outside the window, and a charge more than the horizon before a
// later one is not its double.
func TestReconcileDoubleChargeAcrossSince(t *testing.T) {
	t.Parallel()
	start := time.Date(2025, 3, 1, 9, 0, 0, 0, time.UTC)
	clock := &manualClock{now: start}
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
	net, err := acquirer.NewClient(acquirer.ClientConfig{URL: hs.URL, APIKey: "net-key"})
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]string{}
	charge := func(at time.Duration, logical, name string) {
		t.Helper()
		clock.mu.Lock()
		clock.now = start.Add(at)
		clock.mu.Unlock()
		meta := map[string]string{"tenant": tenantA, payments.MetaKeyDigest: payments.ClientKeyDigest(tenantA, logical)}
		c, err := net.Charge(t.Context(), name, acquirer.ChargeRequest{Amount: 100, Currency: "EUR", Reference: "acct-1", Metadata: meta})
		if err != nil {
			t.Fatal(err)
		}
		ids[name] = c.ID
	}
	const horizon = 3 * time.Hour
	since := start.Add(5 * time.Hour)
	charge(0, "k3", "k3-a")             // 5h before since: past the horizon of k3-b
	charge(2*time.Hour, "k2", "k2-a")   // k2: both before since
	charge(3*time.Hour, "k2", "k2-b")   //
	charge(4*time.Hour, "k1", "k1-a")   // k1: an hour before since ...
	charge(6*time.Hour, "k1", "k1-b")   // ... and an hour after
	charge(6*time.Hour+1, "k3", "k3-b") //
	db := migratedSQLite(t)
	rec, err := payments.Reconcile(t.Context(), db, nil, net, since, &payments.ReconcileOptions{KeyHorizon: horizon})
	if err != nil {
		t.Fatal(err)
	}
	var twice, stray []payments.Difference
	for _, d := range rec.Differences {
		switch d.Kind {
		case payments.DiffChargedTwice:
			twice = append(twice, d)
		case payments.DiffChargeWithoutPayment:
			stray = append(stray, d)
		default:
			t.Errorf("unexpected difference %s", d)
		}
	}
	if len(twice) != 1 || !slices.Equal(twice[0].Charges, []string{ids["k1-a"], ids["k1-b"]}) {
		t.Fatalf("double charges since %s: %v; want k1's two charges %s and %s, on either side of it", since, twice, ids["k1-a"], ids["k1-b"])
	}
	if rec.Charges != 2 || len(stray) != 2 {
		t.Fatalf("compared %d charges, %d without a payment (%v); want the 2 made since %s, only", rec.Charges, len(stray), stray, since)
	}
}
