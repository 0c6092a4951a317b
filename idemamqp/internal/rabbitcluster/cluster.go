// Package rabbitcluster starts RabbitMQ clusters on loopback for
// idemamqp's cluster tests, kills and restarts their nodes, and tells who
// leads a quorum queue. The nodes are the machine's RabbitMQ, run as
// programs of the tests' own (RequireBinaries gates the tests on them).
package rabbitcluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/idemtest"
)

// Config configures Start. The zero value is
// the cluster the cluster tests use: three nodes.
type Config struct {
	// Nodes is the number of nodes. Defaults to 3, the fewest with which a
	// quorum queue survives the loss of one.
	Nodes int
}

// A Cluster is a cluster of private RabbitMQ nodes on loopback,
// with their own node names, ports, Erlang cookie, configuration and data
// in the test's temporary directory, killed when the test ends. It never
// talks to the machine's own node: its cookie is not that node's.
type Cluster struct {
	t     testing.TB
	ctl   string
	env   []string
	Nodes []*Node
}

// A Node is one node of a Cluster.
type Node struct {
	// Name is its Erlang node name, "idem<run>n1@localhost".
	Name string
	// URL is its AMQP URL, amqp://guest:guest@127.0.0.1:<port>/.
	URL string

	t      testing.TB
	server string
	addr   string
	env    []string
	dir    string
	proc   *idemtest.Process
}

// rabbitMQProgram returns the path of a RabbitMQ program. Debian's
// /usr/sbin wrappers run the programs as the rabbitmq user, with that
// user's home and cookie, which belong to the machine's own node: the
// programs behind them, in /usr/lib/rabbitmq/bin, run as the caller.
func rabbitMQProgram(inPath string) string {
	direct := filepath.Join("/usr/lib/rabbitmq/bin", filepath.Base(inPath))
	if st, err := os.Stat(direct); err == nil && !st.IsDir() {
		return direct
	}
	return inPath
}

