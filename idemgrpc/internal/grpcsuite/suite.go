package grpcsuite

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemgrpc"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemmem"
)

// start is when the suite's clocks start.
var start = time.Date(2030, time.January, 2, 3, 4, 5, 0, time.UTC)

// Run checks the interceptor in front of the stores open makes, over a
// real grpc-go connection: concurrent duplicates run once, a lost answer
// is replayed to the retry, a key reused with another request is refused,
// a transient status keeps nothing and a deterministic one is replayed
// (details and kept metadata included), a panic keeps nothing, a crashed
// execution's key is taken over once its lease ends, and the Client's key
// survives gRPC's own retries; an answer too large to keep is kept without
// its message, or rolled back in the same-transaction forms. A store that is an idem.TxStore is checked
// in its same-transaction form, and in the separate form where a case
// needs it. The cases run as parallel subtests.
func Run(t *testing.T, open Open) {
	t.Helper()
	cases := []struct {
		name string
		fn   func(t *testing.T, open Open)
	}{
		{"ConcurrentDuplicatesRunOnce", concurrentDuplicates},
		{"LostAnswerReplayed", lostAnswerReplayed},
		{"MismatchRefused", mismatchRefused},
		{"TransientReruns", transientReruns},
		{"DeterministicReplayed", deterministicReplayed},
		{"PanicKeepsNothing", panicKeepsNothing},
		{"CrashThenRetryOnce", crashThenRetry},
		{"ClientKeySurvivesRetries", clientKeySurvivesRetries},
		{"KeyRules", keyRules},
		{"LargeAnswer", largeAnswer},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.fn(t, open)
		})
	}
}

func newHarness(t *testing.T, open Open, cfg idemgrpc.Config, opts *Options) (*Harness, *idemmem.Clock) {
	clock := idemmem.NewClock(start)
	cfg.Store = open(t, clock)
	if cfg.Scope == nil {
		cfg.SharedScope = true
	}
	return New(t, cfg, opts), clock
}

func concurrentDuplicates(t *testing.T, open Open) {
	const n = 16
	h, _ := newHarness(t, open, idemgrpc.Config{InflightWait: time.Minute}, nil)
	var effects Effects
	release := make(chan struct{})
	h.Handle(func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
		effects.Add("k")
		<-release
		return Msg(t, map[string]any{"id": "pay_1", "amount": req.Fields["amount"].GetNumberValue()}), nil
	})
	req := Msg(t, map[string]any{"amount": 42})
	type result struct {
		out    *structpb.Struct
		header map[string][]string
		err    error
	}
	results := make(chan result, n)
	for range n {
		go func() {
			out, header, err := h.Call(t.Context(), "k", req)
			results <- result{out, header, err}
		}()
	}
	h.WaitClaims(t, n)
	close(release)
	replays := 0
	for range n {
		r := <-results
		if r.err != nil {
			t.Fatalf("a duplicate failed: %v", r.err)
		}
		if r.out.Fields["id"].GetStringValue() != "pay_1" || r.out.Fields["amount"].GetNumberValue() != 42 {
			t.Fatalf("answer %v", r.out)
		}
		if v := r.header[idemgrpc.MetadataReplayed]; len(v) == 1 && v[0] == "true" {
			replays++
		}
	}
	if got := effects.Of("k"); got != 1 {
		t.Fatalf("the handler ran %d times for %d concurrent duplicates, want 1", got, n)
	}
	if replays != n-1 {
		t.Fatalf("%d answers were marked replayed, want %d", replays, n-1)
	}
}

