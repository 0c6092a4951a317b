package idemtest

import (
	"context"
	"fmt"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// RedisClusterConfig configures StartRedisCluster. The zero value is the
// cluster the failover tests use: 3 masters, a replica each, a node timeout
// of one second, so that a dead master is replaced within a few seconds. A
// test that does not test failover should set a NodeTimeout far above any
// stall of a loaded machine (say 15s): with one second, a master that a busy
// machine does not schedule for a second is replaced mid-test.
type RedisClusterConfig struct {
	// Masters is the number of masters the slots are spread over. Defaults
	// to 3, the fewest Redis Cluster accepts.
	Masters int
	// ReplicasPerMaster is the number of replicas of each master. Defaults
	// to 1.
	ReplicasPerMaster int
	// NodeTimeout is cluster-node-timeout: how long a master may not answer
	// before its replica takes over. Defaults to 1s.
	NodeTimeout time.Duration
	// Settings are more configuration directives for every node, each a
	// name and its value ("min-replicas-to-write", "1"). Defaults to none.
	Settings [][2]string
}

// A RedisCluster is a Redis Cluster of private redis-server processes on
// loopback, its data in the test's temporary directory, killed when the test
// ends.
type RedisCluster struct {
	t     testing.TB
	cli   string
	Nodes []*RedisNode
}

// A RedisNode is one redis-server of a RedisCluster.
type RedisNode struct {
	// Addr is host:port of its clients' port.
	Addr string
	t    testing.TB
	args []string
	dir  string
	proc *Process
}

// StartRedisCluster starts a Redis Cluster, creates it with redis-cli
// --cluster create, and returns once every node reports cluster_state:ok and
// every replica is in sync with its master. It needs redis-server and
// redis-cli (7.0 or later), and skips without them (or fails, under
// IDEM_REQUIRE_SERVICES=1). cfg may be nil.
func StartRedisCluster(t testing.TB, cfg *RedisClusterConfig) *RedisCluster {
	t.Helper()
	bins := RequireBinaries(t, "redis-server", "redis-cli")
	var c RedisClusterConfig
	if cfg != nil {
		c = *cfg
	}
	if c.Masters == 0 {
		c.Masters = 3
	}
	if c.ReplicasPerMaster == 0 {
		c.ReplicasPerMaster = 1
	}
	if c.NodeTimeout == 0 {
		c.NodeTimeout = time.Second
	}
	n := c.Masters * (1 + c.ReplicasPerMaster)
	// Each node needs a client port and a cluster bus port, both free.
	ports := FreePorts(t, 2*n)
	root := t.TempDir()
	rc := &RedisCluster{t: t, cli: bins["redis-cli"]}
	for i := range n {
		port, bus := ports[2*i], ports[2*i+1]
		dir := filepath.Join(root, fmt.Sprintf("node%d", i))
		if err := mkdir(dir); err != nil {
			t.Fatal(err)
		}
		args := []string{bins["redis-server"],
			"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--cluster-enabled", "yes", "--cluster-port", strconv.Itoa(bus),
			"--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", strconv.FormatInt(c.NodeTimeout.Milliseconds(), 10),
			"--save", "", "--appendonly", "no", "--dir", dir, "--daemonize", "no",
			"--logfile", "",
		}
		for _, s := range c.Settings {
			args = append(args, "--"+s[0], s[1])
		}
		node := &RedisNode{Addr: fmt.Sprintf("127.0.0.1:%d", port), t: t, args: args, dir: dir}
		node.start()
		rc.Nodes = append(rc.Nodes, node)
	}
	ctx := context.Background()
	for _, node := range rc.Nodes {
		rc.eventually(10*time.Second, node.Addr+" to answer PING", func() bool {
			out, err := rc.CLI(ctx, node.Addr, "PING")
			return err == nil && strings.TrimSpace(out) == "PONG"
		})
	}
	create := []string{rc.cli, "--cluster", "create"}
	create = append(create, rc.Addrs()...)
	create = append(create, "--cluster-replicas", strconv.Itoa(c.ReplicasPerMaster), "--cluster-yes")
	if out, err := RunCommand(ctx, 60*time.Second, nil, create...); err != nil {
		t.Fatalf("creating the Redis Cluster: %v\n%s", err, out)
	}
	rc.WaitHealthy(30 * time.Second)
	return rc
}

func (n *RedisNode) start() {
	n.proc = StartProcess(n.t, "redis-server "+n.Addr, filepath.Join(n.dir, "redis.log"), nil, n.args...)
}

// Kill sends the node SIGKILL: it dies with whatever it had not yet sent its
// replicas.
func (n *RedisNode) Kill() {
	n.proc.Kill()
	if err := n.proc.WaitExit(10 * time.Second); err != nil {
		n.t.Fatalf("redis-server %s: %v", n.Addr, err)
	}
}

// Pause stops the node (SIGSTOP) without killing it: it neither answers nor
// replicates until Resume, as a node stalled by its host would.
func (n *RedisNode) Pause() {
	if err := n.proc.Signal(syscall.SIGSTOP); err != nil {
		n.t.Fatal(err)
	}
}

// DropReplicas makes the node close its replicas' links (CLIENT KILL TYPE
// replica): what it acknowledges until they reconnect reaches none of
// them, as across a network fault. Paused, a replica cannot reconnect.
func (rc *RedisCluster) DropReplicas(n *RedisNode) {
	rc.t.Helper()
	if out, err := rc.CLI(context.Background(), n.Addr, "CLIENT", "KILL", "TYPE", "replica"); err != nil {
		rc.t.Fatalf("CLIENT KILL TYPE replica on %s: %v %s", n.Addr, err, out)
	}
}

// Resume continues a paused node (SIGCONT).
func (n *RedisNode) Resume() {
	if err := n.proc.Signal(syscall.SIGCONT); err != nil {
		n.t.Fatal(err)
	}
}

// Restart starts a killed node again on its port and folder: it keeps its
// cluster identity (nodes.conf) and, without persistence, rejoins empty, as a
// replica of whoever took its slots over.
func (n *RedisNode) Restart() {
	n.t.Helper()
	if !n.proc.Exited() {
		n.t.Fatalf("redis-server %s: Restart of a node that is running", n.Addr)
	}
	n.start()
}

// Alive reports whether the node's process runs.
func (n *RedisNode) Alive() bool { return !n.proc.Exited() }

// Addrs returns every node's host:port.
func (rc *RedisCluster) Addrs() []string {
	out := make([]string, len(rc.Nodes))
	for i, n := range rc.Nodes {
		out[i] = n.Addr
	}
	return out
}

// URL is a redis:// URL naming every node, the first as the host and the
// others as addr query parameters (the form rueidis.ParseURL reads), so that
// a client finds the cluster from whichever node answers.
func (rc *RedisCluster) URL() string {
	addrs := rc.Addrs()
	q := url.Values{}
	for _, a := range addrs[1:] {
		q.Add("addr", a)
	}
	return "redis://" + addrs[0] + "?" + q.Encode()
}

// CLI runs redis-cli against the node at addr with args and returns its
// raw output.
func (rc *RedisCluster) CLI(ctx context.Context, addr string, args ...string) (string, error) {
	host, port, _ := strings.Cut(addr, ":")
	argv := append([]string{rc.cli, "-h", host, "-p", port, "--raw"}, args...)
	return RunCommand(ctx, 10*time.Second, nil, argv...)
}

// ConfigSet sets a configuration directive on every live node.
func (rc *RedisCluster) ConfigSet(name, value string) {
	rc.t.Helper()
	for _, n := range rc.Nodes {
		if !n.Alive() {
			continue
		}
		if out, err := rc.CLI(context.Background(), n.Addr, "CONFIG", "SET", name, value); err != nil || strings.TrimSpace(out) != "OK" {
			rc.t.Fatalf("CONFIG SET %s %s on %s: %v %s", name, value, n.Addr, err, out)
		}
	}
}

// redisNodeLine is one line of CLUSTER NODES.
type redisNodeLine struct {
	id, addr, master string
	flags            []string
	slots            [][2]int
}

func (l redisNodeLine) has(flag string) bool {
	for _, f := range l.flags {
		if f == flag {
			return true
		}
	}
	return false
}

// clusterNodes reads CLUSTER NODES as the node at addr sees the cluster.
func (rc *RedisCluster) clusterNodes(ctx context.Context, addr string) ([]redisNodeLine, error) {
	out, err := rc.CLI(ctx, addr, "CLUSTER", "NODES")
	if err != nil {
		return nil, err
	}
	var lines []redisNodeLine
	for _, s := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(s)
		if len(f) < 8 {
			return nil, fmt.Errorf("CLUSTER NODES line %q: fewer than 8 fields", s)
		}
		a, _, _ := strings.Cut(f[1], "@")
		l := redisNodeLine{id: f[0], addr: a, master: f[3], flags: strings.Split(f[2], ",")}
		for _, r := range f[8:] {
			if strings.HasPrefix(r, "[") {
				continue // a slot being migrated
			}
			lo, hi, ok := strings.Cut(r, "-")
			if !ok {
				hi = lo
			}
			a, err1 := strconv.Atoi(lo)
			b, err2 := strconv.Atoi(hi)
			if err1 != nil || err2 != nil {
				return nil, fmt.Errorf("CLUSTER NODES slot range %q", r)
			}
			l.slots = append(l.slots, [2]int{a, b})
		}
		lines = append(lines, l)
	}
	return lines, nil
}

