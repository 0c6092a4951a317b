package idemredis

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// ErrUnconfirmedReplication is the Problem of a Warning about a master
// with replicas that the Store writes to without waiting for them: Redis
// replicates asynchronously, so a failover can promote a replica that never
// had a claim the master acknowledged, and a duplicate of that request then
// runs again (see "Replication and failover" in the package documentation).
var ErrUnconfirmedReplication = errors.New("idemredis: writes are acknowledged before a replica has them: a failover can lose a claim, and its duplicate then runs again")

// ErrTooFewReplicas is the Problem of a Warning about a master with fewer
// connected replicas than ReplicaConfig.Replicas: every write to it fails
// with ErrNotReplicated until enough replicas are back.
var ErrTooFewReplicas = errors.New("idemredis: the master has fewer connected replicas than the store waits for: every write to it fails")

// A Warning is a setting found on Redis under which the Store can lose a
// claim it reported, or cannot write at all. The Store goes on working; the
// setting wants an operator.
type Warning struct {
	// Node is the master's address as the client knows it.
	Node string
	// Problem says what can happen; errors.Is matches it against the
	// package's sentinels (ErrUnconfirmedReplication, ErrTooFewReplicas).
	Problem error
	// Fix says what mends it.
	Fix string
}

func (w *Warning) Error() string {
	return fmt.Sprintf("idemredis: Redis %s: %s; to fix it: %s", w.Node, strings.TrimPrefix(w.Problem.Error(), "idemredis: "), w.Fix)
}

func (w *Warning) Unwrap() error { return w.Problem }

// nodeReplication is what Warnings reads from one master.
type nodeReplication struct {
	addr string
	// master reports role:master.
	master bool
	// replicas is connected_slaves.
	replicas int
	// minReplicas is min-replicas-to-write, -1 when CONFIG is refused
	// (a managed Redis that renames it, say).
	minReplicas int
}

// parseReplication reads role and connected_slaves from INFO replication.
func parseReplication(info string) (master bool, replicas int) {
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		switch k {
		case "role":
			master = v == "master"
		case "connected_slaves":
			replicas, _ = strconv.Atoi(v)
		}
	}
	return master, replicas
}

// Warnings asks every master the Store reaches (each master of a cluster,
// or the one server) how it replicates, and returns what can make the
// Store lose a claim it reported, in the order found:
//
//   - a master with replicas, on a Store that does not wait for them
//     (ErrUnconfirmedReplication): use OpenReplicated, and set
//     min-replicas-to-write so that a master cut off from its replicas
//     refuses writes;
//   - on a Store that waits for replicas (OpenReplicated), a master with
//     fewer connected replicas than it waits for (ErrTooFewReplicas).
//
// A server with no replicas has no failover to lose writes in, and gets no
// warning. An error is returned when a master cannot be asked.
func (s *Store) Warnings(ctx context.Context) ([]*Warning, error) {
	nodes, err := s.conn.replication(ctx)
	if err != nil {
		return nil, fmt.Errorf("idemredis: reading the replication settings: %w", err)
	}
	rc, acked := s.conn.(*replicaConn)
	var out []*Warning
	for _, n := range nodes {
		if !n.master {
			continue
		}
		switch {
		case !acked && n.replicas > 0:
			fix := "open the store with OpenReplicated (WAIT after every write)"
			if n.minReplicas == 0 {
				fix += " and set min-replicas-to-write 1 on every master"
			}
			out = append(out, &Warning{Node: n.addr, Problem: ErrUnconfirmedReplication, Fix: fix})
		case acked && int64(n.replicas) < rc.acks:
			out = append(out, &Warning{Node: n.addr, Problem: ErrTooFewReplicas,
				Fix: fmt.Sprintf("bring the master's replicas back (%d connected, the store waits for %d), or wait for fewer (ReplicaConfig.Replicas)", n.replicas, rc.acks)})
		}
	}
	return out, nil
}
