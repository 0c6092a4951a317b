package payments_test

import (
	"bytes"
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/payments"
)

// crashCounter is an injected Config.Crash: it counts the crashes and, like
// a dead process, leaves the client without an answer. Panicking with
// http.ErrAbortHandler is what keeps a two-store key in flight: the
// middleware releases nothing after it.
type crashCounter struct{ n atomic.Int32 }

func (c *crashCounter) crash() {
	c.n.Add(1)
	panic(http.ErrAbortHandler)
}

func (c *crashCounter) expect(t *testing.T, want int32) {
	t.Helper()
	if got := c.n.Load(); got != want {
		t.Fatalf("Crash called %d times, want %d", got, want)
	}
}

// The two-store window: the payment commits in the database, the process
// dies before the key completes in Redis. The retry, on another replica,
// waits for the lease to end, takes the key over, runs the handler again,
// and the unique constraint on the payment's origin makes it answer with the
// payment already made instead of charging again.
func TestTwoStoresCrashBetweenPaymentAndKey(t *testing.T) {
	t.Parallel()
	forEachBackend(t, []backend{onPostgresRedis, onSQLiteRedis}, func(t *testing.T, on backend) {
		var crashes crashCounter
		const lease = time.Second
		e := newEnvClocked(t, on, nil, func(c *payments.Config) {
			c.KeyLease = lease
			c.Crash = crashes.crash
		})
		other := e.replica()
		acct := e.createAccount(keyA, 10_000, "KRW")
		q := req{method: "POST", path: "/v1/payments", idemKey: "crash-window", fault: "crash-after-commit",
			body: payBody(acct.ID, 2_500, "KRW")}

		if r, err := e.sendAlone(q); err == nil {
			t.Fatalf("crash-after-commit answered %s; want the connection cut", r)
		}
		crashes.expect(t, 1)

		// The payment committed; the key did not complete and was not
		// released.
		made := e.expectPayments(keyA, acct.ID, 1)
		e.expectBalance(keyA, acct.ID, 7_500)
		before, err := e.keys.Get(context.Background(), idem.Scope(tenantA), "crash-window")
		if err != nil || before.State != idem.StateInFlight {
			t.Fatalf("key after the crash: %+v, %v; want it in flight", before, err)
		}

		// The client retries on the other replica until the lease has ended
		// and the retry has taken the key over. Each attempt waits up to
		// InflightWait for the key to change before it answers 409.
		q.fault = ""
		deadline := time.Now().Add(30 * time.Second)
		var retry resp
		for {
			retry = other.do(q)
			if retry.status != http.StatusConflict {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the key is still in flight 30s after a crash with a %s lease: %s", lease, retry)
			}
		}
		if retry.status != http.StatusCreated {
			t.Fatalf("retry after the lease: %s, want 201", retry)
		}
		if retry.header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("the retry was a replay, but the key was never completed: %v", retry.header)
		}
		if p := decode[payment](t, retry); p.ID != made[0].ID || p.Amount != 2_500 {
			t.Fatalf("retry answered payment %+v; the payment made before the crash is %s", p, made[0].ID)
		}
		other.expectPayments(keyA, acct.ID, 1)
		other.expectBalance(keyA, acct.ID, 7_500)

		// The key is now completed, by a new holder of the same generation.
		after, err := e.keys.Get(context.Background(), idem.Scope(tenantA), "crash-window")
		if err != nil || after.State != idem.StateCompleted {
			t.Fatalf("key after the retry: %+v, %v; want it completed", after, err)
		}
		if !after.CreatedAt.Equal(before.CreatedAt) || after.Token <= before.Token {
			t.Fatalf("key after the retry: created %s token %d; before: created %s token %d; want the same generation, a newer token",
				after.CreatedAt, after.Token, before.CreatedAt, before.Token)
		}

		// Every later retry, on either replica, is a plain replay.
		for _, r := range []*env{e, other} {
			again := r.expect(q, http.StatusCreated)
			if again.header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(again.body, retry.body) {
				t.Fatalf("a later retry was not a replay of the retry's answer: %s", again)
			}
		}
		crashes.expect(t, 1)
		e.expectBalance(keyA, acct.ID, 7_500)
	})
}

// With the keys in the service's database, the key completes in the same
// commit as the payment, so crash-after-commit fires after that commit and
// the retry is an immediate replay.
func TestCrashAfterCommitSameTransactionReplays(t *testing.T) {
	t.Parallel()
	forEachBackend(t, []backend{onSQLite, onPostgres}, func(t *testing.T, on backend) {
		var crashes crashCounter
		e := newEnvOn(t, on, func(c *payments.Config) { c.Crash = crashes.crash })
		acct := e.createAccount(keyA, 10_000, "KRW")
		q := req{method: "POST", path: "/v1/payments", idemKey: "crash-same-tx", fault: "crash-after-commit",
			body: payBody(acct.ID, 1_000, "KRW")}
		if r, err := e.sendAlone(q); err == nil {
			t.Fatalf("crash-after-commit answered %s; want the connection cut", r)
		}
		crashes.expect(t, 1)
		rec, err := e.keys.Get(context.Background(), idem.Scope(tenantA), "crash-same-tx")
		if err != nil || rec.State != idem.StateCompleted || rec.Response == nil || rec.Response.Status != http.StatusCreated {
			t.Fatalf("key after the crash: %+v, %v; want it completed with the 201", rec, err)
		}
		made := e.expectPayments(keyA, acct.ID, 1)

		// The retry still asks for the crash: a replay commits nothing, so
		// it is answered.
		retry := e.expect(q, http.StatusCreated)
		if retry.header.Get("Idempotent-Replayed") != "true" || decode[payment](t, retry).ID != made[0].ID {
			t.Fatalf("retry after the crash: %s; want a replay of payment %s", retry, made[0].ID)
		}
		e.expectPayments(keyA, acct.ID, 1)
		e.expectBalance(keyA, acct.ID, 9_000)
		crashes.expect(t, 1)
	})
}

// crash-after-commit fires only after work that committed something: a
// refusal is answered as usual.
func TestCrashAfterCommitSparesRefusals(t *testing.T) {
	t.Parallel()
	forEachBackend(t, []backend{onSQLite, onPostgresRedis}, func(t *testing.T, on backend) {
		var crashes crashCounter
		e := newEnvOn(t, on, func(c *payments.Config) { c.Crash = crashes.crash })
		acct := e.createAccount(keyA, 100, "KRW")
		r := e.do(req{method: "POST", path: "/v1/payments", idemKey: "too-much", fault: "crash-after-commit",
			body: payBody(acct.ID, 500, "KRW")})
		expectProblem(t, r, http.StatusPaymentRequired, "urn:idem:problem:insufficient-funds")
		r = e.do(req{method: "POST", path: "/v1/accounts/acct_nowhere/deposits", idemKey: "nowhere", fault: "crash-after-commit",
			body: `{"amount":5}`})
		expectProblem(t, r, http.StatusNotFound, "urn:idem:problem:account-not-found")
		crashes.expect(t, 0)

		// A deposit commits, so it crashes too.
		q := req{method: "POST", path: "/v1/accounts/" + acct.ID + "/deposits", idemKey: "top-up", fault: "crash-after-commit", body: `{"amount":50}`}
		if r, err := e.sendAlone(q); err == nil {
			t.Fatalf("crash-after-commit on a deposit answered %s", r)
		}
		crashes.expect(t, 1)
		e.expectBalance(keyA, acct.ID, 150)
	})
}
