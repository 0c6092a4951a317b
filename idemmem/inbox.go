package idemmem

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/idem-go/idem"
)

// ErrTxDone is returned when a write tries to join a Tx that has already
// committed or rolled back, as by a goroutine fn started and did not wait
// for.
var ErrTxDone = errors.New("idemmem: transaction has already committed or rolled back")

// Tx stands in for a database transaction. idemmem has no real
// transactions: a Tx is a list of writes, held back until it commits and
// dropped if it rolls back. That is enough to give the in-memory stores the
// semantics the interfaces promise (an inbox record and the handler's writes
// appear together or not at all), but not isolation: a read inside a Tx does
// not see the Tx's own pending writes, only what has committed.
//
// The stores of this package (Outbox.Add, DeadLetters.Add, the writes of
// Ledger, Counters.Add) join the Tx carried by their context, and apply at
// once when there is none. A Tx is safe for concurrent use.
type Tx struct {
	mu     sync.Mutex
	done   bool
	parent *Tx
	writes []func()
}

type txKey struct{}

// TxFromContext returns the Tx ctx carries, if any: the one Inbox.Process
// or Transact gives its function.
func TxFromContext(ctx context.Context) (*Tx, bool) {
	tx, ok := ctx.Value(txKey{}).(*Tx)
	return tx, ok
}

// OnCommit adds apply to the writes the transaction makes when it commits;
// they run in the order they were added. Returns ErrTxDone after the
// transaction has ended.
func (tx *Tx) OnCommit(apply func()) error {
	tx.mu.Lock()
	defer tx.mu.Unlock()
	if tx.done {
		return ErrTxDone
	}
	tx.writes = append(tx.writes, apply)
	return nil
}

// end closes the transaction, and applies its writes when commit is set:
// to its parent's writes if it is nested, at once otherwise.
func (tx *Tx) end(commit bool) error {
	tx.mu.Lock()
	if tx.done {
		tx.mu.Unlock()
		return ErrTxDone
	}
	tx.done = true
	writes := tx.writes
	tx.writes = nil
	tx.mu.Unlock()
	if !commit {
		return nil
	}
	if tx.parent != nil {
		for _, w := range writes {
			if err := tx.parent.OnCommit(w); err != nil {
				return err
			}
		}
		return nil
	}
	for _, w := range writes {
		w()
	}
	return nil
}

// Transact runs fn in a new Tx, which it commits when fn returns nil and
// rolls back otherwise (also when fn panics), returning fn's error
// unchanged. Inside another Tx it behaves like a savepoint: its writes join
// the outer transaction if fn succeeds, and are dropped if it fails.
//
// It is how a program on the in-memory stores writes an effect and its
// outbox message together:
//
//	err := idemmem.Transact(ctx, func(ctx context.Context) error {
//		if err := balances.Add(ctx, "acct-1", -1250); err != nil {
//			return err
//		}
//		return outbox.Add(ctx, event)
//	})
func Transact(ctx context.Context, fn func(ctx context.Context) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	tx := &Tx{}
	if outer, ok := TxFromContext(ctx); ok {
		tx.parent = outer
	}
	return tx.run(ctx, fn)
}

// run calls fn with tx in its context and ends tx by fn's outcome.
func (tx *Tx) run(ctx context.Context, fn func(ctx context.Context) error) (err error) {
	committed := false
	defer func() {
		if !committed {
			_ = tx.end(false)
		}
	}()
	if err := fn(context.WithValue(ctx, txKey{}, tx)); err != nil {
		return err
	}
	committed = true
	return tx.end(true)
}

// inTx runs apply as a write of the Tx ctx carries, or at once when it
// carries none.
func inTx(ctx context.Context, apply func()) error {
	if tx, ok := TxFromContext(ctx); ok {
		return tx.OnCommit(apply)
	}
	apply()
	return nil
}

// Inbox is an in-memory idem.Inbox: the reference for the semantics of
// de-duplication, not for durability (its records live and die with the
// process).
//
// Process holds a lock on the (consumer, dedupKey) pair while fn runs, so
// that concurrent deliveries of one message run fn once; the others wait,
// and get ErrDuplicate once the first has committed, or run fn themselves if
// it failed. fn runs in a fresh Tx (see TxFromContext): the writes it makes
// through this package's stores and Counters are applied with the record
// when fn returns nil, and dropped when it fails, so a redelivery runs fn
// again from a clean slate.
//
// ProcessSequence (idem.SequenceInbox) holds a lock on the (consumer,
// aggregate) pair in the same way, from the look at the mark to the commit
// that raises it, so that concurrent calls of one aggregate take turns.
//
// Records and marks are kept for the life of the Inbox, which is at least
// as long as any transport of the same process can redeliver. The zero
// Inbox is not usable; call NewInbox.
type Inbox struct {
	mu    sync.Mutex
	keys  map[inboxSlot]*inboxKey
	marks map[inboxSlot]*inboxMark
}

