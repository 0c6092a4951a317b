package idemgrpc_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemgrpc"
	"github.com/idem-go/idem/idemgrpc/internal/grpcsuite"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemmem"
)

func TestNewRefuses(t *testing.T) {
	t.Parallel()
	store := idemmem.NewStore(nil)
	for _, c := range []idemgrpc.Config{
		{},
		{Store: store},
		{Store: store, SharedScope: true, TTL: time.Second, Lease: time.Minute},
		{Store: store, SharedScope: true, Methods: map[string]idemgrpc.Policy{"Create": idemgrpc.Off}},
		{Store: store, SharedScope: true, Methods: map[string]idemgrpc.Policy{"/a.B/C": 7}},
		// Names no call can have, which would never match (a method's
		// policy silently not applied): no method, no service, no slash
		// between them.
		{Store: store, SharedScope: true, Methods: map[string]idemgrpc.Policy{"/a.B/": idemgrpc.Off}},
		{Store: store, SharedScope: true, Methods: map[string]idemgrpc.Policy{"//C": idemgrpc.Off}},
		{Store: store, SharedScope: true, Methods: map[string]idemgrpc.Policy{"/a.B.C": idemgrpc.Off}},
		{Store: store, SharedScope: true, Methods: map[string]idemgrpc.Policy{"/aB": idemgrpc.Off}},
		// A method name holding a slash: gRPC's full method names have
		// exactly two, so this one matches no call.
		{Store: store, SharedScope: true, Methods: map[string]idemgrpc.Policy{"/a.B/C/D": idemgrpc.Off}},
		{Store: store, SharedScope: true, Default: idemgrpc.Off + 1},
		{Store: store, SharedScope: true, Default: idemgrpc.Required - 1 - 1},
		{Store: store, SharedScope: true, MaxResponseBytes: -1},
		{Store: store, SharedScope: true, ReplayMetadata: []string{"Authorization"}},
		{Store: store, SharedScope: true, KeySecret: []byte("short")},
	} {
		if _, err := idemgrpc.New(&c); !errors.Is(err, idem.ErrInvalidArgument) {
			t.Errorf("New(%+v): %v, want ErrInvalidArgument", c, err)
		}
	}
}

// Optional protects the calls that carry a key; Off none; a method's own
// entry wins over its service's, and over Config.Default, which takes any
// Policy.
func TestPolicies(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		def         idemgrpc.Policy // Config.Default
		methods     map[string]idemgrpc.Policy
		key         string
		runs        int // of three calls
		wantMissing bool
	}{
		{0, map[string]idemgrpc.Policy{grpcsuite.Method: idemgrpc.Optional}, "", 3, false},
		{0, map[string]idemgrpc.Policy{grpcsuite.Method: idemgrpc.Optional}, "k", 1, false},
		{0, map[string]idemgrpc.Policy{"/" + grpcsuite.Service + "/*": idemgrpc.Off}, "k", 3, false},
		{0, map[string]idemgrpc.Policy{"/" + grpcsuite.Service + "/*": idemgrpc.Off, grpcsuite.Method: idemgrpc.Required}, "", 0, true},
		// Config.Default, every Policy from the first to the last.
		{idemgrpc.Required, nil, "", 0, true},
		{idemgrpc.Required, nil, "k", 1, false},
		{idemgrpc.Optional, nil, "", 3, false},
		{idemgrpc.Off, nil, "k", 3, false},
		{idemgrpc.Off, map[string]idemgrpc.Policy{grpcsuite.Method: idemgrpc.Required}, "", 0, true},
	} {
		t.Run(fmt.Sprint(c.def, c.methods, c.key), func(t *testing.T) {
			t.Parallel()
			h := grpcsuite.New(t, idemgrpc.Config{Store: idemmem.NewStore(nil), SharedScope: true, Default: c.def, Methods: c.methods}, nil)
			runs := 0
			h.Handle(func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
				runs++
				return req, nil
			})
			var err error
			for range 3 {
				_, _, err = h.Call(t.Context(), c.key, grpcsuite.Msg(t, map[string]any{"a": 1}))
			}
			if runs != c.runs || (idemgrpc.Reason(err) == idemgrpc.ReasonKeyMissing) != c.wantMissing {
				t.Fatalf("ran %d times (want %d), last %v", runs, c.runs, err)
			}
		})
	}
}

type stream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s stream) Context() context.Context { return s.ctx }

