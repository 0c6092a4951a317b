// Package idemotel turns what idem's toolkit does into OpenTelemetry
// traces, and carries trace context from a request to the messages it
// causes. It is the only package of idem that imports
// go.opentelemetry.io/otel: the toolkit's packages expose a small
// observation seam (idemhttp.Observer, consumer.Observer,
// outbox.Observer) that costs nothing when unset, and this package
// implements it with spans, as package idemprom implements it with
// histograms.
//
//	tr := idemotel.New(&idemotel.Config{TracerProvider: tp})
//	m, _ := idemhttp.New(&idemhttp.Config{Store: store, Scope: byTenant,
//		Observer: tr.Middleware("payments")})
//	relay, _ := outbox.New(&outbox.Config{Outbox: ob, Publisher: pub, Observer: tr.Relay()})
//	cons, _ := consumer.New(&consumer.Config{…, Observer: tr.Consumer()})
//
// and, where the handler writes the event that announces its effect:
//
//	msg := idem.Message{ID: id, Topic: "payments.succeeded", Payload: body}
//	tr.Inject(ctx, &msg) // traceparent, from the handler's span
//	err := ob.Add(ctx, msg)
//
// # The spans
//
// A protected request is a span "idemhttp.request" with children
// "idemhttp.claim" (waits for an execution in flight included),
// "idemhttp.handler", "idemhttp.complete" and "idemhttp.replay", as the
// request goes through them. They carry the outcome (idem.outcome), the
// claim's result, the answer's status, the key store's type (idem.store)
// and the key as idem.KeyDigest of its scope and key (idem.key_digest),
// never the key itself, which may be a client's secret. Each round trip
// to the store is an event of the request's span. The request span is a
// child of whatever span the request's context carries, such as an HTTP
// server span.
//
// The handler runs in the handler span's context, so what it writes to the
// outbox can carry that span (Inject), in a W3C traceparent header. The
// outbox row keeps the message's headers, the relay and the transports
// (the embedded ones, NATS JetStream, RabbitMQ) carry them, and the
// consumer's span for the message ("settlement process") is a child of
// the handler's span: the settlement of a payment and the request that
// made it are one trace. A span per relay pass ("outbox relay") links to
// the spans of the messages it published.
//
// # One seam, two implementations
//
// The tracing observers implement the toolkit's Observer interfaces
// themselves rather than wrap the middleware or the consumer from outside.
// A wrapper around an http.Handler sees one request, not its claim, its
// handler and its completion, and could not put a span in the handler's
// context between the claim and the handler; a wrapper around a consumer
// Handler never sees a duplicate, a retry or a dead letter, which happen
// outside the handler. The seam's Begin returns the context a phase runs
// with, which is what a span needs, and what a histogram ignores; its End
// carries the outcome and the duration, which is what a histogram needs.
// idemhttp.Observers (and consumer.Observers, outbox.Observers) put
// tracing and histograms on one middleware together.
//
// Nothing is exported until the program sets a TracerProvider with an
// exporter (Config.TracerProvider, or otel.SetTracerProvider). `idem
// serve` reads the standard OTEL_* environment variables, with
// OTEL_TRACES_EXPORTER=console|otlp|none (none by default).
package idemotel
