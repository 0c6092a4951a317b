package idemprom_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consumer"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemprom"
)

// A consumer's outcomes become idem_consumer_messages_total{consumer,
// outcome}, its dead letters the gauges idem_dead_letters{consumer} and
// idem_dead_letter_oldest_age_seconds{consumer}, and its latencies the
// histograms of a ConsumerObserver: two messages processed, one
// dead-lettered at once as permanent.
func ExampleRegisterConsumer() {
	transport := idemmem.NewTransport(nil)
	defer transport.Close()
	letters := idemmem.NewDeadLetters(nil)
	histograms := idemprom.NewConsumerObserver("audit")
	c, err := consumer.New(&consumer.Config{
		Name: "audit", Topic: "orders", Subscriber: transport, Inbox: idemmem.NewInbox(),
		DeadLetters: letters, Ledger: idemmem.NewLedger(), Observer: histograms,
	})
	if err != nil {
		panic(err)
	}
	reg := prometheus.NewRegistry()
	if err := idemprom.RegisterConsumer(reg, "audit", c); err != nil {
		panic(err)
	}
	if err := idemprom.RegisterDeadLetters(reg, letters, &idemprom.DeadLettersConfig{Consumers: []string{"audit"}}); err != nil {
		panic(err)
	}
	reg.MustRegister(histograms)

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		c.Run(ctx, func(ctx context.Context, m idem.Message) error {
			if string(m.Payload) == "garbage" {
				return idem.Permanent(errors.New("malformed order"))
			}
			return nil
		})
	})
	<-c.Subscribed()
	now := time.Now()
	transport.Publish(ctx,
		idem.Message{ID: "o-1", Topic: "orders", Payload: []byte("{}"), Time: now},
		idem.Message{ID: "o-2", Topic: "orders", Payload: []byte("{}"), Time: now},
		idem.Message{ID: "o-3", Topic: "orders", Payload: []byte("garbage"), Time: now})
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if s := c.Stats(); s.Processed+s.DeadLettered == 3 {
			break
		}
	}
	cancel()
	wg.Wait()

	families, err := reg.Gather()
	if err != nil {
		panic(err)
	}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			switch {
			case m.GetCounter().GetValue() > 0:
				fmt.Printf("%s %v %v\n", f.GetName(), labels(m.GetLabel()), m.GetCounter().GetValue())
			case f.GetName() == "idem_dead_letters":
				fmt.Printf("%s %v %v\n", f.GetName(), labels(m.GetLabel()), m.GetGauge().GetValue())
			case m.GetHistogram().GetSampleCount() > 0:
				fmt.Printf("%s %v %d observed\n", f.GetName(), labels(m.GetLabel()), m.GetHistogram().GetSampleCount())
			}
		}
	}
	// Output:
	// idem_consumer_lag_seconds map[consumer:audit] 2 observed
	// idem_consumer_messages_total map[consumer:audit outcome:dead_lettered] 1
	// idem_consumer_messages_total map[consumer:audit outcome:processed] 2
	// idem_consumer_process_duration_seconds map[consumer:audit outcome:dead_lettered] 1 observed
	// idem_consumer_process_duration_seconds map[consumer:audit outcome:processed] 2 observed
	// idem_dead_letters map[consumer:audit] 1
}
