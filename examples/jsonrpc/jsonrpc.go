package jsonrpc

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/keyed"
)

// HeaderKey is the HTTP header that carries a call's idempotency key, and
// HeaderReplayed the one set to "true" on a replayed answer: idemhttp's
// names, so that a gateway or client that knows one knows both.
const (
	HeaderKey      = "Idempotency-Key"
	HeaderReplayed = "Idempotent-Replayed"
)

// JSON-RPC 2.0's error codes, and this face's, in the range the
// specification leaves to implementations (-32000 to -32099).
const (
	CodeParseError     = -32700
	CodeInvalidRequest = -32600
	CodeMethodNotFound = -32601
	CodeInvalidParams  = -32602
	CodeInternal       = -32603 // the method gave no answer (it panicked, its time ran out); nothing kept

	CodeRetry          = -32000 // a transient failure: nothing kept, retry with the same key
	CodeKeyMismatch    = -32001 // the key was used with another call
	CodeInFlight       = -32002 // a call with the key is still running; retry later (data.retryAfterMs)
	CodeUnavailable    = -32003 // the key could not be claimed or the answer committed; nothing happened
	CodeLeaseLost      = -32004 // the call outlived its lease and was rolled back; retry with the same key
	CodeUnfinished     = -32005 // the call failed after a recovery point; retry with the same key to finish it
	CodeResultOmitted  = -32006 // a replay of a result too large to keep: the call ran, its result is not here
	CodeKeptUnreadable = -32007 // the kept answer cannot be read; the call is not run again
)

// Error is a JSON-RPC error object. A Method returns one to answer with
// it: a code outside CodeRetry's range (-32000 to -32099) and other than
// CodeInternal is the call's deterministic outcome (insufficient funds,
// invalid params), kept and replayed; one inside it, or CodeInternal, is
// transient: nothing is kept, and a retry with the same key runs again.
type Error struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
	Data    any    `json:"data,omitempty"`
}

func (e *Error) Error() string { return fmt.Sprintf("jsonrpc error %d: %s", e.Code, e.Message) }

func (e *Error) transient() bool {
	return (e.Code <= CodeRetry && e.Code >= -32099) || e.Code == CodeInternal
}

// Method is one JSON-RPC method: it gets the call's params and returns its
// result (encoded as JSON), or an error: an *Error as it is, any other
// error as a transient CodeRetry whose text is logged, not sent. ctx is the
// engine's: keyed.ExecutionFromContext, keyed.SaveRecovery and
// keyed.DownstreamKey work with it.
type Method func(ctx context.Context, params json.RawMessage) (any, error)

// Config configures a Server.
type Config struct {
	// Engine is the engine's configuration: the Store, Lease, Timeout,
	// InflightWait and the rest (keyed.Config, which says each default).
	Engine keyed.Config
	// Methods are the methods served, by name; each call needs a key.
	Methods map[string]Method
	// Scope returns who owns the call's key. Required, unless SharedScope.
	Scope func(r *http.Request) (idem.Scope, error)
	// SharedScope puts every key in one scope shared by all callers.
	SharedScope bool
	// MaxBytes bounds a request and a kept answer. Defaults to 1 MiB.
	MaxBytes int
}

// Server serves JSON-RPC 2.0 calls, one per HTTP POST, each run at most
// once per key: a face of the engine (keyed.Face).
type Server struct {
	eng     *keyed.Engine
	methods map[string]Method
	scope   func(*http.Request) (idem.Scope, error)
	max     int
	log     *slog.Logger
}

// New returns a Server for cfg, or an error that names the field refused.
func New(cfg *Config) (*Server, error) {
	if cfg == nil {
		cfg = &Config{}
	}
	if cfg.Scope == nil && !cfg.SharedScope {
		return nil, &idem.ArgumentError{Field: "jsonrpc.Config.Scope", Reason: "is required, unless SharedScope is set"}
	}
	if len(cfg.Methods) == 0 {
		return nil, &idem.ArgumentError{Field: "jsonrpc.Config.Methods", Reason: "names no method"}
	}
	eng, err := keyed.New(&cfg.Engine)
	if err != nil {
		return nil, err
	}
	s := &Server{eng: eng, methods: cfg.Methods, scope: cfg.Scope, max: cfg.MaxBytes, log: eng.Config().Logger}
	if s.max <= 0 {
		s.max = 1 << 20
	}
	return s, nil
}

// Counts returns how many keyed calls ended in each of the engine's
// outcomes.
func (s *Server) Counts() map[keyed.Outcome]uint64 { return s.eng.Counts() }

// Restart ends the leases an earlier incarnation of this replica held
// (keyed.Engine.Restart).
func (s *Server) Restart(ctx context.Context) (int, error) { return s.eng.Restart(ctx) }

// request is a JSON-RPC request object.
type request struct {
	JSONRPC string          `json:"jsonrpc"`
	Method  string          `json:"method"`
	Params  json.RawMessage `json:"params"`
	ID      json.RawMessage `json:"id"`
}