func lostAnswerReplayed(t *testing.T, open Open) {
	h, _ := newHarness(t, open, idemgrpc.Config{}, nil)
	var effects Effects
	started, proceed := make(chan struct{}, 1), make(chan struct{})
	h.Handle(func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
		effects.Add("k")
		started <- struct{}{}
		<-proceed // the client has gone meanwhile: its answer is lost
		return Msg(t, map[string]any{"id": "pay_7"}), nil
	})
	req := Msg(t, map[string]any{"amount": 7})
	ctx, cancel := context.WithCancel(t.Context())
	lost := make(chan error, 1)
	go func() {
		_, _, err := h.Call(ctx, "k", req)
		lost <- err
	}()
	<-started
	cancel()
	if err := <-lost; status.Code(err) != codes.Canceled {
		t.Fatalf("the first call: %v, want Canceled", err)
	}
	close(proceed)
	if o := h.WaitEnds(t, 1); o[0] != idemhttp.OutcomeExecuted {
		t.Fatalf("the first execution ended %s, want executed", o[0])
	}
	out, header, err := h.Call(t.Context(), "k", req)
	if err != nil {
		t.Fatal(err)
	}
	if out.Fields["id"].GetStringValue() != "pay_7" || header[idemgrpc.MetadataReplayed] == nil {
		t.Fatalf("retry got %v with header %v, want the replay of pay_7", out, header)
	}
	if got := effects.Of("k"); got != 1 {
		t.Fatalf("ran %d times, want 1", got)
	}
}

func mismatchRefused(t *testing.T, open Open) {
	h, _ := newHarness(t, open, idemgrpc.Config{}, nil)
	var effects Effects
	h.Handle(func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
		effects.Add("k")
		return req, nil
	})
	if _, _, err := h.Call(t.Context(), "k", Msg(t, map[string]any{"amount": 1, "to": "a"})); err != nil {
		t.Fatal(err)
	}
	// The same fields in another order encode the same: a replay.
	same := &structpb.Struct{Fields: map[string]*structpb.Value{"to": structpb.NewStringValue("a"), "amount": structpb.NewNumberValue(1)}}
	if _, header, err := h.Call(t.Context(), "k", same); err != nil || header[idemgrpc.MetadataReplayed] == nil {
		t.Fatalf("the same request again: %v, header %v; want a replay", err, header)
	}
	_, _, err := h.Call(t.Context(), "k", Msg(t, map[string]any{"amount": 2, "to": "a"}))
	if status.Code(err) != codes.FailedPrecondition || idemgrpc.Reason(err) != idemgrpc.ReasonKeyMismatch {
		t.Fatalf("another request under the key: %v (reason %q), want FailedPrecondition %s", err, idemgrpc.Reason(err), idemgrpc.ReasonKeyMismatch)
	}
	// No retry under the key can succeed, so the refusal invites none:
	// its ErrorInfo alone, no RetryInfo (not even of zero).
	if details := status.Convert(err).Details(); len(details) != 1 {
		t.Fatalf("the mismatch's details: %v; want its ErrorInfo alone", details)
	}
	if got := effects.Of("k"); got != 1 {
		t.Fatalf("ran %d times, want 1", got)
	}
}

func transientReruns(t *testing.T, open Open) {
	for _, code := range []codes.Code{codes.Unavailable, codes.DeadlineExceeded, codes.ResourceExhausted, codes.Internal, codes.Unknown} {
		t.Run(code.String(), func(t *testing.T) {
			t.Parallel()
			h, _ := newHarness(t, open, idemgrpc.Config{}, nil)
			var effects Effects
			h.Handle(func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
				effects.Add("k")
				if effects.Of("k") == 1 {
					return nil, status.Error(code, "try again")
				}
				return Msg(t, map[string]any{"ok": true}), nil
			})
			req := Msg(t, map[string]any{"amount": 3})
			if _, _, err := h.Call(t.Context(), "k", req); status.Code(err) != code {
				t.Fatalf("first call: %v, want %s", err, code)
			}
			if o := h.WaitEnds(t, 1); o[0] != idemhttp.OutcomeReleased {
				t.Fatalf("first call ended %s, want released", o[0])
			}
			if out, header, err := h.Call(t.Context(), "k", req); err != nil || !out.Fields["ok"].GetBoolValue() || header[idemgrpc.MetadataReplayed] != nil {
				t.Fatalf("the retry: %v %v %v, want a fresh run", out, header, err)
			}
			if _, header, err := h.Call(t.Context(), "k", req); err != nil || header[idemgrpc.MetadataReplayed] == nil {
				t.Fatalf("third call: %v %v, want the replay", header, err)
			}
			if got := effects.Of("k"); got != 2 {
				t.Fatalf("ran %d times, want 2", got)
			}
		})
	}
}

