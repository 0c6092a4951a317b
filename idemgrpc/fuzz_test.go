package idemgrpc_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idem-go/idem/idemgrpc"
	"github.com/idem-go/idem/idemgrpc/internal/grpcsuite"
	"github.com/idem-go/idem/idemmem"
)

// FuzzUnary sends fuzzed keys and messages through a real client and
// server, each twice: no key runs its handler twice, a refused key runs
// nothing, the second call answers as the first did (replayed, when the
// first ran), and nothing crashes. The seeds run with every go test.
func FuzzUnary(f *testing.F) {
	for _, s := range []struct {
		key  string
		name string
		raw  []byte
	}{
		{"order-1", "amount", nil},
		{"", "amount", nil},
		{`"quoted"`, "to", nil},
		{"with space", "x", nil},
		{strings.Repeat("k", 256), "x", nil},
		{"ünïcode", "x", nil},
		{"nul\x00", "x", nil},
		{"order-1", "other", nil}, // the same key, another request
		{"raw", "", []byte{0x0a, 0x05, 0x0a, 0x01, 0x61, 0x12, 0x00}},
		{"bad-raw", "", []byte{0xff, 0xff, 0xff}},
	} {
		f.Add(s.key, s.name, s.raw)
	}
	h := grpcsuite.New(f, idemgrpc.Config{Store: idemmem.NewStore(nil), SharedScope: true}, nil)
	var mu sync.Mutex
	runs := map[string]int{}
	h.Handle(func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		key := md.Get(idemgrpc.MetadataKey)[0]
		mu.Lock()
		runs[key]++
		mu.Unlock()
		return req, nil
	})
	f.Fuzz(func(t *testing.T, key, name string, raw []byte) {
		req := new(structpb.Struct)
		if proto.Unmarshal(raw, req) != nil || len(raw) == 0 {
			req = &structpb.Struct{Fields: map[string]*structpb.Value{name: structpb.NewStringValue(key)}}
		}
		ctx := metadata.AppendToOutgoingContext(context.Background(), idemgrpc.MetadataKey, key)
		out := make([]error, 2)
		replayed := make([]bool, 2)
		for i := range 2 {
			var header metadata.MD
			_, header, out[i] = h.Call(ctx, "", req)
			replayed[i] = len(header[idemgrpc.MetadataReplayed]) > 0
		}
		mu.Lock()
		n := runs[key]
		mu.Unlock()
		if n > 1 {
			t.Fatalf("key %q ran %d times", key, n)
		}
		c0, c1 := status.Code(out[0]), status.Code(out[1])
		if out[0] == nil && (out[1] != nil || !replayed[1]) {
			t.Fatalf("key %q: the first call ran, the second answered %v (replayed %v)", key, out[1], replayed[1])
		}
		if out[0] != nil && c0 != c1 {
			t.Fatalf("key %q: %v, then %v", key, out[0], out[1])
		}
		if c0 == codes.InvalidArgument && n != 0 {
			t.Fatalf("refused key %q ran", key)
		}
	})
}
