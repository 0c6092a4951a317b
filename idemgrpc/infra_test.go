package idemgrpc_test

import (
	"context"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/reflection"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	reflectionalphapb "google.golang.org/grpc/reflection/grpc_reflection_v1alpha"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemgrpc"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/keyed"
)

// probeService is a hand-described service of two unary methods on
// google.protobuf.Struct: Ping, which the tests mark Off, and Charge,
// which stays protected.
var probeService = grpc.ServiceDesc{
	ServiceName: "idemgrpc.test.Probe",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{
		{MethodName: "Ping", Handler: structHandler("/idemgrpc.test.Probe/Ping")},
		{MethodName: "Charge", Handler: structHandler("/idemgrpc.test.Probe/Charge")},
	},
}

func structHandler(fullMethod string) func(any, context.Context, func(any) error, grpc.UnaryServerInterceptor) (any, error) {
	return func(_ any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
		in := new(structpb.Struct)
		if err := dec(in); err != nil {
			return nil, err
		}
		h := func(context.Context, any) (any, error) { return in, nil }
		if icpt == nil {
			return h(ctx, in)
		}
		return icpt(ctx, in, &grpc.UnaryServerInfo{FullMethod: fullMethod}, h)
	}
}

// infraServer is a grpc-go server as a newcomer sets one up: the
// interceptor's unary and stream halves, the health service, server
// reflection (v1 and v1alpha) and a service of its own. keys records the
// idempotency keys each unary call arrived with, before the interceptor.
// plain is a bare connection to it; keying one whose calls go through an
// idemgrpc.Client.
func infraServer(t *testing.T, cfg idemgrpc.Config) (plain, keying *grpc.ClientConn, keys func(method string) []string) {
	t.Helper()
	ic, err := idemgrpc.New(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	seen := map[string][]string{}
	record := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		mu.Lock()
		seen[info.FullMethod] = append(seen[info.FullMethod], md.Get(idemgrpc.MetadataKey)...)
		mu.Unlock()
		return handler(ctx, req)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(record, ic.Unary()), grpc.StreamInterceptor(ic.Stream()))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	reflection.Register(srv)
	srv.RegisterService(&probeService, nil)
	lis := bufconn.Listen(1 << 20)
	served := make(chan struct{})
	go func() {
		defer close(served)
		srv.Serve(lis)
	}()
	dial := func(opts ...grpc.DialOption) *grpc.ClientConn {
		conn, err := grpc.NewClient("passthrough:///infra", append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }))...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}
	t.Cleanup(func() {
		srv.Stop()
		<-served
	})
	client := &idemgrpc.Client{Default: cfg.Default}
	return dial(), dial(grpc.WithChainUnaryInterceptor(client.Unary())), func(method string) []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(seen[method])
	}
}

// Adding the interceptor to a server does not break its health probes nor
// its reflection: their calls pass through without a key, unary and
// streaming, whatever Default says, and so do the methods the
// configuration marks Off; every other method still needs a key.
func TestHealthAndReflectionPassWithoutKey(t *testing.T) {
	t.Parallel()
	for _, def := range []idemgrpc.Policy{0, idemgrpc.Required, idemgrpc.Optional} {
		name := def.String()
		if def == 0 {
			name = "unset"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			conn, keying, keys := infraServer(t, idemgrpc.Config{Store: idemmem.NewStore(nil), SharedScope: true, Default: def,
				Methods: map[string]idemgrpc.Policy{"/idemgrpc.test.Probe/Ping": idemgrpc.Off}})
			ctx := t.Context()
			hc := healthpb.NewHealthClient(conn)
			if got, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || got.GetStatus() != healthpb.HealthCheckResponse_SERVING {
				t.Fatalf("Health/Check without a key: %v, %v; want SERVING", got, err)
			}
			if _, err := hc.List(ctx, &healthpb.HealthListRequest{}); err != nil {
				t.Fatalf("Health/List without a key: %v", err)
			}
			if _, err := healthpb.NewHealthClient(keying).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
				t.Fatalf("Health/Check through a Client: %v", err)
			}
			if k := keys(healthpb.Health_Check_FullMethodName); len(k) != 0 {
				t.Fatalf("Health/Check arrived with the keys %q; want none (the Client gives probes none)", k)
			}
			// A probe that carries a key anyway (a client that keys every
			// call) is not refused either, unary nor streaming.
			keyed := metadata.AppendToOutgoingContext(ctx, idemgrpc.MetadataKey, "probe-1")
			if _, err := hc.Check(keyed, &healthpb.HealthCheckRequest{}); err != nil {
				t.Fatalf("Health/Check with a key: %v", err)
			}
			for _, c := range []context.Context{ctx, keyed} {
				w, err := hc.Watch(c, &healthpb.HealthCheckRequest{})
				if err != nil {
					t.Fatal(err)
				}
				if got, err := w.Recv(); err != nil || got.GetStatus() != healthpb.HealthCheckResponse_SERVING {
					t.Fatalf("Health/Watch: %v, %v; want SERVING", got, err)
				}
			}

			v1, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := v1.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
				t.Fatal(err)
			}
			res, err := v1.Recv()
			if err != nil {
				t.Fatalf("reflection v1 without a key: %v", err)
			}
			var names []string
			for _, s := range res.GetListServicesResponse().GetService() {
				names = append(names, s.GetName())
			}
			if !slices.Contains(names, "grpc.health.v1.Health") || !slices.Contains(names, "idemgrpc.test.Probe") {
				t.Fatalf("reflection v1 lists %q", names)
			}
			v1.CloseSend()
			alpha, err := reflectionalphapb.NewServerReflectionClient(conn).ServerReflectionInfo(keyed)
			if err != nil {
				t.Fatal(err)
			}
			if err := alpha.Send(&reflectionalphapb.ServerReflectionRequest{MessageRequest: &reflectionalphapb.ServerReflectionRequest_ListServices{}}); err != nil {
				t.Fatal(err)
			}
			if _, err := alpha.Recv(); err != nil {
				t.Fatalf("reflection v1alpha with a key: %v", err)
			}
			alpha.CloseSend()

			// A method marked Off passes without a key; the others are
			// protected as before.
			if err := conn.Invoke(ctx, "/idemgrpc.test.Probe/Ping", &structpb.Struct{}, new(structpb.Struct)); err != nil {
				t.Fatalf("Ping, marked Off, without a key: %v", err)
			}
			err = conn.Invoke(ctx, "/idemgrpc.test.Probe/Charge", &structpb.Struct{}, new(structpb.Struct))
			if want := map[bool]codes.Code{true: codes.OK, false: codes.InvalidArgument}[def == idemgrpc.Optional]; status.Code(err) != want {
				t.Fatalf("Charge without a key, policy %s: %v; want %s", def, err, want)
			}
			if err := keying.Invoke(ctx, "/idemgrpc.test.Probe/Charge", &structpb.Struct{}, new(structpb.Struct)); err != nil {
				t.Fatalf("Charge through a Client: %v", err)
			}
			if k := keys("/idemgrpc.test.Probe/Charge"); len(k) != 1 {
				t.Fatalf("Charge arrived with the keys %q; want the Client's one", k)
			}
		})
	}
}