var (
	_ idem.BatchInbox    = (*Inbox)(nil)
	_ idem.SequenceInbox = (*Inbox)(nil)
)

type inboxSlot struct{ consumer, key string }

type inboxKey struct {
	// lock is held (a value in it) while a Process runs fn for the key.
	lock chan struct{}
	// done is set, with lock held, when fn has succeeded. It is atomic so
	// that Processed and leave can read it without waiting for the lock.
	done atomic.Bool
	// users counts the Process calls holding or waiting for lock, so that
	// an entry no one processed successfully can be dropped. Guarded by
	// Inbox.mu.
	users int
}

// inboxMark is the mark of one (consumer, aggregate) pair.
type inboxMark struct {
	// lock is held (a value in it) while a ProcessSequence reads the mark,
	// runs fn and commits.
	lock chan struct{}
	// mark is the highest sequence number committed. It is atomic so that
	// Mark and leaveMark can read it without waiting for the lock.
	mark atomic.Uint64
	// users counts the calls holding or waiting for lock, so that an entry
	// that never got a mark can be dropped. Guarded by Inbox.mu.
	users int
}

// NewInbox returns an empty Inbox.
func NewInbox() *Inbox {
	return &Inbox{keys: make(map[inboxSlot]*inboxKey), marks: make(map[inboxSlot]*inboxMark)}
}

