package idemotel

import (
	"context"
	"maps"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consumer"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/outbox"
)

// ScopeName is the instrumentation scope of idem's tracers.
const ScopeName = "github.com/idem-go/idem/idemotel"

// MaxLinks bounds the links of a relay pass's span to the messages it
// published: a pass of 500 messages links to its first 128.
const MaxLinks = 128

// Attribute keys idem sets on its spans, beside OpenTelemetry's semantic
// conventions for HTTP and messaging.
const (
	AttrMiddleware = attribute.Key("idem.middleware")  // the middleware's name
	AttrStore      = attribute.Key("idem.store")       // the key store's type
	AttrKeyDigest  = attribute.Key("idem.key_digest")  // idem.KeyDigest of scope and key, never the key
	AttrOutcome    = attribute.Key("idem.outcome")     // idemhttp.Outcome or consumer.Outcome
	AttrClaim      = attribute.Key("idem.claim")       // the claim's result (idemhttp.ClaimAcquired, …)
	AttrTookOver   = attribute.Key("idem.took_over")   // the claim took over an ended lease
	AttrConsumer   = attribute.Key("idem.consumer")    // the consumer's name
	AttrAttempt    = attribute.Key("idem.attempt")     // the attempt's number, from 1
	AttrBatch      = attribute.Key("idem.batch")       // messages in the inbox transaction
	AttrLag        = attribute.Key("idem.lag_seconds") // publication to commit
	AttrRelay      = attribute.Key("idem.relay")       // the relay's name
	AttrSent       = attribute.Key("idem.sent")        // entries a relay pass marked sent
	AttrMoved      = attribute.Key("idem.moved")       // the pass was a MoveOutbox
	AttrDuration   = attribute.Key("idem.duration_seconds")
)

// Config configures a Tracing. The zero value is ready to use.
type Config struct {
	// TracerProvider makes the tracers. Defaults to otel.GetTracerProvider(),
	// which exports nothing until the program sets one.
	TracerProvider trace.TracerProvider
	// Propagator writes and reads the trace context in message headers.
	// Defaults to propagation.TraceContext{}: the W3C traceparent and
	// tracestate headers.
	Propagator propagation.TextMapPropagator
}

// Tracing makes the observers that turn idem's phases into spans, and
// carries trace context in messages. Create it with New; it is safe for
// concurrent use.
type Tracing struct {
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
}

// New returns a Tracing for cfg, which may be nil.
func New(cfg *Config) *Tracing {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.TracerProvider == nil {
		c.TracerProvider = otel.GetTracerProvider()
	}
	if c.Propagator == nil {
		c.Propagator = propagation.TraceContext{}
	}
	return &Tracing{tracer: c.TracerProvider.Tracer(ScopeName), prop: c.Propagator}
}

// headers is a message's headers as an OpenTelemetry carrier.
type headers map[string]string

func (h headers) Get(key string) string {
	if v, ok := h[key]; ok {
		return v
	}
	// A transport may have changed the name's case (textproto's
	// canonical form, say): look again without it.
	for k, v := range h {
		if strings.EqualFold(k, key) {
			return v
		}
	}
	return ""
}

func (h headers) Set(key, value string) { h[key] = value }

func (h headers) Keys() []string {
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	return keys
}

// Inject writes the trace context of ctx (its current span) into m's
// headers: traceparent, and tracestate when there is one. The headers map
// is copied first, so a map m shares with another message is not changed.
// Without a span in ctx, m is left as it is. Call it as the message is
// written to the outbox, in the request's transaction; the outbox keeps
// the headers, and the relay and the transports carry them to the
// consumer, whose span continues the trace.
func (t *Tracing) Inject(ctx context.Context, m *idem.Message) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return
	}
	h := make(headers, len(m.Headers)+2)
	maps.Copy(h, m.Headers)
	t.prop.Inject(ctx, h)
	m.Headers = h
}

