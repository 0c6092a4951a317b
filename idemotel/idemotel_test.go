package idemotel_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consumer"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemotel"
	"github.com/idem-go/idem/idemtest"
	"github.com/idem-go/idem/outbox"
)

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

// The relay's span links to the spans that wrote the messages it
// published, and the consumer's spans tell a retry and a dead letter from
// a message processed.
func TestRelayLinksAndConsumerOutcomes(t *testing.T) {
	t.Parallel()
	tr, sr := newTracing(t)
	tp := sdktrace.NewTracerProvider()
	defer tp.Shutdown(context.Background())
	ob := idemmem.NewOutbox(nil)
	transport := idemmem.NewTransport(nil)
	defer transport.Close()
	relay, err := outbox.New(&outbox.Config{Outbox: ob, Publisher: transport, Observer: tr.Relay()})
	if err != nil {
		t.Fatal(err)
	}
	cons, err := consumer.New(&consumer.Config{
		Name: "audit", Topic: "t", Subscriber: transport, Inbox: idemmem.NewInbox(), DeadLetters: idemmem.NewDeadLetters(nil),
		Ledger: idemmem.NewLedger(), Retry: idem.RetryPolicy{MaxAttempts: 2, Base: time.Millisecond, Cap: time.Millisecond},
		Observer: tr.Consumer(),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() {
		cons.Run(ctx, func(ctx context.Context, m idem.Message) error {
			if m.ID == "bad" {
				return errors.New("refused")
			}
			return nil
		})
	})
	<-cons.Subscribed()

	wctx, writer := tp.Tracer("test").Start(t.Context(), "writer")
	var spans []trace.SpanContext
	for _, id := range []string{"good", "bad"} {
		m := idem.Message{ID: id, Topic: "t"}
		tr.Inject(wctx, &m)
		if err := ob.Add(wctx, m); err != nil {
			t.Fatal(err)
		}
	}
	writer.End()
	spans = append(spans, writer.SpanContext())
	if n, err := relay.Flush(t.Context()); err != nil || n != 2 {
		t.Fatalf("Flush = %d, %v", n, err)
	}
	passes := find(sr, "outbox relay", "", "")
	if len(passes) != 1 || len(passes[0].Links()) != 2 || passes[0].Links()[0].SpanContext.SpanID() != spans[0].SpanID() {
		t.Fatalf("relay spans %v; want one, linked twice to the writer's span", passes)
	}
	// The two messages are handled apart, so the dead letter's span may end
	// before the processed message's: wait for both, not only the one
	// expected last.
	idemtest.Eventually(t, 10*time.Second, "the dead letter's and the processed message's spans", func() bool {
		return len(find(sr, "audit dead_letter", "", "")) == 1 && len(find(sr, "audit process", "", "")) >= 1
	})
	for name, want := range map[string]int{"audit process": 1, "audit retry": 1} {
		if got := find(sr, name, "", ""); len(got) != want {
			t.Errorf("%d spans %q, want %d", len(got), name, want)
		}
		for _, s := range find(sr, name, "", "") {
			if s.Parent().SpanID() != writer.SpanContext().SpanID() {
				t.Errorf("%s: parent %s, want the writer %s", name, s.Parent().SpanID(), writer.SpanContext().SpanID())
			}
		}
	}
}

// Inject leaves a message alone without a span, and never changes a map
// another message shares.
func TestInject(t *testing.T) {
	t.Parallel()
	tr, _ := newTracing(t)
	shared := map[string]string{"Content-Type": "application/json"}
	m := idem.Message{ID: "1", Topic: "t", Headers: shared}
	tr.Inject(context.Background(), &m)
	if len(m.Headers) != 1 {
		t.Fatalf("without a span: headers %v", m.Headers)
	}
	tp := sdktrace.NewTracerProvider()
	defer tp.Shutdown(context.Background())
	ctx, span := tp.Tracer("test").Start(context.Background(), "s")
	defer span.End()
	tr.Inject(ctx, &m)
	if m.Headers["traceparent"] == "" || len(shared) != 1 {
		t.Fatalf("headers %v, shared %v: want a traceparent in a copy", m.Headers, shared)
	}
	// A transport that canonicalised the name's case still carries it.
	m.Headers = map[string]string{"Traceparent": m.Headers["traceparent"]}
	if got := trace.SpanContextFromContext(tr.Extract(context.Background(), m)); got.SpanID() != span.SpanContext().SpanID() {
		t.Fatalf("Extract = %v, want the span %v", got.SpanID(), span.SpanContext().SpanID())
	}
}
