package idemgrpc_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemgrpc"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/keyed"
)

// plainStore is a store that keeps no recovery points: the memory store
// with its idem.Recoverer methods hidden.
type plainStore struct{ idem.Store }

// NewCompleter takes its CompleterConfig as given, refuses one without a
// Resume, and refuses a store that keeps no recovery points (no Completer
// could find an abandoned call there), each with an ArgumentError.
func TestNewCompleterRefuses(t *testing.T) {
	t.Parallel()
	resume := func(context.Context, idemgrpc.Execution) (any, error) { return nil, idemgrpc.ErrNothingDone }
	ic, err := idemgrpc.New(&idemgrpc.Config{Store: idemmem.NewStore(nil), SharedScope: true})
	if err != nil {
		t.Fatal(err)
	}
	for name, cfg := range map[string]*idemgrpc.CompleterConfig{"nil": nil, "no Resume": {Limit: 3}} {
		comp, err := ic.NewCompleter(cfg)
		if !errors.Is(err, idem.ErrInvalidArgument) || !strings.Contains(err.Error(), "Resume") || comp != nil {
			t.Errorf("NewCompleter(%s): %v, %v; want an ArgumentError naming Resume", name, comp, err)
		}
	}
	comp, err := ic.NewCompleter(&idemgrpc.CompleterConfig{Resume: resume})
	if err != nil || comp == nil {
		t.Fatalf("NewCompleter with a Resume, on a Recoverer: %v, %v; want a Completer", comp, err)
	}

	plain, err := idemgrpc.New(&idemgrpc.Config{Store: plainStore{idemmem.NewStore(nil)}, SharedScope: true})
	if err != nil {
		t.Fatal(err)
	}
	comp, err = plain.NewCompleter(&idemgrpc.CompleterConfig{Resume: resume})
	if !errors.Is(err, idem.ErrInvalidArgument) || !strings.Contains(err.Error(), "Recoverer") || comp != nil {
		t.Fatalf("NewCompleter on a store with no recovery points: %v, %v; want an ArgumentError naming idem.Recoverer", comp, err)
	}
}

// A request message that cannot be encoded (a string that is not UTF-8,
// which proto3 refuses) cannot be fingerprinted: the call is refused as
// InvalidArgument with ReasonRequestType, counted as rejected, its handler
// not run and its key not claimed.
func TestUnencodableRequestRefused(t *testing.T) {
	t.Parallel()
	store := idemmem.NewStore(nil)
	ic, err := idemgrpc.New(&idemgrpc.Config{Store: store, SharedScope: true, Default: idemgrpc.Required})
	if err != nil {
		t.Fatal(err)
	}
	req := &structpb.Struct{Fields: map[string]*structpb.Value{"name": structpb.NewStringValue("\xff")}}
	ctx := metadata.NewIncomingContext(t.Context(), metadata.Pairs(idemgrpc.MetadataKey, "k"))
	_, err = ic.Unary()(ctx, req, &grpc.UnaryServerInfo{FullMethod: "/pay.Payments/Charge"}, func(context.Context, any) (any, error) {
		t.Fatal("the handler ran")
		return nil, nil
	})
	if status.Code(err) != codes.InvalidArgument || idemgrpc.Reason(err) != idemgrpc.ReasonRequestType || !strings.Contains(err.Error(), "cannot be encoded") {
		t.Fatalf("a request that cannot be encoded: %v; want InvalidArgument, %s", err, idemgrpc.ReasonRequestType)
	}
	if n := ic.Counts()[keyed.OutcomeRejected]; n != 1 {
		t.Fatalf("rejected count %d; want 1", n)
	}
	if _, err := store.Get(t.Context(), "", "k"); !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("the key after: %v; want it never claimed", err)
	}
}

