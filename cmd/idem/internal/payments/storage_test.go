package payments

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemsqlite"
)

// storagesForTest returns each storage implementation on a fresh, migrated
// database.
func storagesForTest() map[string]func(t *testing.T) storage {
	return map[string]func(t *testing.T) storage{
		"sqlite": func(t *testing.T) storage {
			db, err := idemsqlite.Open(filepath.Join(t.TempDir(), "storage.db"), nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.Close() })
			if err := Migrate(context.Background(), db); err != nil {
				t.Fatal(err)
			}
			s, err := newSQLiteStorage(context.Background(), db)
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
		"postgres": func(t *testing.T) storage {
			db := OpenPostgresForTest(t, nil)
			if err := MigratePostgres(context.Background(), db); err != nil {
				t.Fatal(err)
			}
			return newPGStorage(db)
		},
	}
}

func TestStorageMakesOnePaymentPerOrigin(t *testing.T) {
	t.Parallel()
	for name, open := range storagesForTest() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			st := open(t)
			ctx := context.Background()
			t0 := time.Date(2025, 3, 1, 9, 0, 0, 123456789, time.UTC)
			newAccount := func(tenant string, balance int64) Account {
				t.Helper()
				a := Account{ID: newID("acct_"), Tenant: tenant, Balance: balance, Currency: "KRW", CreatedAt: t0}
				if err := st.CreateAccount(ctx, a); err != nil {
					t.Fatal(err)
				}
				return a
			}
			pay := func(a Account, amount int64) Payment {
				return Payment{ID: newID("pay_"), Tenant: a.Tenant, AccountID: a.ID, Amount: amount, Currency: "KRW",
					Status: StatusSucceeded, CreatedAt: t0}
			}
			balance := func(a Account) int64 {
				t.Helper()
				got, err := st.Account(ctx, a.Tenant, a.ID)
				if err != nil {
					t.Fatal(err)
				}
				return got.Balance
			}
			a := newAccount("t1", 100)
			o := origin{key: "k1", claimedAt: t0}

			p := pay(a, 100)
			first, err := st.CreatePayment(ctx, p, o)
			if err != nil || first.ID != p.ID {
				t.Fatalf("first payment = %+v, %v; want %s", first, err, p.ID)
			}
			// A re-run of the same execution finds the payment, although the
			// balance it left would refuse a new one with 402.
			again, err := st.CreatePayment(ctx, pay(a, 100), o)
			if err != nil || again != first {
				t.Fatalf("re-run = %+v, %v; want the first payment %+v", again, err, first)
			}
			if got := balance(a); got != 0 {
				t.Fatalf("balance after a payment and its re-run = %d, want 0", got)
			}
			if _, err := st.CreatePayment(ctx, pay(a, 50), o); !errors.Is(err, ErrKeyConflict) {
				t.Fatalf("re-run with another amount: %v, want ErrKeyConflict", err)
			}
			b := newAccount("t1", 1_000)
			if _, err := st.CreatePayment(ctx, pay(b, 100), o); !errors.Is(err, ErrKeyConflict) {
				t.Fatalf("re-run from another account: %v, want ErrKeyConflict", err)
			}
			if got := balance(b); got != 1_000 {
				t.Fatalf("a refused re-run debited the other account: %d", got)
			}
			// A new generation of the key (claimed again after it expired) is
			// a new payment; so is the same key in another tenant.
			if _, err := st.CreatePayment(ctx, pay(a, 100), origin{key: "k1", claimedAt: t0.Add(24 * time.Hour)}); !errors.Is(err, ErrInsufficientFunds) {
				t.Fatalf("a new generation of the key: %v, want it to run (and be refused for funds)", err)
			}
			c := newAccount("t2", 100)
			if got, err := st.CreatePayment(ctx, pay(c, 100), o); err != nil || got.ID == first.ID {
				t.Fatalf("the same key in another tenant = %+v, %v; want a payment of its own", got, err)
			}
			// Without an origin, nothing is de-duplicated: unsafe mode.
			for range 2 {
				if _, err := st.CreatePayment(ctx, pay(b, 100), origin{}); err != nil {
					t.Fatal(err)
				}
			}
			if got := balance(b); got != 800 {
				t.Fatalf("two payments without an origin left %d, want 800", got)
			}
			list, _, err := st.AccountPayments(ctx, "t1", a.ID, listPage{limit: 10})
			if err != nil || len(list) != 1 || list[0] != first {
				t.Fatalf("account a's payments = %+v, %v; want only %+v", list, err, first)
			}

			// Deposits follow the same rule.
			od := origin{key: "d1", claimedAt: t0}
			d := Deposit{ID: newID("dep_"), Tenant: "t1", AccountID: a.ID, Amount: 500, CreatedAt: t0}
			dep, err := st.CreateDeposit(ctx, d, od)
			if err != nil || dep.ID != d.ID || dep.Balance != 500 {
				t.Fatalf("deposit = %+v, %v", dep, err)
			}
			d2 := d
			d2.ID = newID("dep_")
			if again, err := st.CreateDeposit(ctx, d2, od); err != nil || again != dep {
				t.Fatalf("deposit re-run = %+v, %v; want %+v", again, err, dep)
			}
			d2.Amount = 7
			if _, err := st.CreateDeposit(ctx, d2, od); !errors.Is(err, ErrKeyConflict) {
				t.Fatalf("deposit re-run with another amount: %v, want ErrKeyConflict", err)
			}
			if got := balance(a); got != 500 {
				t.Fatalf("balance after a deposit and its re-runs = %d, want 500", got)
			}
		})
	}
}

