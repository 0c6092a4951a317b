package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
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
	"github.com/idem-go/idem/cmd/idem/internal/payments"
	"github.com/idem-go/idem/idemgrpc"
	"github.com/idem-go/idem/idemsqlite"
	"github.com/idem-go/idem/idemtest"
)

// grpcAnswer is one call's answer on the gRPC face.
type grpcAnswer struct {
	out    *structpb.Struct
	header metadata.MD
	err    error
}

func (a grpcAnswer) replayed() bool { return len(a.header.Get(idemgrpc.MetadataReplayed)) == 1 }

// grpcCall calls method on r's gRPC face with key and fault (each left
// out when empty) and body's members, as the API key apiKey ("" for none).
func (r *replicaProc) grpcCall(t *testing.T, method, apiKey, key, fault string, body map[string]any) grpcAnswer {
	t.Helper()
	r.mu.Lock()
	addr := r.grpc
	r.mu.Unlock()
	if addr == "" {
		t.Fatalf("replica %s serves no gRPC", r.id)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	in, err := structpb.NewStruct(body)
	if err != nil {
		t.Fatal(err)
	}
	var md []string
	if apiKey != "" {
		md = append(md, "authorization", "Bearer "+apiKey)
	}
	if key != "" {
		md = append(md, idemgrpc.MetadataKey, key)
	}
	if fault != "" {
		md = append(md, payments.MetadataFault, fault)
	}
	ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(t.Context(), md...), 20*time.Second)
	defer cancel()
	a := grpcAnswer{out: new(structpb.Struct)}
	a.err = conn.Invoke(ctx, method, in, a.out, grpc.Header(&a.header))
	return a
}

