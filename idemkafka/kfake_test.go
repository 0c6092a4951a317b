package idemkafka_test

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idem-go/idem/idemkafka"
)

// startKafka starts an in-process Kafka (kfake) for one test and returns
// its address. Its group session timeouts may be short, so that a test can
// kill a consumer and see its partitions move within seconds.
func startKafka(t testing.TB, opts ...kfake.Opt) []string {
	t.Helper()
	opts = append([]kfake.Opt{
		kfake.NumBrokers(1),
		kfake.GroupMinSessionTimeout(100 * time.Millisecond),
	}, opts...)
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		t.Fatalf("starting kfake: %v", err)
	}
	t.Cleanup(c.Close)
	return c.ListenAddrs()
}

// open opens a Transport on seeds, closed when the test ends.
func open(t testing.TB, seeds []string, cfg idemkafka.Config) *idemkafka.Transport {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tr, err := idemkafka.Open(ctx, seeds, &cfg)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = tr.Close() })
	return tr
}

// alterRetention sets topic's retention.ms, as an operator would.
func alterRetention(ctx context.Context, seeds []string, topic, ms string) error {
	return alterTopic(ctx, seeds, topic, "retention.ms", ms)
}

// alterTopic sets one of topic's settings, as an operator would.
func alterTopic(ctx context.Context, seeds []string, topic, name, value string) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...))
	if err != nil {
		return err
	}
	defer cl.Close()
	res, err := kadm.NewClient(cl).AlterTopicConfigs(ctx, []kadm.AlterConfig{{Op: kadm.SetConfig, Name: name, Value: &value}}, topic)
	if err != nil {
		return err
	}
	for _, r := range res {
		if r.Err != nil {
			return r.Err
		}
	}
	return nil
}