// Executions of one origin that overlap (a slow one that outlived its lease
// and the retry that took its key over) make one payment between them,
// whichever account each one names.
func TestStorageConcurrentExecutionsOfOneOrigin(t *testing.T) {
	t.Parallel()
	for name, open := range storagesForTest() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			st := open(t)
			ctx := context.Background()
			now := time.Now().UTC()
			accounts := make([]Account, 2)
			for i := range accounts {
				accounts[i] = Account{ID: newID("acct_"), Tenant: "t", Balance: 1_000, Currency: "KRW", CreatedAt: now}
				if err := st.CreateAccount(ctx, accounts[i]); err != nil {
					t.Fatal(err)
				}
			}
			o := origin{key: "overlap", claimedAt: now}
			const n = 8
			ids := make([]string, n)
			errs := make([]error, n)
			var wg sync.WaitGroup
			start := make(chan struct{})
			for i := range n {
				wg.Go(func() {
					<-start
					a := accounts[i%2]
					p := Payment{ID: newID("pay_"), Tenant: "t", AccountID: a.ID, Amount: 100, Currency: "KRW",
						Status: StatusSucceeded, CreatedAt: now}
					got, err := st.CreatePayment(ctx, p, o)
					ids[i], errs[i] = got.ID, err
				})
			}
			close(start)
			wg.Wait()
			made := map[string]bool{}
			for i, err := range errs {
				switch {
				case err == nil:
					made[ids[i]] = true
				case errors.Is(err, ErrKeyConflict):
				default:
					t.Fatalf("execution %d: %v", i, err)
				}
			}
			if len(made) != 1 {
				t.Fatalf("%d overlapping executions answered with payments %v; want exactly one", n, made)
			}
			var total int64
			for _, a := range accounts {
				got, err := st.Account(ctx, "t", a.ID)
				if err != nil {
					t.Fatal(err)
				}
				total += got.Balance
			}
			if total != 2_000-100 {
				t.Fatalf("balances add up to %d after one payment of 100 from 2000", total)
			}
		})
	}
}

// lostAckStorage reports the first payment's commit as failed although it
// happened: a connection lost while committing.
type lostAckStorage struct {
	storage
	lost atomic.Bool
}

func (l *lostAckStorage) CreatePayment(ctx context.Context, p Payment, o origin) (Payment, error) {
	got, err := l.storage.CreatePayment(ctx, p, o)
	if err == nil && l.lost.CompareAndSwap(false, true) {
		return Payment{}, fmt.Errorf("%w: commit: connection reset by peer", errOutcomeUnknown)
	}
	return got, err
}