// live returns a node that runs, to ask about the cluster.
func (rc *RedisCluster) live(not *RedisNode) *RedisNode {
	for _, n := range rc.Nodes {
		if n != not && n.Alive() {
			return n
		}
	}
	rc.t.Fatal("no Redis Cluster node is running")
	return nil
}

func (rc *RedisCluster) node(addr string) *RedisNode {
	for _, n := range rc.Nodes {
		if n.Addr == addr {
			return n
		}
	}
	return nil
}

// Slot returns the hash slot of key (CLUSTER KEYSLOT).
func (rc *RedisCluster) Slot(key string) int {
	rc.t.Helper()
	out, err := rc.CLI(context.Background(), rc.live(nil).Addr, "CLUSTER", "KEYSLOT", key)
	if err != nil {
		rc.t.Fatal(err)
	}
	slot, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		rc.t.Fatalf("CLUSTER KEYSLOT %q answered %q", key, out)
	}
	return slot
}

// MasterOf returns the node that serves key's slot as a master, as a live
// node other than not sees the cluster, and that master's replicas; nil
// when no healthy master serves it (during a failover).
func (rc *RedisCluster) MasterOf(key string, not *RedisNode) (master *RedisNode, replicas []*RedisNode) {
	rc.t.Helper()
	slot := rc.Slot(key)
	lines, err := rc.clusterNodes(context.Background(), rc.live(not).Addr)
	if err != nil {
		rc.t.Fatal(err)
	}
	var id string
	for _, l := range lines {
		if !l.has("master") || l.has("fail") || l.has("fail?") {
			continue
		}
		for _, r := range l.slots {
			if slot >= r[0] && slot <= r[1] {
				id, master = l.id, rc.node(l.addr)
			}
		}
	}
	if master == nil || master == not {
		return nil, nil
	}
	for _, l := range lines {
		if l.master == id && !l.has("fail") {
			if n := rc.node(l.addr); n != nil {
				replicas = append(replicas, n)
			}
		}
	}
	return master, replicas
}

