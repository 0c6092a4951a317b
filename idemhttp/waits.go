package idemhttp

import (
	"sync"

	"github.com/idem-go/idem"
)

type waitKey struct {
	scope idem.Scope
	key   idem.Key
}

// localWaits wakes duplicates waiting in this process as soon as the
// execution they wait for, also in this process, ends. Duplicates waiting on
// another process's execution rely on the store (idem.Waiter) or polling.
type localWaits struct {
	mu sync.Mutex
	m  map[waitKey]*waitEntry
}

type waitEntry struct {
	ch       chan struct{}
	watchers int
}

// watch returns a channel closed at the next notify of k, and a function
// to call when no longer watching.
func (l *localWaits) watch(k waitKey) (<-chan struct{}, func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.m[k]
	if e == nil {
		e = &waitEntry{ch: make(chan struct{})}
		l.m[k] = e
	}
	e.watchers++
	return e.ch, func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		e.watchers--
		if e.watchers == 0 && l.m[k] == e {
			delete(l.m, k)
		}
	}
}

func (l *localWaits) notify(k waitKey) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e := l.m[k]; e != nil {
		close(e.ch)
		delete(l.m, k)
	}
}

// claimGates hold back the duplicates of a key this process is executing.
// With an idem.TxClaimer, a duplicate of a key whose execution has not
// committed waits in the database, holding a connection of the pool:
// without the gates, a burst of duplicates of a slow request would take
// every connection and starve the requests of other keys. A duplicate of a
// key executing here waits at its gate instead, holding nothing, and claims
// once the execution has ended (a replay, then). Keys not executing here
// pass freely: replays of one key run side by side.
type claimGates struct {
	mu sync.Mutex
	m  map[waitKey]*claimGate
}

type claimGate struct {
	ended       chan struct{} // closed when the execution ends
	fingerprint idem.Fingerprint
	waiting     int // requests waiting for it (for tests)
}

// executing returns, when this process is executing k, a channel closed
// when that execution ends, the fingerprint of the request being executed,
// and done, to call when the caller stops waiting for it. Otherwise it
// returns nil channels.
func (g *claimGates) executing(k waitKey) (ended <-chan struct{}, fp idem.Fingerprint, done func()) {
	g.mu.Lock()
	defer g.mu.Unlock()
	gate := g.m[k]
	if gate == nil {
		return nil, "", nil
	}
	gate.waiting++
	return gate.ended, gate.fingerprint, func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		gate.waiting--
	}
}

// begin records that this process executes k for a request fingerprinted
// fp, until end is called.
func (g *claimGates) begin(k waitKey, fp idem.Fingerprint) (end func()) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.m[k] != nil {
		return func() {} // already recorded (cannot happen: one holder per key)
	}
	if g.m == nil {
		g.m = make(map[waitKey]*claimGate)
	}
	gate := &claimGate{ended: make(chan struct{}), fingerprint: fp}
	g.m[k] = gate
	return func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		delete(g.m, k)
		close(gate.ended)
	}
}

// waiting returns how many requests wait at k's gate.
func (g *claimGates) waiting(k waitKey) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	if gate := g.m[k]; gate != nil {
		return gate.waiting
	}
	return 0
}
