package payments_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idem-go/idem/cmd/idem/internal/payments"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemotel"
	"github.com/idem-go/idem/idemsqlite"
	"github.com/idem-go/idem/idemtest"
)

// The service's tracing, end to end: idemotel's spans across the payment's
// request, its outbox row, the relay and the settlement consumer.

// A payment's settlement continues the trace of the request that made
// it: the payment's handler span wrote the traceparent into the outbox
// row, the relay and the embedded transport carried it, and the
// settlement consumer's span is its child.
func TestSettlementContinuesPaymentTrace(t *testing.T) {
	t.Parallel()
	tr, sr := newTracing(t)
	db, err := idemsqlite.Open(filepath.Join(t.TempDir(), "payments.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	svc, err := payments.New(t.Context(), &payments.Config{
		DB: db, APIKeys: map[string]string{"sk_test": "acme"},
		Observers: &payments.Observers{Middleware: tr.Middleware, Consumer: tr.Consumer(), Relay: tr.Relay(), Message: tr.Inject},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Close()
	call := func(path, key, body string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer sk_test")
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(idemhttp.HeaderKey, key)
		rr := httptest.NewRecorder()
		svc.Handler().ServeHTTP(rr, req)
		if rr.Code != http.StatusCreated {
			t.Fatalf("POST %s: %d %s", path, rr.Code, rr.Body)
		}
		return rr
	}
	var acct struct{ ID string }
	json.Unmarshal(call("/v1/accounts", "acct-1", `{"balance":10000,"currency":"KRW"}`).Body.Bytes(), &acct)
	call("/v1/payments", "order-secret-42", `{"account_id":"`+acct.ID+`","amount":3000,"currency":"KRW"}`)
	call("/v1/payments", "order-secret-42", `{"account_id":"`+acct.ID+`","amount":3000,"currency":"KRW"}`) // replayed

	idemtest.Eventually(t, 30*time.Second, "the settlement span", func() bool {
		return len(find(sr, "settlement process", idemotel.AttrOutcome, "processed")) > 0
	})
	settle := find(sr, "settlement process", idemotel.AttrOutcome, "processed")[0]
	var handler, request sdktrace.ReadOnlySpan
	for _, s := range find(sr, "idemhttp.handler", idemotel.AttrMiddleware, "payments") {
		handler = s
	}
	for _, s := range find(sr, "idemhttp.request", idemotel.AttrOutcome, "executed") {
		if v, _ := attr(s, idemotel.AttrMiddleware); v.AsString() == "payments" {
			request = s
		}
	}
	if handler == nil || request == nil {
		t.Fatalf("no payments handler or executed request span among %d spans", len(sr.Ended()))
	}
	if settle.Parent().SpanID() != handler.SpanContext().SpanID() || settle.SpanContext().TraceID() != request.SpanContext().TraceID() {
		t.Errorf("settlement span: parent %s in trace %s; want the payment handler's span %s in trace %s",
			settle.Parent().SpanID(), settle.SpanContext().TraceID(), handler.SpanContext().SpanID(), request.SpanContext().TraceID())
	}
	if !settle.Parent().IsRemote() || settle.SpanKind() != trace.SpanKindConsumer {
		t.Errorf("settlement span: parent remote %v, kind %v; want a consumer span continuing a remote parent", settle.Parent().IsRemote(), settle.SpanKind())
	}
	if handler.Parent().SpanID() != request.SpanContext().SpanID() {
		t.Errorf("handler span's parent %s, want the request span %s", handler.Parent().SpanID(), request.SpanContext().SpanID())
	}
	// The request's phases and its replay.
	for _, name := range []string{"idemhttp.claim", "idemhttp.replay"} {
		if len(find(sr, name, idemotel.AttrMiddleware, "payments")) == 0 {
			t.Errorf("no %s span of the payments middleware", name)
		}
	}
	if len(find(sr, "idemhttp.request", idemotel.AttrOutcome, "replayed")) == 0 {
		t.Error("no span of the replayed request")
	}
	// The key is never recorded as it is.
	for _, s := range sr.Ended() {
		for _, kv := range s.Attributes() {
			if strings.Contains(kv.Value.Emit(), "order-secret-42") {
				t.Errorf("span %s records the key in %s", s.Name(), kv.Key)
			}
		}
	}
	if v, ok := attr(request, idemotel.AttrKeyDigest); !ok || v.AsString() == "" {
		t.Error("the request span has no key digest")
	}
}

// newTracing returns a Tracing whose spans are recorded as they end.
func newTracing(t *testing.T) (*idemotel.Tracing, *tracetest.SpanRecorder) {
	t.Helper()
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	return idemotel.New(&idemotel.Config{TracerProvider: tp}), sr
}

func attr(s sdktrace.ReadOnlySpan, key attribute.Key) (attribute.Value, bool) {
	for _, kv := range s.Attributes() {
		if kv.Key == key {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}

// find returns the ended spans named name whose attribute key is value
// (any value when key is empty).
func find(sr *tracetest.SpanRecorder, name string, key attribute.Key, value string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range sr.Ended() {
		if s.Name() != name {
			continue
		}
		if v, ok := attr(s, key); key == "" || (ok && v.Emit() == value) {
			out = append(out, s)
		}
	}
	return out
}
