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

// claimGates let one request per key at a time into the store's ClaimTx in
// this process. With an idem.TxClaimer, a duplicate of a key whose first
// execution is running waits in the database, holding a connection of the
// pool; without the gate, a burst of duplicates arriving at one replica
// would take every connection and starve the requests of other keys. Behind
// the gate, a process's duplicates of a key wait here, holding nothing, and
// go in one after another: once the first execution has committed, each
// is a quick replay.
type claimGates struct {
	mu sync.Mutex
	m  map[waitKey]*claimGate
}

type claimGate struct {
	left    chan struct{} // closed when the request inside leaves
	waiting int           // requests waiting for it (for tests)
}

// enter lets the caller in when nobody of this process is inside for k:
// leave must then be called once the caller's claim (and execution) is
// over. Otherwise it returns left, closed when the one inside leaves, and
// done, to call when the caller stops waiting.
func (g *claimGates) enter(k waitKey) (leave func(), left <-chan struct{}, done func()) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if gate := g.m[k]; gate != nil {
		gate.waiting++
		return nil, gate.left, func() {
			g.mu.Lock()
			defer g.mu.Unlock()
			gate.waiting--
		}
	}
	if g.m == nil {
		g.m = make(map[waitKey]*claimGate)
	}
	gate := &claimGate{left: make(chan struct{})}
	g.m[k] = gate
	return func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		delete(g.m, k)
		close(gate.left)
	}, nil, nil
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
