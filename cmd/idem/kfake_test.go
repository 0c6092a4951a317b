package main

import (
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"
)

// startKafka starts an in-process Kafka (kfake) for one test and returns
// its brokers' addresses. No Kafka can be installed on the project's
// machines, so the tests bring their own, and never skip for want of one.
func startKafka(t testing.TB) []string {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatalf("starting kfake: %v", err)
	}
	t.Cleanup(c.Close)
	return c.ListenAddrs()
}