// Start starts a RabbitMQ cluster and returns once every
// node runs and sees the others. The first node boots alone; the others
// then boot together and join it through classic peer discovery (the
// nodes listed in each configuration), which spares the stop_app,
// join_cluster and start_app round of rabbitmqctl. The management plugin
// is off (an empty enabled-plugins file). It needs rabbitmq-server and
// rabbitmqctl, and skips without them (or fails, under
// IDEM_REQUIRE_SERVICES=1). cfg may be nil.
//
// Booting takes half a minute on a small machine: start one cluster per
// test and share it between subtests.
func Start(t testing.TB, cfg *Config) *Cluster {
	t.Helper()
	bins := idemtest.RequireBinaries(t, "rabbitmq-server", "rabbitmqctl")
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.Nodes == 0 {
		c.Nodes = 3
	}
	root := t.TempDir()
	home := filepath.Join(root, "home")
	if err := makeDir(home); err != nil {
		t.Fatal(err)
	}
	// A cookie of the cluster's own: the CLI and the nodes share it, and
	// no other node on the machine accepts it.
	secret := make([]byte, 16)
	if _, err := rand.Read(secret); err != nil {
		t.Fatal(err)
	}
	run := hex.EncodeToString(secret[:4])
	if err := os.WriteFile(filepath.Join(home, ".erlang.cookie"), []byte(hex.EncodeToString(secret)), 0o400); err != nil {
		t.Fatal(err)
	}
	envFile, plugins := filepath.Join(root, "rabbitmq-env.conf"), filepath.Join(root, "enabled_plugins")
	if err := os.WriteFile(envFile, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(plugins, []byte("[].\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	rc := &Cluster{
		t: t, ctl: rabbitMQProgram(bins["rabbitmqctl"]),
		// The empty env file keeps /etc/rabbitmq/rabbitmq-env.conf, which
		// names the machine's node, out.
		env: []string{"HOME=" + home, "RABBITMQ_CONF_ENV_FILE=" + envFile},
	}
	ports := idemtest.FreePorts(t, 2*c.Nodes)
	names := make([]string, c.Nodes)
	for i := range c.Nodes {
		names[i] = fmt.Sprintf("idem%sn%d@localhost", run, i+1)
	}
	var peers strings.Builder
	peers.WriteString("loopback_users = none\ncluster_formation.peer_discovery_backend = classic_config\n")
	for i, n := range names {
		fmt.Fprintf(&peers, "cluster_formation.classic_config.nodes.%d = %s\n", i+1, n)
	}
	for i := range c.Nodes {
		amqpPort, dist := ports[2*i], ports[2*i+1]
		dir := filepath.Join(root, fmt.Sprintf("node%d", i+1))
		for _, d := range []string{"mnesia", "log"} {
			if err := makeDir(filepath.Join(dir, d)); err != nil {
				t.Fatal(err)
			}
		}
		conf := filepath.Join(dir, "rabbitmq.conf")
		if err := os.WriteFile(conf, []byte(peers.String()), 0o600); err != nil {
			t.Fatal(err)
		}
		addr := fmt.Sprintf("127.0.0.1:%d", amqpPort)
		rc.Nodes = append(rc.Nodes, &Node{
			Name: names[i], URL: "amqp://guest:guest@" + addr + "/",
			t: t, server: rabbitMQProgram(bins["rabbitmq-server"]), addr: addr, dir: dir,
			env: append(append([]string(nil), rc.env...),
				"RABBITMQ_NODENAME="+names[i],
				"RABBITMQ_NODE_IP_ADDRESS=127.0.0.1",
				"RABBITMQ_NODE_PORT="+strconv.Itoa(amqpPort),
				"RABBITMQ_DIST_PORT="+strconv.Itoa(dist),
				"RABBITMQ_MNESIA_BASE="+filepath.Join(dir, "mnesia"),
				"RABBITMQ_LOG_BASE="+filepath.Join(dir, "log"),
				"RABBITMQ_CONFIG_FILE="+conf,
				"RABBITMQ_ENABLED_PLUGINS_FILE="+plugins,
				"RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=-kernel inet_dist_use_interface {127,0,0,1}",
			),
		})
	}
	// The first node boots alone, so that the others find it running and
	// join it, rather than each starting a cluster of its own.
	rc.Nodes[0].start()
	rc.Nodes[0].WaitUp(t, 90*time.Second)
	for _, n := range rc.Nodes[1:] {
		n.start()
	}
	for _, n := range rc.Nodes[1:] {
		n.WaitUp(t, 90*time.Second)
	}
	rc.WaitRunning(t, 30*time.Second)
	return rc
}

func (n *Node) start() {
	n.proc = idemtest.StartProcess(n.t, "rabbitmq-server "+n.Name, filepath.Join(n.dir, "rabbitmq.out"),
		&idemtest.ProcessOptions{Env: n.env, Group: true, Dir: n.dir}, n.server)
}

// WaitUp waits up to limit for the node to take AMQP connections, and
// fails t if it does not, or if the node exits first.
func (n *Node) WaitUp(t testing.TB, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for step := 50 * time.Millisecond; ; step = min(2*step, 500*time.Millisecond) {
		if n.proc.Exited() {
			t.Fatalf("rabbitmq-server %s exited while booting:\n%s", n.Name, n.proc.TailLog())
		}
		// RabbitMQ opens its AMQP listener last, once it has booted.
		if conn, err := net.DialTimeout("tcp", n.addr, time.Second); err == nil {
			conn.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("rabbitmq-server %s did not take connections on %s within %s:\n%s", n.Name, n.addr, limit, n.proc.TailLog())
		}
		time.Sleep(step)
	}
}

// Kill sends the node, the Erlang VM and its launcher, SIGKILL: it dies
// with whatever it had not written or sent its peers.
func (n *Node) Kill() {
	n.t.Helper()
	n.proc.Kill()
	if err := n.proc.WaitExit(20 * time.Second); err != nil {
		n.t.Fatalf("rabbitmq-server %s: %v", n.Name, err)
	}
}

// Restart starts a killed node again on its ports and data: it rejoins
// the cluster it was in, and its quorum queues' members catch up.
func (n *Node) Restart() {
	n.t.Helper()
	if !n.proc.Exited() {
		n.t.Fatalf("rabbitmq-server %s: Restart of a node that is running", n.Name)
	}
	n.start()
}

// Alive reports whether the node's process runs.
func (n *Node) Alive() bool { return !n.proc.Exited() }

// URLs returns every node's AMQP URL.
func (rc *Cluster) URLs() []string {
	urls := make([]string, len(rc.Nodes))
	for i, n := range rc.Nodes {
		urls[i] = n.URL
	}
	return urls
}

// Node returns the node named name, or nil.
func (rc *Cluster) Node(name string) *Node {
	for _, n := range rc.Nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// Ctl runs rabbitmqctl against node with args, with the cluster's cookie,
// and returns its output.
func (rc *Cluster) Ctl(ctx context.Context, node *Node, args ...string) (string, error) {
	argv := append([]string{rc.ctl, "-n", node.Name, "-q"}, args...)
	return idemtest.RunCommand(ctx, 30*time.Second, &idemtest.ProcessOptions{Env: rc.env}, argv...)
}

// live returns a live node, or nil.
func (rc *Cluster) live() *Node {
	for _, n := range rc.Nodes {
		if n.Alive() {
			return n
		}
	}
	return nil
}

// WaitRunning waits up to limit for every live node to run in the
// cluster, as the first live node sees it.
func (rc *Cluster) WaitRunning(t testing.TB, limit time.Duration) {
	t.Helper()
	want := 0
	for _, n := range rc.Nodes {
		if n.Alive() {
			want++
		}
	}
	rc.eventually(t, limit, fmt.Sprintf("%d running nodes in the cluster", want), func() bool {
		node := rc.live()
		if node == nil {
			return false
		}
		out, err := rc.Ctl(context.Background(), node, "cluster_status", "--formatter", "json")
		if err != nil {
			return false
		}
		var st struct {
			Running []string `json:"running_nodes"`
		}
		return json.Unmarshal([]byte(out), &st) == nil && len(st.Running) == want
	})
}

// A QuorumQueue is what rabbitmqctl list_queues says of a quorum queue.
type QuorumQueue struct {
	Name    string   `json:"name"`
	Type    string   `json:"type"`
	Leader  string   `json:"leader"`
	Members []string `json:"members"`
	Online  []string `json:"online"`
}

// Queues lists the queues of the cluster, as a live node sees them.
func (rc *Cluster) Queues(ctx context.Context) ([]QuorumQueue, error) {
	node := rc.live()
	if node == nil {
		return nil, fmt.Errorf("no live node")
	}
	out, err := rc.Ctl(ctx, node, "list_queues", "name", "type", "leader", "members", "online", "--formatter", "json")
	if err != nil {
		return nil, err
	}
	var qs []QuorumQueue
	if err := json.Unmarshal([]byte(out), &qs); err != nil {
		return nil, fmt.Errorf("list_queues: %w: %s", err, out)
	}
	return qs, nil
}

// Queue returns what the cluster says of the queue named name.
func (rc *Cluster) Queue(ctx context.Context, name string) (QuorumQueue, error) {
	qs, err := rc.Queues(ctx)
	if err != nil {
		return QuorumQueue{}, err
	}
	for _, q := range qs {
		if q.Name == name {
			return q, nil
		}
	}
	return QuorumQueue{}, fmt.Errorf("no queue %q", name)
}

// WaitQueueLeader waits up to limit for the quorum queue named name to
// have a live leader other than not (nil for any) and at least online of
// its members online, and returns the leader.
func (rc *Cluster) WaitQueueLeader(t testing.TB, name string, not *Node, online int, limit time.Duration) *Node {
	t.Helper()
	var leader *Node
	rc.eventually(t, limit, "queue "+name+" to have a leader", func() bool {
		q, err := rc.Queue(context.Background(), name)
		if err != nil {
			return false
		}
		leader = rc.Node(q.Leader)
		return leader != nil && leader.Alive() && leader != not && len(q.Online) >= online
	})
	return leader
}

func (rc *Cluster) eventually(t testing.TB, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for step := 50 * time.Millisecond; !cond(); step = min(2*step, 500*time.Millisecond) {
		if time.Now().After(deadline) {
			var logs strings.Builder
			for _, n := range rc.Nodes {
				fmt.Fprintf(&logs, "\n--- %s (alive %v):\n%s", n.Name, n.Alive(), n.proc.TailLog())
			}
			t.Fatalf("timed out after %s waiting for %s%s", limit, what, logs.String())
		}
		time.Sleep(step)
	}
}

// makeDir makes a private folder for a server's data.
func makeDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("making %s: %w", dir, err)
	}
	return nil
}
