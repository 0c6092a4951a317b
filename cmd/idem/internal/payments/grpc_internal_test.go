package payments

import (
	"context"
	"path/filepath"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idem-go/idem/idemgrpc"
	"github.com/idem-go/idem/idemsqlite"
)

// The gRPC face's interceptors give a call with no tenant the empty scope,
// and refuse it Unauthenticated without running it: calls the
// authentication did not vouch for never share one set of keys.
func TestGRPCEmptyScopeIsUnauthenticated(t *testing.T) {
	t.Parallel()
	db, err := idemsqlite.Open(filepath.Join(t.TempDir(), "idem.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	s, err := New(t.Context(), &Config{DB: db, APIKeys: map[string]string{"k": "acme"}, GRPC: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, c := range []struct {
		method string
		ic     *idemgrpc.Interceptor
	}{{GRPCCreatePayment, s.grpcPayments}, {GRPCCreateRefund, s.grpcRefunds}} {
		ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs(idemgrpc.MetadataKey, "no-tenant-1"))
		ran := false
		_, err := c.ic.Unary()(ctx, &structpb.Struct{}, &grpc.UnaryServerInfo{FullMethod: c.method}, func(context.Context, any) (any, error) {
			ran = true
			return &structpb.Struct{}, nil
		})
		if status.Code(err) != codes.Unauthenticated || ran {
			t.Fatalf("%s without a tenant: %v, ran %v; want Unauthenticated, nothing run", c.method, err, ran)
		}
	}
	if _, err := New(t.Context(), &Config{DB: db, APIKeys: map[string]string{"k": "acme"}, GRPC: true, Unsafe: true}); err == nil {
		t.Fatal("GRPC with Unsafe: no error")
	}
}