// WaitMasterOf waits up to limit for a master other than old to serve key's
// slot, as every live node sees it, and returns it: the end of a failover.
func (rc *RedisCluster) WaitMasterOf(key string, old *RedisNode, limit time.Duration) *RedisNode {
	rc.t.Helper()
	var m *RedisNode
	rc.eventually(limit, "a new master of "+key, func() bool {
		m, _ = rc.MasterOf(key, old)
		return m != nil && m != old
	})
	return m
}

// WaitHealthy waits up to limit until every live node reports
// cluster_state:ok and knows every other, and every live replica's link to
// its master is up.
func (rc *RedisCluster) WaitHealthy(limit time.Duration) {
	rc.t.Helper()
	ctx := context.Background()
	for _, n := range rc.Nodes {
		if !n.Alive() {
			continue
		}
		rc.eventually(limit, n.Addr+" to report cluster_state:ok", func() bool {
			out, err := rc.CLI(ctx, n.Addr, "CLUSTER", "INFO")
			return err == nil && strings.Contains(out, "cluster_state:ok") &&
				strings.Contains(out, fmt.Sprintf("cluster_known_nodes:%d\r", len(rc.Nodes)))
		})
		rc.eventually(limit, n.Addr+" to be in sync with its master", func() bool {
			out, err := rc.CLI(ctx, n.Addr, "INFO", "replication")
			if err != nil {
				return false
			}
			return strings.Contains(out, "role:master") || strings.Contains(out, "master_link_status:up")
		})
	}
}

func (rc *RedisCluster) eventually(limit time.Duration, what string, cond func() bool) {
	rc.t.Helper()
	deadline := time.Now().Add(limit)
	for step := 10 * time.Millisecond; !cond(); step = min(2*step, 200*time.Millisecond) {
		if time.Now().After(deadline) {
			var logs strings.Builder
			for _, n := range rc.Nodes {
				fmt.Fprintf(&logs, "--- %s:\n%s\n", n.Addr, n.proc.TailLog())
			}
			rc.t.Fatalf("timed out after %s waiting for %s\n%s", limit, what, logs.String())
		}
		time.Sleep(step)
	}
}
