package idemgrpc_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemgrpc"
	"github.com/idem-go/idem/idemgrpc/internal/grpcsuite"
	"github.com/idem-go/idem/idemmem"
)

func withRetryInfo(code codes.Code, d time.Duration) error {
	st, _ := status.New(code, "later").WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(d)})
	return st.Err()
}

// Which outcomes the Client retries, how long it waits, and that every
// attempt carries one key.
func TestClientRetries(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	cases := []struct {
		name     string
		errs     []error // the attempts' outcomes, the last repeated
		deadline time.Duration
		attempts int
		minSleep time.Duration // the first wait is at least this
	}{
		{"unavailable then ok", []error{status.Error(codes.Unavailable, "down"), nil}, 0, 2, 0},
		{"in flight, with its delay", []error{withRetryInfo(codes.Aborted, 2*time.Second), nil}, 0, 2, 2 * time.Second},
		{"exhausted with RetryInfo", []error{withRetryInfo(codes.ResourceExhausted, time.Second), nil}, 0, 2, time.Second},
		{"exhausted without", []error{status.Error(codes.ResourceExhausted, "quota")}, 0, 1, 0},
		{"deterministic", []error{status.Error(codes.FailedPrecondition, "no funds")}, 0, 1, 0},
		{"deadline exceeded", []error{status.Error(codes.DeadlineExceeded, "slow")}, 0, 1, 0},
		{"gives up after 4", []error{status.Error(codes.Unavailable, "down")}, 0, 4, 0},
		{"no retry past the deadline", []error{withRetryInfo(codes.Aborted, 3*time.Second)}, 2 * time.Second, 1, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			var sleeps []time.Duration
			client := &idemgrpc.Client{
				Now:   func() time.Time { return now },
				Sleep: func(_ context.Context, d time.Duration) error { sleeps = append(sleeps, d); return nil },
			}
			var keys []string
			invoker := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, opts ...grpc.CallOption) error {
				md, _ := metadata.FromOutgoingContext(ctx)
				keys = append(keys, md.Get(idemgrpc.MetadataKey)...)
				return c.errs[min(len(keys)-1, len(c.errs)-1)]
			}
			ctx := context.Background()
			if c.deadline > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithDeadline(ctx, now.Add(c.deadline))
				defer cancel()
			}
			err := client.Unary()(ctx, grpcsuite.Method, &structpb.Struct{}, &structpb.Struct{}, nil, invoker)
			if len(keys) != c.attempts {
				t.Fatalf("%d attempts (keys %q), want %d; err %v", len(keys), keys, c.attempts, err)
			}
			for _, k := range keys {
				if k != keys[0] {
					t.Fatalf("keys %q: want one key for every attempt", keys)
				}
			}
			if c.minSleep > 0 && (len(sleeps) == 0 || sleeps[0] < c.minSleep) {
				t.Fatalf("waits %v, want the first at least %s", sleeps, c.minSleep)
			}
		})
	}
}

// The key is the metadata's own, else WithKey's, else a fresh one per
// call; Off methods get none.
func TestClientKeys(t *testing.T) {
	t.Parallel()
	client := &idemgrpc.Client{Methods: map[string]idemgrpc.Policy{"/x.Reads/*": idemgrpc.Off}}
	var got []string
	invoker := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, opts ...grpc.CallOption) error {
		md, _ := metadata.FromOutgoingContext(ctx)
		got = append(got, md.Get(idemgrpc.MetadataKey)...)
		return nil
	}
	call := func(ctx context.Context, method string) {
		if err := client.Unary()(ctx, method, &structpb.Struct{}, &structpb.Struct{}, nil, invoker); err != nil {
			t.Fatal(err)
		}
	}
	call(metadata.AppendToOutgoingContext(idemgrpc.WithKey(context.Background(), "mine"), idemgrpc.MetadataKey, "own"), grpcsuite.Method)
	call(idemgrpc.WithKey(context.Background(), "mine"), grpcsuite.Method)
	call(context.Background(), grpcsuite.Method)
	call(context.Background(), grpcsuite.Method)
	call(context.Background(), "/x.Reads/Get")
	if len(got) != 4 || got[0] != "own" || got[1] != "mine" || got[2] == got[3] || len(got[2]) != 36 {
		t.Fatalf("keys %q: want own, mine, two fresh UUIDs, none for an Off method", got)
	}
}

