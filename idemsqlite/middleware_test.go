package idemsqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemsqlite"
	"github.com/idem-go/idem/idemtest"
)

// The middleware on the store: in the form it chooses for it (the store
// writes serially, so Claim, then the handler in CompleteTx), with the claim
// in the handler's transaction (ClaimTx), which it chooses for a TxClaimer
// that does not write serially, and with a TxStore that is no TxClaimer.
func TestMiddleware(t *testing.T) {
	t.Parallel()
	idemtest.TestMiddleware(t, func(t *testing.T, clock idem.Clock) idem.Store {
		return newStore(t, openDB(t), clock)
	})
}

// The engine's behaviours through idemhttp (idemtest.TestFace), in the
// form the engine chooses for the store: Claim, then the handler in
// CompleteTx.
func TestFace(t *testing.T) {
	t.Parallel()
	idemtest.TestFace(t, idemtest.HTTP, func(t *testing.T, clock idem.Clock) idem.Store {
		return newStore(t, openDB(t), clock)
	})
}

func TestMiddlewareClaimTx(t *testing.T) {
	t.Parallel()
	idemtest.TestMiddleware(t, func(t *testing.T, clock idem.Clock) idem.Store {
		return claimTxForm{completeTxOnly{newStore(t, openDB(t), clock)}}
	})
}

// claimTxForm is the store without its WritesSerially, so that the
// middleware claims in the handler's transaction (ClaimTx).
type claimTxForm struct{ completeTxOnly }

func (c claimTxForm) ClaimTx(ctx context.Context, req idem.ClaimRequest, wait time.Duration, work idem.ClaimedWork) (idem.Claim, bool, error) {
	return c.s.ClaimTx(ctx, req, wait, work)
}

// A handler that waits before its writes (a call to another service) does
// not hold the single writer meanwhile: another request's writes commit,
// and its answer comes, while the first still waits; and a duplicate of the
// waiting request waits for its answer, which it replays, the handler
// having run once.
func TestMiddlewareSlowHandlerHoldsNoWriter(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	migratePayments(t, db)
	store := newStore(t, db, idem.SystemClock{})
	entered, proceed := make(chan struct{}, 1), make(chan struct{})
	var runs atomic.Int32
	h := mustMiddleware(t, &idemhttp.Config{SharedScope: true, Store: store}).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get(idemhttp.HeaderKey)
		if key == "slow" {
			runs.Add(1)
			entered <- struct{}{}
			<-proceed
		}
		if err := insertPayment(r.Context(), db, key); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	do := func(key string) <-chan *httptest.ResponseRecorder {
		out := make(chan *httptest.ResponseRecorder, 1)
		go func() {
			req := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader("{}"))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set(idemhttp.HeaderKey, key)
			rr := httptest.NewRecorder()
			h.ServeHTTP(rr, req)
			out <- rr
		}()
		return out
	}
	slow := do("slow")
	<-entered
	dup := do("slow")
	// A bound, not a measure: with the writer held by the waiting request,
	// this one would wait for it for ever.
	select {
	case rr := <-do("fast"):
		if rr.Code != http.StatusCreated {
			t.Fatalf("the other request: %d %s", rr.Code, rr.Body)
		}
	case <-time.After(30 * time.Second):
		close(proceed)
		t.Fatal("another request could not write while a handler waited before its writes")
	}
	if got := payments(t, db); !slices.Equal(got, []string{"fast"}) {
		t.Errorf("committed %v while the slow request waited, want [fast]", got)
	}
	close(proceed)
	first, second := <-slow, <-dup
	if first.Code != http.StatusCreated || second.Code != http.StatusCreated || second.Header().Get(idemhttp.HeaderReplayed) != "true" {
		t.Errorf("the slow request: %d; its duplicate: %d, replayed %q", first.Code, second.Code, second.Header().Get(idemhttp.HeaderReplayed))
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("the slow handler ran %d times, want 1", n)
	}
	if got := payments(t, db); !slices.Equal(got, []string{"fast", "slow"}) {
		t.Errorf("committed %v, want [fast slow]", got)
	}
}

func TestMiddlewareCompleteTxOnly(t *testing.T) {
	t.Parallel()
	idemtest.TestMiddleware(t, func(t *testing.T, clock idem.Clock) idem.Store {
		return completeTxOnly{newStore(t, openDB(t), clock)}
	})
}

// completeTxOnly is a TxStore that does not claim in its transactions, as a
// TxStore that is not a TxClaimer offers.
type completeTxOnly struct{ s *idemsqlite.Store }