func deterministicReplayed(t *testing.T, open Open) {
	for _, code := range []codes.Code{codes.NotFound, codes.FailedPrecondition, codes.InvalidArgument} {
		t.Run(code.String(), func(t *testing.T) {
			t.Parallel()
			h, _ := newHarness(t, open, idemgrpc.Config{ReplayMetadata: []string{"x-ledger-id", "x-trace-bin"}}, nil)
			var effects Effects
			h.Handle(func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
				effects.Add("k")
				grpc.SetHeader(ctx, map[string][]string{"x-ledger-id": {"L1"}, "x-other": {"not kept"}})
				grpc.SetTrailer(ctx, map[string][]string{"x-trace-bin": {"\x00\x01\xff"}})
				st, _ := status.New(code, "insufficient funds").WithDetails(&errdetails.ErrorInfo{Reason: "FUNDS", Domain: "bank.example"})
				return nil, st.Err()
			})
			req := Msg(t, map[string]any{"amount": 1e9})
			_, _, first := h.Call(t.Context(), "k", req)
			var trailer = new(mdHolder)
			_, header, again := h.Call(t.Context(), "k", req, grpc.Trailer(&trailer.MD))
			if status.Code(first) != code || !proto.Equal(status.Convert(first).Proto(), status.Convert(again).Proto()) {
				t.Fatalf("first %v, replay %v: want the same %s with its details", first, again, code)
			}
			if header[idemgrpc.MetadataReplayed] == nil || fmt.Sprint(header["x-ledger-id"]) != "[L1]" || header["x-other"] != nil {
				t.Fatalf("replay's header %v: want idempotent-replayed and x-ledger-id only", header)
			}
			if got := trailer.MD["x-trace-bin"]; len(got) != 1 || got[0] != "\x00\x01\xff" {
				t.Fatalf("replay's trailer x-trace-bin %q", got)
			}
			if got := effects.Of("k"); got != 1 {
				t.Fatalf("ran %d times, want 1", got)
			}
		})
	}
}

func panicKeepsNothing(t *testing.T, open Open) {
	recoverer := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
		defer func() {
			if v := recover(); v != nil {
				err = status.Errorf(codes.Internal, "panic: %v", v)
			}
		}()
		return handler(ctx, req)
	}
	h, _ := newHarness(t, open, idemgrpc.Config{}, &Options{Outer: []grpc.UnaryServerInterceptor{recoverer}})
	var effects Effects
	h.Handle(func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
		effects.Add("k")
		if effects.Of("k") == 1 {
			panic("boom")
		}
		return Msg(t, map[string]any{"ok": true}), nil
	})
	req := Msg(t, map[string]any{"amount": 5})
	if _, _, err := h.Call(t.Context(), "k", req); status.Code(err) != codes.Internal {
		t.Fatalf("panicking call: %v, want the recoverer's Internal", err)
	}
	if out, _, err := h.Call(t.Context(), "k", req); err != nil || !out.Fields["ok"].GetBoolValue() {
		t.Fatalf("retry after the panic: %v %v, want a fresh run", out, err)
	}
	if got := effects.Of("k"); got != 2 {
		t.Fatalf("ran %d times, want 2", got)
	}
}

