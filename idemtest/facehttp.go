package idemtest

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/keyed"
)

// HTTP is idemhttp's face, for TestFace: a Middleware in front of the
// suite's handler on an httptest.Server, in one shared scope, and a client
// that sends POST /pay with an Idempotency-Key. Replies are 201 (Created),
// 402 (Refused) and 503 (Transient) with the body as text; the
// middleware's problems are told apart by their type.
var HTTP Face = httpFace{}

type httpFace struct{}

func (httpFace) Name() string { return "http" }

func (httpFace) Serve(t *testing.T, cfg FaceConfig) Server {
	t.Helper()
	e := cfg.Engine
	m, err := idemhttp.New(&idemhttp.Config{Store: e.Store, SeparateTx: e.SeparateTx, SharedScope: true, TTL: e.TTL, Lease: e.Lease,
		Timeout: e.Timeout, Holder: e.Holder, Timers: e.Timers, InflightWait: e.InflightWait, PollInterval: e.PollInterval,
		RecentKeys: e.RecentKeys, MemoryReplayFor: e.MemoryReplayFor, MemoryReplayBytes: e.MemoryReplayBytes, Clock: e.Clock,
		KeySecret: e.KeySecret, BodyKeys: e.BodyKeys, DiscardBodies: e.DiscardBodies, Observer: e.Observer, Logger: e.Logger})
	if err != nil {
		t.Fatal(err)
	}
	h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			t.Errorf("reading the body the middleware hands on: %v", err)
		}
		writeReply(w, cfg.Handler(r.Context(), string(body)))
	}))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if cfg.Arrived != nil {
			cfg.Arrived(r.Context())
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return &httpServer{m: m, srv: srv, client: srv.Client()}
}

func writeReply(w http.ResponseWriter, reply Reply) {
	status := http.StatusCreated
	switch reply.Kind {
	case Refused:
		status = http.StatusPaymentRequired
	case Transient:
		status = http.StatusServiceUnavailable
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	io.WriteString(w, reply.Body)
}

type httpServer struct {
	m      *idemhttp.Middleware
	srv    *httptest.Server
	client *http.Client
}

func (s *httpServer) Do(ctx context.Context, key, body string) Answer {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.srv.URL+"/pay", strings.NewReader(body))
	if err != nil {
		return Answer{Kind: Other, Raw: err.Error()}
	}
	req.Header.Set("Content-Type", "text/plain")
	req.Header.Set(idemhttp.HeaderKey, key)
	resp, err := s.client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return Answer{Kind: Gone, Raw: err.Error()}
		}
		return Answer{Kind: Other, Raw: err.Error()}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	a := Answer{Replayed: resp.Header.Get(idemhttp.HeaderReplayed) == "true",
		Raw: resp.Status + " " + strings.TrimSpace(string(b))}
	if n, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil {
		a.RetryAfter = time.Duration(n) * time.Second
	}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), idemhttp.ProblemContentType) {
		var p struct{ Type, Title string }
		_ = json.Unmarshal(b, &p)
		switch p.Type {
		case idemhttp.ProblemKeyMismatch:
			a.Kind = Mismatch
		case idemhttp.ProblemInFlight:
			a.Kind = InFlight
		case idemhttp.ProblemStoreUnavailable:
			a.Kind = Unavailable
		case idemhttp.ProblemLeaseLost:
			a.Kind = LeaseLost
		case idemhttp.ProblemHandlerFailed:
			a.Kind = Failed
			if resp.StatusCode == http.StatusServiceUnavailable {
				a.Kind = Unfinished
			}
		case idemhttp.ProblemAnswerUnreadable:
			a.Kind = Unreadable
		default:
			a.Kind = Other
		}
		return a
	}
	a.Body = string(b)
	switch resp.StatusCode {
	case http.StatusCreated:
		a.Kind = Created
	case http.StatusPaymentRequired:
		a.Kind = Refused
	case http.StatusServiceUnavailable:
		a.Kind = Transient
	default:
		a.Kind = Other
	}
	return a
}

func (s *httpServer) Counts() map[keyed.Outcome]uint64 { return s.m.Counts() }

func (s *httpServer) Restart(ctx context.Context) (int, error) { return s.m.Restart(ctx) }

func (s *httpServer) NewCompleter(cfg keyed.CompleterConfig, resume FaceResume) (*keyed.Completer, error) {
	return s.m.NewCompleter(&idemhttp.CompleterConfig{Every: cfg.Every, Timeout: cfg.Timeout, Limit: cfg.Limit, Parallel: cfg.Parallel, Logger: cfg.Logger,
		Resume: func(ctx context.Context, w http.ResponseWriter, ex idemhttp.Execution) error {
			reply, err := resume(ctx, ex)
			if err != nil {
				return err
			}
			writeReply(w, reply)
			return nil
		}})
}
