package idemnats_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consumer/consumertest"
	"github.com/idem-go/idem/idemnats"
	"github.com/idem-go/idem/idemnats/internal/natscluster"
	"github.com/idem-go/idem/idemtest"
)

// TestClusterNATS runs idemnats on a JetStream cluster of three private
// servers, its stream on all three (Replicas 3): the transport suite, then
// events published and consumed while the stream's leader is killed
// (SIGKILL) and later restarted, with the servers' default sync interval
// and, where the server knows it (2.10 and later), sync_interval: always.
func TestClusterNATS(t *testing.T) {
	t.Parallel()
	version, _ := natscluster.ServerVersion(t)
	cluster := natscluster.Start(t, nil)

	t.Run("Transport", func(t *testing.T) {
		idemtest.TestTransport(t, features, func(t *testing.T, _ idem.Clock) (idem.Publisher, idem.Subscriber) {
			tr, _ := newOnCluster(t, cluster, idemnats.Config{})
			return tr, tr
		})
	})
	t.Run("Warnings", func(t *testing.T) {
		// A stream of one replica on a cluster is reported, one of three
		// is not; the sync policy is reported unless stated.
		one, _ := newOnCluster(t, cluster, idemnats.Config{Replicas: 1})
		if ws := one.Warnings(); len(ws) != 1 || ws[0].Setting != "Replicas" || ws[0].Value != "1" ||
			!errors.Is(ws[0], idemnats.ErrDropsMessages) {
			t.Errorf("Warnings with Replicas 1 on a cluster = %v, want one about Replicas", ws)
		}
		three, _ := newOnCluster(t, cluster, idemnats.Config{})
		if ws := three.Warnings(); len(ws) != 0 {
			t.Errorf("Warnings with Replicas 3 = %v, want none", ws)
		}
		if ws := three.DurabilityWarnings(); len(ws) != 1 || !errors.Is(ws[0], idemnats.ErrSyncUnconfirmed) {
			t.Errorf("DurabilityWarnings = %v, want the unconfirmed sync policy", ws)
		}
		stated, _ := newOnCluster(t, cluster, idemnats.Config{SyncAlways: true})
		if ws := stated.DurabilityWarnings(); len(ws) != 0 {
			t.Errorf("DurabilityWarnings with SyncAlways = %v, want none", ws)
		}
	})
	t.Run("FailoverDefaultSync", func(t *testing.T) {
		natsFailover(t, cluster, "nats", false)
	})
	t.Run("FailoverDefaultSyncSequence", func(t *testing.T) {
		natsFailover(t, cluster, "nats", true)
	})
	t.Run("FailoverSyncAlways", func(t *testing.T) {
		if !natscluster.VersionAtLeast(version, 2, 10) {
			t.Skipf("nats-server %s has no sync_interval (2.10 and later have it; set %s to such a server to measure it)",
				version, natscluster.ServerEnv)
		}
		always := natscluster.Start(t, &natscluster.Config{SyncInterval: "always"})
		natsFailover(t, always, "nats-sync-always", false)
	})
}

// newOnCluster returns a Transport through every server of cluster, on a
// stream of its own (Replicas 3 unless cfg says otherwise), deleted when
// the test ends, and the stream's name.
func newOnCluster(t testing.TB, cluster *natscluster.Cluster, cfg idemnats.Config) (*idemnats.Transport, string) {
	t.Helper()
	run := fmt.Sprintf("%08x", rand.Uint32())
	cfg.Stream = "IDEMCLUSTER_" + run
	cfg.SubjectPrefix = "idemcluster" + run
	if cfg.Replicas == 0 {
		cfg.Replicas = 3
	}
	// A stream is created, or looked up, only once the cluster has a meta
	// leader: right after a failover that can take a few tries.
	var tr *idemnats.Transport
	var err error
	for try := 0; try < 20; try++ {
		tr, err = idemnats.Open(t.Context(), cluster.URL(), &cfg)
		if err == nil {
			break
		}
		wait := time.NewTimer(250 * time.Millisecond)
		select {
		case <-wait.C:
		case <-t.Context().Done():
			wait.Stop()
		}
	}
	if err != nil {
		t.Fatalf("Open on the cluster: %v", err)
	}
	t.Cleanup(func() {
		_ = tr.Close()
		nc, err := nats.Connect(cluster.URL())
		if err != nil {
			t.Errorf("connect to delete stream %s: %v", cfg.Stream, err)
			return
		}
		defer nc.Close()
		js, _ := jetstream.New(nc)
		// Right after a failover, a loaded machine can take more than one
		// request's timeout to have a meta leader answer a deletion: try
		// again, each try bounded, for up to 60 s.
		deadline := time.Now().Add(60 * time.Second)
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			err = js.DeleteStream(ctx, cfg.Stream)
			cancel()
			if err == nil || errors.Is(err, jetstream.ErrStreamNotFound) {
				return
			}
			if time.Now().After(deadline) {
				t.Errorf("delete stream %s: %v", cfg.Stream, err)
				return
			}
			t.Logf("delete stream %s: %v; trying again", cfg.Stream, err)
			time.Sleep(250 * time.Millisecond) // a pause between tries, in a cleanup with nothing to wait on
		}
	})
	return tr, cfg.Stream
}

// natsFailover publishes and consumes events on cluster while the leader
// of their stream is killed and restarted, then checks what the stream
// holds and that the restarted server caught up. sequence makes the
// consumer de-duplicate by key and sequence number, holding gaps.
func natsFailover(t *testing.T, cluster *natscluster.Cluster, engine string, sequence bool) {
	cfg := idemnats.Config{PollWait: time.Second, SyncAlways: engine == "nats-sync-always"}
	tr, stream := newOnCluster(t, cluster, cfg)
	figures := engine
	if sequence {
		figures += "-sequence"
	}
	var leader, killed *natscluster.Server
	fig := consumertest.RunEventFailover(t, consumertest.EventFailover{
		Report:     idemtest.ClusterResult,
		PerKey:     40 * idemtest.ClusterScale(t),
		Engine:     engine,
		Sequence:   sequence,
		Publisher:  tr,
		Subscriber: tr,
		Subscribed: func(t testing.TB) {
			leader = cluster.WaitStreamLeader(t, stream, nil, 10*time.Second)
		},
		Kill: func(t testing.TB) {
			// The stream's leader leads it still unless something moved it.
			if now, _ := cluster.StreamLeader(stream); now != nil {
				leader = now
			}
			killedAt := time.Now()
			leader.Kill()
			killed = leader
			next := cluster.WaitStreamLeader(t, stream, leader, 30*time.Second)
			idemtest.ClusterResult(t, figures, "leader-election", time.Since(killedAt).Milliseconds(), "ms")
			t.Logf("killed stream leader %s; %s leads now", leader.Name, next.Name)
		},
		Restart: func(t testing.TB) { killed.Restart() },
	})
	// The restarted server catches up, and the stream holds each event
	// once: the re-sent ones were dropped by their Nats-Msg-Id.
	cluster.WaitStreamCurrent(t, stream, 3, 30*time.Second)
	nc, err := nats.Connect(cluster.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	st, err := js.Stream(t.Context(), stream)
	if err != nil {
		t.Fatalf("stream info: %v", err)
	}
	stored := st.CachedInfo().State.Msgs
	idemtest.ClusterResult(t, figures, "stream-messages", stored, "messages")
	if int(stored) != fig.Published {
		t.Errorf("the stream holds %d messages for %d events published once each", stored, fig.Published)
	}
}