// Extract returns ctx with the remote span context m's headers carry, if
// any: a span started from it continues the producer's trace.
func (t *Tracing) Extract(ctx context.Context, m idem.Message) context.Context {
	if len(m.Headers) == 0 {
		return ctx
	}
	return t.prop.Extract(ctx, headers(m.Headers))
}

// Middleware returns the idemhttp.Observer that makes spans of a
// middleware's requests, labelled idem.middleware=name: a span
// "idemhttp.request" per protected request, with children
// "idemhttp.claim", "idemhttp.handler" (the handler runs in its context,
// so the spans it starts, and the messages it writes, are its children),
// "idemhttp.complete" and "idemhttp.replay". They carry the outcome, the
// claim's result, the answer's status, the store's type and the key as
// idem.KeyDigest, never as it is; each round trip to the store is an
// event of the request's span.
func (t *Tracing) Middleware(name string) idemhttp.Observer {
	return &middlewareObserver{t: t, name: name}
}

type middlewareObserver struct {
	t    *Tracing
	name string
}

var spanNames = [...]string{"idemhttp.request", "idemhttp.claim", "idemhttp.handler", "idemhttp.complete", "idemhttp.replay"}

func (o *middlewareObserver) Begin(ctx context.Context, e idemhttp.Event) context.Context {
	name := "idemhttp." + e.Phase.String()
	if int(e.Phase) < len(spanNames) {
		name = spanNames[e.Phase]
	}
	attrs := []attribute.KeyValue{AttrMiddleware.String(o.name), AttrStore.String(e.Store)}
	if e.Phase == idemhttp.PhaseRequest && e.Request != nil {
		attrs = append(attrs, attribute.String("http.request.method", e.Request.Method), attribute.String("url.path", e.Request.URL.Path))
	}
	if e.Key != "" {
		attrs = append(attrs, AttrKeyDigest.String(idem.KeyDigest(e.Scope, e.Key)))
	}
	ctx, _ = o.t.tracer.Start(ctx, name, trace.WithAttributes(attrs...))
	return ctx
}

func (o *middlewareObserver) End(ctx context.Context, e idemhttp.Event) {
	span := trace.SpanFromContext(ctx)
	if e.Phase == idemhttp.PhaseRequest && e.Key != "" {
		span.SetAttributes(AttrKeyDigest.String(idem.KeyDigest(e.Scope, e.Key)))
	}
	if e.Outcome != "" {
		span.SetAttributes(AttrOutcome.String(string(e.Outcome)))
	}
	if e.Claim != "" {
		span.SetAttributes(AttrClaim.String(e.Claim))
	}
	if e.TookOver {
		span.SetAttributes(AttrTookOver.Bool(true))
	}
	if e.Status != 0 {
		span.SetAttributes(attribute.Int("http.response.status_code", e.Status))
	}
	switch {
	case e.Err != nil:
		span.RecordError(e.Err)
		span.SetStatus(codes.Error, e.Err.Error())
	case e.Outcome == idemhttp.OutcomeStoreError || e.Outcome == idemhttp.OutcomeLeaseLost || e.Outcome == idemhttp.OutcomeAborted:
		span.SetStatus(codes.Error, string(e.Outcome))
	}
	span.End()
}

func (o *middlewareObserver) Store(ctx context.Context, op idemhttp.StoreOp, d time.Duration, err error) {
	attrs := []attribute.KeyValue{AttrDuration.Float64(d.Seconds())}
	if err != nil {
		attrs = append(attrs, attribute.String("error.message", err.Error()))
	}
	trace.SpanFromContext(ctx).AddEvent("idem.store."+string(op), trace.WithAttributes(attrs...))
}

// Consumer returns the consumer.Observer that makes a span of the handling
// of each delivery: a consumer span that continues the trace the message's
// headers carry (see Inject), a child of the span that wrote the message.
// It is named after the consumer and what
// became of the message ("settlement process", "settlement duplicate",
// "settlement retry", "settlement dead_letter", "settlement park",
// "settlement interrupted"), and carries the outcome, the attempt, the
// batch's size and, for a message processed, its end-to-end lag. A
// Handler's spans are its children.
func (t *Tracing) Consumer() consumer.Observer { return &consumerObserver{t: t} }

