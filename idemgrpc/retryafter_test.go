package idemgrpc_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idem-go/idem/idemgrpc"
	"github.com/idem-go/idem/idemgrpc/internal/grpcsuite"
	"github.com/idem-go/idem/idemmem"
)

// A duplicate of a call still running is answered Aborted with a RetryInfo
// of the time left on the holder's lease, by the engine's clock, not a
// constant; the Client waits all of it, past its Policy.Cap (5s by
// default), before it retries; the retry gets the first execution's answer
// replayed, and the handler runs once.
func TestRetryInfoFromTheLeaseHonoured(t *testing.T) {
	t.Parallel()
	clock := idemmem.NewClock(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC))
	store := idemmem.NewStore(&idemmem.Config{Clock: clock})
	first := make(chan error, 1)
	var slept []time.Duration
	client := &idemgrpc.Client{} // its Sleep is set below
	h := grpcsuite.New(t, idemgrpc.Config{Store: store, SharedScope: true, Lease: 10 * time.Second, Clock: clock, Timers: clock,
		InflightWait: -1}, &grpcsuite.Options{Dial: []grpc.DialOption{grpc.WithUnaryInterceptor(client.Unary())}})
	var runs atomic.Int64
	entered, release := make(chan struct{}), make(chan struct{})
	h.Handle(func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
		runs.Add(1)
		close(entered)
		<-release
		return req, nil
	})
	// The holder finishes while the duplicate's client waits.
	client.Sleep = func(ctx context.Context, d time.Duration) error {
		slept = append(slept, d)
		close(release)
		if err := <-first; err != nil {
			t.Errorf("the first call: %v", err)
		}
		return nil
	}
	msg := grpcsuite.Msg(t, map[string]any{"amount": 10})
	go func() {
		_, _, err := h.Call(t.Context(), "k", msg)
		first <- err
	}()
	select {
	case <-entered:
	case err := <-first:
		t.Fatalf("the first call ended before its handler ran: %v", err)
	}
	// 3s into the lease: the heartbeat ticked (every sixth of the lease)
	// but renews nothing before a third of it; 7s of the lease are left.
	clock.Advance(3 * time.Second)
	out, header, err := h.Call(t.Context(), "k", msg)
	if err != nil || out.Fields["amount"].GetNumberValue() != 10 || metadata.MD(header).Get(idemgrpc.MetadataReplayed) == nil {
		t.Fatalf("the duplicate, after its retry: %v, %v (header %v); want the first's answer replayed", out, err, header)
	}
	if len(slept) != 1 || slept[0] != 7*time.Second {
		t.Fatalf("the client waited %v; want once, the 7s left on the holder's lease", slept)
	}
	if runs.Load() != 1 {
		t.Fatalf("the handler ran %d times, want 1", runs.Load())
	}
}
