// Package keywait lets the duplicates of a key wait, in one process, for
// that process's own execution of the key: the engine (package keyed) uses
// it, for every face, so that a duplicate is woken as soon
// as the execution it waits for ends, rather than at its next poll of the
// store, and so that, with an idem.TxClaimer, a burst of duplicates waits
// here instead of in the database, one pool connection each.
//
// It was API between idem's modules (idemgrpc v0.1.0 imports it; see
// docs/releasing.md): it changes only compatibly.
package keywait

import (
	"sync"

	"github.com/idem-go/idem"
)

// Key names one key in its scope.
type Key struct {
	Scope idem.Scope
	Key   idem.Key
}

// Local wakes duplicates waiting in this process as soon as the execution
// they wait for, also in this process, ends. Duplicates waiting on another
// process's execution rely on the store (idem.Waiter) or polling. The zero
// value is ready to use.
type Local struct {
	mu sync.Mutex
	m  map[Key]*waitEntry
}

type waitEntry struct {
	ch       chan struct{}
	watchers int
}

// Watch returns a channel closed at the next Notify of k, and a function
// to call when no longer watching.
func (l *Local) Watch(k Key) (<-chan struct{}, func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m == nil {
		l.m = make(map[Key]*waitEntry)
	}
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

// Notify wakes every watcher of k.
func (l *Local) Notify(k Key) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e := l.m[k]; e != nil {
		close(e.ch)
		delete(l.m, k)
	}
}

// Gates hold back the duplicates of a key this process is executing.
// With an idem.TxClaimer, a duplicate of a key whose execution has not
// committed waits in the database, holding a connection of the pool:
// without the gates, a burst of duplicates of a slow request would take
// every connection and starve the requests of other keys. A duplicate of a
// key executing here waits at its gate instead, holding nothing, and claims
// once the execution has ended (a replay, then). Keys not executing here
// pass freely: replays of one key run side by side. The zero value is
// ready to use.
type Gates struct {
	mu sync.Mutex
	m  map[Key]*gate
}

type gate struct {
	ended       chan struct{} // closed when the execution ends
	fingerprint idem.Fingerprint
	waiting     int // requests waiting for it (for tests)
}

// Executing returns, when this process is executing k, a channel closed
// when that execution ends, the fingerprint of the request being executed,
// and done, to call when the caller stops waiting for it. Otherwise it
// returns nil channels.
func (g *Gates) Executing(k Key) (ended <-chan struct{}, fp idem.Fingerprint, done func()) {
	g.mu.Lock()
	defer g.mu.Unlock()
	gt := g.m[k]
	if gt == nil {
		return nil, "", nil
	}
	gt.waiting++
	return gt.ended, gt.fingerprint, func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		gt.waiting--
	}
}

// Begin records that this process executes k for a request fingerprinted
// fp, until end is called.
func (g *Gates) Begin(k Key, fp idem.Fingerprint) (end func()) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.m[k] != nil {
		return func() {} // already recorded (cannot happen: one holder per key)
	}
	if g.m == nil {
		g.m = make(map[Key]*gate)
	}
	gt := &gate{ended: make(chan struct{}), fingerprint: fp}
	g.m[k] = gt
	return func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		delete(g.m, k)
		close(gt.ended)
	}
}

// Waiting returns how many requests wait at k's gate.
func (g *Gates) Waiting(k Key) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	if gt := g.m[k]; gt != nil {
		return gt.waiting
	}
	return 0
}
