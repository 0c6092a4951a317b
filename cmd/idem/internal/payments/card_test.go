package payments_test

import (
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/acquirer"
	"github.com/idem-go/idem/cmd/idem/internal/payments"
	"github.com/idem-go/idem/idemsqlite"
	"github.com/idem-go/idem/idemtest"
)

// cardNetwork starts an acquirer on a file of its own, sets cfg to charge
// at it (with the charge faults' transport), and returns a client that
// reads its charges.
func cardNetwork(t *testing.T, cfg *payments.Config) *acquirer.Client {
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
	c, err := acquirer.NewClient(acquirer.ClientConfig{URL: hs.URL, APIKey: "net-key", Transport: payments.ChargeFaults(nil),
		Policy: idem.RetryPolicy{MaxAttempts: 4, Base: time.Millisecond, Cap: 10 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Acquirer = c
	return c
}

// charges returns the charges the network made on an account's card.
func charges(t *testing.T, c *acquirer.Client, accountID string) []acquirer.Charge {
	t.Helper()
	all, err := c.Charges(t.Context(), accountID)
	if err != nil {
		t.Fatal(err)
	}
	return all
}

// A payment charges the account's card once however often it is sent: the
// charge goes with a key derived from the payment's, so the retry's charge
// is the first one, replayed by the network.
func TestCardPaymentChargesOnce(t *testing.T) {
	t.Parallel()
	forEachBackend(t, []backend{onSQLite, onPostgres}, func(t *testing.T, on backend) {
		var net *acquirer.Client
		e := newEnvOn(t, on, func(c *payments.Config) { net = cardNetwork(t, c) })
		acct := e.createAccount(keyA, 10_000, "EUR")
		q := req{method: "POST", path: "/v1/payments", idemKey: "card-1", body: payBody(acct.ID, 1_250, "EUR")}
		first := decode[payment](t, e.expect(q, http.StatusCreated))
		again := e.expect(q, http.StatusCreated)
		if p := decode[payment](t, again); p.ID != first.ID || p.ChargeID != first.ChargeID || again.header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("the retry = %s; want payment %s replayed", again, first.ID)
		}
		made := charges(t, net, acct.ID)
		if len(made) != 1 || made[0].ID != first.ChargeID || made[0].Amount != 1_250 || made[0].Metadata[payments.MetaKeyDigest] != payments.ClientKeyDigest(tenantA, "card-1") || made[0].Metadata["idempotency_key"] != "" {
			t.Fatalf("charges = %+v; want the one of payment %s", made, first.ID)
		}
		e.expectBalance(keyA, acct.ID, 8_750)
		// A payment the service refuses charges nothing.
		e.do(req{method: "POST", path: "/v1/payments", idemKey: "too-much", body: payBody(acct.ID, 1_000_000, "EUR")})
		if made := charges(t, net, acct.ID); len(made) != 1 {
			t.Fatalf("%d charges after a refused payment, want 1", len(made))
		}
	})
}

// The process dies after the network charged and before the payment is
// recorded: nothing is recorded, and the client's retry, once the key is
// free again, records the payment with the charge already made, not a
// second one.
func TestCardCrashAfterCharge(t *testing.T) {
	t.Parallel()
	forEachBackend(t, []backend{onSQLite, onPostgres}, func(t *testing.T, on backend) {
		var (
			crashes crashCounter
			net     *acquirer.Client
		)
		e := newEnvOn(t, on, func(c *payments.Config) {
			net = cardNetwork(t, c)
			c.Crash = crashes.crash
			c.KeyLease = time.Second
		})
		acct := e.createAccount(keyA, 10_000, "EUR")
		q := req{method: "POST", path: "/v1/payments", idemKey: "crash-charge", fault: "crash-after-charge",
			body: payBody(acct.ID, 2_000, "EUR")}
		if r, err := e.sendAlone(q); err == nil {
			t.Fatalf("crash-after-charge answered %s; want the connection cut", r)
		}
		crashes.expect(t, 1)
		e.expectPayments(keyA, acct.ID, 0)
		if made := charges(t, net, acct.ID); len(made) != 1 {
			t.Fatalf("%d charges after the crash, want the 1 made before it", len(made))
		}
		q.fault = ""
		deadline := time.Now().Add(30 * time.Second)
		var retry resp
		for {
			if e.clock != nil {
				e.clock.Advance(time.Second)
			}
			retry = e.do(q)
			if retry.status != http.StatusConflict || time.Now().After(deadline) {
				break
			}
		}
		if retry.status != http.StatusCreated {
			t.Fatalf("the retry = %s, want 201", retry)
		}
		made := charges(t, net, acct.ID)
		if p := decode[payment](t, retry); len(made) != 1 || p.ChargeID != made[0].ID {
			t.Fatalf("the retry's payment %+v, charges %+v; want the one charge made before the crash", p, made)
		}
		e.expectPayments(keyA, acct.ID, 1)
		e.expectBalance(keyA, acct.ID, 8_000)
	})
}

// The network's answer to the charge is lost: the service's client retries
// with the same key and the network answers with the charge it made.
func TestCardDropChargeAnswer(t *testing.T) {
	t.Parallel()
	var net *acquirer.Client
	e := newEnv(t, func(c *payments.Config) { net = cardNetwork(t, c) })
	acct := e.createAccount(keyA, 10_000, "EUR")
	p := decode[payment](t, e.expect(req{method: "POST", path: "/v1/payments", idemKey: "lost-answer", fault: "drop-charge-answer",
		body: payBody(acct.ID, 500, "EUR")}, http.StatusCreated))
	made := charges(t, net, acct.ID)
	if len(made) != 1 || made[0].ID != p.ChargeID {
		t.Fatalf("charges %+v for payment %+v; want one, the payment's", made, p)
	}
}

// Without idempotency (the unsafe mode) the retry charges the card again:
// what the lab shows before it shows idem.
func TestCardUnsafeChargesTwice(t *testing.T) {
	t.Parallel()
	var net *acquirer.Client
	e := newEnv(t, func(c *payments.Config) { net = cardNetwork(t, c); c.Unsafe = true })
	acct := e.createAccount(keyA, 10_000, "EUR")
	q := req{method: "POST", path: "/v1/payments", idemKey: "ignored", body: payBody(acct.ID, 500, "EUR")}
	e.expect(q, http.StatusCreated)
	e.expect(q, http.StatusCreated)
	if made := charges(t, net, acct.ID); len(made) != 2 {
		t.Fatalf("%d charges in the unsafe mode, want 2", len(made))
	}
}

// A network that cannot be reached leaves nothing: the payment is answered
// 503 and not kept, and its retry charges once the network is back.
func TestCardNetworkDown(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *payments.Config) {
		down := httptest.NewServer(http.NotFoundHandler())
		down.Close()
		net, err := acquirer.NewClient(acquirer.ClientConfig{URL: down.URL,
			Policy: idem.RetryPolicy{MaxAttempts: 2, Base: time.Millisecond, Cap: time.Millisecond}})
		if err != nil {
			t.Fatal(err)
		}
		c.Acquirer = net
	})
	acct := e.createAccount(keyA, 10_000, "EUR")
	r := e.do(req{method: "POST", path: "/v1/payments", idemKey: "no-network", body: payBody(acct.ID, 500, "EUR")})
	expectProblem(t, r, http.StatusServiceUnavailable, "urn:idem:problem:temporarily-unavailable")
	e.expectPayments(keyA, acct.ID, 0)
	e.expectBalance(keyA, acct.ID, 10_000)
}