// A Resume whose answer is not a protocol buffer message has no answer the
// key can keep: the round finishes nothing and counts the key failed, its
// outcome unknown; the key stays in flight with its point, and a later
// Resume that answers with a message finishes it.
func TestCompleterKeepsNoAnswerThatIsNotAMessage(t *testing.T) {
	t.Parallel()
	clock := idemmem.NewClock(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC))
	store := idemmem.NewStore(&idemmem.Config{Clock: clock})
	ic, err := idemgrpc.New(&idemgrpc.Config{Store: store, SharedScope: true, Clock: clock, Lease: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	claim, err := store.Claim(t.Context(), idem.ClaimRequest{Key: "k", Fingerprint: idem.NewFingerprint("/pay.Pay/Charge", "", "", "", []byte("k")),
		Lease: 10 * time.Second, TTL: time.Hour})
	if err != nil || claim.Outcome != idem.Acquired {
		t.Fatalf("claim: %v, %v", claim.Outcome, err)
	}
	ref := idem.Ref{Key: "k", Token: claim.Token}
	if err := store.SaveRecovery(t.Context(), ref, idem.RecoveryPoint{Name: "charging"}); err != nil {
		t.Fatal(err)
	}
	if err := store.Yield(t.Context(), ref); err != nil {
		t.Fatal(err)
	}
	var answer any = "charged, but not a message"
	comp, err := ic.NewCompleter(&idemgrpc.CompleterConfig{Resume: func(context.Context, idemgrpc.Execution) (any, error) {
		return answer, nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := comp.RunOnce(t.Context()); n != 0 {
		t.Fatalf("the round finished %d keys with an answer that is not a message; want none", n)
	}
	if s := comp.Stats(); s.Completed != 0 || s.Failed != 1 || s.Unknown != 1 {
		t.Errorf("stats %+v; want one failed, its outcome unknown", s)
	}
	rec, err := store.Get(t.Context(), "", "k")
	if err != nil || rec.State != idem.StateInFlight || rec.Recovery.Name != "charging" {
		t.Fatalf("the key: %+v, %v; want it in flight with its point", rec, err)
	}
	answer = structpb.NewStringValue("charged")
	clock.Advance(11 * time.Second) // past the lease the failed round took
	if n, err := comp.RunOnce(t.Context()); n != 1 || err != nil {
		t.Fatalf("the round with a message for an answer finished %d, %v; want the key", n, err)
	}
	if rec, err := store.Get(t.Context(), "", "k"); err != nil || rec.State != idem.StateCompleted {
		t.Fatalf("the key: %v, %v; want it completed", rec.State, err)
	}
}

// A retry of a call that stopped at a recovery point sealed with a body key
// this interceptor lacks is refused as Internal without running the
// handler: nothing can go on from a point no one can read, and the key
// stays in flight with its point until an interceptor with the key comes.
func TestRetryOnAPointThatCannotBeOpenedRefused(t *testing.T) {
	t.Parallel()
	store := idemmem.NewStore(nil)
	k1 := keyed.BodyKey{ID: "k1", Key: []byte("0123456789abcdef0123456789abcdef")}
	k2 := keyed.BodyKey{ID: "k2", Key: []byte("fedcba9876543210fedcba9876543210")}
	newIC := func(keys ...keyed.BodyKey) *idemgrpc.Interceptor {
		ic, err := idemgrpc.New(&idemgrpc.Config{Store: store, SharedScope: true, Default: idemgrpc.Required, BodyKeys: keys})
		if err != nil {
			t.Fatal(err)
		}
		return ic
	}
	req := structpb.NewStringValue("charge 10")
	info := &grpc.UnaryServerInfo{FullMethod: "/pay.Payments/Charge"}
	ctx := metadata.NewIncomingContext(t.Context(), metadata.Pairs(idemgrpc.MetadataKey, "k"))
	_, err := newIC(k1).Unary()(ctx, req, info, func(ctx context.Context, _ any) (any, error) {
		if err := idemgrpc.SaveRecovery(ctx, "charging", []byte("ch_1")); err != nil {
			t.Fatal(err)
		}
		return nil, status.Error(codes.Unavailable, "the card network does not answer")
	})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("the first call: %v; want its handler's Unavailable", err)
	}
	ran := false
	_, err = newIC(k2).Unary()(ctx, req, info, func(context.Context, any) (any, error) {
		ran = true
		return structpb.NewStringValue("charged"), nil
	})
	if status.Code(err) != codes.Internal || ran {
		t.Fatalf("the retry without the point's body key: %v, handler ran %v; want Internal and the handler not run", err, ran)
	}
	rec, err := store.Get(t.Context(), "", "k")
	if err != nil || rec.State != idem.StateInFlight || rec.Recovery.Name != "charging" {
		t.Fatalf("the key: %+v, %v; want it in flight with its point", rec, err)
	}
}