// crashThenRetry: server A claims the key and hangs (its process is as
// good as dead: it never completes nor releases); a retry reaching server
// B, on the same store, waits and is told the call is in flight; once A's
// lease has ended, B takes the key over and runs the call, once; A's late
// end is fenced off. In the separate form, since a hung transaction of a
// TxClaimer holds its claim until its connection dies.
func crashThenRetry(t *testing.T, open Open) {
	clock := idemmem.NewClock(start)
	store := open(t, clock)
	const lease = time.Minute
	a := New(t, idemgrpc.Config{Store: store, SharedScope: true, SeparateTx: true, Lease: lease}, nil)
	b := New(t, idemgrpc.Config{Store: store, SharedScope: true, SeparateTx: true, Lease: lease, InflightWait: -1}, nil)
	var effects Effects
	hung, revive := make(chan struct{}, 1), make(chan struct{})
	a.Handle(func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
		hung <- struct{}{}
		<-revive
		return nil, errors.New("dead") // a dead process applies nothing
	})
	b.Handle(func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
		effects.Add("k")
		ex, _ := idemgrpc.ExecutionFromContext(ctx)
		return Msg(t, map[string]any{"took_over": ex.TookOver}), nil
	})
	req := Msg(t, map[string]any{"amount": 9})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	aDone := make(chan struct{})
	go func() {
		defer close(aDone)
		a.Call(ctx, "k", req)
	}()
	<-hung
	_, _, err := b.Call(t.Context(), "k", req)
	if status.Code(err) != codes.Aborted || idemgrpc.Reason(err) != idemgrpc.ReasonInFlight {
		t.Fatalf("retry while A holds the key: %v, want Aborted %s", err, idemgrpc.ReasonInFlight)
	}
	if d := retryInfo(err); d <= 0 {
		t.Fatalf("Aborted carries no RetryInfo: %v", status.Convert(err).Details())
	}
	clock.Advance(lease + time.Second)
	out, _, err := b.Call(t.Context(), "k", req)
	if err != nil || !out.Fields["took_over"].GetBoolValue() {
		t.Fatalf("retry after A's lease: %v %v, want a run that took over", out, err)
	}
	cancel()
	close(revive)
	<-aDone
	if o := a.WaitEnds(t, 1); o[0] != idemhttp.OutcomeLeaseLost {
		t.Fatalf("A's late end: %s, want lease_lost", o[0])
	}
	if _, header, err := b.Call(t.Context(), "k", req); err != nil || header[idemgrpc.MetadataReplayed] == nil {
		t.Fatalf("a third try: %v %v, want the replay", header, err)
	}
	if got := effects.Of("k"); got != 1 {
		t.Fatalf("the effect ran %d times, want 1", got)
	}
}

func retryInfo(err error) time.Duration {
	for _, d := range status.Convert(err).Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.GetRetryDelay().AsDuration()
		}
	}
	return 0
}

// clientKeySurvivesRetries: the Client's key is the same on gRPC's own
// retry (a retryPolicy in the service config) and on the Client's.
func clientKeySurvivesRetries(t *testing.T, open Open) {
	const serviceConfig = `{"methodConfig": [{"name": [{"service": "` + Service + `"}],
		"retryPolicy": {"maxAttempts": 3, "initialBackoff": "0.001s", "maxBackoff": "0.002s", "backoffMultiplier": 1, "retryableStatusCodes": ["UNAVAILABLE"]}}]}`
	client := &idemgrpc.Client{Sleep: func(context.Context, time.Duration) error { return nil }}
	h, _ := newHarness(t, open, idemgrpc.Config{}, &Options{Dial: []grpc.DialOption{
		grpc.WithDefaultServiceConfig(serviceConfig), grpc.WithChainUnaryInterceptor(client.Unary()),
	}})
	var mu sync.Mutex
	var keys []string
	var effects Effects
	h.Handle(func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
		ex, _ := idemgrpc.ExecutionFromContext(ctx)
		mu.Lock()
		keys = append(keys, string(ex.Key))
		n := len(keys)
		mu.Unlock()
		switch n {
		case 1, 2, 3: // gRPC's three attempts, then the Client retries
			return nil, status.Error(codes.Unavailable, "not now")
		case 4:
			return nil, idemgrpcAborted()
		}
		effects.Add(string(ex.Key))
		return Msg(t, map[string]any{"ok": true}), nil
	})
	out := new(structpb.Struct)
	if err := h.Conn.Invoke(t.Context(), Method, Msg(t, map[string]any{"amount": 1}), out); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(keys) != 5 {
		t.Fatalf("%d attempts reached the handler, want 5", len(keys))
	}
	for _, k := range keys {
		if k != keys[0] || k == "" {
			t.Fatalf("keys across attempts: %q, want one key", keys)
		}
	}
	if effects.Of(keys[0]) != 1 {
		t.Fatal("the effect did not run once")
	}
}

