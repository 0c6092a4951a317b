package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/idem-go/idem/cmd/idem/internal/payments"
	"github.com/idem-go/idem/idemotel"
)

// The standard OpenTelemetry variables serve reads itself; the SDK and the
// OTLP exporter read the others (OTEL_SERVICE_NAME,
// OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER, OTEL_EXPORTER_OTLP_*,
// OTEL_BSP_*).
const (
	envTracesExporter = "OTEL_TRACES_EXPORTER"
	envOTLPProtocol   = "OTEL_EXPORTER_OTLP_PROTOCOL"
	envOTLPTracesProt = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
)

// tracingShutdownTimeout bounds the export of the spans left at shutdown.
const tracingShutdownTimeout = 5 * time.Second

// startTracing sets up the trace exporters OTEL_TRACES_EXPORTER names, a
// comma-separated list of console (spans as JSON on stdout), otlp (OTLP
// over HTTP, configured by the OTEL_EXPORTER_OTLP_* variables) and none,
// the default: then nothing is traced, and cfg is left as it is.
// Otherwise cfg gets the tracing observers, and stop flushes and shuts
// the exporters down.
func (a *app) startTracing(ctx context.Context, cfg *payments.Config) (stop func(), err error) {
	names, err := a.tracesExporters()
	if err != nil || len(names) == 0 {
		return func() {}, err
	}
	var opts []sdktrace.TracerProviderOption
	for _, name := range names {
		var exp sdktrace.SpanExporter
		switch name {
		case "console":
			exp, err = stdouttrace.New(stdouttrace.WithWriter(a.stdout))
		case "otlp":
			exp, err = otlptracehttp.New(ctx)
		}
		if err != nil {
			return nil, fmt.Errorf("%s=%s: %w", envTracesExporter, name, err)
		}
		opts = append(opts, sdktrace.WithBatcher(exp))
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", "idem")),
		resource.WithFromEnv(), resource.WithTelemetrySDK())
	if err != nil {
		return nil, fmt.Errorf("OpenTelemetry resource (OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES): %w", err)
	}
	tp := sdktrace.NewTracerProvider(append(opts, sdktrace.WithResource(res))...)
	tr := idemotel.New(&idemotel.Config{TracerProvider: tp})
	cfg.Observers = &payments.Observers{
		Middleware: tr.Middleware,
		Consumer:   tr.Consumer(),
		Relay:      tr.Relay(),
		Message:    tr.Inject,
	}
	return func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), tracingShutdownTimeout)
		defer cancel()
		if err := tp.Shutdown(sctx); err != nil {
			fmt.Fprintf(a.stderr, "idem: exporting the last spans failed: %v\n", err)
		}
	}, nil
}

// tracesExporters reads OTEL_TRACES_EXPORTER: the exporters to run, none
// when it is unset, empty or "none".
func (a *app) tracesExporters() ([]string, error) {
	v, _ := a.lookupEnv(envTracesExporter)
	var names []string
	seen := map[string]bool{}
	for item := range strings.SplitSeq(v, ",") {
		name := strings.ToLower(strings.TrimSpace(item))
		switch name {
		case "", "none":
			continue
		case "console", "otlp":
		default:
			return nil, fmt.Errorf("%s=%q: unknown exporter %q; want console, otlp or none", envTracesExporter, v, name)
		}
		if !seen[name] {
			seen[name] = true
			names = append(names, name)
		}
	}
	if seen["otlp"] {
		for _, env := range []string{envOTLPTracesProt, envOTLPProtocol} {
			if p, ok := a.lookupEnv(env); ok && p != "" {
				if p != "http/protobuf" {
					return nil, fmt.Errorf("%s=%q: idem serve exports OTLP over HTTP only; want http/protobuf", env, p)
				}
				break
			}
		}
	}
	if len(names) > 0 && v != "" && strings.Contains(strings.ToLower(v), "none") {
		return nil, errors.New(envTracesExporter + ": none cannot be combined with other exporters")
	}
	return names, nil
}
