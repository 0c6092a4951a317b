package idemkafka_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemkafka"
	"github.com/idem-go/idem/idemtest"
)

// A member that loses its group session while it holds records (its
// heartbeats stop reaching the coordinator, which removes it once its
// session times out) no longer owns them: once it hears of it, its
// deliveries of them answer ErrStaleDelivery, and nothing it settles then
// is committed. The partition's next owner gets every record it had not
// settled, from the one after the last it acknowledged, none skipped.
func TestLostSessionDeliveriesAreStale(t *testing.T) {
	t.Parallel()
	const (
		topic = "payments.succeeded"
		group = "settlement"
		n     = 5
	)
	ctx := t.Context()
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.GroupMinSessionTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatalf("starting kfake: %v", err)
	}
	t.Cleanup(cluster.Close)
	seeds := cluster.ListenAddrs()
	cfg := idemkafka.Config{Partitions: 1, SessionTimeout: time.Second, RevokeWait: 300 * time.Millisecond, CommitInterval: 50 * time.Millisecond}

	a := open(t, seeds, cfg)
	var ids []string
	for i := range n {
		ids = append(ids, fmt.Sprintf("r%d", i))
		if err := a.Publish(ctx, idem.Message{ID: ids[i], Topic: topic, Payload: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	sa, err := a.Subscribe(ctx, idem.Subscription{Topic: topic, Consumer: group})
	if err != nil {
		t.Fatal(err)
	}
	defer sa.Close()
	// A takes every record, acknowledges the first, and holds the others.
	var held []idem.Delivery
	for range n {
		d := nextWithin(t, sa, 10*time.Second)
		held = append(held, d)
	}
	if got := deliveredIDs(held); !slices.Equal(got, ids) {
		t.Fatalf("A was given %v, want %v", got, ids)
	}
	if err := held[0].Ack(ctx); err != nil {
		t.Fatal(err)
	}
	idemtest.Eventually(t, 10*time.Second, "A's acknowledgement of r0 committed", func() bool {
		return committed(cluster, group, topic) == 1
	})
	info := cluster.GroupInfo(group)
	if info == nil || len(info.Members) != 1 {
		t.Fatalf("group %+v, want A alone", info)
	}
	memberA := info.Members[0].MemberID

	// A's heartbeats are lost from now on: the coordinator never sees
	// them, and A, answered as if they had arrived, believes it holds the
	// partition.
	var losing atomic.Bool
	losing.Store(true)
	cluster.ControlKey(int16(kmsg.Heartbeat), func(req kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		hb := req.(*kmsg.HeartbeatRequest)
		if !losing.Load() || hb.MemberID != memberA {
			return nil, nil, false
		}
		return hb.ResponseKind(), nil, true
	})
	wait, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := cluster.WaitGroupInfo(wait, group, func(g *kfake.GroupInfo) bool {
		return !slices.ContainsFunc(g.Members, func(m kfake.GroupMember) bool { return m.MemberID == memberA })
	}); err != nil {
		t.Fatalf("the coordinator did not remove A once its session timed out: %v", err)
	}

	// B joins and is given the partition: it gets every record A had not
	// acknowledged, from the committed offset, in order.
	b := open(t, seeds, cfg)
	sb, err := b.Subscribe(ctx, idem.Subscription{Topic: topic, Consumer: group})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	var again []idem.Delivery
	for range n - 1 {
		again = append(again, nextWithin(t, sb, 30*time.Second))
	}
	if got := deliveredIDs(again); !slices.Equal(got, ids[1:]) {
		t.Errorf("B, the new owner, was given %v, want %v: none skipped, r0 not again", got, ids[1:])
	}

	// A hears of its lost session at its next heartbeat: what it holds is
	// no longer its own.
	losing.Store(false)
	idemtest.Eventually(t, 30*time.Second, "A's deliveries stale once it heard its session was lost", func() bool {
		return errors.Is(held[1].InProgress(ctx), idem.ErrStaleDelivery)
	})
	for i, settle := range []func(d idem.Delivery) error{
		func(d idem.Delivery) error { return d.Ack(ctx) },
		func(d idem.Delivery) error { return d.Nack(ctx, 0) },
		func(d idem.Delivery) error { return d.Term(ctx) },
		func(d idem.Delivery) error { return d.Ack(ctx) },
	} {
		d := held[i+1]
		if err := settle(d); !errors.Is(err, idem.ErrStaleDelivery) || !errors.Is(err, idemkafka.ErrStaleDelivery) {
			t.Errorf("A's settlement of %s after its session was lost: %v, want ErrStaleDelivery", d.Message().ID, err)
		}
	}

	// B's acknowledgements are what the group commits.
	for _, d := range again {
		if err := d.Ack(ctx); err != nil {
			t.Errorf("B's Ack of %s: %v", d.Message().ID, err)
		}
	}
	idemtest.Eventually(t, 30*time.Second, "B's acknowledgements committed", func() bool {
		return committed(cluster, group, topic) == n
	})
}

// nextWithin returns s's next delivery, failing the test after d.
func nextWithin(t *testing.T, s idem.Stream, d time.Duration) idem.Delivery {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), d)
	defer cancel()
	dl, err := s.Next(ctx)
	if err != nil {
		t.Fatalf("Next: %v", err)
	}
	return dl
}

func deliveredIDs(ds []idem.Delivery) []string {
	var ids []string
	for _, d := range ds {
		ids = append(ids, d.Message().ID)
	}
	return ids
}

// committed returns the group's committed offset of topic's partition 0,
// or -1 when none.
func committed(c *kfake.Cluster, group, topic string) int64 {
	g := c.GroupInfo(group)
	if g == nil {
		return -1
	}
	cm, ok := g.Commits[topic][0]
	if !ok {
		return -1
	}
	return cm.Offset
}