// A configuration that names the health service takes it back: its
// calls then need a key like any other.
func TestHealthProtectedWhenNamed(t *testing.T) {
	t.Parallel()
	cfg := idemgrpc.Config{Store: idemmem.NewStore(nil), Scope: func(context.Context, string) (idem.Scope, error) { return "t", nil },
		Methods: map[string]idemgrpc.Policy{"/grpc.health.v1.Health/*": idemgrpc.Required}}
	ic, err := idemgrpc.New(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{healthpb.Health_Check_FullMethodName, healthpb.Health_List_FullMethodName} {
		if p := ic.Policy(m); p != idemgrpc.Required {
			t.Fatalf("Policy(%s) = %s; want required, as configured", m, p)
		}
	}
	ic, err = idemgrpc.New(&idemgrpc.Config{Store: idemmem.NewStore(nil), SharedScope: true, Default: idemgrpc.Required})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{healthpb.Health_Check_FullMethodName, healthpb.Health_Watch_FullMethodName,
		reflectionpb.ServerReflection_ServerReflectionInfo_FullMethodName, reflectionalphapb.ServerReflection_ServerReflectionInfo_FullMethodName} {
		if p := ic.Policy(m); p != idemgrpc.Off {
			t.Fatalf("Policy(%s) = %s; want off by default", m, p)
		}
	}
}

// seen counts what an Observer is shown.
type seen struct{ n atomic.Int64 }

func (s *seen) Begin(ctx context.Context, _ keyed.Event) context.Context { s.n.Add(1); return ctx }
func (s *seen) End(context.Context, keyed.Event)                         { s.n.Add(1) }
func (s *seen) Store(context.Context, keyed.StoreOp, time.Duration, error) {
	s.n.Add(1)
}

// A call the interceptor lets through (a probe, a method marked Off) is
// none of the engine's: an Observer sees nothing of it and nothing is
// counted, as on idemhttp.
func TestObserverSeesNothingOfPassedCalls(t *testing.T) {
	t.Parallel()
	obs := &seen{}
	conn, _, _ := infraServer(t, idemgrpc.Config{Store: idemmem.NewStore(nil), SharedScope: true, Observer: obs,
		Methods: map[string]idemgrpc.Policy{"/idemgrpc.test.Probe/Ping": idemgrpc.Off}})
	if _, err := healthpb.NewHealthClient(conn).Check(t.Context(), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	if err := conn.Invoke(t.Context(), "/idemgrpc.test.Probe/Ping", &structpb.Struct{}, new(structpb.Struct)); err != nil {
		t.Fatal(err)
	}
	if n := obs.n.Load(); n != 0 {
		t.Fatalf("the observer was shown %d events of calls let through; want none", n)
	}
	ctx := metadata.AppendToOutgoingContext(t.Context(), idemgrpc.MetadataKey, "c-1")
	if err := conn.Invoke(ctx, "/idemgrpc.test.Probe/Charge", &structpb.Struct{}, new(structpb.Struct)); err != nil {
		t.Fatal(err)
	}
	if obs.n.Load() == 0 {
		t.Fatal("the observer saw nothing of a keyed call")
	}
}
