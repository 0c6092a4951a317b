package payments_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/idem-go/idem/cmd/idem/internal/payments"
)

// page is one answer of a paginated list.
type page[T any] struct {
	Data    []T  `json:"data"`
	HasMore bool `json:"has_more"`
}

type refund struct {
	ID        string    `json:"id"`
	PaymentID string    `json:"payment_id"`
	AccountID string    `json:"account_id"`
	Amount    int64     `json:"amount"`
	Currency  string    `json:"currency"`
	Reason    string    `json:"reason"`
	Status    string    `json:"status"`
	CreatedAt time.Time `json:"created_at"`
}

type deposit struct {
	ID     string `json:"id"`
	Amount int64  `json:"amount"`
}

var sqlAndPostgres = []backend{onSQLite, onPostgres}

// refundBackends add the two-store form, where the refund's origin, not the
// key's transaction, keeps a re-run from refunding twice.
var refundBackends = []backend{onSQLite, onPostgres, onPostgresRedis, onSQLiteRedis}

func ids[T any](list []T, id func(T) string) []string {
	out := make([]string, len(list))
	for i, v := range list {
		out[i] = id(v)
	}
	return out
}

func TestPaginationWalksForwardAndBack(t *testing.T) {
	t.Parallel()
	forEachBackend(t, sqlAndPostgres, func(t *testing.T, b backend) {
		e := newEnvOn(t, b, nil)
		acct := e.createAccount(keyA, 1_000_000, "KRW")
		const n = 250
		made := make([]string, 0, n)
		for i := range n {
			// Every tenth payment shares its time with the one before, so the
			// order must fall back on the id.
			if i%10 != 0 {
				e.clock.Advance(time.Millisecond)
			}
			p := decode[payment](t, e.expect(req{method: "POST", path: "/v1/payments", idemKey: fmt.Sprintf("walk-%d", i),
				body: payBody(acct.ID, 1, "KRW")}, http.StatusCreated))
			made = append(made, p.ID)
		}
		list := func(query string) page[payment] {
			t.Helper()
			return decode[page[payment]](t, e.expect(req{method: "GET", path: "/v1/accounts/" + acct.ID + "/payments?" + query}, http.StatusOK))
		}
		var forward [][]string
		var more []bool
		q := "limit=100"
		for range 10 {
			p := list(q)
			forward = append(forward, ids(p.Data, func(p payment) string { return p.ID }))
			more = append(more, p.HasMore)
			if !p.HasMore {
				break
			}
			q = "limit=100&starting_after=" + p.Data[len(p.Data)-1].ID
		}
		if len(forward) != 3 || len(forward[0]) != 100 || len(forward[1]) != 100 || len(forward[2]) != 50 || !slices.Equal(more, []bool{true, true, false}) {
			t.Fatalf("pages of %d, %d, %d... (has_more %v), want 100, 100, 50", len(forward[0]), len(forward[1]), len(forward[len(forward)-1]), more)
		}
		all := slices.Concat(forward...)
		// Newest first; among payments of the same time, the larger id first.
		got := list("limit=1000")
		if !slices.Equal(all, ids(got.Data, func(p payment) string { return p.ID })) || got.HasMore {
			t.Fatalf("the pages are not the whole list in order")
		}
		if len(all) != n || !sameSet(all, made) {
			t.Fatalf("the pages hold %d payments, want the %d made", len(all), n)
		}
		for i := 1; i < len(got.Data); i++ {
			a, b := got.Data[i-1], got.Data[i]
			if a.CreatedAt.Before(b.CreatedAt) || (a.CreatedAt.Equal(b.CreatedAt) && a.ID < b.ID) {
				t.Fatalf("not newest first at %d: %s %v then %s %v", i, a.ID, a.CreatedAt, b.ID, b.CreatedAt)
			}
		}
		// And back: the page before the third is the second, and before it the first.
		back := list("limit=100&ending_before=" + forward[2][0])
		if !slices.Equal(ids(back.Data, func(p payment) string { return p.ID }), forward[1]) || !back.HasMore {
			t.Fatalf("ending_before the third page gave %d payments (has_more %v), want the second page", len(back.Data), back.HasMore)
		}
		back = list("limit=100&ending_before=" + forward[1][0])
		if !slices.Equal(ids(back.Data, func(p payment) string { return p.ID }), forward[0]) || back.HasMore {
			t.Fatalf("ending_before the second page gave %d payments (has_more %v), want the first page and no more", len(back.Data), back.HasMore)
		}
		if p := list("ending_before=" + forward[0][0]); len(p.Data) != 0 || p.HasMore {
			t.Fatalf("ending_before the newest gave %d payments, want none", len(p.Data))
		}
		if p := list("starting_after=" + forward[2][49]); len(p.Data) != 0 || p.HasMore {
			t.Fatalf("starting_after the oldest gave %d payments, want none", len(p.Data))
		}
		if p := list(""); len(p.Data) != 100 || !p.HasMore {
			t.Fatalf("the default limit gave %d payments, want 100", len(p.Data))
		}

		// Deposits are paginated the same way.
		var deps []string
		for i := range 5 {
			e.clock.Advance(time.Millisecond)
			d := decode[deposit](t, e.expect(req{method: "POST", path: "/v1/accounts/" + acct.ID + "/deposits",
				idemKey: fmt.Sprintf("dep-%d", i), body: fmt.Sprintf(`{"amount":%d}`, i+1)}, http.StatusCreated))
			deps = append([]string{d.ID}, deps...)
		}
		dlist := func(query string) page[deposit] {
			t.Helper()
			return decode[page[deposit]](t, e.expect(req{method: "GET", path: "/v1/accounts/" + acct.ID + "/deposits?" + query}, http.StatusOK))
		}
		p1 := dlist("limit=2")
		p2 := dlist("limit=2&starting_after=" + p1.Data[1].ID)
		p3 := dlist("limit=2&starting_after=" + p2.Data[1].ID)
		walked := slices.Concat(ids(p1.Data, func(d deposit) string { return d.ID }), ids(p2.Data, func(d deposit) string { return d.ID }),
			ids(p3.Data, func(d deposit) string { return d.ID }))
		if !slices.Equal(walked, deps) || !p1.HasMore || !p2.HasMore || p3.HasMore {
			t.Fatalf("deposits walked %v (has_more %v %v %v), want %v", walked, p1.HasMore, p2.HasMore, p3.HasMore, deps)
		}
		if b := dlist("limit=2&ending_before=" + p3.Data[0].ID); !slices.Equal(ids(b.Data, func(d deposit) string { return d.ID }), deps[2:4]) || !b.HasMore {
			t.Fatalf("deposits ending_before the third page: %+v", b)
		}
	})
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

func TestBadCursorsAreRefused(t *testing.T) {
	t.Parallel()
	forEachBackend(t, sqlAndPostgres, func(t *testing.T, b backend) {
		e := newEnvOn(t, b, nil)
		acct := e.createAccount(keyA, 1_000, "KRW")
		other := e.createAccount(keyA, 1_000, "KRW")
		theirs := e.createAccount(keyB, 1_000, "KRW")
		mine := decode[payment](t, e.expect(req{method: "POST", path: "/v1/payments", idemKey: "p1", body: payBody(acct.ID, 1, "KRW")}, http.StatusCreated))
		ofOther := decode[payment](t, e.expect(req{method: "POST", path: "/v1/payments", idemKey: "p2", body: payBody(other.ID, 1, "KRW")}, http.StatusCreated))
		ofB := decode[payment](t, e.expect(req{method: "POST", path: "/v1/payments", apiKey: keyB, idemKey: "p3", body: payBody(theirs.ID, 1, "KRW")}, http.StatusCreated))
		dep := decode[deposit](t, e.expect(req{method: "POST", path: "/v1/accounts/" + acct.ID + "/deposits", idemKey: "d1", body: `{"amount":1}`}, http.StatusCreated))
		for _, tc := range []struct{ list, query string }{
			{"payments", "starting_after=" + ofB.ID},
			{"payments", "ending_before=" + ofB.ID},
			{"payments", "starting_after=" + ofOther.ID},
			{"payments", "starting_after=pay_doesnotexist"},
			{"payments", "starting_after=" + url.QueryEscape("pay_' OR 1=1 --")},
			{"payments", "ending_before="},
			{"payments", "starting_after=" + dep.ID},
			{"payments", "starting_after=" + mine.ID + "&ending_before=" + mine.ID},
			{"payments", "starting_after=" + mine.ID + "&starting_after=" + mine.ID},
			{"payments", "limit=1001"},
			{"payments", "limit=x"},
			{"deposits", "starting_after=" + mine.ID},
			{"deposits", "ending_before=dep_nope"},
			{"deposits", "limit=0"},
		} {
			r := e.do(req{method: "GET", path: "/v1/accounts/" + acct.ID + "/" + tc.list + "?" + tc.query})
			expectProblem(t, r, http.StatusBadRequest, "urn:idem:problem:invalid-request")
		}
		expectProblem(t, e.do(req{method: "GET", path: "/v1/accounts/" + theirs.ID + "/deposits"}), http.StatusNotFound, "urn:idem:problem:account-not-found")
		// Nothing changed.
		e.expectBalance(keyA, acct.ID, 1_000)
		e.expectPayments(keyA, acct.ID, 1)
	})
}

func refundBody(paymentID string, amount int64) string {
	if amount == 0 {
		return fmt.Sprintf(`{"payment_id":%q}`, paymentID)
	}
	return fmt.Sprintf(`{"payment_id":%q,"amount":%d,"reason":"requested_by_customer"}`, paymentID, amount)
}

func TestRefunds(t *testing.T) {
	t.Parallel()
	forEachBackend(t, refundBackends, func(t *testing.T, b backend) {
		e := newEnvOn(t, b, nil)
		acct := e.createAccount(keyA, 10_000, "KRW")
		pay := func(key string, amount int64) payment {
			return decode[payment](t, e.expect(req{method: "POST", path: "/v1/payments", idemKey: key, body: payBody(acct.ID, amount, "KRW")}, http.StatusCreated))
		}
		full, part := pay("full", 1_000), pay("part", 3_000)
		e.expectBalance(keyA, acct.ID, 6_000)

		// Without an amount: the whole payment.
		r := e.expect(req{method: "POST", path: "/v1/refunds", idemKey: "rf-full", body: refundBody(full.ID, 0)}, http.StatusCreated)
		rf := decode[refund](t, r)
		if rf.Amount != 1_000 || rf.PaymentID != full.ID || rf.AccountID != acct.ID || rf.Currency != "KRW" || rf.Status != "succeeded" {
			t.Fatalf("full refund = %+v", rf)
		}
		if loc := r.header.Get("Location"); loc != "/v1/refunds/"+rf.ID {
			t.Fatalf("Location = %q", loc)
		}
		e.expectBalance(keyA, acct.ID, 7_000)
		if got := decode[refund](t, e.expect(req{method: "GET", path: "/v1/refunds/" + rf.ID}, http.StatusOK)); got != rf {
			t.Fatalf("GET the refund = %+v, want %+v", got, rf)
		}
		expectProblem(t, e.do(req{method: "GET", path: "/v1/refunds/" + rf.ID, apiKey: keyB}), http.StatusNotFound, "urn:idem:problem:refund-not-found")
		// Refunded in full: nothing is left.
		expectProblem(t, e.do(req{method: "POST", path: "/v1/refunds", idemKey: "rf-full-again", body: refundBody(full.ID, 0)}),
			http.StatusConflict, "urn:idem:problem:refund-exceeds-payment")

		// Partial, twice, then over.
		e.expect(req{method: "POST", path: "/v1/refunds", idemKey: "rf-p1", body: refundBody(part.ID, 1_000)}, http.StatusCreated)
		second := e.expect(req{method: "POST", path: "/v1/refunds", idemKey: "rf-p2", body: refundBody(part.ID, 1_500)}, http.StatusCreated)
		e.expectBalance(keyA, acct.ID, 9_500)
		over := req{method: "POST", path: "/v1/refunds", idemKey: "rf-over", body: refundBody(part.ID, 501)}
		expectProblem(t, e.do(over), http.StatusConflict, "urn:idem:problem:refund-exceeds-payment")
		// Deterministic, so the key keeps the refusal.
		if again := e.do(over); again.status != http.StatusConflict || again.header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("the over-refund's duplicate = %s (replayed %q), want the kept 409", again, again.header.Get("Idempotent-Replayed"))
		}
		// A duplicate of a refund replays it and credits nothing.
		dup := e.expect(req{method: "POST", path: "/v1/refunds", idemKey: "rf-p2", body: refundBody(part.ID, 1_500)}, http.StatusCreated)
		if dup.header.Get("Idempotent-Replayed") != "true" || string(dup.body) != string(second.body) {
			t.Fatalf("duplicate = %s, want the replay of %s", dup, second)
		}
		e.expectBalance(keyA, acct.ID, 9_500)
		// The rest, by default.
		last := decode[refund](t, e.expect(req{method: "POST", path: "/v1/refunds", idemKey: "rf-rest", body: refundBody(part.ID, 0)}, http.StatusCreated))
		if last.Amount != 500 {
			t.Fatalf("the remaining refund = %d, want 500", last.Amount)
		}
		e.expectBalance(keyA, acct.ID, 10_000)

		// Bad requests change nothing.
		for _, bad := range []struct {
			q      req
			status int
			typ    string
		}{
			{req{method: "POST", path: "/v1/refunds", body: refundBody(part.ID, 1)}, 400, ""},
			{req{method: "POST", path: "/v1/refunds", idemKey: "b1", body: `{"amount":1}`}, 400, "urn:idem:problem:invalid-request"},
			{req{method: "POST", path: "/v1/refunds", idemKey: "b2", body: fmt.Sprintf(`{"payment_id":%q,"amount":0}`, part.ID)}, 400, "urn:idem:problem:invalid-request"},
			{req{method: "POST", path: "/v1/refunds", idemKey: "b3", body: fmt.Sprintf(`{"payment_id":%q,"amount":-5}`, part.ID)}, 400, "urn:idem:problem:invalid-request"},
			{req{method: "POST", path: "/v1/refunds", idemKey: "b4", body: fmt.Sprintf(`{"payment_id":%q,"reason":"a\u0001b"}`, part.ID)}, 400, "urn:idem:problem:invalid-request"},
			{req{method: "POST", path: "/v1/refunds", idemKey: "b5", body: refundBody("pay_nope", 1)}, 404, "urn:idem:problem:payment-not-found"},
			{req{method: "POST", path: "/v1/refunds", apiKey: keyB, idemKey: "b6", body: refundBody(full.ID, 1)}, 404, "urn:idem:problem:payment-not-found"},
		} {
			r := e.do(bad.q)
			if bad.typ == "" {
				if r.status != bad.status {
					t.Fatalf("%s: got %s, want %d", bad.q.body, r, bad.status)
				}
				continue
			}
			expectProblem(t, r, bad.status, bad.typ)
		}
		e.expectBalance(keyA, acct.ID, 10_000)
		if n := refundsInDB(t, e, part.ID); n != 3_000 {
			t.Fatalf("refunds of the payment sum to %d in the database, want 3000", n)
		}
	})
}

