// Package idemprom exports what idem's toolkit does to Prometheus, for any
// program that uses it.
//
// The toolkit's packages count what they do and offer an observation seam
// (idemhttp.Observer, consumer.Observer, outbox.Observer) without
// importing a metrics library; this package turns those counts into
// collectors read at scrape time, and implements the seam with
// histograms, so only programs that want Prometheus depend on it.
//
// Counts, read at each scrape (they cost the toolkit an atomic add):
//
//   - RegisterMiddleware: idem_http_requests_total{middleware, outcome},
//     one series per idemhttp.Outcome. An alert on the rate of
//     outcome="store_error" or outcome="lease_lost" is the first one to
//     write.
//   - RegisterConsumer: idem_consumer_messages_total{consumer, outcome}:
//     processed, duplicate, retried, dead_lettered, parked.
//   - RegisterDeadLetters: idem_dead_letters{consumer} and
//     idem_dead_letter_oldest_age_seconds{consumer}, from
//     idem.DeadLetters.Stats.
//   - RegisterOutbox: idem_outbox_backlog{outbox} and
//     idem_outbox_oldest_age_seconds{outbox}, from an outbox that tells its
//     backlog (Backlogger: idemsqlite's and idempg's).
//   - RegisterStream: idem_stream_held_messages{consumer},
//     idem_stream_held_bytes, idem_stream_held_peak_messages,
//     idem_stream_delayed_messages, idem_stream_held_limit,
//     idem_stream_uncommitted_messages, idem_stream_oldest_held_age_seconds
//     and idem_stream_commit_failures_total, from a transport that tells
//     what its streams hold (StreamStatser: idemkafka's), so that a
//     partition pinned by a message that keeps failing shows before it
//     hurts.
//
// Histograms and relay counters, given to the toolkit's Config.Observer and
// registered like any collector:
//
//   - MiddlewareObserver: idem_http_request_duration_seconds{outcome},
//     idem_http_phase_duration_seconds{phase} (claim, handler, complete,
//     replay) and idem_http_store_duration_seconds{op}, each labelled
//     middleware;
//   - ConsumerObserver: idem_consumer_process_duration_seconds{outcome}
//     and idem_consumer_lag_seconds (publication to commit), labelled
//     consumer;
//   - RelayObserver: idem_outbox_relayed_total,
//     idem_outbox_pass_failures_total, idem_outbox_pass_duration_seconds
//     and idem_outbox_relay_delay_seconds, labelled relay.
//
// The gRPC face (idemgrpc) is counted as the HTTP face is, under names of
// its own with the same labels: NewGRPCCollector (or RegisterGRPC) exports
// idem_grpc_requests_total{middleware, outcome}, NewGRPCObserver
// idem_grpc_request_duration_seconds, idem_grpc_phase_duration_seconds and
// idem_grpc_store_duration_seconds, and NewGRPCCompleterCollector
// idem_grpc_recovery_unknown, idem_grpc_recovery_oldest_unknown_seconds,
// idem_grpc_recovered_total and idem_grpc_recovery_failures_total (HTTP's:
// NewCompleterCollector, idem_http_recovery_…). middleware names the
// interceptor there; give the two faces' middlewares different names, so
// that a query on both ("idem_http_… or idem_grpc_…", as the shipped
// alerts make) keeps every series.
//
// For example:
//
//	obs := idemprom.NewMiddlewareObserver("payments")
//	m, _ := idemhttp.New(&idemhttp.Config{Store: store, Scope: scopeByTenant, Observer: obs})
//	reg := prometheus.NewRegistry()
//	idemprom.RegisterMiddleware(reg, "payments", m)
//	reg.MustRegister(obs)
//
// idemhttp.Observers (and consumer.Observers, outbox.Observers) combine
// these histograms with tracing (package idemotel) on one middleware.
//
// The Grafana dashboard in deploy/grafana and the alert rules in
// deploy/prometheus are written against these names, as `idem serve`
// exports them.
package idemprom