// A stream that carries a key is refused, since nothing protects it;
// others pass.
func TestStreams(t *testing.T) {
	t.Parallel()
	ic, err := idemgrpc.New(&idemgrpc.Config{Store: idemmem.NewStore(nil), SharedScope: true,
		Methods: map[string]idemgrpc.Policy{"/x.Feed/Off": idemgrpc.Off}})
	if err != nil {
		t.Fatal(err)
	}
	keyed := metadata.NewIncomingContext(context.Background(), metadata.Pairs(idemgrpc.MetadataKey, "k"))
	for _, c := range []struct {
		ctx    context.Context
		method string
		runs   bool
	}{
		{keyed, "/x.Feed/Watch", false},
		{context.Background(), "/x.Feed/Watch", true},
		{keyed, "/x.Feed/Off", true},
	} {
		ran := false
		err := ic.Stream()(nil, stream{ctx: c.ctx}, &grpc.StreamServerInfo{FullMethod: c.method}, func(any, grpc.ServerStream) error {
			ran = true
			return nil
		})
		if ran != c.runs || (!c.runs && (status.Code(err) != codes.Unimplemented || idemgrpc.Reason(err) != idemgrpc.ReasonStreaming)) {
			t.Errorf("%s: ran %v, err %v", c.method, ran, err)
		}
	}
}

// registerLedger registers a service descriptor, as a generated package
// does: Post answers a Struct; Balance declares NO_SIDE_EFFECTS.
var registerLedger = sync.OnceValue(func() error {
	str := func(s string) *string { return &s }
	noSideEffects := descriptorpb.MethodOptions_NO_SIDE_EFFECTS
	fdp := &descriptorpb.FileDescriptorProto{
		Name: str("idemgrpc/regtest/ledger.proto"), Package: str("idemgrpc.regtest"), Syntax: str("proto3"),
		Dependency: []string{"google/protobuf/struct.proto"},
		Service: []*descriptorpb.ServiceDescriptorProto{{Name: str("Ledger"), Method: []*descriptorpb.MethodDescriptorProto{
			{Name: str("Post"), InputType: str(".google.protobuf.Struct"), OutputType: str(".google.protobuf.Struct")},
			{Name: str("Balance"), InputType: str(".google.protobuf.Struct"), OutputType: str(".google.protobuf.Struct"),
				Options: &descriptorpb.MethodOptions{IdempotencyLevel: &noSideEffects}},
		}}},
	}
	fd, err := protodesc.NewFile(fdp, protoregistry.GlobalFiles)
	if err != nil {
		return err
	}
	return protoregistry.GlobalFiles.RegisterFile(fd)
})

// A method's descriptor in the registry decides its default policy and
// the type of its replays; without one, a replay carries the same bytes.
func TestRegistry(t *testing.T) {
	t.Parallel()
	if err := registerLedger(); err != nil {
		t.Fatal(err)
	}
	store := idemmem.NewStore(nil)
	newIC := func() *idemgrpc.Interceptor {
		ic, err := idemgrpc.New(&idemgrpc.Config{Store: store, SharedScope: true})
		if err != nil {
			t.Fatal(err)
		}
		return ic
	}
	first := newIC()
	if p := first.Policy("/idemgrpc.regtest.Ledger/Balance"); p != idemgrpc.Off {
		t.Errorf("Balance (NO_SIDE_EFFECTS): %s, want off", p)
	}
	if p := first.Policy("/idemgrpc.regtest.Ledger/Post"); p != idemgrpc.Required {
		t.Errorf("Post: %s, want required", p)
	}
	answer := grpcsuite.Msg(t, map[string]any{"id": "tx_1", "amount": 3})
	req := grpcsuite.Msg(t, map[string]any{"amount": 3})
	cases := []struct {
		method string
		want   func(any) bool
	}{
		{"/idemgrpc.regtest.Ledger/Post", func(v any) bool { _, ok := v.(*structpb.Struct); return ok }},
		{grpcsuite.Method, func(v any) bool { _, ok := v.(*emptypb.Empty); return ok }},
	}
	for _, c := range cases {
		info := &grpc.UnaryServerInfo{FullMethod: c.method}
		ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs(idemgrpc.MetadataKey, "key-of-"+c.method))
		if _, err := first.Unary()(ctx, req, info, func(context.Context, any) (any, error) { return answer, nil }); err != nil {
			t.Fatal(err)
		}
		// Another process, which has not seen the method answer.
		got, err := newIC().Unary()(ctx, req, info, func(context.Context, any) (any, error) {
			t.Fatal("the replay ran the handler")
			return nil, nil
		})
		if err != nil || !c.want(got) {
			t.Fatalf("%s: replayed %T, %v", c.method, got, err)
		}
		det := proto.MarshalOptions{Deterministic: true}
		want, _ := det.Marshal(answer)
		if b, _ := det.Marshal(got.(proto.Message)); string(b) != string(want) {
			t.Fatalf("%s: replay encodes as %x, want %x", c.method, b, want)
		}
	}
}

type recorder struct {
	mu     sync.Mutex
	events []idemhttp.Event
}

func (r *recorder) Begin(ctx context.Context, _ idemhttp.Event) context.Context { return ctx }
func (r *recorder) End(_ context.Context, e idemhttp.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
}
func (r *recorder) Store(context.Context, idemhttp.StoreOp, time.Duration, error) {}

