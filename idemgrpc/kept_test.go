package idemgrpc_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemgrpc"
	"github.com/idem-go/idem/idemgrpc/internal/grpcsuite"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/keyed"
)

// Without BodyKeys or DiscardBodies, an answer is kept in the documented
// form a store's reader (and an older or newer replica) reads: the code in
// Grpc-Status, the status message in Grpc-Message, the whole status in
// Grpc-Status-Details-Bin only when it has details, the replayed metadata
// under Grpc-Header-, all in the record's headers in clear, and no
// envelope in the body.
func TestKeptFormInClear(t *testing.T) {
	t.Parallel()
	store := idemmem.NewStore(nil)
	h := grpcsuite.New(t, idemgrpc.Config{Store: store, SharedScope: true, ReplayMetadata: []string{"x-receipt"}, MemoryReplayFor: -1}, nil)
	h.Handle(func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
		grpc.SetHeader(ctx, metadata.Pairs("x-receipt", "r1"))
		if req.Fields["details"].GetBoolValue() {
			st, _ := status.New(codes.FailedPrecondition, "declined").WithDetails(&errdetails.ErrorInfo{Reason: "DECLINED"})
			return nil, st.Err()
		}
		return nil, status.Error(codes.FailedPrecondition, "declined")
	})
	for key, details := range map[string]bool{"plain": false, "details": true} {
		if _, _, err := h.Call(t.Context(), key, grpcsuite.Msg(t, map[string]any{"details": details})); status.Code(err) != codes.FailedPrecondition {
			t.Fatalf("%s: %v", key, err)
		}
	}
	h.WaitEnds(t, 2)
	for key, details := range map[string]bool{"plain": false, "details": true} {
		got, err := store.Get(t.Context(), "", idem.Key(key))
		if err != nil || got.Response == nil {
			t.Fatalf("%s: %+v, %v", key, got, err)
		}
		hd := got.Response.Header
		if hd.Get("Grpc-Status") != "9" || hd.Get("Grpc-Message") != "declined" || strings.Join(hd["Grpc-Header-x-receipt"], "") != "r1" ||
			hd.Get("Grpc-Enveloped") != "" || len(got.Response.Body) != 0 || (hd.Get("Grpc-Status-Details-Bin") != "") != details {
			t.Errorf("%s (details %t): kept as %v, body %q; want Grpc-Status 9, Grpc-Message, Grpc-Header-x-receipt, details only when there are some, no envelope", key, details, hd, got.Response.Body)
		}
		_, md, err := h.Call(t.Context(), key, grpcsuite.Msg(t, map[string]any{"details": details}))
		if st := status.Convert(err); st.Code() != codes.FailedPrecondition || st.Message() != "declined" || len(st.Details()) != map[bool]int{false: 0, true: 1}[details] || strings.Join(md["x-receipt"], "") != "r1" {
			t.Errorf("%s: replayed %v %v, metadata %v", key, st.Code(), st.Message(), md)
		}
	}
}

// A response whose encoding is exactly MaxResponseBytes is kept whole and
// replayed with its message; one byte more is too large to keep: the
// caller gets it whole, and a replay an empty message marked
// idempotent-body-omitted, with the replayed metadata kept in clear, or,
// with BodyKeys, none (it would be kept only in the sealed body, which is
// not kept).
func TestAnswerAtMaxResponseBytes(t *testing.T) {
	t.Parallel()
	answer := map[string]any{"receipt": strings.Repeat("r", 40)}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(grpcsuite.Msg(t, answer))
	if err != nil {
		t.Fatal(err)
	}
	keys := []keyed.BodyKey{{ID: "k1", Key: []byte("0123456789abcdef0123456789abcdef")}}
	for _, c := range []struct {
		name     string
		max      int
		bodyKeys []keyed.BodyKey
		wantBody bool // the message replayed
		wantMD   bool // x-receipt replayed
	}{
		{"at the limit", len(b), nil, true, true},
		{"a byte over", len(b) - 1, nil, false, true},
		{"at the limit, sealed", len(b), keys, true, true},
		{"a byte over, sealed", len(b) - 1, keys, false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			h := grpcsuite.New(t, idemgrpc.Config{Store: idemmem.NewStore(nil), SharedScope: true, MaxResponseBytes: c.max, BodyKeys: c.bodyKeys,
				ReplayMetadata: []string{"x-receipt"}, MemoryReplayFor: -1}, nil)
			runs := 0
			h.Handle(func(ctx context.Context, _ *structpb.Struct) (*structpb.Struct, error) {
				runs++
				grpc.SetHeader(ctx, metadata.Pairs("x-receipt", "r1"))
				return grpcsuite.Msg(t, answer), nil
			})
			req := grpcsuite.Msg(t, map[string]any{"amount": 1})
			if out, _, err := h.Call(t.Context(), "k", req); err != nil || out.Fields["receipt"].GetStringValue() != answer["receipt"] {
				t.Fatalf("the first call: %v, %v; want the whole answer", out, err)
			}
			h.WaitEnds(t, 1)
			out, md, err := h.Call(t.Context(), "k", req)
			if err != nil || runs != 1 || len(md[idemgrpc.MetadataReplayed]) == 0 {
				t.Fatalf("the retry: %v, %v, ran %d times; want a replay", md, err, runs)
			}
			if gotBody := out.Fields["receipt"].GetStringValue() == answer["receipt"]; gotBody != c.wantBody || (len(md[idemgrpc.MetadataBodyOmitted]) == 0) != c.wantBody {
				t.Errorf("replay with MaxResponseBytes %d for %d bytes: %v, metadata %v; want the message %t", c.max, len(b), out, md, c.wantBody)
			}
			if gotMD := strings.Join(md["x-receipt"], "") == "r1"; gotMD != c.wantMD {
				t.Errorf("replay with MaxResponseBytes %d for %d bytes: metadata %v; want x-receipt %t", c.max, len(b), md, c.wantMD)
			}
		})
	}
}

