// Package natscluster starts clusters of nats-server with JetStream on
// loopback for idemnats's cluster tests, kills and restarts their servers,
// and tells who leads a stream. The servers are programs of the machine's
// (RequireBinaries gates the tests on them).
package natscluster

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/idemtest"
)

// ServerEnv names the environment variable that picks the nats-server
// program the cluster tests start, such as a newer release than the
// machine's. Defaults to nats-server in PATH.
const ServerEnv = "IDEMTEST_NATS_SERVER"

// Config configures Start. The zero value is the
// cluster the cluster tests use: three JetStream servers with the server's
// default sync interval.
type Config struct {
	// Servers is the number of servers. Defaults to 3, the fewest with
	// which a stream of 3 replicas survives the loss of one.
	Servers int
	// SyncInterval is the jetstream block's sync_interval: how often the
	// servers fsync what they stored, or "always" to fsync before every
	// acknowledgement. nats-server 2.10 and later know it; 2.9 refuses a
	// configuration with it, and fsyncs every 2 minutes. Defaults to
	// empty: not set, the server's default (2 minutes).
	SyncInterval string
}

// A Cluster is a cluster of private nats-server processes with
// JetStream on loopback, their data in the test's temporary directory,
// killed when the test ends.
type Cluster struct {
	t testing.TB
	// Version is the servers' version, as nats-server --version says it
	// ("2.9.10").
	Version string
	Servers []*Server
}

// A Server is one nats-server of a Cluster.
type Server struct {
	// Name is its server_name, which JetStream names a stream's leader
	// and replicas by.
	Name string
	// URL is its client URL, nats://127.0.0.1:<port>.
	URL string

	t       testing.TB
	args    []string
	dir     string
	monitor string
	proc    *idemtest.Process
}

