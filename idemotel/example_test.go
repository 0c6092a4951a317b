package idemotel_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemotel"
)

// A protected request becomes a span with a child per phase; the message
// its handler writes carries the handler's span in a traceparent header,
// for the consumer's span to continue.
func ExampleTracing_Middleware() {
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	defer tp.Shutdown(context.Background())
	tr := idemotel.New(&idemotel.Config{TracerProvider: tp})

	m, err := idemhttp.New(&idemhttp.Config{SharedScope: true, Store: idemmem.NewStore(nil), Observer: tr.Middleware("payments")})
	if err != nil {
		panic(err)
	}
	var event idem.Message
	h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		event = idem.Message{ID: "evt_1", Topic: "payments.succeeded"}
		tr.Inject(r.Context(), &event) // as it is written to the outbox
		w.WriteHeader(http.StatusCreated)
	}))
	req := httptest.NewRequest(http.MethodPost, "/v1/payments", strings.NewReader(`{"amount":100}`))
	req.Header.Set(idemhttp.HeaderKey, "order-42")
	h.ServeHTTP(httptest.NewRecorder(), req)

	for _, s := range sr.Ended() {
		fmt.Println(s.Name())
	}
	fmt.Println("traceparent carried:", event.Headers["traceparent"] != "")
	// Output:
	// idemhttp.claim
	// idemhttp.handler
	// idemhttp.complete
	// idemhttp.request
	// traceparent carried: true
}
