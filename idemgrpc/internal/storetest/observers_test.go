package storetest_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idem-go/idem/idemgrpc"
	"github.com/idem-go/idem/idemgrpc/internal/grpcsuite"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemotel"
	"github.com/idem-go/idem/idemprom"
)

// idemprom's and idemotel's observers, written for idemhttp, watch the
// interceptor through the same seam: histograms by outcome, and a span
// per phase whose request span names the call's method.
func TestObservers(t *testing.T) {
	t.Parallel()
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	defer tp.Shutdown(context.Background())
	prom := idemprom.NewMiddlewareObserver("payments-grpc")
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(prom)
	obs := idemhttp.Observers(prom, idemotel.New(&idemotel.Config{TracerProvider: tp}).Middleware("payments-grpc"))
	h := grpcsuite.New(t, idemgrpc.Config{Store: idemmem.NewStore(nil), SharedScope: true, Observer: obs}, nil)
	h.Handle(func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) { return req, nil })
	for range 2 {
		if _, _, err := h.Call(t.Context(), "k", grpcsuite.Msg(t, map[string]any{"a": 1})); err != nil {
			t.Fatal(err)
		}
	}
	h.WaitEnds(t, 2)
	if n := testutil.CollectAndCount(prom, "idem_http_request_duration_seconds"); n == 0 {
		t.Fatal("no request histogram series")
	}
	var names []string
	path := ""
	for _, s := range sr.Ended() {
		names = append(names, s.Name())
		for _, a := range s.Attributes() {
			if a.Key == "url.path" {
				path = a.Value.AsString()
			}
		}
	}
	if fmt.Sprint(names) != "[idemhttp.claim idemhttp.handler idemhttp.complete idemhttp.request idemhttp.replay idemhttp.request]" || path != grpcsuite.Method {
		t.Fatalf("spans %v, url.path %q", names, path)
	}
}