// refundsInDB sums the payment's refunds in the database, and checks the
// payment's refunded total against the sum.
func refundsInDB(t *testing.T, e *env, paymentID string) int64 {
	t.Helper()
	var sum, refunded int64
	const q = `SELECT COALESCE((SELECT SUM(amount) FROM refunds WHERE payment_id = %[1]s), 0), refunded FROM payments WHERE id = %[1]s`
	var err error
	if e.cfg.DB != nil {
		err = e.cfg.DB.Reader().QueryRowContext(context.Background(), fmt.Sprintf(q, "?1"), paymentID).Scan(&sum, &refunded)
	} else {
		err = e.cfg.Postgres.Pool().QueryRow(context.Background(), fmt.Sprintf(q, "$1"), paymentID).Scan(&sum, &refunded)
	}
	if err != nil {
		t.Fatalf("sum the refunds: %v", err)
	}
	if sum != refunded {
		t.Fatalf("the refunds sum to %d but the payment records %d refunded", sum, refunded)
	}
	return sum
}

func TestConcurrentRefundsNeverExceedThePayment(t *testing.T) {
	t.Parallel()
	forEachBackend(t, refundBackends, func(t *testing.T, b backend) {
		e := newEnvOn(t, b, nil)
		acct := e.createAccount(keyA, 1_000, "KRW")
		p := decode[payment](t, e.expect(req{method: "POST", path: "/v1/payments", idemKey: "pay", body: payBody(acct.ID, 1_000, "KRW")}, http.StatusCreated))
		const n = 20
		answers := make([]resp, n)
		errs := make([]error, n)
		start := make(chan struct{})
		done := make(chan struct{}, n)
		for i := range n {
			go func() {
				defer func() { done <- struct{}{} }()
				<-start
				answers[i], errs[i] = e.send(req{method: "POST", path: "/v1/refunds", idemKey: fmt.Sprintf("rf-%d", i), body: refundBody(p.ID, 150)})
			}()
		}
		close(start)
		for range n {
			<-done
		}
		created, refused := 0, 0
		for i, r := range answers {
			switch {
			case errs[i] != nil:
				t.Fatalf("refund %d: %v", i, errs[i])
			case r.status == http.StatusCreated:
				created++
			case r.status == http.StatusConflict:
				refused++
			default:
				t.Fatalf("refund %d: %s", i, r)
			}
		}
		// 6 × 150 = 900 fit in 1000; a seventh would not.
		if created != 6 || refused != n-6 {
			t.Fatalf("%d refunds made and %d refused, want 6 and %d", created, refused, n-6)
		}
		if sum := refundsInDB(t, e, p.ID); sum != 900 {
			t.Fatalf("refunds sum to %d in the database, want 900", sum)
		}
		e.expectBalance(keyA, acct.ID, 900)
	})
}