// Process implements idem.Inbox. fn's context carries the Tx its writes
// should join. Process always starts a transaction of its own: it does not
// join one ctx already carries, since its record must be visible as soon as
// its key lock is released.
//
// Returns an error matching idem.ErrInvalidArgument, without running fn,
// when consumer or dedupKey is empty or fn is nil, and ctx.Err() when ctx
// ends before the key's lock is free.
func (i *Inbox) Process(ctx context.Context, consumer, dedupKey string, fn func(ctx context.Context) error) error {
	switch {
	case consumer == "":
		return &idem.ArgumentError{Field: "consumer", Reason: "must not be empty"}
	case dedupKey == "":
		return &idem.ArgumentError{Field: "dedupKey", Reason: "must not be empty"}
	case fn == nil:
		return &idem.ArgumentError{Field: "fn", Reason: "must not be nil"}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	s := inboxSlot{consumer, dedupKey}
	i.mu.Lock()
	k := i.keys[s]
	if k == nil {
		k = &inboxKey{lock: make(chan struct{}, 1)}
		i.keys[s] = k
	}
	k.users++
	i.mu.Unlock()
	defer i.leave(s, k)

	select {
	case k.lock <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-k.lock }()
	if k.done.Load() {
		return idem.ErrDuplicate
	}
	tx := &Tx{}
	// Record inside the transaction, after fn's writes, so the record and
	// the effects are applied by the same commit.
	return tx.run(ctx, func(ctx context.Context) error {
		if err := fn(ctx); err != nil {
			return err
		}
		return tx.OnCommit(func() { k.done.Store(true) })
	})
}

// ProcessBatch implements idem.BatchInbox: it holds the locks of every key
// (taken in the keys' order, so that batches sharing keys never wait for
// each other in a cycle) while fn runs in one fresh Tx, and records the
// fresh keys when that Tx commits.
func (i *Inbox) ProcessBatch(ctx context.Context, consumer string, dedupKeys []string, fn func(ctx context.Context, fresh []bool) error) error {
	switch {
	case consumer == "":
		return &idem.ArgumentError{Field: "consumer", Reason: "must not be empty"}
	case fn == nil:
		return &idem.ArgumentError{Field: "fn", Reason: "must not be nil"}
	}
	seen := make(map[string]struct{}, len(dedupKeys))
	for _, k := range dedupKeys {
		if k == "" {
			return &idem.ArgumentError{Field: "dedupKeys", Reason: "must not hold an empty key"}
		}
		if _, dup := seen[k]; dup {
			return &idem.ArgumentError{Field: "dedupKeys", Reason: fmt.Sprintf("holds %q twice", k)}
		}
		seen[k] = struct{}{}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	order := make([]int, len(dedupKeys))
	for n := range order {
		order[n] = n
	}
	slices.SortFunc(order, func(a, b int) int { return strings.Compare(dedupKeys[a], dedupKeys[b]) })
	slots := make([]inboxSlot, len(dedupKeys))
	keys := make([]*inboxKey, len(dedupKeys))
	i.mu.Lock()
	for n, k := range dedupKeys {
		s := inboxSlot{consumer, k}
		e := i.keys[s]
		if e == nil {
			e = &inboxKey{lock: make(chan struct{}, 1)}
			i.keys[s] = e
		}
		e.users++
		slots[n], keys[n] = s, e
	}
	i.mu.Unlock()
	defer func() {
		for n := range keys {
			i.leave(slots[n], keys[n])
		}
	}()
	var locked []int
	defer func() {
		for _, n := range locked {
			<-keys[n].lock
		}
	}()
	for _, n := range order {
		select {
		case keys[n].lock <- struct{}{}:
			locked = append(locked, n)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	fresh := make([]bool, len(keys))
	for n, k := range keys {
		fresh[n] = !k.done.Load()
	}
	tx := &Tx{}
	return tx.run(ctx, func(ctx context.Context) error {
		if err := fn(ctx, fresh); err != nil {
			return err
		}
		return tx.OnCommit(func() {
			for n, k := range keys {
				if fresh[n] {
					k.done.Store(true)
				}
			}
		})
	})
}

// ProcessSequence implements idem.SequenceInbox. It holds the lock of the
// (consumer, aggregate) pair while it reads the mark, runs fn in a fresh Tx
// (see TxFromContext) and commits it; the new mark is one of that Tx's
// writes, so it is applied with fn's, and dropped with them when fn fails.
// Like Process, it always starts a transaction of its own.
//
// Returns an error matching idem.ErrInvalidArgument, without running fn,
// for the arguments idem.CheckSequenceArgs refuses, and ctx.Err() when ctx
// ends before the pair's lock is free.
func (i *Inbox) ProcessSequence(ctx context.Context, consumer, aggregate string, seq uint64, gap idem.GapPolicy, fn func(ctx context.Context) error) error {
	if err := idem.CheckSequenceArgs(consumer, aggregate, seq, gap, fn); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	s := inboxSlot{consumer, aggregate}
	i.mu.Lock()
	m := i.marks[s]
	if m == nil {
		m = &inboxMark{lock: make(chan struct{}, 1)}
		i.marks[s] = m
	}
	m.users++
	i.mu.Unlock()
	defer i.leaveMark(s, m)

	select {
	case m.lock <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-m.lock }()
	if err := idem.CheckSequence(aggregate, m.mark.Load(), seq, gap); err != nil {
		return err
	}
	tx := &Tx{}
	return tx.run(ctx, func(ctx context.Context) error {
		if err := fn(ctx); err != nil {
			return err
		}
		return tx.OnCommit(func() { m.mark.Store(seq) })
	})
}

// leaveMark drops the caller's interest in m, and the entry itself when no
// one else wants it and it holds no mark.
func (i *Inbox) leaveMark(s inboxSlot, m *inboxMark) {
	i.mu.Lock()
	defer i.mu.Unlock()
	m.users--
	if m.users == 0 && m.mark.Load() == 0 {
		delete(i.marks, s)
	}
}

// Mark returns the mark of the pair: the highest sequence number
// ProcessSequence committed for it, 0 when none.
func (i *Inbox) Mark(consumer, aggregate string) uint64 {
	i.mu.Lock()
	defer i.mu.Unlock()
	if m := i.marks[inboxSlot{consumer, aggregate}]; m != nil {
		return m.mark.Load()
	}
	return 0
}

// leave drops the caller's interest in k, and the entry itself when no one
// else wants it and it holds no record.
func (i *Inbox) leave(s inboxSlot, k *inboxKey) {
	i.mu.Lock()
	defer i.mu.Unlock()
	k.users--
	if k.users == 0 && !k.done.Load() {
		delete(i.keys, s)
	}
}

// Processed reports whether the pair has been recorded: whether Process
// would return idem.ErrDuplicate.
func (i *Inbox) Processed(consumer, dedupKey string) bool {
	i.mu.Lock()
	defer i.mu.Unlock()
	k := i.keys[inboxSlot{consumer, dedupKey}]
	return k != nil && k.done.Load()
}

// Counters are named in-memory integers whose changes join the Tx in their
// context: an effect that, like a row in a database, changes only when the
// transaction commits. A handler that increments one is a non-idempotent
// effect that only the inbox protects from duplicates. The zero value is
// ready to use.
type Counters struct {
	mu sync.Mutex
	m  map[string]int64
}

// Add adds delta to the counter name, when the Tx in ctx commits, or at
// once without one.
func (c *Counters) Add(ctx context.Context, name string, delta int64) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return inTx(ctx, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.m == nil {
			c.m = make(map[string]int64)
		}
		c.m[name] += delta
	})
}

// Get returns the committed value of the counter name (zero if it was never
// added to).
func (c *Counters) Get(name string) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.m[name]
}