// grpcRetryUntilAnswered retries the call, as a client that gets
// Unavailable or Aborted (its key in flight) would, every 50ms, until
// another answer.
func grpcRetryUntilAnswered(t *testing.T, r *replicaProc, method, key string, body map[string]any, limit time.Duration) grpcAnswer {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		a := r.grpcCall(t, method, "test-key", key, "", body)
		if c := status.Code(a.err); c != codes.Unavailable && c != codes.Aborted || time.Now().After(deadline) {
			return a
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// idem serve --grpc: two calls of CreatePayment with one key make one
// payment and one charge, and the second gets the first's answer,
// marked replayed; a call the face cannot give a scope (no API key, a
// wrong one) is Unauthenticated and runs nothing; the same key sent over
// HTTP is another request (its fingerprint differs) and is refused.
func TestGRPCFaceDeduplicates(t *testing.T) {
	t.Parallel()
	netDB, err := idemsqlite.Open(filepath.Join(t.TempDir(), "acquirer.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer netDB.Close()
	net, err := acquirer.New(t.Context(), acquirer.Config{DB: netDB, APIKey: "net-key", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(net.Handler())
	defer hs.Close()
	netClient, err := acquirer.NewClient(acquirer.ClientConfig{URL: hs.URL, APIKey: "net-key"})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	a := startReplica(t, "grpc", []string{"--db", "sqlite:" + filepath.Join(dir, "idem.db"), "--acquirer", hs.URL, "--grpc", "127.0.0.1:0"})
	defer a.stop(t)

	acct := a.post(t, "/v1/accounts", "grpc-acct", "", map[string]any{"balance": 10000, "currency": "EUR"})
	if acct.status != http.StatusCreated {
		t.Fatalf("account: %s", acct)
	}
	pay := map[string]any{"account_id": acct.body["id"], "amount": 1250, "currency": "EUR", "description": "grpc"}
	for _, c := range []struct{ name, apiKey string }{{"no API key", ""}, {"a wrong API key", "not-a-key"}} {
		if got := a.grpcCall(t, payments.GRPCCreatePayment, c.apiKey, "grpc-pay-1", "", pay); status.Code(got.err) != codes.Unauthenticated {
			t.Fatalf("a call with %s: %v; want Unauthenticated", c.name, got.err)
		}
	}
	first := a.grpcCall(t, payments.GRPCCreatePayment, "test-key", "grpc-pay-1", "", pay)
	if first.err != nil || first.replayed() {
		t.Fatalf("the first call: %v (replayed %v)", first.err, first.replayed())
	}
	again := a.grpcCall(t, payments.GRPCCreatePayment, "test-key", "grpc-pay-1", "", pay)
	id := first.out.Fields["id"].GetStringValue()
	if again.err != nil || !again.replayed() || again.out.Fields["id"].GetStringValue() != id || id == "" ||
		again.out.Fields["charge_id"].GetStringValue() != first.out.Fields["charge_id"].GetStringValue() {
		t.Fatalf("the second call: %v, %v (replayed %v); want payment %q replayed", again.out, again.err, again.replayed(), id)
	}
	if got := a.grpcCall(t, payments.GRPCCreatePayment, "test-key", "", "", pay); status.Code(got.err) != codes.InvalidArgument {
		t.Fatalf("a call without a key: %v; want InvalidArgument", got.err)
	}
	if r := a.post(t, "/v1/payments", "grpc-pay-1", "", pay); r.status != http.StatusUnprocessableEntity {
		t.Fatalf("the gRPC call's key sent over HTTP: %s; want 422, another request under the key", r)
	}
	made, err := netClient.Charges(t.Context(), acct.body["id"].(string))
	if err != nil {
		t.Fatal(err)
	}
	if len(made) != 1 || made[0].ID != first.out.Fields["charge_id"].GetStringValue() {
		t.Fatalf("charges = %+v; want the one of payment %s", made, id)
	}
	if bal := a.get(t, "/v1/accounts/"+acct.body["id"].(string)); bal.body["balance"] != float64(8750) {
		t.Fatalf("the account after one payment of 1250: %s", bal)
	}
	// A refund over gRPC, replayed the same way.
	refund := map[string]any{"payment_id": id, "amount": 250, "reason": "grpc"}
	r1 := a.grpcCall(t, payments.GRPCCreateRefund, "test-key", "grpc-refund-1", "", refund)
	r2 := a.grpcCall(t, payments.GRPCCreateRefund, "test-key", "grpc-refund-1", "", refund)
	if r1.err != nil || r2.err != nil || !r2.replayed() || r1.out.Fields["id"].GetStringValue() != r2.out.Fields["id"].GetStringValue() {
		t.Fatalf("the refund and its replay: %v %v, %v %v", r1.out, r1.err, r2.out, r2.err)
	}
	// A refusal is kept and replayed as the same status.
	tooMuch := map[string]any{"account_id": acct.body["id"], "amount": 1000000, "currency": "EUR"}
	d1 := a.grpcCall(t, payments.GRPCCreatePayment, "test-key", "grpc-too-much", "", tooMuch)
	d2 := a.grpcCall(t, payments.GRPCCreatePayment, "test-key", "grpc-too-much", "", tooMuch)
	if status.Code(d1.err) != codes.FailedPrecondition || status.Code(d2.err) != codes.FailedPrecondition || !d2.replayed() {
		t.Fatalf("a payment past the balance and its replay: %v, %v (replayed %v); want FailedPrecondition twice, the second replayed", d1.err, d2.err, d2.replayed())
	}
}

func (r *replicaProc) get(t *testing.T, path string) answerOf {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, r.base+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer test-key")
	resp, err := (&http.Client{Timeout: 20 * time.Second}).Do(req)
	if err != nil {
		return answerOf{err: err}
	}
	defer resp.Body.Close()
	a := answerOf{status: resp.StatusCode}
	_ = json.NewDecoder(resp.Body).Decode(&a.body)
	return a
}

// idem serve --grpc drains both faces together, within the one
// --shutdown-timeout: an HTTP request and a gRPC call that outlast it are
// both cut off at its end (not one after the other, which took twice the
// timeout), and "stopped" is logged once both faces are.
func TestGRPCFaceShutdownDrainsBothFacesInOneTimeout(t *testing.T) {
	t.Parallel()
	// The proof uses no bound on wall time. Each face holds a call that
	// answers stall after it began: after the one timeout, so a shutdown
	// that keeps to it cuts both calls off, and before two timeouts, so one
	// that drained the faces one after the other (each with its own
	// timeout) would let the second face's call answer. What load can
	// change is only how long after the calls began the signal goes: up to
	// stall-timeout (3.5s) of it, the proof stands.
	const timeout = 5 * time.Second
	const stall = 2*timeout - 1500*time.Millisecond
	delay := "delay=" + stall.String()
	a := startReplica(t, "grpc-drain", []string{"--db", "sqlite:" + filepath.Join(t.TempDir(), "idem.db"),
		"--grpc", "127.0.0.1:0", "--faults", "--shutdown-timeout", timeout.String()})
	acct := a.post(t, "/v1/accounts", "drain-acct", "", map[string]any{"balance": 10000, "currency": "EUR"})
	if acct.status != http.StatusCreated {
		t.Fatalf("account: %s", acct)
	}
	pay := func(d string) map[string]any {
		return map[string]any{"account_id": acct.body["id"], "amount": 100, "currency": "EUR", "description": d}
	}
	httpDone := make(chan answerOf, 1)
	go func() { httpDone <- a.post(t, "/v1/payments", "drain-http", delay, pay("http")) }()
	grpcDone := make(chan grpcAnswer, 1)
	go func() {
		grpcDone <- a.grpcCall(t, payments.GRPCCreatePayment, "test-key", "drain-grpc", delay, pay("grpc"))
	}()
	idemtest.Eventually(t, 30*time.Second, "both calls in flight", func() bool {
		return strings.Count(a.log(), "injecting faults") == 2
	})
	start := time.Now()
	a.cmd.Process.Signal(os.Interrupt)
	select {
	case <-a.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("the replica did not stop within 30s:\n%s", a.log())
	}
	took := time.Since(start)
	t.Logf("stopped %v after the signal, with --shutdown-timeout %v and calls stalled %v", took.Round(time.Millisecond), timeout, stall)
	if took < timeout {
		t.Errorf("stopped %v after the signal, with --shutdown-timeout %v; want the calls in flight given the timeout", took, timeout)
	}
	// Each call is cut off, not answered: the shutdown ended before the
	// stalled calls would have, on either face.
	if g := <-grpcDone; status.Code(g.err) != codes.Unavailable {
		t.Errorf("the gRPC call in flight past the timeout ended with %v, %v; want it cut off (Unavailable) within the one timeout", g.out, g.err)
	}
	if h := <-httpDone; h.err == nil {
		t.Errorf("the HTTP call in flight past the timeout answered %s; want its connection cut off within the one timeout", h)
	}
	logs := a.log()
	if i, j := strings.Index(logs, "cutting off the gRPC calls left"), strings.Index(logs, `msg=stopped`); i < 0 || j < i {
		t.Errorf("the log does not say the gRPC face was cut off before \"stopped\":\n%s", logs)
	}
	if i, j := strings.Index(logs, "closing the connections left"), strings.Index(logs, `msg=stopped`); i < 0 || j < i {
		t.Errorf("the log does not say the HTTP face was cut off before \"stopped\":\n%s", logs)
	}
}
