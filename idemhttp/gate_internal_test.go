package idemhttp

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
)

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
