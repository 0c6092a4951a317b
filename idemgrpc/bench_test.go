package idemgrpc_test

import (
	"context"
	"strconv"
	"testing"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idem-go/idem/idemgrpc"
	"github.com/idem-go/idem/idemgrpc/internal/grpcsuite"
	"github.com/idem-go/idem/idemmem"
)

// BenchmarkFirstExecution is one call with a new key through a real
// grpc-go server and client (bufconn) on the in-memory store: the claim,
// the handler, the answer's record. Its allocations are the figure to
// watch (they do not depend on the machine's load, as its time does);
// BenchmarkUnprotected is the same call without a key, for the ratio.
func BenchmarkFirstExecution(b *testing.B) {
	h := grpcsuite.New(b, idemgrpc.Config{Store: idemmem.NewStore(nil), SharedScope: true}, nil)
	benchCalls(b, h, true)
}

func BenchmarkUnprotected(b *testing.B) {
	off := map[string]idemgrpc.Policy{"/" + grpcsuite.Service + "/*": idemgrpc.Off}
	h := grpcsuite.New(b, idemgrpc.Config{Store: idemmem.NewStore(nil), SharedScope: true, Methods: off}, nil)
	benchCalls(b, h, false)
}

func benchCalls(b *testing.B, h *grpcsuite.Harness, keyed bool) {
	h.Handle(func(_ context.Context, req *structpb.Struct) (*structpb.Struct, error) { return req, nil })
	req := grpcsuite.Msg(b, map[string]any{"amount": 100})
	ctx := context.Background()
	if _, _, err := h.Call(ctx, "warm", req); err != nil { // the connection's setup is not measured
		b.Fatal(err)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		key := ""
		if keyed {
			i++
			key = "k" + strconv.Itoa(i)
		}
		if _, _, err := h.Call(ctx, key, req); err != nil {
			b.Fatal(err)
		}
	}
}