// ServeHTTP answers one JSON-RPC call. Batches are refused: one key names
// one operation.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "JSON-RPC calls are POSTed", http.StatusMethodNotAllowed)
		return
	}
	c := &call{s: s, w: w, ctx: r.Context()}
	if s.eng.Observed() {
		c.ctx = s.eng.Begin(c.ctx, r)
		defer s.eng.End(c.ctx)
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, int64(s.max)+1))
	var req request
	switch {
	case err != nil:
		c.fail(CodeParseError, "the request could not be read", nil)
		return
	case len(body) > s.max:
		c.fail(CodeInvalidRequest, fmt.Sprintf("the request exceeds %d bytes", s.max), nil)
		return
	case len(bytes.TrimSpace(body)) > 0 && bytes.TrimSpace(body)[0] == '[':
		c.fail(CodeInvalidRequest, "batches are not served: send one call per request, each with its own key", nil)
		return
	}
	if err := json.Unmarshal(body, &req); err != nil {
		c.fail(CodeParseError, "the request is not JSON: "+err.Error(), nil)
		return
	}
	c.id = req.ID
	switch {
	case req.JSONRPC != "2.0" || req.Method == "":
		c.fail(CodeInvalidRequest, `a request has "jsonrpc": "2.0" and a method`, nil)
		return
	case len(req.ID) == 0 || string(req.ID) == "null":
		c.fail(CodeInvalidRequest, "a keyed call has an id: a notification gets no answer to keep", nil)
		return
	}
	m, ok := s.methods[req.Method]
	if !ok {
		c.fail(CodeMethodNotFound, "no method "+strconv.Quote(req.Method), nil)
		return
	}
	key, err := idem.ParseKey(r.Header.Get(HeaderKey))
	if err != nil {
		s.eng.Reject(c.ctx, "", "")
		c.fail(CodeInvalidRequest, "every call carries an "+HeaderKey+" header, one key per operation: "+err.Error(), nil)
		return
	}
	var scope idem.Scope
	if s.scope != nil {
		if scope, err = s.scope(r); err != nil {
			s.eng.Reject(c.ctx, "", "")
			c.fail(CodeInvalidRequest, "the caller could not be told, so nothing was run", nil)
			return
		}
	}
	// The id is the message's, not the operation's: a retry may send
	// another. The fingerprint is the method and its params, canonical
	// JSON, so that a client that orders its members otherwise is not
	// refused.
	params := req.Params
	if len(params) == 0 {
		params = json.RawMessage("null")
	}
	c.method, c.params, c.run = req.Method, params, m
	fp := idem.NewFingerprint(http.MethodPost, "jsonrpc:"+req.Method, "", "application/json", params)
	s.eng.Serve(c.ctx, keyed.Request{Scope: scope, Key: key, Fingerprint: fp, Method: req.Method, Path: r.URL.Path}, c)
}

// call is one keyed call, as the engine's face.
type call struct {
	s      *Server
	w      http.ResponseWriter
	ctx    context.Context
	id     json.RawMessage
	method string
	params json.RawMessage
	run    Method

	// member is the answer's "result" or "error" member, once Run has
	// answered; answered says it did.
	member   []byte
	answered bool
}

// Run implements keyed.Face: the method, once, its answer captured whole
// (nothing reaches the client before Send).
func (c *call) Run(ctx context.Context, _ bool) (ran keyed.Ran) {
	defer func() {
		if v := recover(); v != nil {
			c.s.log.ErrorContext(ctx, "jsonrpc: a method panicked", "method", c.method, "panic", fmt.Sprint(v))
			ran = keyed.Ran{Status: http.StatusInternalServerError, Failure: "panicked"}
		}
	}()
	result, err := c.run(ctx, c.params)
	var rerr *Error
	switch {
	case err != nil && ctx.Err() != nil:
		return keyed.Ran{Status: http.StatusGatewayTimeout, Failure: "timed out"}
	case errors.As(err, &rerr):
	case err != nil:
		c.s.log.WarnContext(ctx, "jsonrpc: a method failed", "method", c.method, "error", err.Error())
		rerr = &Error{Code: CodeRetry, Message: "the call failed; retry it with the same key"}
	}
	ran.Status, ran.Keep = http.StatusOK, true
	if rerr != nil {
		ran.Status, ran.Keep = http.StatusUnprocessableEntity, !rerr.transient()
		if !ran.Keep {
			ran.Status = http.StatusServiceUnavailable
		}
		c.member, ran.Err = json.Marshal(map[string]*Error{"error": rerr})
	} else {
		c.member, ran.Err = json.Marshal(map[string]any{"result": result})
	}
	if ran.Err != nil {
		c.member = nil
		return ran
	}
	c.answered = true
	ran.Answer = idem.Response{Status: ran.Status, Header: http.Header{"Content-Type": {"application/json"}}, Body: c.member}
	ran.Overflow = len(c.member) > c.s.max
	return ran
}