func idemgrpcAborted() error { return status.Error(codes.Aborted, "contention; retry") }

func keyRules(t *testing.T, open Open) {
	h, _ := newHarness(t, open, idemgrpc.Config{}, nil)
	var effects Effects
	h.Handle(func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
		effects.Add("any")
		return req, nil
	})
	req := Msg(t, map[string]any{"amount": 1})
	if _, _, err := h.Call(t.Context(), "", req); status.Code(err) != codes.InvalidArgument || idemgrpc.Reason(err) != idemgrpc.ReasonKeyMissing {
		t.Fatalf("no key: %v, want InvalidArgument %s", err, idemgrpc.ReasonKeyMissing)
	}
	two := withKey(withKey(t.Context(), "a"), "b")
	if _, _, err := h.Call(two, "", req); status.Code(err) != codes.InvalidArgument || idemgrpc.Reason(err) != idemgrpc.ReasonKeyInvalid {
		t.Fatalf("two keys: %v, want InvalidArgument %s", err, idemgrpc.ReasonKeyInvalid)
	}
	if got := effects.Of("any"); got != 0 {
		t.Fatalf("refused calls ran %d times", got)
	}
}

// largeAnswer: an answer over MaxResponseBytes. In the same-transaction
// forms it is rolled back, and the retry runs again; otherwise the caller
// gets it whole and its replays an empty message marked
// idempotent-body-omitted.
func largeAnswer(t *testing.T, open Open) {
	clock := idemmem.NewClock(start)
	store := open(t, clock)
	_, tx := store.(idem.TxStore)
	h := New(t, idemgrpc.Config{Store: store, SharedScope: true, MaxResponseBytes: 64}, nil)
	var effects Effects
	big := strings.Repeat("x", 100)
	h.Handle(func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
		effects.Add("k")
		return Msg(t, map[string]any{"receipt": big}), nil
	})
	req := Msg(t, map[string]any{"amount": 1})
	out, _, err := h.Call(t.Context(), "k", req)
	if tx {
		if status.Code(err) != codes.Internal || idemgrpc.Reason(err) != idemgrpc.ReasonResponseTooLarge {
			t.Fatalf("in a transaction: %v, want Internal %s", err, idemgrpc.ReasonResponseTooLarge)
		}
		if details := status.Convert(err).Details(); len(details) != 1 {
			t.Fatalf("the refusal's details: %v; want its ErrorInfo alone, no RetryInfo (the same answer would be too large again)", details)
		}
		if _, _, err := h.Call(t.Context(), "k", req); status.Code(err) != codes.Internal {
			t.Fatalf("the retry: %v, want it run and refused again", err)
		}
		if got := effects.Of("k"); got != 2 {
			t.Fatalf("ran %d times, want 2 (rolled back each time)", got)
		}
		return
	}
	if err != nil || out.Fields["receipt"].GetStringValue() != big {
		t.Fatalf("first call: %v %v, want the whole answer", out, err)
	}
	out, header, err := h.Call(t.Context(), "k", req)
	if err != nil || len(out.Fields) != 0 || header[idemgrpc.MetadataBodyOmitted] == nil || header[idemgrpc.MetadataReplayed] == nil {
		t.Fatalf("replay: %v %v %v, want an empty message marked idempotent-body-omitted", out, header, err)
	}
	if got := effects.Of("k"); got != 1 {
		t.Fatalf("ran %d times, want 1", got)
	}
}
