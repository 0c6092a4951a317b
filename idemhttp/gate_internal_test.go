package idemhttp

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/idemtest"
)

// With a store that claims keys in the request's transaction (idempg), a
// duplicate waiting in the database holds a pool connection. A burst of
// duplicates of one slow request must not take the whole pool: they wait at
// the key's gate in the process, and a request for another key still gets
// a connection and runs. Once the slow one commits, every duplicate replays
// its answer.
func TestDuplicatesOfASlowRequestLeaveThePoolToOthers(t *testing.T) {
	url := idemtest.RequireService(t, "PostgreSQL", "IDEM_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
	b := make([]byte, 6)
	rand.Read(b)
	schema := "idemhttp_test_" + hex.EncodeToString(b)
	db, err := idempg.Open(t.Context(), url, &idempg.Config{Schema: schema, MaxConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		db.Pool().Exec(ctx, `DROP SCHEMA `+pgx.Identifier{schema}.Sanitize()+` CASCADE`)
		db.Close()
	})
	store, err := idempg.NewStore(t.Context(), db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(store.Close)
	m, err := New(&Config{SharedScope: true, Store: store, InflightWait: time.Minute})
	if err != nil {
		t.Fatal(err)
	}

	entered := make(chan struct{})
	release := make(chan struct{})
	var releaseOnce sync.Once
	letGo := func() { releaseOnce.Do(func() { close(release) }) }
	// Registered after the DB's cleanup, so it runs first: a failing test
	// lets the slow request go before the pool is closed.
	t.Cleanup(letGo)
	var slowRuns atomic.Int32
	h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, key, _ := KeyFromContext(r.Context())
		if key == "slow" {
			slowRuns.Add(1)
			close(entered)
			<-release
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "done "+string(key))
	}))
	send := func(ctx context.Context, key string) *httptest.ResponseRecorder {
		req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/v1/payments", strings.NewReader(`{"amount":1}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(HeaderKey, key)
		rr := httptest.NewRecorder()
		h.ServeHTTP(rr, req)
		return rr
	}

	const dups = 10
	answers := make(chan *httptest.ResponseRecorder, dups+1)
	var wg sync.WaitGroup
	wg.Go(func() { answers <- send(t.Context(), "slow") })
	<-entered
	for range dups {
		wg.Go(func() { answers <- send(t.Context(), "slow") })
	}
	idemtest.Eventually(t, 10*time.Second, "the duplicates waiting at the key's gate", func() bool {
		return m.gates.waiting(waitKey{key: "slow"}) == dups
	})

	// The slow request holds one of the two connections; the other is free
	// for another key.
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	other := send(ctx, "other")
	cancel()
	if other.Code != http.StatusCreated || other.Body.String() != "done other" {
		t.Fatalf("another key while duplicates wait: %d %s", other.Code, other.Body)
	}

	letGo()
	wg.Wait()
	close(answers)
	replayed := 0
	for rr := range answers {
		if rr.Code != http.StatusCreated || rr.Body.String() != "done slow" {
			t.Errorf("slow key: %d %s", rr.Code, rr.Body)
		}
		if rr.Header().Get(HeaderReplayed) == "true" {
			replayed++
		}
	}
	if n := slowRuns.Load(); n != 1 || replayed != dups {
		t.Fatalf("the slow handler ran %d times and %d answers were replays; want 1 and %d", n, replayed, dups)
	}
}

// replayClaimer is a TxClaimer whose keys are all completed, and which
// answers a claim only once a second one of the same key is in ClaimTx
// with it (or after a while): it tells whether the middleware lets two
// replays of one key claim side by side.
type replayClaimer struct {
	*idemmem.Store
	mu      sync.Mutex
	inside  int
	most    int
	changed chan struct{}
}

func (c *replayClaimer) CompleteTx(context.Context, idem.Ref, idem.TxWork) (bool, error) {
	return false, errors.New("not used")
}

func (c *replayClaimer) ClaimTx(ctx context.Context, req idem.ClaimRequest, _ time.Duration, _ idem.ClaimedWork) (idem.Claim, bool, error) {
	c.mu.Lock()
	c.inside++
	c.most = max(c.most, c.inside)
	close(c.changed)
	c.changed = make(chan struct{})
	c.mu.Unlock()
	deadline := time.After(5 * time.Second)
	for {
		c.mu.Lock()
		n, changed := c.most, c.changed
		c.mu.Unlock()
		if n >= 2 {
			break
		}
		select {
		case <-changed:
			continue
		case <-deadline:
		}
		break
	}
	c.mu.Lock()
	c.inside--
	c.mu.Unlock()
	return idem.Claim{Outcome: idem.Completed, Record: idem.Record{Scope: req.Scope, Key: req.Key, State: idem.StateCompleted,
		Response: &idem.Response{Status: http.StatusCreated, Body: []byte("first")}}}, false, nil
}

// Replays of one key are not held at any gate: they claim side by side.
func TestReplaysOfOneKeyClaimSideBySide(t *testing.T) {
	claimer := &replayClaimer{Store: idemmem.NewStore(nil), changed: make(chan struct{})}
	m, err := New(&Config{SharedScope: true, Store: claimer})
	if err != nil {
		t.Fatal(err)
	}
	h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Error("the handler ran for a completed key")
	}))
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			req := httptest.NewRequest(http.MethodPost, "/v1/payments", strings.NewReader(`{}`))
			req.Header.Set(HeaderKey, "hot")
			rr := httptest.NewRecorder()
			h.ServeHTTP(rr, req)
			if rr.Code != http.StatusCreated || rr.Header().Get(HeaderReplayed) != "true" {
				t.Errorf("replay: %d %s", rr.Code, rr.Body)
			}
		})
	}
	wg.Wait()
	if claimer.most != 2 {
		t.Fatalf("at most %d replays of the key claimed at once, want 2", claimer.most)
	}
}

// detached's context outlives the request's, carries its values (its
// Execution included), ends at its deadline, and makes no timer for a
// store that reads only the deadline.
func TestDetached(t *testing.T) {
	type key struct{}
	parent, cancel := context.WithCancel(context.WithValue(context.Background(), key{}, "v"))
	ex := newExecCtx(parent, time.Hour, Execution{Key: "k"})
	d, stop := detached(ex)
	defer stop()
	cancel()
	dl, ok := d.Deadline()
	if !ok || time.Until(dl) > 10*time.Second || time.Until(dl) < 9*time.Second {
		t.Errorf("deadline %v, %v; want 10s from now", dl, ok)
	}
	if e, ok := ExecutionFromContext(d); !ok || e.Key != "k" {
		t.Errorf("ExecutionFromContext = %+v, %v; want the request's", e, ok)
	}
	if d.(*execCtx).inner.Load() != nil {
		t.Error("the deadline and the Execution alone made a timer")
	}
	if d.Value(key{}) != "v" {
		t.Error("the request's values are lost")
	}
	if d.Err() != nil {
		t.Errorf("ended with the request: %v", d.Err())
	}
	stop()
	select {
	case <-d.Done():
	default:
		t.Error("stop did not end it")
	}
}
