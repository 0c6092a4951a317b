package consoletest_test

import (
	"context"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/console"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemsqlite"
)

// The "Unknown outcomes" page lists an execution stopped at a recovery
// point once its holder's lease ended: being finished within the bound,
// unknown past it, with what the point says shown as text (a point whose
// data is a script shows as the script's text). The overview counts them
// and links to the page.
func TestUnknownOutcomesPage(t *testing.T) {
	t.Parallel()
	clock := idemmem.NewClock(time.Date(2026, 1, 1, 9, 0, 0, 0, time.UTC))
	kdb, err := idemsqlite.Open(filepath.Join(t.TempDir(), "keys.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { kdb.Close() })
	store, err := idemsqlite.NewStore(t.Context(), kdb, &idemsqlite.StoreConfig{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	show := func(_ context.Context, rec idem.Record) ([]console.PointField, error) {
		return []console.PointField{{Name: "payment", Value: string(rec.Recovery.Data)}}, nil
	}
	w := newWorld(t, &console.Config{Clock: clock, Recoveries: store, ShowPoint: show, CompletionBound: 30 * time.Second})

	c, err := store.Claim(t.Context(), idem.ClaimRequest{Scope: "acme", Key: "pay-1", Fingerprint: "fp", Lease: time.Second, TTL: 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	const hostile = `<script>alert(1)</script>`
	if err := store.SaveRecovery(t.Context(), idem.Ref{Scope: "acme", Key: "pay-1", Token: c.Token}, idem.RecoveryPoint{Name: "charging", Data: []byte(hostile)}); err != nil {
		t.Fatal(err)
	}
	page := func(path string) string {
		t.Helper()
		rec := w.do(req{path: path, token: aliceToken})
		if rec.Code != http.StatusOK {
			t.Fatalf("GET %s: %d %s", path, rec.Code, rec.Body)
		}
		return rec.Body.String()
	}
	if body := page("/console/outcomes"); !strings.Contains(body, "No execution is stopped") {
		t.Fatalf("while its holder's lease runs: %s", body)
	}
	clock.Advance(2 * time.Second)
	body := page("/console/outcomes")
	if !strings.Contains(body, "being finished</td>") || !strings.Contains(body, "pay-1") || !strings.Contains(body, "charging") {
		t.Fatalf("within the bound: want pay-1 being finished at charging:\n%s", body)
	}
	if strings.Contains(body, hostile) || !strings.Contains(body, "&lt;script&gt;alert(1)&lt;/script&gt;") {
		t.Fatalf("the point's data is not shown as text:\n%s", body)
	}
	if ov := page("/console/"); !strings.Contains(ov, `href="/console/outcomes">0 unknown outcome(s)</a>, 1 being finished`) {
		t.Fatalf("overview within the bound:\n%s", ov)
	}
	clock.Advance(time.Minute)
	if body := page("/console/outcomes"); !strings.Contains(body, ">unknown</strong>") {
		t.Fatalf("past the bound: want pay-1 unknown:\n%s", body)
	}
	if ov := page("/console/"); !strings.Contains(ov, `1 unknown outcome(s)</a>, 0 being finished`) {
		t.Fatalf("overview past the bound:\n%s", ov)
	}

	plain := newWorld(t, nil)
	if rec := plain.do(req{path: "/console/outcomes", token: aliceToken}); rec.Code != http.StatusNotFound {
		t.Fatalf("the page without a key store: %d; want 404", rec.Code)
	}
	if _, err := console.New(&console.Config{Letters: plain.svc, Operators: []console.Operator{{Name: "a", Token: aliceToken}},
		CompletionBound: -time.Second}); err == nil {
		t.Fatal("a negative CompletionBound was accepted")
	}
}