// A full method is split as gRPC's server routes it: the service is what
// lies between the first slash and the last, the method what follows the
// last. A call to "/x.Reads/Get/More" goes to a service "x.Reads/Get", not
// to x.Reads (nor to the health service for "/grpc.health.v1.Health/Check/
// More"), so the policy of x.Reads, or of the health service, is not its
// own: it gets a key, as the Default (Required) says.
func TestClientSplitsMethodAtItsLastSlash(t *testing.T) {
	t.Parallel()
	client := &idemgrpc.Client{Methods: map[string]idemgrpc.Policy{"/x.Reads/*": idemgrpc.Off}}
	for _, c := range []struct {
		method string
		keyed  bool
	}{
		{"/x.Reads/Get", false},
		{"/x.Reads/Get/More", true},
		{"/grpc.health.v1.Health/Check", false},
		{"/grpc.health.v1.Health/Check/More", true},
	} {
		var keys []string
		invoker := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, opts ...grpc.CallOption) error {
			md, _ := metadata.FromOutgoingContext(ctx)
			keys = md.Get(idemgrpc.MetadataKey)
			return nil
		}
		if err := client.Unary()(context.Background(), c.method, &structpb.Struct{}, &structpb.Struct{}, nil, invoker); err != nil {
			t.Fatalf("%s: %v", c.method, err)
		}
		if got := len(keys) == 1; got != c.keyed {
			t.Errorf("%s: keys %q, want a key: %v", c.method, keys, c.keyed)
		}
	}
}

