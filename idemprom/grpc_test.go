package idemprom_test

import (
	"context"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemprom"
	"github.com/idem-go/idem/keyed"
)

// The gRPC face's figures go out under idem_grpc_… names, the same
// families as HTTP's idem_http_… with the same labels, so one registry
// holds both faces' and an operator tells them apart by name; nothing of
// the gRPC face is named idem_http_….
func TestGRPCCollectorsAreNamedForTheirFace(t *testing.T) {
	t.Parallel()
	eng, err := keyed.New(&keyed.Config{Store: idemmem.NewStore(nil), SeparateTx: true})
	if err != nil {
		t.Fatal(err)
	}
	comp, err := eng.NewCompleter(&keyed.CompleterConfig{Resume: func(context.Context, keyed.Execution) (idem.Response, error) {
		return idem.Response{}, keyed.ErrNothingDone
	}})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	if err := idemprom.RegisterGRPC(reg, "grpc-payments", eng); err != nil {
		t.Fatal(err)
	}
	obs := idemprom.NewGRPCObserver("grpc-payments")
	reg.MustRegister(obs, idemprom.NewGRPCCompleterCollector("grpc-payments", comp),
		// The HTTP face's beside them, under their own names.
		idemprom.NewMiddlewareObserver("payments"))
	obs.End(t.Context(), keyed.Event{Phase: keyed.PhaseRequest, Outcome: keyed.OutcomeExecuted})

	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, f := range families {
		names[f.GetName()] = true
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "middleware" && strings.HasPrefix(l.GetValue(), "grpc-") && !strings.HasPrefix(f.GetName(), "idem_grpc_") {
					t.Errorf("the gRPC face's %s is exported as %s", l.GetValue(), f.GetName())
				}
			}
		}
	}
	for _, want := range []string{"idem_grpc_requests_total", "idem_grpc_request_duration_seconds", "idem_grpc_phase_duration_seconds",
		"idem_grpc_store_duration_seconds", "idem_grpc_recovery_unknown", "idem_grpc_recovery_oldest_unknown_seconds",
		"idem_grpc_recovered_total", "idem_grpc_recovery_failures_total", "idem_http_request_duration_seconds"} {
		if !names[want] {
			t.Errorf("no %s among %v", want, names)
		}
	}
	want := `
# HELP idem_grpc_recovery_unknown Keys in flight with a recovery point whose outcome the completer could not learn yet; never released.
# TYPE idem_grpc_recovery_unknown gauge
idem_grpc_recovery_unknown{middleware="grpc-payments"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "idem_grpc_recovery_unknown"); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(obs, "idem_grpc_request_duration_seconds"); n == 0 {
		t.Fatal("no idem_grpc_request_duration_seconds series")
	}
}
