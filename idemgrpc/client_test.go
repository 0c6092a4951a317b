package idemgrpc_test

import (
	"context"
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