type consumerObserver struct{ t *Tracing }

func (o *consumerObserver) Begin(ctx context.Context, e consumer.Event) context.Context {
	opts := []trace.SpanStartOption{
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(
			AttrConsumer.String(e.Consumer), AttrAttempt.Int(e.Attempt),
			attribute.String("messaging.operation.type", "process"),
			attribute.String("messaging.destination.name", e.Topic),
			attribute.String("messaging.consumer.group.name", e.Consumer),
			attribute.String("messaging.message.id", e.Message.ID),
		),
	}
	// The producer's context, when the message carries one, is the
	// parent: the span that wrote the message and the one that applied it
	// are one trace.
	if pctx := o.t.Extract(ctx, e.Message); trace.SpanContextFromContext(pctx).IsRemote() {
		ctx = pctx
	}
	ctx, _ = o.t.tracer.Start(ctx, e.Consumer+" process", opts...)
	return ctx
}

var consumerOps = map[consumer.Outcome]string{
	consumer.OutcomeProcessed:    "process",
	consumer.OutcomeDuplicate:    "duplicate",
	consumer.OutcomeRetried:      "retry",
	consumer.OutcomeDeadLettered: "dead_letter",
	consumer.OutcomeParked:       "park",
	consumer.OutcomeStale:        "stale",
	consumer.OutcomeInterrupted:  "interrupted",
}

func (o *consumerObserver) End(ctx context.Context, e consumer.Event) {
	span := trace.SpanFromContext(ctx)
	if op, ok := consumerOps[e.Outcome]; ok {
		span.SetName(e.Consumer + " " + op)
	}
	span.SetAttributes(AttrOutcome.String(string(e.Outcome)), AttrBatch.Int(e.Batch))
	if e.Outcome == consumer.OutcomeProcessed && !e.Message.Time.IsZero() {
		span.SetAttributes(AttrLag.Float64(e.Lag.Seconds()))
	}
	if e.Err != nil {
		span.RecordError(e.Err)
		if e.Outcome == consumer.OutcomeDeadLettered {
			span.SetStatus(codes.Error, e.Err.Error())
		}
	}
	span.End()
}

// Relay returns the outbox.Observer that makes a producer span of each
// relay pass that relayed something or failed, from the pass's start to its
// end, linked to the spans that wrote its messages (the first MaxLinks).
func (t *Tracing) Relay() outbox.Observer { return &relayObserver{t: t} }

type relayObserver struct{ t *Tracing }

func (o *relayObserver) Pass(ctx context.Context, p outbox.Pass) {
	var links []trace.Link
	for _, m := range p.Messages {
		if len(links) == MaxLinks {
			break
		}
		if sc := trace.SpanContextFromContext(o.t.Extract(context.Background(), m)); sc.IsValid() {
			links = append(links, trace.Link{SpanContext: sc, Attributes: []attribute.KeyValue{attribute.String("messaging.message.id", m.ID)}})
		}
	}
	_, span := o.t.tracer.Start(ctx, "outbox relay", trace.WithSpanKind(trace.SpanKindProducer), trace.WithTimestamp(p.Start),
		trace.WithLinks(links...), trace.WithAttributes(
			AttrRelay.String(p.Relay), AttrSent.Int(p.Sent), AttrMoved.Bool(p.Moved),
			attribute.String("messaging.operation.type", "send"),
			attribute.Int("messaging.batch.message_count", len(p.Messages)),
		))
	if p.Err != nil {
		span.RecordError(p.Err)
		span.SetStatus(codes.Error, p.Err.Error())
	}
	span.End(trace.WithTimestamp(p.Start.Add(p.Duration)))
}