// Send implements keyed.Face.
func (c *call) Send() {
	if !c.answered {
		c.fail(CodeInternal, "the result could not be encoded", nil)
		return
	}
	c.write(c.member)
}

// Replay implements keyed.Face: the kept member, under this call's id.
func (c *call) Replay(kept *idem.Response) error {
	c.w.Header().Set(HeaderReplayed, "true")
	if kept.BodyOmitted {
		c.fail(CodeResultOmitted, "the call ran; its result was too large to keep, so it is not replayed", nil)
		return nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(kept.Body, &m); err != nil || len(m) != 1 || (m["result"] == nil && m["error"] == nil) {
		c.w.Header().Del(HeaderReplayed)
		return fmt.Errorf("jsonrpc: the kept answer is no result nor error member: %v", err)
	}
	c.write(kept.Body)
	return nil
}

// Refuse implements keyed.Face: each refusal as an error object.
func (c *call) Refuse(r keyed.Refusal) {
	var retry map[string]int64
	if r.RetryAfter > 0 {
		c.w.Header().Set("Retry-After", strconv.Itoa(int((r.RetryAfter+time.Second-1)/time.Second)))
		retry = map[string]int64{"retryAfterMs": r.RetryAfter.Milliseconds()}
	}
	switch r.Reason {
	case keyed.RefusedMismatch:
		c.fail(CodeKeyMismatch, "this key was used with another call (method or params); use a new key for a new operation", nil)
	case keyed.RefusedInFlight:
		if c.ctx.Err() != nil {
			return // the caller left: nobody reads an answer
		}
		c.fail(CodeInFlight, "a call with this key is still running; retry later with the same key to get its answer", retry)
	case keyed.RefusedStoreUnavailable, keyed.RefusedCommitFailed:
		c.fail(CodeUnavailable, "the call was not run or not committed; retry with the same key", retry)
	case keyed.RefusedLeaseLost:
		c.fail(CodeLeaseLost, "the call outlived its lease and was rolled back; retry with the same key", retry)
	case keyed.RefusedUnfinished:
		if c.answered {
			c.Send() // the method's own transient answer
			return
		}
		c.fail(CodeUnfinished, "the call failed after a recovery point; retry with the same key to finish it", retry)
	case keyed.RefusedUnreadable:
		c.s.log.ErrorContext(c.ctx, "jsonrpc: a kept answer cannot be read", "method", c.method, "error", fmt.Sprint(r.Err))
		c.fail(CodeKeptUnreadable, "the kept answer of this key cannot be read; the call is not run again", nil)
	default: // handler failed, too large, unkeepable
		c.fail(CodeInternal, "the call gave no answer to keep; nothing was kept", nil)
	}
}

// fail answers with an error object of the face's own.
func (c *call) fail(code int, msg string, data any) {
	member, _ := json.Marshal(map[string]*Error{"error": {Code: code, Message: msg, Data: data}})
	c.write(member)
}

// write answers with member ({"result": …} or {"error": …}) under the
// call's id.
func (c *call) write(member []byte) {
	id := c.id
	if len(id) == 0 {
		id = json.RawMessage("null")
	}
	var b bytes.Buffer
	b.WriteString(`{"jsonrpc":"2.0","id":`)
	b.Write(id)
	b.WriteByte(',')
	b.Write(bytes.TrimPrefix(member, []byte("{")))
	c.w.Header().Set("Content-Type", "application/json")
	c.w.Write(b.Bytes())
}

// ResumeFunc finishes an abandoned call from its recovery point, answering
// as its Method would.
type ResumeFunc func(ctx context.Context, ex keyed.Execution) (any, error)

// NewCompleter returns the engine's Completer for s's store (an
// idem.Recoverer), whose resumes answer as s's methods do: a result or a
// kept *Error is kept for the client's retry to get replayed.
func (s *Server) NewCompleter(cfg keyed.CompleterConfig, resume ResumeFunc) (*keyed.Completer, error) {
	cfg.Resume = func(ctx context.Context, ex keyed.Execution) (idem.Response, error) {
		result, err := resume(ctx, ex)
		if rerr := (*Error)(nil); err != nil && (!errors.As(err, &rerr) || rerr.transient()) {
			// keyed.ErrNothingDone releases the key; any other error leaves
			// its outcome unknown, and the key in flight with its point.
			return idem.Response{}, err
		}
		c := &call{s: s, method: "resume " + ex.Recovery.Name, run: func(context.Context, json.RawMessage) (any, error) { return result, err }}
		switch ran := c.Run(ctx, false); {
		case ran.Failure != "":
			return idem.Response{}, errors.New("jsonrpc: the resume " + ran.Failure)
		case ran.Err != nil:
			return idem.Response{}, ran.Err
		case ran.Overflow:
			return idem.Response{}, fmt.Errorf("jsonrpc: the resume's answer exceeds %d bytes", s.max)
		default:
			return ran.Answer, nil
		}
	}
	return s.eng.NewCompleter(&cfg)
}
