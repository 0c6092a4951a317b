package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/idemtest"
)

func TestTracesExporters(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		env     map[string]string
		want    []string
		wantErr string
	}{
		{env: nil},
		{env: map[string]string{envTracesExporter: ""}},
		{env: map[string]string{envTracesExporter: "none"}},
		{env: map[string]string{envTracesExporter: "console"}, want: []string{"console"}},
		{env: map[string]string{envTracesExporter: " OTLP , console,otlp"}, want: []string{"otlp", "console"}},
		{env: map[string]string{envTracesExporter: "otlp", envOTLPProtocol: "http/protobuf"}, want: []string{"otlp"}},
		{env: map[string]string{envTracesExporter: "jaeger"}, wantErr: `unknown exporter "jaeger"`},
		{env: map[string]string{envTracesExporter: "none,console"}, wantErr: "none cannot be combined"},
		{env: map[string]string{envTracesExporter: "otlp", envOTLPProtocol: "grpc"}, wantErr: "OTLP over HTTP only"},
		{env: map[string]string{envTracesExporter: "otlp", envOTLPProtocol: "grpc", envOTLPTracesProt: "http/protobuf"}, want: []string{"otlp"}},
	} {
		got, err := newApp(c.env).tracesExporters()
		switch {
		case c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)):
			t.Errorf("%v: error %v, want one saying %q", c.env, err, c.wantErr)
		case c.wantErr == "" && (err != nil || strings.Join(got, ",") != strings.Join(c.want, ",")):
			t.Errorf("%v: %v, %v; want %v", c.env, got, err, c.want)
		}
	}
}

// An unknown exporter is refused before anything is opened: not even the
// database file is made.
func TestServeRefusesUnknownTracesExporter(t *testing.T) {
	t.Parallel()
	db := filepath.Join(t.TempDir(), "idem.db")
	a := newApp(map[string]string{envTracesExporter: "zipkin"})
	var stderr bytes.Buffer
	a.stderr = &stderr
	if code := a.run(t.Context(), []string{"serve", "--addr", "127.0.0.1:0", "--db", "sqlite:" + db, "--api-keys", "acme:k"}); code == exitOK {
		t.Fatal("serve with OTEL_TRACES_EXPORTER=zipkin succeeded")
	}
	if !strings.Contains(stderr.String(), `OTEL_TRACES_EXPORTER="zipkin"`) {
		t.Errorf("stderr %q does not name the variable", stderr.String())
	}
	if _, err := os.Stat(db); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the database file was made: %v", err)
	}
}

// span is what the console exporter prints of a span.
type span struct {
	Name        string
	SpanContext struct{ TraceID, SpanID string }
	Parent      struct{ TraceID, SpanID string }
}

// With OTEL_TRACES_EXPORTER=console, serve prints its spans on stdout, and
// the settlement of a payment is a child of the payment's handler span.
func TestServeExportsTracesToConsole(t *testing.T) {
	t.Parallel()
	const apiKey = "test-key-traces"
	a := newApp(map[string]string{envTracesExporter: "console"})
	stdout := &syncBuffer{}
	a.stdout = stdout
	srv := startServe(t, a, "--db", "sqlite:"+filepath.Join(t.TempDir(), "idem.db"), "--api-keys", "acme:"+apiKey, "--log-level", "warn")
	checkChargesOnce(t, srv, apiKey)
	idemtest.Eventually(t, 30*time.Second, "the settlement of the payment", func() bool {
		return metricValue(metricsOf(t, srv), `idem_consumer_messages_total{consumer="settlement",outcome="processed"}`) >= 1
	})
	stopCleanly(t, srv) // flushes the spans

	var spans []span
	dec := json.NewDecoder(strings.NewReader(stdout.String()))
	for {
		var s span
		if err := dec.Decode(&s); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decoding the console's spans: %v\n%s", err, stdout)
		}
		spans = append(spans, s)
	}
	handlers := map[string]span{}
	var settle *span
	for i, s := range spans {
		switch s.Name {
		case "idemhttp.handler":
			handlers[s.SpanContext.SpanID] = s
		case "settlement process":
			settle = &spans[i]
		}
	}
	if settle == nil || len(handlers) == 0 {
		t.Fatalf("no settlement or handler span among %d spans", len(spans))
	}
	h, ok := handlers[settle.Parent.SpanID]
	if !ok || h.SpanContext.TraceID != settle.SpanContext.TraceID {
		t.Fatalf("the settlement span's parent %+v is none of the handler spans", settle.Parent)
	}
}