// A Client whose Methods holds a name no call can have (or an entry that
// is no Policy) refuses every call, before any attempt, with an error
// naming the entry, as New refuses such a Config.Methods: an entry that
// matched no call would leave its policy silently not applied.
func TestClientRefusesMethodsNoCallMatches(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		methods map[string]idemgrpc.Policy
		want    string // in the error
	}{
		{map[string]idemgrpc.Policy{"/a.B/": idemgrpc.Off}, `"/a.B/"`},
		{map[string]idemgrpc.Policy{"//C": idemgrpc.Off}, `"//C"`},
		{map[string]idemgrpc.Policy{"/a.B.C": idemgrpc.Off}, `"/a.B.C"`},
		{map[string]idemgrpc.Policy{"a.B/C": idemgrpc.Off}, `"a.B/C"`},
		{map[string]idemgrpc.Policy{"/a.B/C/D": idemgrpc.Off}, `"/a.B/C/D"`},
		{map[string]idemgrpc.Policy{"/a.B/C": 7}, `"/a.B/C"`},
		// A good entry beside a bad one does not hide it.
		{map[string]idemgrpc.Policy{"/x.Reads/*": idemgrpc.Off, "/a.B/C/D": idemgrpc.Off}, `"/a.B/C/D"`},
	} {
		client := &idemgrpc.Client{Methods: c.methods}
		attempts := 0
		invoker := func(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error {
			attempts++
			return nil
		}
		for range 2 { // the second call is refused too
			err := client.Unary()(context.Background(), grpcsuite.Method, &structpb.Struct{}, &structpb.Struct{}, nil, invoker)
			if !errors.Is(err, idem.ErrInvalidArgument) || !strings.Contains(err.Error(), "idemgrpc.Client.Methods") || !strings.Contains(err.Error(), c.want) {
				t.Errorf("Methods %v: %v, want ErrInvalidArgument naming idemgrpc.Client.Methods and %s", c.methods, err, c.want)
			}
		}
		if attempts != 0 {
			t.Errorf("Methods %v: %d attempts, want none", c.methods, attempts)
		}
	}
	// Both forms of a good name are taken.
	client := &idemgrpc.Client{Methods: map[string]idemgrpc.Policy{"/x.Reads/*": idemgrpc.Off, "/x.Writes/Put": idemgrpc.Optional}}
	invoker := func(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error { return nil }
	if err := client.Unary()(context.Background(), "/x.Reads/Get", &structpb.Struct{}, &structpb.Struct{}, nil, invoker); err != nil {
		t.Errorf("Methods %v: %v, want the call made", client.Methods, err)
	}
}

// A Client whose Default is no Policy refuses every call, before any
// attempt, as New refuses such a Config.Default: it was taken silently,
// as if it were Required.
func TestClientRefusesADefaultThatIsNoPolicy(t *testing.T) {
	t.Parallel()
	for _, def := range []idemgrpc.Policy{-1, 7} {
		client := &idemgrpc.Client{Default: def}
		attempts := 0
		invoker := func(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error {
			attempts++
			return nil
		}
		err := client.Unary()(context.Background(), grpcsuite.Method, &structpb.Struct{}, &structpb.Struct{}, nil, invoker)
		if !errors.Is(err, idem.ErrInvalidArgument) || !strings.Contains(err.Error(), "idemgrpc.Client.Default") {
			t.Errorf("Default %d: %v, want ErrInvalidArgument naming idemgrpc.Client.Default", def, err)
		}
		if attempts != 0 {
			t.Errorf("Default %d: %d attempts, want none", def, attempts)
		}
	}
}

// A server calling a further service through a Client passes its key on:
// each call gets DownstreamKey of the execution, and a re-run after a
// transient failure sends the same keys, so the downstream service
// replays what the first run asked of it.
func TestKeyPassedDownstream(t *testing.T) {
	t.Parallel()
	down := grpcsuite.New(t, idemgrpc.Config{Store: idemmem.NewStore(nil), SharedScope: true}, nil)
	var mu sync.Mutex
	downRuns := map[string]int{}
	down.Handle(func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
		ex, _ := idemgrpc.ExecutionFromContext(ctx)
		mu.Lock()
		downRuns[string(ex.Key)]++
		mu.Unlock()
		return req, nil
	})
	client := &idemgrpc.Client{}
	downstream, err := grpc.NewClient("passthrough:///down", grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithContextDialer(down.Dialer()),
		grpc.WithChainUnaryInterceptor(client.Unary()))
	if err != nil {
		t.Fatal(err)
	}
	defer downstream.Close()

	up := grpcsuite.New(t, idemgrpc.Config{Store: idemmem.NewStore(nil), Scope: func(context.Context, string) (idem.Scope, error) { return "tenant-a", nil }}, nil)
	upRuns := 0
	var wantKeys []string
	up.Handle(func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
		upRuns++
		ex, _ := idemgrpc.ExecutionFromContext(ctx)
		wantKeys = []string{idemgrpc.DownstreamKey(ex, grpcsuite.Method, 0), idemgrpc.DownstreamKey(ex, grpcsuite.Method, 1)}
		for _, leg := range []string{"debit", "credit"} {
			out := new(structpb.Struct)
			if err := downstream.Invoke(ctx, grpcsuite.Method, grpcsuite.Msg(t, map[string]any{"leg": leg}), out); err != nil {
				return nil, err
			}
		}
		if upRuns == 1 {
			return nil, status.Error(codes.Unavailable, "failed after both legs") // transient: re-run
		}
		return grpcsuite.Msg(t, map[string]any{"ok": true}), nil
	})
	req := grpcsuite.Msg(t, map[string]any{"transfer": 10})
	if _, _, err := up.Call(t.Context(), "t-1", req); status.Code(err) != codes.Unavailable {
		t.Fatalf("first run: %v", err)
	}
	if _, _, err := up.Call(t.Context(), "t-1", req); err != nil {
		t.Fatalf("re-run: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if upRuns != 2 || len(downRuns) != 2 || downRuns[wantKeys[0]] != 1 || downRuns[wantKeys[1]] != 1 {
		t.Fatalf("upstream ran %d times; downstream runs by key %v, want one each for %q", upRuns, downRuns, wantKeys)
	}
}

// A handler that calls several services at once, each call named
// (WithCallName), sends each call with the same key in every execution,
// although its calls start in another order: here the first execution
// starts them in one order and fails after a recovery point, and the
// retry goes on from the point and starts them in another. The
// numbered keys of unnamed calls would have swapped.
func TestNamedCallsKeepTheirKeysAcrossExecutions(t *testing.T) {
	t.Parallel()
	legs := []string{"debit", "credit", "fee", "notify", "audit", "ledger"}
	// Each execution starts its calls in an order of its own, drawn from
	// a seeded source, so that a failure can be replayed.
	rnd := rand.New(rand.NewPCG(36, 1))
	var orders [][]string
	for len(orders) < 2 {
		o := slices.Clone(legs)
		rnd.Shuffle(len(o), func(i, j int) { o[i], o[j] = o[j], o[i] })
		if len(orders) == 0 || o[0] != orders[0][0] { // another call first, at least
			orders = append(orders, o)
		}
	}

	type arrival struct{ leg, key string }
	var mu sync.Mutex
	var arrivals [][]arrival // per upstream execution, as the calls arrived downstream
	downRuns := map[string]int{}
	record := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		mu.Lock()
		last := &arrivals[len(arrivals)-1]
		*last = append(*last, arrival{req.(*structpb.Struct).Fields["leg"].GetStringValue(), strings.Join(md.Get(idemgrpc.MetadataKey), ",")})
		mu.Unlock()
		return handler(ctx, req)
	}
	down := grpcsuite.New(t, idemgrpc.Config{Store: idemmem.NewStore(nil), SharedScope: true}, &grpcsuite.Options{Outer: []grpc.UnaryServerInterceptor{record}})
	down.Handle(func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
		ex, _ := idemgrpc.ExecutionFromContext(ctx)
		mu.Lock()
		downRuns[string(ex.Key)]++
		mu.Unlock()
		return req, nil
	})
	client := &idemgrpc.Client{}
	downstream, err := grpc.NewClient("passthrough:///down", grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithContextDialer(down.Dialer()),
		grpc.WithChainUnaryInterceptor(client.Unary()))
	if err != nil {
		t.Fatal(err)
	}
	defer downstream.Close()

	up := grpcsuite.New(t, idemgrpc.Config{Store: idemmem.NewStore(nil), KeySecret: []byte("0123456789abcdef0123"),
		Scope: func(context.Context, string) (idem.Scope, error) { return "tenant-a", nil }}, nil)
	var resumed []string
	var upEx idemgrpc.Execution
	want := map[string]string{}
	up.Handle(func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
		ex, _ := idemgrpc.ExecutionFromContext(ctx)
		mu.Lock()
		upEx = ex
		run := len(arrivals)
		arrivals = append(arrivals, nil)
		resumed = append(resumed, ex.Recovery.Name)
		mu.Unlock()
		if ex.Recovery.IsZero() {
			if err := idemgrpc.SaveRecovery(ctx, "calling", nil); err != nil {
				return nil, err
			}
		}
		gates := map[string]chan struct{}{}
		done := make(chan error)
		for _, leg := range legs {
			gate := make(chan struct{})
			gates[leg] = gate
			go func() {
				<-gate
				done <- downstream.Invoke(idemgrpc.WithCallName(ctx, "leg", leg), grpcsuite.Method, grpcsuite.Msg(t, map[string]any{"leg": leg}), new(structpb.Struct))
			}()
			if run == 0 {
				mu.Lock()
				want[leg] = ex.DownstreamKey("leg", leg)
				mu.Unlock()
			}
		}
		var errs []error
		for _, leg := range orders[run] {
			close(gates[leg])
			errs = append(errs, <-done)
		}
		if err := errors.Join(errs...); err != nil {
			return nil, err
		}
		if run == 0 {
			return nil, status.Error(codes.Unavailable, "failed after the calls") // past the point: kept in flight, yielded
		}
		return grpcsuite.Msg(t, map[string]any{"ok": true}), nil
	})
	req := grpcsuite.Msg(t, map[string]any{"transfer": 10})
	if _, _, err := up.Call(t.Context(), "t-1", req); status.Code(err) != codes.Unavailable {
		t.Fatalf("first execution: %v", err)
	}
	if _, _, err := up.Call(t.Context(), "t-1", req); err != nil {
		t.Fatalf("the retry: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(arrivals) != 2 || !slices.Equal(resumed, []string{"", "calling"}) {
		t.Fatalf("%d executions, from points %q; want 2, the second resumed from calling", len(arrivals), resumed)
	}
	keys := make([]map[string]string, 2)
	for run, as := range arrivals {
		keys[run] = map[string]string{}
		var order []string
		for _, a := range as {
			keys[run][a.leg] = a.key
			order = append(order, a.leg)
		}
		if !slices.Equal(order, orders[run]) {
			t.Fatalf("execution %d: the calls arrived in the order %q; want %q", run+1, order, orders[run])
		}
	}
	for _, leg := range legs {
		k := keys[0][leg]
		if k == "" || k != keys[1][leg] || k != want[leg] || downRuns[k] != 1 {
			t.Fatalf("keys of %s: %q then %q (DownstreamKey %q); want the same in both executions, run once downstream: %v, runs %v",
				leg, k, keys[1][leg], want[leg], keys, downRuns)
		}
	}
	if len(downRuns) != len(legs) {
		t.Fatalf("downstream runs by key %v; want one per call", downRuns)
	}
	// Numbered by arrival, as a Client numbers calls it is not told the
	// names of, some call would have gone with another's key.
	swapped := false
	for i, a := range arrivals[0] {
		j := slices.IndexFunc(arrivals[1], func(b arrival) bool { return b.leg == a.leg })
		swapped = swapped || idemgrpc.DownstreamKey(upEx, grpcsuite.Method, i) != idemgrpc.DownstreamKey(upEx, grpcsuite.Method, j)
	}
	if !swapped {
		t.Fatal("the two executions' calls arrived so that numbered keys would not have differed: the case proves nothing")
	}
}

