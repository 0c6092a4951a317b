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
