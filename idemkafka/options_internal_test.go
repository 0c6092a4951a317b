package idemkafka

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// The publisher's acks=all is the transport's own: an entry of
// Config.ClientOptions asking for less does not weaken what an
// acknowledged Publish means.
func TestClientOptionsKeepAcksAll(t *testing.T) {
	t.Parallel()
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatalf("starting kfake: %v", err)
	}
	t.Cleanup(c.Close)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	tr, err := Open(ctx, c.ListenAddrs(), &Config{ClientOptions: []kgo.Opt{
		kgo.DisableIdempotentWrite(), kgo.RequiredAcks(kgo.LeaderAck()),
	}})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer tr.Close()
	if got := tr.cl.OptValue(kgo.RequiredAcks); got != kgo.AllISRAcks() {
		t.Errorf("the publisher's acks = %v, want acks=all (%v)", got, kgo.AllISRAcks())
	}
}