// The numbered keys of a Client's unnamed calls are those earlier
// versions sent, so that an execution resumed on this one sends its
// predecessor's keys. (They last changed before the first release, to
// derive from the request's seed, which sealing the keys does not change.)
func TestNumberedDownstreamKeyUnchanged(t *testing.T) {
	t.Parallel()
	ex := idemgrpc.Execution{Scope: "tenant-a", Key: "k-1", FullMethod: "/payments.v1.Payments/Create"}
	if got, want := idemgrpc.DownstreamKey(ex, ex.FullMethod, 0), "idg1_qtszbAb_eT_15Sbqtft1eymdB8goDuzW8O-FsQKVf6w"; got != want {
		t.Fatalf("DownstreamKey(…, 0) = %q; want %q", got, want)
	}
}

// TestClientWaitsAtMostItsCap: the client's own waits between attempts
// grow from Policy.Base up to Policy.Cap, which is kept when set and is 5 s
// when left zero (not RetryPolicy's 30 s), and no server's bound cuts them.
func TestClientWaitsAtMostItsCap(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ cap, want time.Duration }{{0, 5 * time.Second}, {2 * time.Second, 2 * time.Second}} {
		var sleeps []time.Duration
		client := &idemgrpc.Client{
			Policy: idem.RetryPolicy{MaxAttempts: 6, Base: time.Second, Cap: c.cap, Jitter: idem.NoJitter},
			Sleep:  func(_ context.Context, d time.Duration) error { sleeps = append(sleeps, d); return nil },
		}
		invoker := func(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error {
			return status.Error(codes.Unavailable, "down")
		}
		_ = client.Unary()(context.Background(), grpcsuite.Method, &structpb.Struct{}, &structpb.Struct{}, nil, invoker)
		var want []time.Duration
		for d := time.Second; len(want) < 5; d *= 2 {
			want = append(want, min(d, c.want))
		}
		if !slices.Equal(sleeps, want) {
			t.Errorf("Policy.Cap %s: waits %v, want %v", c.cap, sleeps, want)
		}
	}
	// A Base longer than idemhttp.MaxRetryAfter is the client's own delay,
	// waited in full: that bound is on what a server may ask.
	var sleeps []time.Duration
	client := &idemgrpc.Client{
		Policy: idem.RetryPolicy{MaxAttempts: 2, Base: 2 * time.Minute, Jitter: idem.NoJitter},
		Sleep:  func(_ context.Context, d time.Duration) error { sleeps = append(sleeps, d); return nil },
	}
	invoker := func(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error {
		return status.Error(codes.Unavailable, "down")
	}
	_ = client.Unary()(context.Background(), grpcsuite.Method, &structpb.Struct{}, &structpb.Struct{}, nil, invoker)
	if want := []time.Duration{2 * time.Minute}; !slices.Equal(sleeps, want) {
		t.Errorf("Policy.Base 2m: waits %v, want %v", sleeps, want)
	}
}
