package idemgrpc_test

import (
	"context"
	"errors"
	"strings"
	"testing"

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