func (r *recorder) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, e := range r.events {
		s := e.Phase.String()
		if e.Phase == idemhttp.PhaseRequest {
			s += fmt.Sprintf("(%s %s %s %d)", e.Request.Method, e.Request.URL.Path, e.Outcome, e.Status)
		}
		out = append(out, s)
	}
	r.events = nil
	return out
}

// The Observer sees idemhttp's phases, with the call as a request.
func TestObserver(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	h := grpcsuite.New(t, idemgrpc.Config{Store: idemmem.NewStore(nil), SharedScope: true, Observer: rec}, nil)
	h.Handle(func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
		return nil, status.Error(codes.NotFound, "no such account")
	})
	for _, want := range []string{
		"[claim handler complete request(POST " + grpcsuite.Method + " executed 404)]",
		"[replay request(POST " + grpcsuite.Method + " replayed 404)]", // from memory
	} {
		h.Call(t.Context(), "k", grpcsuite.Msg(t, map[string]any{"a": 1}))
		h.WaitEnds(t, 1)
		if got := fmt.Sprint(rec.take()); got != want {
			t.Errorf("phases %s, want %s", got, want)
		}
	}
	if c := h.Interceptor.Counts(); c[idemhttp.OutcomeExecuted] != 1 || c[idemhttp.OutcomeReplayed] != 1 {
		t.Errorf("counts %v", c)
	}
}

// Keys are sealed before the store sees them, as idemhttp seals them.
func TestKeySecret(t *testing.T) {
	t.Parallel()
	store := idemmem.NewStore(nil)
	secret := []byte("0123456789abcdef0123456789abcdef")
	h := grpcsuite.New(t, idemgrpc.Config{Store: store, Scope: func(context.Context, string) (idem.Scope, error) { return "t1", nil }, KeySecret: secret}, nil)
	if _, _, err := h.Call(t.Context(), "order-7", grpcsuite.Msg(t, map[string]any{"a": 1})); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Get(t.Context(), "t1", "order-7"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("the key in clear: %v, want not found", err)
	}
	if _, err := store.Get(t.Context(), "t1", idemhttp.SealKey(secret, "t1", "order-7")); err != nil {
		t.Fatalf("the sealed key: %v", err)
	}
}

// A Scope that returns no scope and no error (metadata the call lacks) is
// refused Unauthenticated and runs nothing, unless SharedScope is set.
func TestEmptyScopeRefused(t *testing.T) {
	t.Parallel()
	for _, shared := range []bool{false, true} {
		h := grpcsuite.New(t, idemgrpc.Config{Store: idemmem.NewStore(nil), SharedScope: shared,
			Scope: func(context.Context, string) (idem.Scope, error) { return "", nil }}, nil)
		runs := 0
		h.Handle(func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
			runs++
			return req, nil
		})
		_, _, err := h.Call(t.Context(), "k-1", grpcsuite.Msg(t, map[string]any{"a": 1}))
		switch {
		case !shared && (status.Code(err) != codes.Unauthenticated || runs != 0):
			t.Fatalf("an empty scope: %v after %d runs; want Unauthenticated and nothing run", err, runs)
		case shared && (err != nil || runs != 1):
			t.Fatalf("an empty scope, SharedScope: %v after %d runs; want it run", err, runs)
		}
	}
}

// With no answers kept in memory, a duplicate of a key completed here is
// answered from one read of its record, and another request under it is
// refused from the record too.
func TestReplayFromRecord(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	h := grpcsuite.New(t, idemgrpc.Config{Store: idemmem.NewStore(nil), SharedScope: true, MemoryReplayFor: -1, Observer: rec}, nil)
	runs := 0
	h.Handle(func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
		runs++
		return req, nil
	})
	req := grpcsuite.Msg(t, map[string]any{"a": 1})
	h.Call(t.Context(), "k", req)
	h.WaitEnds(t, 1)
	rec.take()
	out, header, err := h.Call(t.Context(), "k", req)
	if err != nil || !proto.Equal(out, req) || header[idemgrpc.MetadataReplayed] == nil {
		t.Fatalf("duplicate: %v %v %v", out, header, err)
	}
	h.WaitEnds(t, 1)
	if got := fmt.Sprint(rec.take()); got != "[replay request(POST "+grpcsuite.Method+" replayed 200)]" {
		t.Errorf("phases %s: want the replay alone, no claim", got)
	}
	if _, _, err := h.Call(t.Context(), "k", grpcsuite.Msg(t, map[string]any{"a": 2})); idemgrpc.Reason(err) != idemgrpc.ReasonKeyMismatch {
		t.Fatalf("another request: %v, want %s", err, idemgrpc.ReasonKeyMismatch)
	}
	if runs != 1 {
		t.Fatalf("ran %d times", runs)
	}
}
