// Package grpcsuite is idemgrpc's conformance suite: the interceptor, on a
// real grpc-go server and client over an in-memory connection (bufconn),
// in front of a store. idemgrpc runs it on idemmem; the module in
// idemgrpc/internal/storetest runs it on SQLite, PostgreSQL and Redis, so
// that idemgrpc's own go.mod needs none of their drivers.
package grpcsuite

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemgrpc"
	"github.com/idem-go/idem/idemhttp"
)

// Service and Method name the test service, described by hand (no protoc):
// Create takes and answers a google.protobuf.Struct.
const (
	Service = "idemgrpc.test.Payments"
	Method  = "/" + Service + "/Create"
)

// Handler is the test service's Create.
type Handler func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error)

// Harness is a grpc-go server with the interceptor in front of Create,
// and a client connected to it.
type Harness struct {
	Interceptor *idemgrpc.Interceptor
	Conn        *grpc.ClientConn
	Server      *grpc.Server

	handler atomic.Pointer[Handler]
	lis     *bufconn.Listener
	// Ends receives the Outcome of every protected call, as it ends;
	// Claims a value as each begins to claim its key.
	Ends   chan idemhttp.Outcome
	Claims chan struct{}
}

// Options configure a Harness beyond its Config.
type Options struct {
	// Outer are server interceptors put before the Interceptor (a
	// recoverer, say).
	Outer []grpc.UnaryServerInterceptor
	// Dial are more options for the client.
	Dial []grpc.DialOption
}

// New starts a server on an in-memory listener with cfg's Interceptor and
// connects a client to it; both stop when the test ends. cfg.Observer, if
// set, is called beside the Harness's own.
func New(t testing.TB, cfg idemgrpc.Config, opts *Options) *Harness {
	t.Helper()
	if opts == nil {
		opts = &Options{}
	}
	h := &Harness{Ends: make(chan idemhttp.Outcome, 4096), Claims: make(chan struct{}, 4096)}
	cfg.Observer = idemhttp.Observers(cfg.Observer, signals{h})
	ic, err := idemgrpc.New(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	h.Interceptor = ic
	lis := bufconn.Listen(1 << 20)
	h.lis = lis
	h.Server = grpc.NewServer(grpc.ChainUnaryInterceptor(append(opts.Outer, ic.Unary())...), grpc.StreamInterceptor(ic.Stream()))
	h.Server.RegisterService(&serviceDesc, h)
	served := make(chan struct{})
	go func() {
		defer close(served)
		h.Server.Serve(lis)
	}()
	dial := append([]grpc.DialOption{
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
	}, opts.Dial...)
	conn, err := grpc.NewClient("passthrough:///bufnet", dial...)
	if err != nil {
		t.Fatal(err)
	}
	h.Conn = conn
	t.Cleanup(func() {
		conn.Close()
		h.Server.Stop()
		<-served
	})
	return h
}

// Handle sets the handler of Create.
func (h *Harness) Handle(fn Handler) { h.handler.Store(&fn) }

// Call calls Create with key (none when empty) and req, and returns the
// answer and the header metadata.
func (h *Harness) Call(ctx context.Context, key string, req *structpb.Struct, opts ...grpc.CallOption) (*structpb.Struct, map[string][]string, error) {
	if key != "" {
		ctx = withKey(ctx, key)
	}
	var header map[string][]string
	var md = new(mdHolder)
	out := new(structpb.Struct)
	err := h.Conn.Invoke(ctx, Method, req, out, append(opts, grpc.Header(&md.MD))...)
	header = md.MD
	if err != nil {
		return nil, header, err
	}
	return out, header, nil
}

// WaitEnds waits for n protected calls to end and returns their outcomes.
func (h *Harness) WaitEnds(t testing.TB, n int) []idemhttp.Outcome {
	t.Helper()
	var out []idemhttp.Outcome
	timeout := time.NewTimer(30 * time.Second)
	defer timeout.Stop()
	for len(out) < n {
		select {
		case o := <-h.Ends:
			out = append(out, o)
		case <-timeout.C:
			t.Fatalf("%d of %d calls ended within 30s: %v", len(out), n, out)
		}
	}
	return out
}

// WaitClaims waits until n calls have begun to claim their key.
func (h *Harness) WaitClaims(t testing.TB, n int) {
	t.Helper()
	timeout := time.NewTimer(30 * time.Second)
	defer timeout.Stop()
	for i := 0; i < n; i++ {
		select {
		case <-h.Claims:
		case <-timeout.C:
			t.Fatalf("%d of %d calls claimed within 30s", i, n)
		}
	}
}

// Msg makes a request or answer from its fields.
func Msg(t testing.TB, fields map[string]any) *structpb.Struct {
	t.Helper()
	s, err := structpb.NewStruct(fields)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// Effects counts, by key, the effects a test's handler applied.
type Effects struct {
	mu sync.Mutex
	n  map[string]int
}

// Add counts one effect for key.
func (e *Effects) Add(key string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.n == nil {
		e.n = map[string]int{}
	}
	e.n[key]++
}

// Of returns how many effects key had.
func (e *Effects) Of(key string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.n[key]
}

// signals is the Harness's Observer.
type signals struct{ h *Harness }

func (s signals) Begin(ctx context.Context, e idemhttp.Event) context.Context {
	if e.Phase == idemhttp.PhaseClaim {
		select {
		case s.h.Claims <- struct{}{}:
		default:
		}
	}
	return ctx
}

func (s signals) End(_ context.Context, e idemhttp.Event) {
	if e.Phase == idemhttp.PhaseRequest {
		select {
		case s.h.Ends <- e.Outcome:
		default:
		}
	}
}

func (signals) Store(context.Context, idemhttp.StoreOp, time.Duration, error) {}

var serviceDesc = grpc.ServiceDesc{
	ServiceName: Service,
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Create",
		Handler: func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
			in := new(structpb.Struct)
			if err := dec(in); err != nil {
				return nil, err
			}
			h := srv.(*Harness)
			call := func(ctx context.Context, req any) (any, error) {
				fn := h.handler.Load()
				if fn == nil {
					return &structpb.Struct{}, nil
				}
				out, err := (*fn)(ctx, req.(*structpb.Struct))
				if out == nil {
					return nil, err // a typed nil would be sent as an empty message
				}
				return out, err
			}
			if interceptor == nil {
				return call(ctx, in)
			}
			return interceptor(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: Method}, call)
		},
	}},
}

// Open makes a fresh, empty store that reads time from clock.
type Open func(t *testing.T, clock idem.Clock) idem.Store

// Dialer connects to the Harness's in-memory listener, for a second client.
func (h *Harness) Dialer() func(context.Context, string) (net.Conn, error) {
	return func(ctx context.Context, _ string) (net.Conn, error) { return h.lis.DialContext(ctx) }
}
