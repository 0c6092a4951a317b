package payments

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/idem-go/idem/idemhttp"
)

// DefaultProbeTimeout is how long /healthz and /readyz wait for the
// database before answering 503.
const DefaultProbeTimeout = 2 * time.Second

// writeProbe runs the readiness write (storage.Probe) at most once at a
// time. A write that a stalled disk holds may never return; the probe
// then answers from it ("a write has been waiting for 40s") instead of
// piling up more writes behind it.
type writeProbe struct {
	mu      sync.Mutex
	running bool
	started time.Time
	done    chan struct{} // closed when the running write returns
	err     error         // the running write's result, once done
}

// check starts the write unless one is running, and waits for it at most
// timeout. It returns the write's error, or one saying how long it has
// been waiting.
func (p *writeProbe) check(ctx context.Context, write func(context.Context) error, timeout time.Duration) error {
	p.mu.Lock()
	if !p.running {
		p.running, p.started, p.done = true, time.Now(), make(chan struct{})
		done := p.done
		go func() {
			// Detached from the request: a write stuck in the kernel
			// cannot be cancelled anyway, and the next check reads its
			// outcome.
			wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
			err := write(wctx)
			cancel()
			p.mu.Lock()
			p.running, p.err = false, err
			p.mu.Unlock()
			close(done)
		}()
	}
	done, started := p.done, p.started
	p.mu.Unlock()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-done:
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.err
	case <-t.C:
		return fmt.Errorf("a write to the database has not committed after %v", time.Since(started).Round(time.Millisecond))
	case <-ctx.Done():
		return ctx.Err()
	}
}

// healthz says whether the process is alive and its database answers a
// read, within probeTimeout. It does not write: see readyz.
func (s *Service) healthz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), s.probeTimeout)
	defer cancel()
	if err := s.store.Ping(ctx); err != nil {
		s.logger.ErrorContext(r.Context(), "payments: health check failed", "err", err)
		writeProblem(w, http.StatusServiceUnavailable, "unhealthy", "Unhealthy", "the database does not answer", nil)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// readyz says whether the service can take payments: a write to the
// database commits, durably, within probeTimeout. A full, read-only or
// stalled disk, or a database that refuses writes, makes it 503 while
// /healthz, which only reads, may still answer 200.
func (s *Service) readyz(w http.ResponseWriter, r *http.Request) {
	if err := s.probe.check(r.Context(), s.store.Probe, s.probeTimeout); err != nil {
		s.logger.ErrorContext(r.Context(), "payments: readiness check failed", "err", err)
		writeProblem(w, http.StatusServiceUnavailable, "not-ready", "Not ready", "the database does not commit writes", nil)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
}

// requestTimeoutBody is what a request that ran out of time is answered:
// problem+json, as every error of the API.
const requestTimeoutBody = `{"type":"` + ProblemTypePrefix + `request-timeout","title":"Request timed out",` +
	`"status":503,"detail":"The request did not finish in time: the database did not answer. ` +
	`It may still complete: retry with the same Idempotency-Key, which replays its result if it did."}`

// withRequestTimeout answers 503 to a request not done within d, whatever
// it waits for: a stalled disk or database must not hold a client for
// good (http.TimeoutHandler, which buffers the answer until the handler
// is done). The request's context is cancelled then; what it was writing
// commits or not as a whole, and a retry with its key finds out which.
func withRequestTimeout(h http.Handler, d time.Duration) http.Handler {
	th := http.TimeoutHandler(h, d, requestTimeoutBody)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		th.ServeHTTP(&timeoutHeaders{ResponseWriter: w}, r)
	})
}

// timeoutHeaders gives TimeoutHandler's own 503, which comes with no
// headers at all, the Content-Type and Retry-After of the API's problems.
// An answer of the handler's own carries its own Content-Type and is
// left as it is.
type timeoutHeaders struct{ http.ResponseWriter }

func (t *timeoutHeaders) WriteHeader(code int) {
	if h := t.Header(); code == http.StatusServiceUnavailable && h.Get("Content-Type") == "" {
		h.Set("Content-Type", idemhttp.ProblemContentType)
		h.Set("Retry-After", "1")
	}
	t.ResponseWriter.WriteHeader(code)
}

func (t *timeoutHeaders) Unwrap() http.ResponseWriter { return t.ResponseWriter }
