package jsonrpc_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/examples/jsonrpc"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemsqlite"
	"github.com/idem-go/idem/idemtest"
	"github.com/idem-go/idem/keyed"
)

// face is the JSON-RPC face for idemtest.TestFace: a Server on an
// httptest.Server whose one method, pay, takes the suite's body as its
// params; the client POSTs a call with a fresh id each time. Replies are a
// result (Created), an error of code 402 (Refused, kept) and CodeRetry
// (Transient), the body as the error's message.
type face struct{}

func (face) Name() string { return "jsonrpc" }

func (face) Serve(t *testing.T, cfg idemtest.FaceConfig) idemtest.Server {
	t.Helper()
	s, err := jsonrpc.New(&jsonrpc.Config{Engine: cfg.Engine, SharedScope: true, Methods: map[string]jsonrpc.Method{
		"pay": func(ctx context.Context, params json.RawMessage) (any, error) {
			var body string
			if err := json.Unmarshal(params, &body); err != nil {
				return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: err.Error()}
			}
			return answerOf(cfg.Handler(ctx, body))
		}}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if cfg.Arrived != nil {
			cfg.Arrived(r.Context())
		}
		s.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return &server{s: s, url: srv.URL, client: srv.Client()}
}

func answerOf(r idemtest.Reply) (any, error) {
	switch r.Kind {
	case idemtest.Refused:
		return nil, &jsonrpc.Error{Code: 402, Message: r.Body}
	case idemtest.Transient:
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeRetry, Message: r.Body}
	}
	return r.Body, nil
}

type server struct {
	s      *jsonrpc.Server
	url    string
	client *http.Client
	ids    atomic.Int64
}

// response is a JSON-RPC response object.
type response struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Result  json.RawMessage `json:"result"`
	Error   *jsonrpc.Error  `json:"error"`
}

// call POSTs one call of method with params under key (none when empty),
// and returns the response, the HTTP answer, and its body.
func call(ctx context.Context, client *http.Client, url, key, method string, params any, id int64) (response, *http.Response, string, error) {
	b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "method": method, "params": params, "id": id})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(string(b)))
	if err != nil {
		return response{}, nil, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set(jsonrpc.HeaderKey, key)
	}
	resp, err := client.Do(req)
	if err != nil {
		return response{}, nil, "", err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out response
	if err := json.Unmarshal(raw, &out); err != nil {
		return response{}, resp, string(raw), err
	}
	if string(out.ID) != strconv.FormatInt(id, 10) || out.JSONRPC != "2.0" {
		return out, resp, string(raw), errors.New("the response is not the call's (id, version)")
	}
	return out, resp, string(raw), nil
}

func (s *server) Do(ctx context.Context, key, body string) idemtest.Answer {
	out, resp, raw, err := call(ctx, s.client, s.url, key, "pay", body, s.ids.Add(1))
	switch {
	case err != nil && ctx.Err() != nil:
		return idemtest.Answer{Kind: idemtest.Gone, Raw: err.Error()}
	case err != nil:
		return idemtest.Answer{Kind: idemtest.Other, Raw: err.Error() + " " + raw}
	}
	a := idemtest.Answer{Replayed: resp.Header.Get(jsonrpc.HeaderReplayed) == "true", Raw: raw}
	if out.Error == nil {
		a.Kind = idemtest.Created
		if err := json.Unmarshal(out.Result, &a.Body); err != nil {
			a.Kind = idemtest.Other
		}
		return a
	}
	if d, ok := out.Error.Data.(map[string]any); ok {
		if ms, ok := d["retryAfterMs"].(float64); ok {
			a.RetryAfter = time.Duration(ms) * time.Millisecond
		}
	}
	a.Kind = map[int]idemtest.Kind{
		402:                        idemtest.Refused,
		jsonrpc.CodeRetry:          idemtest.Transient,
		jsonrpc.CodeKeyMismatch:    idemtest.Mismatch,
		jsonrpc.CodeInFlight:       idemtest.InFlight,
		jsonrpc.CodeUnavailable:    idemtest.Unavailable,
		jsonrpc.CodeLeaseLost:      idemtest.LeaseLost,
		jsonrpc.CodeInternal:       idemtest.Failed,
		jsonrpc.CodeUnfinished:     idemtest.Unfinished,
		jsonrpc.CodeKeptUnreadable: idemtest.Unreadable,
	}[out.Error.Code]
	switch a.Kind {
	case "":
		a.Kind = idemtest.Other
	case idemtest.Refused, idemtest.Transient:
		a.Body = out.Error.Message
	}
	return a
}

func (s *server) Counts() map[keyed.Outcome]uint64 { return s.s.Counts() }

func (s *server) Restart(ctx context.Context) (int, error) { return s.s.Restart(ctx) }

func (s *server) NewCompleter(cfg keyed.CompleterConfig, resume idemtest.FaceResume) (*keyed.Completer, error) {
	return s.s.NewCompleter(cfg, func(ctx context.Context, ex keyed.Execution) (any, error) {
		reply, err := resume(ctx, ex)
		if err != nil {
			return nil, err
		}
		return answerOf(reply)
	})
}

// The engine's behaviours through the JSON-RPC face: the suite idemhttp
// and idemgrpc pass, on a store in memory (the separate form) and on
// SQLite (the same-transaction forms).
func TestFace(t *testing.T) {
	t.Parallel()
	t.Run("memory", func(t *testing.T) {
		t.Parallel()
		idemtest.TestFace(t, face{}, func(t *testing.T, clock idem.Clock) idem.Store {
			return idemmem.NewStore(&idemmem.Config{Clock: clock})
		})
	})
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		idemtest.TestFace(t, face{}, func(t *testing.T, clock idem.Clock) idem.Store {
			db, err := idemsqlite.Open(filepath.Join(t.TempDir(), "keys.db"), nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.Close() })
			store, err := idemsqlite.NewStore(t.Context(), db, &idemsqlite.StoreConfig{Clock: clock})
			if err != nil {
				t.Fatal(err)
			}
			return store
		})
	})
}