// The payment fails after the charge, before its commit, with a transient
// error, and the retry finds the charge made. In phases (the keys in the
// service's database) the key is not released, since its "charging" point
// says the card may have been charged: the failed execution yields its
// lease, and the retry takes the key over at once and goes on from the
// point. With the keys apart (Redis) the key is released, and the derived
// charge key alone finds the charge.
func TestCardFailAfterCharge(t *testing.T) {
	t.Parallel()
	forEachBackend(t, []backend{onSQLite, onPostgres, onPostgresRedis}, func(t *testing.T, on backend) {
		var net *acquirer.Client
		e := newEnvOn(t, on, func(c *payments.Config) {
			net = cardNetwork(t, c)
			c.CompleterEvery = time.Hour // the retry, not the completer, finishes it here
		})
		acct := e.createAccount(keyA, 10_000, "EUR")
		q := req{method: "POST", path: "/v1/payments", idemKey: "fails-once", fault: "fail-before-commit",
			body: payBody(acct.ID, 700, "EUR")}
		expectProblem(t, e.do(q), http.StatusServiceUnavailable, "urn:idem:problem:temporarily-unavailable")
		e.expectPayments(keyA, acct.ID, 0)
		q.fault = ""
		r := e.expect(q, http.StatusCreated)
		p := decode[payment](t, r)
		made := charges(t, net, acct.ID)
		if len(made) != 1 || made[0].ID != p.ChargeID {
			t.Fatalf("charges %+v for payment %+v; want one, made by the failed attempt", made, p)
		}
		e.expectBalance(keyA, acct.ID, 9_300)
	})
}