// In the two-store form, a commit whose outcome is unknown must not release
// the key: the retry would claim it anew, under a claim time the payment's
// constraint does not know, and charge again. The key stays in flight until
// its lease ends, and the retry that takes it over finds the payment.
// With the keys apart from the money, a key store that loses a claim lets
// a retry claim the key anew, a moment later, while the lost claim's
// execution may still run: the claims differ in time, not in logical
// request. Whichever pays second finds the other's payment, the later
// claim's as well as the earlier's, and they race without both paying.
func TestStorageClaimsOfALostKey(t *testing.T) {
	t.Parallel()
	for name, open := range storagesForTest() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			st := open(t)
			ctx := context.Background()
			t0 := time.Date(2025, 3, 1, 9, 0, 0, 0, time.UTC)
			const ttl = time.Hour
			claim := func(key string, at time.Time) origin {
				return origin{key: key, claimedAt: at, since: at.Add(-ttl), until: at.Add(ttl)}
			}
			account := func() Account {
				t.Helper()
				a := Account{ID: newID("acct_"), Tenant: "t", Balance: 1_000, Currency: "KRW", CreatedAt: t0}
				if err := st.CreateAccount(ctx, a); err != nil {
					t.Fatal(err)
				}
				return a
			}
			pay := func(a Account) Payment {
				return Payment{ID: newID("pay_"), Tenant: "t", AccountID: a.ID, Amount: 100, Currency: "KRW", Status: StatusSucceeded, CreatedAt: t0}
			}
			balance := func(a Account) int64 {
				t.Helper()
				got, err := st.Account(ctx, "t", a.ID)
				if err != nil {
					t.Fatal(err)
				}
				return got.Balance
			}

			// The retry's claim pays first; the lost claim's execution,
			// earlier by its claim, commits after it.
			a := account()
			later, err := st.CreatePayment(ctx, pay(a), claim("lost", t0.Add(time.Second)))
			if err != nil {
				t.Fatal(err)
			}
			earlier, err := st.CreatePayment(ctx, pay(a), claim("lost", t0))
			if err != nil || earlier.ID != later.ID {
				t.Fatalf("the earlier claim, paying second = %+v, %v; want the later claim's payment %s", earlier, err, later.ID)
			}
			if got := balance(a); got != 900 {
				t.Fatalf("balance %d after one logical payment of 100, want 900", got)
			}
			// Beyond the TTL, a claim is a new logical request.
			if again, err := st.CreatePayment(ctx, pay(a), claim("lost", t0.Add(2*ttl))); err != nil || again.ID == later.ID {
				t.Fatalf("a claim beyond the TTL = %+v, %v; want a payment of its own", again, err)
			}

			// Deposits and refunds follow the same rule.
			dep := Deposit{ID: newID("dep_"), Tenant: "t", AccountID: a.ID, Amount: 500, CreatedAt: t0}
			laterDep, err := st.CreateDeposit(ctx, dep, claim("lost-deposit", t0.Add(time.Second)))
			if err != nil {
				t.Fatal(err)
			}
			dep.ID = newID("dep_")
			if got, err := st.CreateDeposit(ctx, dep, claim("lost-deposit", t0)); err != nil || got.ID != laterDep.ID {
				t.Fatalf("the earlier claim's deposit, second = %+v, %v; want the later claim's %s", got, err, laterDep.ID)
			}
			rf := Refund{ID: newID("re_"), Tenant: "t", PaymentID: later.ID, Amount: 30, Status: StatusSucceeded, CreatedAt: t0}
			laterRefund, err := st.CreateRefund(ctx, rf, claim("lost-refund", t0.Add(time.Second)))
			if err != nil {
				t.Fatal(err)
			}
			rf.ID = newID("re_")
			if got, err := st.CreateRefund(ctx, rf, claim("lost-refund", t0)); err != nil || got.ID != laterRefund.ID {
				t.Fatalf("the earlier claim's refund, second = %+v, %v; want the later claim's %s", got, err, laterRefund.ID)
			}
			// 1,000 - 100 (one payment, another beyond the TTL) + 500 + 30.
			if got := balance(a); got != 1_000-200+500+30 {
				t.Fatalf("balance %d after one deposit of 500 and one refund of 30, want %d", got, 1_000-200+500+30)
			}

			// Eight claims of one logical request, a millisecond apart, at
			// once.
			b := account()
			const n = 8
			ids := make([]string, n)
			errs := make([]error, n)
			start := make(chan struct{})
			var wg sync.WaitGroup
			for i := range n {
				wg.Go(func() {
					<-start
					got, err := st.CreatePayment(ctx, pay(b), claim("raced", t0.Add(time.Duration(i)*time.Millisecond)))
					ids[i], errs[i] = got.ID, err
				})
			}
			close(start)
			wg.Wait()
			made := map[string]bool{}
			for i, err := range errs {
				if err != nil {
					t.Fatalf("claim %d: %v", i, err)
				}
				made[ids[i]] = true
			}
			if len(made) != 1 || balance(b) != 900 {
				t.Fatalf("%d racing claims of one logical request made payments %v and left balance %d; want one payment and 900", n, made, balance(b))
			}
		})
	}
}