// ServerVersion returns the version of the nats-server the cluster
// tests start (see ServerEnv) and its path, skipping the test (or
// failing it, under IDEM_REQUIRE_SERVICES=1) when there is none.
func ServerVersion(t testing.TB) (version, path string) {
	t.Helper()
	path = os.Getenv(ServerEnv)
	if path == "" {
		path = idemtest.RequireBinaries(t, "nats-server")["nats-server"]
	} else if _, err := os.Stat(path); err != nil {
		t.Fatalf("%s=%q: %v", ServerEnv, path, err)
	}
	out, err := idemtest.RunCommand(context.Background(), 10*time.Second, nil, path, "--version")
	if err != nil {
		t.Fatalf("nats-server --version: %v", err)
	}
	m := regexp.MustCompile(`v?(\d+\.\d+\.\d+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("nats-server --version said %q: no version in it", out)
	}
	return m[1], path
}

// VersionAtLeast reports whether version ("2.9.10") is at least
// major.minor.
func VersionAtLeast(version string, major, minor int) bool {
	parts := strings.SplitN(version, ".", 3)
	if len(parts) < 2 {
		return false
	}
	ma, err1 := strconv.Atoi(parts[0])
	mi, err2 := strconv.Atoi(parts[1])
	if err1 != nil || err2 != nil {
		return false
	}
	return ma > major || (ma == major && mi >= minor)
}

// Start starts a JetStream cluster and returns once every
// server is up and the cluster has elected its meta leader, so that a
// stream can be created. Each server has a configuration file of its own
// (server_name, client and cluster ports, routes to the others, a
// monitoring port, jetstream store_dir). cfg may be nil.
func Start(t testing.TB, cfg *Config) *Cluster {
	t.Helper()
	version, bin := ServerVersion(t)
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.Servers == 0 {
		c.Servers = 3
	}
	if c.SyncInterval != "" && !VersionAtLeast(version, 2, 10) {
		t.Fatalf("nats-server %s does not know sync_interval (2.10 and later do)", version)
	}
	ports := idemtest.FreePorts(t, 3*c.Servers)
	root := t.TempDir()
	nc := &Cluster{t: t, Version: version}
	routes := make([]string, c.Servers)
	for i := range c.Servers {
		routes[i] = fmt.Sprintf("nats://127.0.0.1:%d", ports[3*i+1])
	}
	for i := range c.Servers {
		client, clusterPort, monitor := ports[3*i], ports[3*i+1], ports[3*i+2]
		name := fmt.Sprintf("n%d", i+1)
		dir := filepath.Join(root, name)
		if err := makeDir(filepath.Join(dir, "js")); err != nil {
			t.Fatal(err)
		}
		var others []string
		for j, r := range routes {
			if j != i {
				others = append(others, strconv.Quote(r))
			}
		}
		sync := ""
		if c.SyncInterval != "" {
			sync = "\n  sync_interval: " + strconv.Quote(c.SyncInterval)
		}
		conf := fmt.Sprintf(`server_name: %s
listen: "127.0.0.1:%d"
http: "127.0.0.1:%d"
jetstream {
  store_dir: %s%s
}
cluster {
  name: idemtest
  listen: "127.0.0.1:%d"
  routes: [%s]
}
`, name, client, monitor, strconv.Quote(filepath.Join(dir, "js")), sync, clusterPort, strings.Join(others, ", "))
		confPath := filepath.Join(dir, "nats.conf")
		if err := os.WriteFile(confPath, []byte(conf), 0o600); err != nil {
			t.Fatal(err)
		}
		s := &Server{
			Name: name, URL: fmt.Sprintf("nats://127.0.0.1:%d", client),
			t: t, args: []string{bin, "-c", confPath}, dir: dir,
			monitor: fmt.Sprintf("http://127.0.0.1:%d", monitor),
		}
		s.start()
		nc.Servers = append(nc.Servers, s)
	}
	nc.WaitMetaLeader(30 * time.Second)
	return nc
}

func (s *Server) start() {
	s.proc = idemtest.StartProcess(s.t, "nats-server "+s.Name, filepath.Join(s.dir, "nats.log"), nil, s.args...)
}

// Kill sends the server SIGKILL: it dies with whatever it had not
// written, fsynced or sent its peers.
func (s *Server) Kill() {
	s.t.Helper()
	s.proc.Kill()
	if err := s.proc.WaitExit(10 * time.Second); err != nil {
		s.t.Fatalf("nats-server %s: %v", s.Name, err)
	}
}

// Restart starts a killed server again on its ports and store: it
// recovers its streams from disk and catches up from the others.
func (s *Server) Restart() {
	s.t.Helper()
	if !s.proc.Exited() {
		s.t.Fatalf("nats-server %s: Restart of a server that is running", s.Name)
	}
	s.start()
}

// Alive reports whether the server's process runs.
func (s *Server) Alive() bool { return !s.proc.Exited() }

// URL returns the client URLs of every server, comma-separated, as
// nats.Connect (and idemnats.Open) take a cluster.
func (nc *Cluster) URL() string {
	urls := make([]string, len(nc.Servers))
	for i, s := range nc.Servers {
		urls[i] = s.URL
	}
	return strings.Join(urls, ",")
}

// Server returns the server named name, or nil.
func (nc *Cluster) Server(name string) *Server {
	for _, s := range nc.Servers {
		if s.Name == name {
			return s
		}
	}
	return nil
}

// jsz is the part of a server's /jsz monitoring answer the helpers read.
type jsz struct {
	Meta *struct {
		Leader string `json:"leader"`
	} `json:"meta_cluster"`
	Accounts []struct {
		Streams []struct {
			Name    string `json:"name"`
			Cluster *struct {
				Leader   string `json:"leader"`
				Replicas []struct {
					Name    string `json:"name"`
					Current bool   `json:"current"`
				} `json:"replicas"`
			} `json:"cluster"`
		} `json:"stream_detail"`
	} `json:"account_details"`
}

// jsz asks the server's monitoring port what JetStream it knows.
func (s *Server) jsz(ctx context.Context) (*jsz, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.monitor+"/jsz?"+url.Values{
		"accounts": {"true"}, "streams": {"true"},
	}.Encode(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("nats-server %s: /jsz: %s", s.Name, resp.Status)
	}
	var out jsz
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, fmt.Errorf("nats-server %s: /jsz: %w", s.Name, err)
	}
	return &out, nil
}

// WaitMetaLeader waits up to limit for every live server to know the
// cluster's meta leader, without which no stream can be created or
// looked up.
func (nc *Cluster) WaitMetaLeader(limit time.Duration) {
	nc.t.Helper()
	nc.eventually(nc.t, limit, "every server to know the JetStream meta leader", func() bool {
		for _, s := range nc.Servers {
			if !s.Alive() {
				continue
			}
			j, err := s.jsz(context.Background())
			if err != nil || j.Meta == nil || j.Meta.Leader == "" {
				return false
			}
		}
		return true
	})
}

// StreamLeader returns the server that leads stream, as the live servers
// see it, and the names of its other replicas that it finds current; nil
// when no live server knows a leader that is alive.
func (nc *Cluster) StreamLeader(stream string) (leader *Server, current []string) {
	find := func(s *Server) (leader string, current []string) {
		j, err := s.jsz(context.Background())
		if err != nil {
			return "", nil
		}
		for _, a := range j.Accounts {
			for _, st := range a.Streams {
				if st.Name != stream || st.Cluster == nil {
					continue
				}
				for _, r := range st.Cluster.Replicas {
					if r.Current {
						current = append(current, r.Name)
					}
				}
				return st.Cluster.Leader, current
			}
		}
		return "", nil
	}
	for _, s := range nc.Servers {
		if !s.Alive() {
			continue
		}
		name, _ := find(s)
		l := nc.Server(name)
		if l == nil || !l.Alive() {
			continue
		}
		// Only the leader knows whether its replicas are current.
		if again, current := find(l); again == l.Name {
			return l, current
		}
	}
	return nil, nil
}

// WaitStreamLeader waits up to limit for stream to have a live leader
// other than not (nil for any), and returns it; it fails t if none comes.
func (nc *Cluster) WaitStreamLeader(t testing.TB, stream string, not *Server, limit time.Duration) *Server {
	t.Helper()
	var leader *Server
	nc.eventually(t, limit, "stream "+stream+" to have a leader", func() bool {
		leader, _ = nc.StreamLeader(stream)
		return leader != nil && leader != not
	})
	return leader
}

// WaitStreamCurrent waits up to limit for every replica of stream to be
// current with its leader (a restarted server has caught up), and fails t
// if they are not.
func (nc *Cluster) WaitStreamCurrent(t testing.TB, stream string, replicas int, limit time.Duration) {
	t.Helper()
	nc.eventually(t, limit, fmt.Sprintf("stream %s to have %d current replicas besides its leader", stream, replicas-1), func() bool {
		leader, current := nc.StreamLeader(stream)
		return leader != nil && len(current) == replicas-1
	})
}

func (nc *Cluster) eventually(t testing.TB, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for step := 10 * time.Millisecond; !cond(); step = min(2*step, 200*time.Millisecond) {
		if time.Now().After(deadline) {
			var logs strings.Builder
			for _, s := range nc.Servers {
				fmt.Fprintf(&logs, "\n--- nats-server %s (alive %v):\n%s", s.Name, s.Alive(), s.proc.TailLog())
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
