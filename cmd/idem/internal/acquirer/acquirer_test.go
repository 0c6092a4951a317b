package acquirer_test

import (
	"encoding/json"
	"errors"
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
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemsqlite"
)

// start runs an acquirer with cfg on a fresh file and returns its URL.
func start(t *testing.T, cfg acquirer.Config) string {
	t.Helper()
	db, err := idemsqlite.Open(filepath.Join(t.TempDir(), "acquirer.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	cfg.DB = db
	s, err := acquirer.New(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	return srv.URL
}

func client(t *testing.T, url, apiKey string) *acquirer.Client {
	t.Helper()
	c, err := acquirer.NewClient(acquirer.ClientConfig{URL: url, APIKey: apiKey,
		Policy: idem.RetryPolicy{MaxAttempts: 6, Base: time.Millisecond, Cap: 5 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

var teapot = acquirer.ChargeRequest{Amount: 1250, Currency: "EUR", Reference: "card_4242",
	Metadata: map[string]string{"payment_key": "k-1"}}

func TestChargeOncePerKey(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	c := client(t, start(t, acquirer.Config{}), "")
	first, err := c.Charge(ctx, "key-1", teapot)
	if err != nil {
		t.Fatal(err)
	}
	again, err := c.Charge(ctx, "key-1", teapot)
	if err != nil || again.ID != first.ID {
		t.Fatalf("the same key again = %+v, %v; want charge %s replayed", again, err, first.ID)
	}
	other, err := c.Charge(ctx, "key-2", teapot)
	if err != nil || other.ID == first.ID {
		t.Fatalf("another key = %+v, %v; want a new charge", other, err)
	}
	// The same key with another charge is refused, not charged.
	changed := teapot
	changed.Amount = 99
	var refused *acquirer.Error
	if _, err := c.Charge(ctx, "key-1", changed); !errors.As(err, &refused) || refused.Status != http.StatusUnprocessableEntity {
		t.Fatalf("the same key with another amount = %v, want 422", err)
	}
	all, err := c.Charges(ctx, "card_4242")
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 2 || all[0].ID != first.ID || all[0].IdempotencyKey != "key-1" || all[0].Metadata["payment_key"] != "k-1" ||
		all[1].IdempotencyKey != "key-2" {
		t.Fatalf("charges = %+v", all)
	}
}

// Many attempts at one key at once make one charge.
func TestConcurrentAttemptsChargeOnce(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	c := client(t, start(t, acquirer.Config{}), "")
	var wg sync.WaitGroup
	ids := make([]string, 16)
	for i := range ids {
		wg.Go(func() {
			ch, err := c.Charge(ctx, "one-key", teapot)
			if err != nil {
				t.Error(err)
			}
			ids[i] = ch.ID
		})
	}
	wg.Wait()
	all, err := c.Charges(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 1 {
		t.Fatalf("%d charges for one key, want 1", len(all))
	}
	for _, id := range ids {
		if id != all[0].ID {
			t.Fatalf("an attempt got %s, want %s", id, all[0].ID)
		}
	}
}

func TestDeclinedIsKept(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	c := client(t, start(t, acquirer.Config{}), "")
	req := teapot
	req.Reference = acquirer.DeclinedPrefix + "card"
	for range 2 {
		if _, err := c.Charge(ctx, "k", req); !errors.Is(err, acquirer.ErrDeclined) {
			t.Fatalf("a declined card = %v, want ErrDeclined", err)
		}
	}
	if all, err := c.Charges(ctx, ""); err != nil || len(all) != 0 {
		t.Fatalf("charges after a decline: %d, %v", len(all), err)
	}
}

// A random refusal and a dropped answer on the way, then the retry with
// the same key gets the charge the dropped answer carried: one charge.
func TestRandomFaultsChargeOnce(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	draws := []float64{0.1, 0.7, 0.95}
	var mu sync.Mutex
	url := start(t, acquirer.Config{Faults: true, FaultRate: 0.8, Rand: func() float64 {
		mu.Lock()
		defer mu.Unlock()
		x := draws[0]
		if len(draws) > 1 {
			draws = draws[1:]
		}
		return x
	}})
	ch, err := client(t, url, "").Charge(ctx, "key-1", teapot)
	if err != nil {
		t.Fatal(err)
	}
	all, err := client(t, url, "").Charges(ctx, "")
	if err != nil || len(all) != 1 || all[0].ID != ch.ID {
		t.Fatalf("charges = %+v, %v; want only %s", all, err, ch.ID)
	}
}

func post(t *testing.T, url, key, fault, body string) (*http.Response, error) {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, url+"/v1/charges", strings.NewReader(body))
	req.Header.Set(idemhttp.HeaderKey, key)
	if fault != "" {
		req.Header.Set(acquirer.HeaderFault, fault)
	}
	resp, err := http.DefaultClient.Do(req)
	if err == nil {
		t.Cleanup(func() { resp.Body.Close() })
	}
	return resp, err
}

func TestHeaderFaults(t *testing.T) {
	t.Parallel()
	url := start(t, acquirer.Config{Faults: true})
	body := `{"amount": 500, "currency": "USD", "reference": "card_1"}`
	if resp, err := post(t, url, "k1", "fail-before-commit", body); err != nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("fail-before-commit = %v, %v; want 503", resp, err)
	}
	if _, err := post(t, url, "k1", "drop-after-commit", body); err == nil {
		t.Fatal("drop-after-commit answered")
	}
	resp, err := post(t, url, "k1", "", body)
	if err != nil || resp.StatusCode != http.StatusCreated || resp.Header.Get(idemhttp.HeaderReplayed) != "true" {
		t.Fatalf("the retry = %v, %v; want the dropped answer replayed", resp, err)
	}
	if resp, err := post(t, url, "k2", "explode", body); err != nil || resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("an unknown fault = %v, %v; want 400", resp, err)
	}
	all, err := client(t, url, "").Charges(t.Context(), "")
	if err != nil || len(all) != 1 {
		t.Fatalf("%d charges, %v; want the one the dropped answer made", len(all), err)
	}
}

func TestAPIKey(t *testing.T) {
	t.Parallel()
	url := start(t, acquirer.Config{APIKey: "s3cret"})
	var refused *acquirer.Error
	if _, err := client(t, url, "wrong").Charge(t.Context(), "k", teapot); !errors.As(err, &refused) || refused.Status != http.StatusUnauthorized {
		t.Fatalf("a wrong key = %v, want 401", err)
	}
	if _, err := client(t, url, "s3cret").Charge(t.Context(), "k", teapot); err != nil {
		t.Fatal(err)
	}
}

func TestRefunds(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	c := client(t, start(t, acquirer.Config{}), "")
	ch, err := c.Charge(ctx, "k", teapot)
	if err != nil {
		t.Fatal(err)
	}
	part, err := c.Refund(ctx, "r1", ch.ID, 250)
	if err != nil || part.Amount != 250 {
		t.Fatalf("refund 250 = %+v, %v", part, err)
	}
	if again, err := c.Refund(ctx, "r1", ch.ID, 250); err != nil || again.ID != part.ID {
		t.Fatalf("the same refund again = %+v, %v; want %s replayed", again, err, part.ID)
	}
	rest, err := c.Refund(ctx, "r2", ch.ID, 0)
	if err != nil || rest.Amount != 1000 {
		t.Fatalf("refund the rest = %+v, %v; want 1000", rest, err)
	}
	var refused *acquirer.Error
	if _, err := c.Refund(ctx, "r3", ch.ID, 1); !errors.As(err, &refused) || refused.Status != http.StatusUnprocessableEntity {
		t.Fatalf("a refund past the charge = %v, want 422", err)
	}
	all, err := c.Charges(ctx, "")
	if err != nil || all[0].AmountRefunded != 1250 {
		t.Fatalf("charge after refunds = %+v, %v", all, err)
	}
}

func TestListPages(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url := start(t, acquirer.Config{})
	c := client(t, url, "")
	var made []string
	for i := range 5 {
		ch, err := c.Charge(ctx, "k"+string(rune('a'+i)), teapot)
		if err != nil {
			t.Fatal(err)
		}
		made = append(made, ch.ID)
	}
	var got []string
	after := ""
	for pages := 0; ; pages++ {
		u := url + "/v1/charges?limit=2"
		if after != "" {
			u += "&starting_after=" + after
		}
		resp, err := http.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		var page acquirer.ChargeList
		err = json.NewDecoder(resp.Body).Decode(&page)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		for _, ch := range page.Data {
			got = append(got, ch.ID)
		}
		if !page.HasMore {
			break
		}
		after = page.Data[len(page.Data)-1].ID
		if pages > 5 {
			t.Fatal("pages without end")
		}
	}
	if strings.Join(got, ",") != strings.Join(made, ",") {
		t.Fatalf("paged = %v, want %v", got, made)
	}
	if resp, err := http.Get(url + "/v1/charges?limit=0"); err != nil || resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("limit=0 = %v, %v; want 400", resp, err)
	}
}

// The client streams the list: EachChargePage hands over one page of at
// most limit charges at a time, in the order they were made, from since
// on, and stops at fn's error; ChargeByID finds one charge alone, and says
// when the network has none.
func TestEachChargePage(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	clock := &stepClock{now: time.Date(2025, 3, 1, 9, 0, 0, 0, time.UTC)}
	url := start(t, acquirer.Config{Clock: clock})
	c := client(t, url, "")
	var made []string
	for i := range 7 {
		ch, err := c.Charge(ctx, "k"+string(rune('a'+i)), teapot)
		if err != nil {
			t.Fatal(err)
		}
		made = append(made, ch.ID)
		clock.advance(time.Minute)
	}
	var sizes []int
	var got []string
	err := c.EachChargePage(ctx, time.Date(2025, 3, 1, 9, 2, 0, 0, time.UTC), 2, func(page []acquirer.Charge) error {
		sizes = append(sizes, len(page))
		for _, ch := range page {
			got = append(got, ch.ID)
		}
		return nil
	})
	if err != nil || !slices.Equal(got, made[2:]) || !slices.Equal(sizes, []int{2, 2, 1}) {
		t.Fatalf("pages of 2 since the third charge: %v in pages %v (%v); want %v in pages [2 2 1]", got, sizes, err, made[2:])
	}
	stop := errors.New("enough")
	pages := 0
	if err := c.EachChargePage(ctx, time.Time{}, 3, func([]acquirer.Charge) error { pages++; return stop }); !errors.Is(err, stop) || pages != 1 {
		t.Fatalf("fn's error: %v after %d pages; want it returned after the first", err, pages)
	}
	if ch, ok, err := c.ChargeByID(ctx, made[4]); err != nil || !ok || ch.ID != made[4] {
		t.Fatalf("ChargeByID(%s) = %v, %v, %v; want it", made[4], ch.ID, ok, err)
	}
	if _, ok, err := c.ChargeByID(ctx, "ch_none"); err != nil || ok {
		t.Fatalf("ChargeByID(ch_none) = %v, %v; want not found, no error", ok, err)
	}
}

// stepClock is a clock the test moves.
type stepClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *stepClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *stepClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}