func TestTwoStoresUnknownCommitKeepsTheKey(t *testing.T) {
	t.Parallel()
	db, err := idemsqlite.Open(filepath.Join(t.TempDir(), "payments.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	keys := OpenRedisKeysForTest(t, nil)
	svc, err := New(context.Background(), &Config{DB: db, Keys: keys, APIKeys: map[string]string{"k": "t"}, KeyLease: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Close() })
	lossy := &lostAckStorage{storage: svc.store}
	svc.store = lossy
	srv := httptest.NewServer(svc.Handler())
	t.Cleanup(srv.Close)

	post := func(path, key, body string) (int, string, error) {
		r, _ := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(body))
		r.Header.Set("Authorization", "Bearer k")
		if key != "" {
			r.Header.Set("Idempotency-Key", key)
		}
		tr := &http.Transport{DisableKeepAlives: true}
		defer tr.CloseIdleConnections()
		res, err := (&http.Client{Transport: tr}).Do(r)
		if err != nil {
			return 0, "", err
		}
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		return res.StatusCode, string(b), err
	}
	code, body, err := post("/v1/accounts", "", `{"balance":1000,"currency":"KRW"}`)
	if err != nil || code != http.StatusCreated {
		t.Fatalf("create account: %d %s %v", code, body, err)
	}
	var created Account
	if err := json.Unmarshal([]byte(body), &created); err != nil {
		t.Fatal(err)
	}
	acct := created.ID
	pay := `{"account_id":"` + acct + `","amount":300,"currency":"KRW"}`

	if code, body, err := post("/v1/payments", "unknown-commit", pay); err == nil {
		t.Fatalf("a payment whose commit is unknown was answered: %d %s", code, body)
	}
	if rec, err := keys.Get(context.Background(), "t", "unknown-commit"); err != nil || rec.State != idem.StateInFlight {
		t.Fatalf("key after the unknown commit: %+v, %v; want it in flight", rec, err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, body, err = post("/v1/payments", "unknown-commit", pay)
		if err != nil {
			t.Fatal(err)
		}
		if code != http.StatusConflict || time.Now().After(deadline) {
			break
		}
	}
	if code != http.StatusCreated {
		t.Fatalf("retry: %d %s; want 201", code, body)
	}
	list, _, err := lossy.AccountPayments(context.Background(), "t", acct, listPage{limit: 10})
	if err != nil || len(list) != 1 || !strings.Contains(body, list[0].ID) {
		t.Fatalf("payments %+v, %v; retry answered %s; want one payment, the one answered", list, err, body)
	}
	if a, err := lossy.Account(context.Background(), "t", acct); err != nil || a.Balance != 700 {
		t.Fatalf("account %+v, %v; want balance 700", a, err)
	}
}
