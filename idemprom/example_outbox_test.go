package idemprom_test

import (
	"context"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemprom"
	"github.com/idem-go/idem/outbox"
)

// An outbox's backlog is read at each scrape (idem_outbox_backlog,
// idem_outbox_oldest_age_seconds), and a RelayObserver counts and times
// the relay's passes: three entries written, two relayed, one left.
func ExampleRegisterOutbox() {
	ctx := context.Background()
	ob := idemmem.NewOutbox(nil)
	relayed := idemprom.NewRelayObserver("orders")
	reg := prometheus.NewRegistry()
	if err := idemprom.RegisterOutbox(reg, "orders", ob, nil); err != nil {
		panic(err)
	}
	reg.MustRegister(relayed)
	transport := idemmem.NewTransport(nil)
	defer transport.Close()
	relay, err := outbox.New(&outbox.Config{Outbox: ob, Publisher: transport, Batch: 2, Observer: relayed})
	if err != nil {
		panic(err)
	}
	for _, id := range []string{"e-1", "e-2", "e-3"} {
		if err := ob.Add(ctx, idem.Message{ID: id, Topic: "orders"}); err != nil {
			panic(err)
		}
	}
	if _, err := relay.Flush(ctx); err != nil {
		panic(err)
	}
	families, err := reg.Gather()
	if err != nil {
		panic(err)
	}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			switch f.GetName() {
			case "idem_outbox_backlog":
				fmt.Println(f.GetName(), labels(m.GetLabel()), m.GetGauge().GetValue())
			case "idem_outbox_relayed_total", "idem_outbox_pass_failures_total":
				fmt.Println(f.GetName(), labels(m.GetLabel()), m.GetCounter().GetValue())
			case "idem_outbox_pass_duration_seconds":
				fmt.Println(f.GetName(), labels(m.GetLabel()), m.GetHistogram().GetSampleCount(), "observed")
			}
		}
	}
	// Output:
	// idem_outbox_backlog map[outbox:orders] 1
	// idem_outbox_pass_duration_seconds map[relay:orders] 1 observed
	// idem_outbox_pass_failures_total map[relay:orders] 0
	// idem_outbox_relayed_total map[relay:orders] 2
}