// Reconcile finds the charge a crash left without its payment, and nothing
// once the payment is retried; in the unsafe mode it finds the payment
// charged twice.
func TestReconcile(t *testing.T) {
	t.Parallel()
	forEachBackend(t, []backend{onSQLite, onPostgres}, func(t *testing.T, on backend) {
		var (
			crashes crashCounter
			net     *acquirer.Client
		)
		e := newEnvOn(t, on, func(c *payments.Config) {
			net = cardNetwork(t, c)
			c.Crash = crashes.crash
			c.KeyLease = time.Second
		})
		since := e.clock.Now().Add(-time.Hour)
		acct := e.createAccount(keyA, 10_000, "EUR")
		e.expect(req{method: "POST", path: "/v1/payments", idemKey: "fine", body: payBody(acct.ID, 100, "EUR")}, http.StatusCreated)
		q := req{method: "POST", path: "/v1/payments", idemKey: "crashed", fault: "crash-after-charge", body: payBody(acct.ID, 200, "EUR")}
		if _, err := e.sendAlone(q); err == nil {
			t.Fatal("crash-after-charge answered")
		}
		reconcile := func() *payments.Reconciliation {
			t.Helper()
			rec, err := payments.Reconcile(t.Context(), e.cfg.DB, e.cfg.Postgres, net, since, nil)
			if err != nil {
				t.Fatal(err)
			}
			return rec
		}
		rec := reconcile()
		if len(rec.Differences) != 1 || rec.Differences[0].Kind != payments.DiffChargeWithoutPayment || rec.Payments != 1 || rec.Charges != 2 {
			t.Fatalf("after the crash: %+v; want the crashed payment's charge without its payment", rec)
		}
		q.fault = ""
		for deadline := time.Now().Add(30 * time.Second); ; {
			e.clock.Advance(time.Second)
			if r := e.do(q); r.status == http.StatusCreated || time.Now().After(deadline) {
				break
			}
		}
		if rec := reconcile(); len(rec.Differences) != 0 || rec.Payments != 2 || rec.Charges != 2 {
			t.Fatalf("after the retry: %+v; want the books to agree", rec)
		}
	})
}

func TestReconcileUnsafeChargedTwice(t *testing.T) {
	t.Parallel()
	var net *acquirer.Client
	e := newEnv(t, func(c *payments.Config) { net = cardNetwork(t, c); c.Unsafe = true })
	acct := e.createAccount(keyA, 10_000, "EUR")
	q := req{method: "POST", path: "/v1/payments", idemKey: "pressed-twice", body: payBody(acct.ID, 500, "EUR")}
	e.expect(q, http.StatusCreated)
	e.expect(q, http.StatusCreated)
	rec, err := payments.Reconcile(t.Context(), e.cfg.DB, nil, net, e.clock.Now().Add(-time.Hour), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.Differences) != 1 || rec.Differences[0].Kind != payments.DiffChargedTwice || len(rec.Differences[0].Charges) != 2 {
		t.Fatalf("unsafe reconciliation: %+v; want one payment charged twice", rec)
	}
}

// The process dies between the charge and the commit, and the client never
// comes back: the completer finishes the payment by itself, from its
// "charging" point, within its bound (the lease, a round, a resume). The
// books agree, the card was charged once, and the client who does come back
// later gets the completer's answer replayed.
func TestCompleterFinishesAbandonedPayment(t *testing.T) {
	t.Parallel()
	forEachBackend(t, []backend{onSQLite, onPostgres}, func(t *testing.T, on backend) {
		var (
			crashes crashCounter
			net     *acquirer.Client
		)
		e := newEnvOn(t, on, func(c *payments.Config) {
			net = cardNetwork(t, c)
			c.Crash = crashes.crash
			c.KeyLease = time.Second
			c.CompleterEvery = 20 * time.Millisecond
		})
		comp, err := e.svc.Completer()
		if err != nil {
			t.Fatal(err)
		}
		since := time.Now().Add(-time.Hour)
		if e.clock != nil {
			since = e.clock.Now().Add(-time.Hour)
		}
		acct := e.createAccount(keyA, 10_000, "EUR")
		q := req{method: "POST", path: "/v1/payments", idemKey: "abandoned", fault: "crash-after-charge", body: payBody(acct.ID, 300, "EUR")}
		if _, err := e.sendAlone(q); err == nil {
			t.Fatal("crash-after-charge answered")
		}
		crashes.expect(t, 1)
		if e.clock != nil {
			e.clock.Advance(2 * time.Second) // the lease ends, by the SQLite store's clock
		}
		idemtest.Eventually(t, 30*time.Second, "the completer finished the abandoned payment", func() bool {
			return comp.Stats().Completed == 1
		})
		list := e.expectPayments(keyA, acct.ID, 1)
		made := charges(t, net, acct.ID)
		if len(made) != 1 || made[0].ID != list[0].ChargeID {
			t.Fatalf("charges %+v for payment %+v; want its one charge", made, list[0])
		}
		e.expectBalance(keyA, acct.ID, 9_700)
		rec, err := payments.Reconcile(t.Context(), e.cfg.DB, e.cfg.Postgres, net, since, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(rec.Differences) != 0 {
			t.Fatalf("reconciliation after the completer: %+v", rec.Differences)
		}
		q.fault = ""
		r := e.expect(q, http.StatusCreated)
		if p := decode[payment](t, r); p.ID != list[0].ID || r.header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("the client coming back got %s; want payment %s replayed", r, list[0].ID)
		}
		if s := comp.Stats(); s.Unknown != 0 || s.Failed != 0 {
			t.Fatalf("completer stats %+v", s)
		}
	})
}
