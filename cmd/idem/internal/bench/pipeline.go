package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem/cmd/idem/internal/payments"
	"github.com/idem-go/idem/idemhttp"
)

// pipelineAccounts is how many accounts the payments are spread over, as
// scripts/serve-load spreads them.
const pipelineAccounts = 100

// runPipeline runs the payment service of cfg in process and pays it n
// times from 16 clients, over pipelineAccounts accounts, through its HTTP
// handler (no sockets), then waits until every payment is settled.
func runPipeline(ctx context.Context, cfg payments.Config, n int) (pipelineFigures, error) {
	const apiKey = "bench-key"
	cfg.APIKeys = map[string]string{apiKey: "bench"}
	svc, err := payments.New(ctx, &cfg)
	if err != nil {
		return pipelineFigures{}, err
	}
	defer svc.Close()
	h := svc.Handler()
	call := func(ctx context.Context, method, path, key string, body any, want int, out any) error {
		var b []byte
		if body != nil {
			b, _ = json.Marshal(body)
		}
		req := httptest.NewRequestWithContext(ctx, method, path, bytes.NewReader(b))
		req.Header.Set("Authorization", "Bearer "+apiKey)
		req.Header.Set("Content-Type", "application/json")
		if key != "" {
			req.Header.Set(idemhttp.HeaderKey, key)
		}
		rr := httptest.NewRecorder()
		h.ServeHTTP(rr, req)
		if rr.Code != want {
			return fmt.Errorf("%s %s: status %d, want %d: %s", method, path, rr.Code, want, rr.Body.String())
		}
		if out != nil {
			return json.Unmarshal(rr.Body.Bytes(), out)
		}
		return nil
	}
	run := randomID()
	accounts := make([]string, pipelineAccounts)
	for i := range accounts {
		var a struct {
			ID string `json:"id"`
		}
		if err := call(ctx, http.MethodPost, "/v1/accounts", fmt.Sprintf("%s-acct-%d", run, i),
			map[string]any{"balance": int64(1) << 40, "currency": "KRW"}, http.StatusCreated, &a); err != nil {
			return pipelineFigures{}, err
		}
		accounts[i] = a.ID
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	var errOnce sync.Once
	var firstErr error
	began := time.Now()
	for range 16 {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n || ctx.Err() != nil {
					return
				}
				body := map[string]any{"account_id": accounts[i%len(accounts)], "amount": 1250, "currency": "KRW"}
				if err := call(ctx, http.MethodPost, "/v1/payments", fmt.Sprintf("%s-pay-%d", run, i), body, http.StatusCreated, nil); err != nil {
					errOnce.Do(func() { firstErr = err })
					return
				}
			}
		})
	}
	wg.Wait()
	paid := time.Since(began)
	if firstErr != nil {
		return pipelineFigures{}, firstErr
	}
	deadline := time.Now().Add(5 * time.Minute)
	for {
		var st struct {
			Total  int64 `json:"total"`
			Events int64 `json:"events"`
		}
		if err := call(ctx, http.MethodGet, "/v1/settlement", "", nil, http.StatusOK, &st); err != nil {
			return pipelineFigures{}, err
		}
		if st.Events >= int64(n) {
			if st.Events != int64(n) || st.Total != 1250*int64(n) {
				return pipelineFigures{}, fmt.Errorf("settlement %+v after %d payments of 1250", st, n)
			}
			break
		}
		if time.Now().After(deadline) {
			return pipelineFigures{}, fmt.Errorf("%d of %d payments settled after 5 minutes", st.Events, n)
		}
		select {
		case <-time.After(5 * time.Millisecond):
		case <-ctx.Done():
			return pipelineFigures{}, ctx.Err()
		}
	}
	return pipelineFigures{payments: n, paid: paid, settled: time.Since(began)}, nil
}