// A handler that returns once its context has ended (its Timeout passed)
// gave up: nothing says its effect is whole, so even an error that is
// kept when the handler returns it in time (FailedPrecondition, a
// deterministic refusal) is not kept, and a retry with the key runs the
// handler again rather than replaying the give-up.
func TestErrorReturnedAfterTheTimeoutIsNotKept(t *testing.T) {
	t.Parallel()
	store := idemmem.NewStore(nil)
	h := grpcsuite.New(t, idemgrpc.Config{Store: store, SharedScope: true, Timeout: 50 * time.Millisecond}, nil)
	var runs atomic.Int32
	h.Handle(func(ctx context.Context, _ *structpb.Struct) (*structpb.Struct, error) {
		runs.Add(1)
		<-ctx.Done()
		return nil, status.Error(codes.FailedPrecondition, "declined")
	})
	req := grpcsuite.Msg(t, map[string]any{"amount": 1})
	for n := range 2 {
		_, md, err := h.Call(t.Context(), "k", req)
		if status.Code(err) != codes.FailedPrecondition || len(md[idemgrpc.MetadataReplayed]) != 0 {
			t.Fatalf("call %d: %v, metadata %v; want the handler's FailedPrecondition, not a replay", n+1, err, md)
		}
		h.WaitEnds(t, 1)
	}
	if got := runs.Load(); got != 2 {
		t.Fatalf("ran %d times for two calls with one key; want 2: an answer given after the Timeout is not kept", got)
	}
	if rec, err := store.Get(t.Context(), "", "k"); err == nil && rec.State == idem.StateCompleted {
		t.Errorf("the key after a handler that gave up: %+v; want no answer kept", rec)
	}
}

// A replay hands the interceptors before this one the answer as the type
// the handler returned (*structpb.Struct here), even for a service
// described by hand, whose method the protobuf registry does not know:
// the interceptor learns the type from the handler's first answer.
func TestReplayIsTheHandlersType(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var seen []string
	outer := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
		resp, err := next(ctx, req)
		mu.Lock()
		seen = append(seen, fmt.Sprintf("%T", resp))
		mu.Unlock()
		return resp, err
	}
	h := grpcsuite.New(t, idemgrpc.Config{Store: idemmem.NewStore(nil), SharedScope: true}, &grpcsuite.Options{Outer: []grpc.UnaryServerInterceptor{outer}})
	h.Handle(func(context.Context, *structpb.Struct) (*structpb.Struct, error) {
		return grpcsuite.Msg(t, map[string]any{"receipt": "r1"}), nil
	})
	req := grpcsuite.Msg(t, map[string]any{"amount": 1})
	if _, _, err := h.Call(t.Context(), "k", req); err != nil {
		t.Fatal(err)
	}
	h.WaitEnds(t, 1)
	out, md, err := h.Call(t.Context(), "k", req)
	if err != nil || len(md[idemgrpc.MetadataReplayed]) == 0 || out.Fields["receipt"].GetStringValue() != "r1" {
		t.Fatalf("the retry: %v, %v, metadata %v; want the answer replayed", out, err, md)
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"*structpb.Struct", "*structpb.Struct"}; !slices.Equal(seen, want) {
		t.Errorf("the interceptor before idemgrpc saw answers of types %v; want %v (the replay as the handler's type)", seen, want)
	}
}