func TestSettlementSubtractsRefunds(t *testing.T) {
	t.Parallel()
	forEachBackend(t, sqlAndPostgres, func(t *testing.T, b backend) {
		e := newEnvOn(t, b, func(c *payments.Config) { c.TransportPoll = 10 * time.Millisecond })
		acct := e.createAccount(keyA, 10_000, "KRW")
		p := decode[payment](t, e.expect(req{method: "POST", path: "/v1/payments", idemKey: "pay", body: payBody(acct.ID, 1_000, "KRW")}, http.StatusCreated))
		e.expect(req{method: "POST", path: "/v1/refunds", idemKey: "rf-1", body: refundBody(p.ID, 300)}, http.StatusCreated)
		e.expect(req{method: "POST", path: "/v1/refunds", idemKey: "rf-1", body: refundBody(p.ID, 300)}, http.StatusCreated)
		e.expect(req{method: "POST", path: "/v1/refunds", idemKey: "rf-2", body: refundBody(p.ID, 200)}, http.StatusCreated)
		deadline := time.Now().Add(20 * time.Second)
		var st payments.Settlement
		for {
			st = decode[payments.Settlement](t, e.expect(req{method: "GET", path: "/v1/settlement"}, http.StatusOK))
			if st.Total == 500 && st.Events == 1 && st.Refunds == 2 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("settlement = %+v, want 500 KRW: one payment of 1000 and two refunds of 500", st)
			}
			time.Sleep(20 * time.Millisecond) // polling under a deadline
		}
	})
}
