package idemkafka

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idem-go/idem"
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

// Options the stream cannot honour are refused when the transport is
// opened, with the option named, rather than taken in by every stream:
// BlockRebalanceOnPoll would hold every rebalance until an
// AllowRebalance the stream never calls, and AdjustFetchOffsetsFn could
// move a partition's first fetch past its committed offset, skipping
// records.
func TestClientOptionsTheStreamCannotHonourAreRefused(t *testing.T) {
	t.Parallel()
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatalf("starting kfake: %v", err)
	}
	t.Cleanup(c.Close)
	adjust := func(_ context.Context, m map[string]map[int32]kgo.Offset) (map[string]map[int32]kgo.Offset, error) {
		return m, nil
	}
	for name, opt := range map[string]kgo.Opt{
		"BlockRebalanceOnPoll": kgo.BlockRebalanceOnPoll(),
		"AdjustFetchOffsetsFn": kgo.AdjustFetchOffsetsFn(adjust),
	} {
		tr, err := Open(t.Context(), c.ListenAddrs(), &Config{ClientOptions: []kgo.Opt{kgo.ClientID("svc"), opt}})
		if !errors.Is(err, idem.ErrInvalidArgument) || !strings.Contains(err.Error(), name) {
			t.Errorf("Open with kgo.%s = %v, want idem.ErrInvalidArgument naming it", name, err)
		}
		if tr != nil {
			_ = tr.Close()
		}
	}
	tr, err := Open(t.Context(), c.ListenAddrs(), &Config{ClientOptions: []kgo.Opt{kgo.ClientID("svc")}})
	if err != nil {
		t.Fatalf("Open with kgo.ClientID: %v", err)
	}
	_ = tr.Close()
}
