package payments

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idem-go/idem/cmd/idem/internal/acquirer"
	"github.com/idem-go/idem/idemgrpc"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemsqlite"
	"github.com/idem-go/idem/idemtest"
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

// A call the database holds up ends Unavailable (request-timeout) within
// Config.RequestTimeout, as the HTTP face's 503, even though the client
// set no deadline of its own; once the database answers, the retry with
// the same key charges once.
func TestGRPCStalledDatabaseAnswersInBoundedTime(t *testing.T) {
	t.Parallel()
	svc, lock := lockedSQLite(t, Config{GRPC: true, RequestTimeout: 300 * time.Millisecond, InflightWait: 100 * time.Millisecond})
	acct := serveJSON(svc.Handler(), "POST", "/v1/accounts", "", `{"balance":100,"currency":"KRW"}`)
	if acct.Code != http.StatusCreated {
		t.Fatalf("account: %d %s", acct.Code, acct.Body)
	}
	id := strings.TrimPrefix(acct.Header().Get("Location"), "/v1/accounts/")

	conn := serveGRPC(t, svc)
	in, err := structpb.NewStruct(map[string]any{"account_id": id, "amount": 30, "currency": "KRW"})
	if err != nil {
		t.Fatal(err)
	}
	call := func(ctx context.Context) error {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer k", idemgrpc.MetadataKey, "g-1")
		return conn.Invoke(ctx, GRPCCreatePayment, in, new(structpb.Struct))
	}

	release := lock()
	// No deadline of the call's own; this one only keeps a failing test
	// from hanging for the lock's minute.
	backstop, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	start := time.Now()
	err = call(backstop)
	took := time.Since(start)
	release()
	if status.Code(err) != codes.Unavailable || !strings.Contains(status.Convert(err).Message(), "request-timeout") {
		t.Fatalf("a payment with the database stalled: %v after %v; want Unavailable (request-timeout) within the request timeout", err, took)
	}
	idemtest.Eventually(t, 30*time.Second, "the retry after the stall answered", func() bool {
		return call(t.Context()) == nil
	})
	var a struct{ Balance int64 }
	got := serveJSON(svc.Handler(), "GET", "/v1/accounts/"+id, "", "")
	if err := json.Unmarshal(got.Body.Bytes(), &a); err != nil || a.Balance != 70 {
		t.Errorf("balance after the stall and the retry: %s (%v), want 70: charged once", got.Body, err)
	}
	// The face's calls are counted on /metrics as the HTTP face's are,
	// under the gRPC face's names: none under HTTP's.
	for _, want := range []string{
		`idem_grpc_requests_total{middleware="grpc-payments",outcome="executed"} 1`,
		`idem_grpc_request_duration_seconds_count{middleware="grpc-payments",outcome="executed"} 1`,
	} {
		idemtest.Eventually(t, 10*time.Second, "the gRPC payment counted on /metrics as "+want, func() bool {
			return strings.Contains(serveJSON(svc.Handler(), "GET", "/metrics", "", "").Body.String(), want)
		})
	}
	if m := serveJSON(svc.Handler(), "GET", "/metrics", "", "").Body.String(); strings.Contains(m, `idem_http_`) && strings.Contains(m, `middleware="grpc-`) {
		for line := range strings.Lines(m) {
			if strings.HasPrefix(line, "idem_http_") && strings.Contains(line, `middleware="grpc-`) {
				t.Errorf("the gRPC face's figures under an HTTP name: %s", line)
			}
		}
	}
}

// A gRPC client that reuses a key for another payment after the service
// forgot it (Config.KeyTTL) is refused by the card network, which still
// holds the key's charge: it gets FailedPrecondition, as it does from the
// interceptor while the key is remembered, so that one code says "this key
// is another operation's" whichever of the two finds it out.
func TestGRPCKeyReusedAfterItsTTLIsFailedPrecondition(t *testing.T) {
	t.Parallel()
	adb, err := idemsqlite.Open(filepath.Join(t.TempDir(), "acquirer.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { adb.Close() })
	network, err := acquirer.New(t.Context(), acquirer.Config{DB: adb, APIKey: "net-key"})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(network.Handler())
	t.Cleanup(hs.Close)
	card, err := acquirer.NewClient(acquirer.ClientConfig{URL: hs.URL, APIKey: "net-key"})
	if err != nil {
		t.Fatal(err)
	}
	db, err := idemsqlite.Open(filepath.Join(t.TempDir(), "idem.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	clock := idemmem.NewClock(time.Date(2025, 3, 1, 0, 0, 0, 0, time.UTC))
	svc, err := New(t.Context(), &Config{DB: db, APIKeys: map[string]string{"k": "acme"}, GRPC: true, Acquirer: card, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Close() })
	acct := serveJSON(svc.Handler(), "POST", "/v1/accounts", "", `{"balance":100,"currency":"KRW"}`)
	if acct.Code != http.StatusCreated {
		t.Fatalf("account: %d %s", acct.Code, acct.Body)
	}
	id := strings.TrimPrefix(acct.Header().Get("Location"), "/v1/accounts/")
	conn := serveGRPC(t, svc)
	pay := func(amount int) error {
		in, err := structpb.NewStruct(map[string]any{"account_id": id, "amount": amount, "currency": "KRW"})
		if err != nil {
			t.Fatal(err)
		}
		ctx := metadata.AppendToOutgoingContext(t.Context(), "authorization", "Bearer k", idemgrpc.MetadataKey, "g-reused")
		return conn.Invoke(ctx, GRPCCreatePayment, in, new(structpb.Struct))
	}
	if err := pay(30); err != nil {
		t.Fatalf("the first payment: %v", err)
	}
	if err := pay(40); status.Code(err) != codes.FailedPrecondition || idemgrpc.Reason(err) != idemgrpc.ReasonKeyMismatch {
		t.Fatalf("the key again with another amount, remembered: %v (reason %q); want FailedPrecondition, %s", err, idemgrpc.Reason(err), idemgrpc.ReasonKeyMismatch)
	}
	clock.Advance(DefaultKeyTTL + time.Second)
	if n, err := svc.purgeExpired(t.Context(), 10); err != nil || n == 0 {
		t.Fatalf("purge after the key's TTL: %d, %v; want the key forgotten", n, err)
	}
	err = pay(40)
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(status.Convert(err).Message(), "idempotency-key-conflict") {
		t.Fatalf("the forgotten key again with another amount: %v; want FailedPrecondition (idempotency-key-conflict), as while the key was remembered", err)
	}
}

// serveGRPC serves svc's gRPC face on a loopback port until the test ends,
// and returns a client connection to it.
func serveGRPC(t *testing.T, svc *Service) *grpc.ClientConn {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := svc.GRPCServer()
	go srv.Serve(lis) //nolint:errcheck // ends with Stop
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}
