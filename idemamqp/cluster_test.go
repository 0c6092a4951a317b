package idemamqp_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consumer/consumertest"
	"github.com/idem-go/idem/idemamqp"
	"github.com/idem-go/idem/idemamqp/internal/rabbitcluster"
	"github.com/idem-go/idem/idemtest"
)

// TestClusterRabbitMQ runs idemamqp on a RabbitMQ cluster of three
// private nodes, its consumers' quorum queues with a member on each: the
// transport suite, the warnings, then events published and consumed while
// the node that leads the consumer's queue is killed (SIGKILL) and later
// restarted. One cluster serves every subtest, since booting one takes
// half a minute here.
func TestClusterRabbitMQ(t *testing.T) {
	t.Parallel()
	cluster := rabbitcluster.Start(t, nil)
	url := strings.Join(cluster.URLs(), ",")

	t.Run("Transport", func(t *testing.T) {
		idemtest.TestTransport(t, quorumFeatures, func(t *testing.T, clock idem.Clock) (idem.Publisher, idem.Subscriber) {
			tr := newOnCluster(t, cluster, url, idemamqp.Config{Clock: clock})
			return tr, tr
		})
	})
	t.Run("Warnings", func(t *testing.T) {
		quorum := newOnCluster(t, cluster, url, idemamqp.Config{})
		s, err := quorum.Subscribe(t.Context(), idem.Subscription{Topic: "orders", Consumer: "c"})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if ws := quorum.Warnings(); len(ws) != 0 {
			t.Errorf("Warnings of quorum queues = %v, want none", ws)
		}
		q, err := cluster.Queue(t.Context(), quorum.Queue("c"))
		if err != nil {
			t.Fatal(err)
		}
		if q.Type != "quorum" || len(q.Members) != len(cluster.Nodes) {
			t.Errorf("queue %s is %s with members %v, want quorum on all %d nodes", q.Name, q.Type, q.Members, len(cluster.Nodes))
		}
		classic := newOnCluster(t, cluster, url, idemamqp.Config{ClassicQueues: true})
		s2, err := classic.Subscribe(t.Context(), idem.Subscription{Topic: "orders", Consumer: "c"})
		if err != nil {
			t.Fatal(err)
		}
		defer s2.Close()
		if ws := classic.Warnings(); len(ws) != 1 || !errors.Is(ws[0], idemamqp.ErrNotReplicated) || ws[0].Queue != classic.Queue("c") {
			t.Errorf("Warnings of a classic queue on a cluster = %v, want ErrNotReplicated", ws)
		}
	})
	t.Run("Failover", func(t *testing.T) { rabbitFailover(t, cluster, url, false) })
	t.Run("FailoverSequence", func(t *testing.T) { rabbitFailover(t, cluster, url, true) })
}

// rabbitFailover publishes and consumes events on cluster while the node
// that leads the consumer's queue is killed and restarted. sequence makes
// the consumer de-duplicate by key and sequence number, holding gaps.
func rabbitFailover(t *testing.T, cluster *rabbitcluster.Cluster, url string, sequence bool) {
	// Mandatory: a message routed to no queue fails its publish, and is
	// sent again, instead of vanishing.
	tr := newOnCluster(t, cluster, url, idemamqp.Config{Mandatory: true})
	queue := tr.Queue("cluster")
	figures := "rabbitmq"
	if sequence {
		figures += "-sequence"
	}
	var leader, killed *rabbitcluster.Node
	consumertest.RunEventFailover(t, consumertest.EventFailover{
		Report:     idemtest.ClusterResult,
		PerKey:     40 * idemtest.ClusterScale(t),
		Engine:     "rabbitmq",
		Sequence:   sequence,
		Publisher:  tr,
		Subscriber: tr,
		// rabbitmqctl takes a second or two: the leader is found before
		// the events flow.
		Subscribed: func(t testing.TB) {
			leader = cluster.WaitQueueLeader(t, queue, nil, len(cluster.Nodes), 60*time.Second)
		},
		Kill: func(t testing.TB) {
			killedAt := time.Now()
			leader.Kill()
			killed = leader
			next := cluster.WaitQueueLeader(t, queue, leader, len(cluster.Nodes)-1, 60*time.Second)
			idemtest.ClusterResult(t, figures, "leader-election", time.Since(killedAt).Milliseconds(), "ms")
			t.Logf("killed queue leader %s; %s leads now", leader.Name, next.Name)
		},
		Restart: func(t testing.TB) { killed.Restart() },
	})
	// The restarted node rejoins, and its member of the queue is online
	// again.
	killed.WaitUp(t, 90*time.Second)
	cluster.WaitQueueLeader(t, queue, nil, len(cluster.Nodes), 60*time.Second)
	cluster.WaitRunning(t, 30*time.Second)
}

// newOnCluster returns a Transport through every node of cluster (url
// lists them), on an exchange and queue prefix of its own, deleted with
// its queues when the test ends.
func newOnCluster(t testing.TB, cluster *rabbitcluster.Cluster, url string, cfg idemamqp.Config) *idemamqp.Transport {
	t.Helper()
	run := fmt.Sprintf("%08x", rand.Uint32())
	cfg.Exchange = "idemcluster." + run
	cfg.QueuePrefix = "idemcluster." + run
	tr, err := idemamqp.Open(t.Context(), url, &cfg)
	if err != nil {
		t.Fatalf("Open on the cluster: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := tr.DeleteQueues(ctx); err != nil && !errors.Is(err, idem.ErrClosed) {
			t.Errorf("DeleteQueues: %v", err)
		}
		if err := tr.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		for _, n := range cluster.Nodes {
			if n.Alive() {
				deleteExchange(t, n.URL, cfg.Exchange)
				break
			}
		}
	})
	return tr
}