func (c completeTxOnly) Claim(ctx context.Context, req idem.ClaimRequest) (idem.Claim, error) {
	return c.s.Claim(ctx, req)
}
func (c completeTxOnly) Complete(ctx context.Context, ref idem.Ref, resp idem.Response) error {
	return c.s.Complete(ctx, ref, resp)
}
func (c completeTxOnly) Release(ctx context.Context, ref idem.Ref) error {
	return c.s.Release(ctx, ref)
}
func (c completeTxOnly) Renew(ctx context.Context, ref idem.Ref, lease time.Duration) (time.Time, error) {
	return c.s.Renew(ctx, ref, lease)
}
func (c completeTxOnly) Get(ctx context.Context, scope idem.Scope, key idem.Key) (idem.Record, error) {
	return c.s.Get(ctx, scope, key)
}
func (c completeTxOnly) Purge(ctx context.Context, limit int) (int, error) {
	return c.s.Purge(ctx, limit)
}
func (c completeTxOnly) CompleteTx(ctx context.Context, ref idem.Ref, work idem.TxWork) (bool, error) {
	return c.s.CompleteTx(ctx, ref, work)
}

func mustMiddleware(t testing.TB, cfg *idemhttp.Config) *idemhttp.Middleware {
	t.Helper()
	m, err := idemhttp.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// post sends a protected POST of an empty JSON object under key.
func post(h http.Handler, path, key string) {
	req := httptest.NewRequest(http.MethodPost, path, strings.NewReader("{}"))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(idemhttp.HeaderKey, key)
	h.ServeHTTP(httptest.NewRecorder(), req)
}

// TestSameTransaction: with a TxStore, the handler's writes commit with the
// key, and a failed execution leaves neither.
func TestSameTransaction(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	store := newStore(t, db, idem.SystemClock{})
	ctx := context.Background()
	if _, err := db.Writer().ExecContext(ctx, `CREATE TABLE charges (key TEXT)`); err != nil {
		t.Fatal(err)
	}
	h := mustMiddleware(t, &idemhttp.Config{SharedScope: true, Store: store}).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		err := db.WithTx(r.Context(), func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO charges VALUES (?)`, r.Header.Get(idemhttp.HeaderKey))
			return err
		})
		if err != nil || r.URL.Path == "/fail" {
			http.Error(w, "failed after writing", http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	post(h, "/ok", "a")
	post(h, "/fail", "b")
	post(h, "/ok", "a")
	var keys []string
	rows, err := db.Reader().QueryContext(ctx, `SELECT key FROM charges ORDER BY key`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var k string
		rows.Scan(&k)
		keys = append(keys, k)
	}
	if fmt.Sprint(keys) != "[a]" {
		t.Fatalf("charges %v, want [a]", keys)
	}
	if _, err := store.Get(ctx, "", "b"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("failed key b: %v, want ErrNotFound (released)", err)
	}
}

// BenchmarkMiddleware measures idemhttp's middleware in front of a trivial
// handler on the store (in the same-transaction form: Claim, then the
// handler in CompleteTx), for first executions and for replays, beside the
// bare handler as the baseline of the same run:
//
//	go test -run '^$' -bench Middleware -benchtime 2s ./idemsqlite/
func BenchmarkMiddleware(b *testing.B) {
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		w.Write([]byte(`{"id":"pay_123","status":"succeeded"}`))
	})
	body := `{"account_id":"acct_1","amount":12000,"currency":"KRW","description":"coffee"}`
	serve := func(b *testing.B, h http.Handler, key string) {
		req := httptest.NewRequest(http.MethodPost, "/v1/payments", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if key != "" {
			req.Header.Set(idemhttp.HeaderKey, key)
		}
		rr := httptest.NewRecorder()
		h.ServeHTTP(rr, req)
		if rr.Code != http.StatusCreated {
			b.Fatalf("status %d: %s", rr.Code, rr.Body)
		}
	}
	open := func(b *testing.B) idem.Store {
		db, err := idemsqlite.Open(filepath.Join(b.TempDir(), "bench.db"), nil)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { db.Close() })
		s, err := idemsqlite.NewStore(context.Background(), db, nil)
		if err != nil {
			b.Fatal(err)
		}
		return s
	}
	b.Run("baseline", func(b *testing.B) {
		for b.Loop() {
			serve(b, handler, "")
		}
	})
	b.Run("first", func(b *testing.B) {
		h := mustMiddleware(b, &idemhttp.Config{SharedScope: true, Store: open(b)}).Handler(handler)
		i := 0
		for b.Loop() {
			i++
			serve(b, h, fmt.Sprintf("first-%d", i))
		}
	})
	b.Run("replay", func(b *testing.B) {
		h := mustMiddleware(b, &idemhttp.Config{SharedScope: true, Store: open(b)}).Handler(handler)
		serve(b, h, "replayed")
		for b.Loop() {
			serve(b, h, "replayed")
		}
	})
}
