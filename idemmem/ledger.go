package idemmem

import (
	"context"
	"slices"
	"sync"

	"github.com/idem-go/idem"
)

// Ledger is an in-memory idem.Ledger. Its writes (RecordAttempt,
// ForgetAttempts, HoldBack, Park, LetGo) join the Tx in their context (see
// Transact) and apply when it commits; reads see only what has committed.
// RecordAttempt and LetGo return what their write will leave or take: the
// attempts recorded so far plus the new one, the messages parked so far. The
// zero Ledger is not usable; call NewLedger.
type Ledger struct {
	mu       sync.Mutex
	attempts map[ledgerSlot][]idem.Attempt // by (consumer, dedup key)
	holds    map[ledgerSlot]string         // letter ID, by (consumer, ordering key)
	parked   map[ledgerSlot][]idem.Message // in parking order, by (consumer, ordering key)
}

var _ idem.Ledger = (*Ledger)(nil)

type ledgerSlot struct{ consumer, key string }

// NewLedger returns an empty Ledger.
func NewLedger() *Ledger {
	return &Ledger{
		attempts: make(map[ledgerSlot][]idem.Attempt),
		holds:    make(map[ledgerSlot]string),
		parked:   make(map[ledgerSlot][]idem.Message),
	}
}

// checkLedger validates the arguments every method shares, and ctx.
func checkLedger(ctx context.Context, consumer, keyField, key string) error {
	switch {
	case consumer == "":
		return &idem.ArgumentError{Field: "consumer", Reason: "must not be empty"}
	case key == "":
		return &idem.ArgumentError{Field: keyField, Reason: "must not be empty"}
	}
	return ctx.Err()
}

// RecordAttempt implements idem.Ledger. Returns an error matching
// idem.ErrInvalidArgument when consumer or dedupKey is empty.
func (l *Ledger) RecordAttempt(ctx context.Context, consumer, dedupKey string, a idem.Attempt) ([]idem.Attempt, error) {
	if err := checkLedger(ctx, consumer, "dedupKey", dedupKey); err != nil {
		return nil, err
	}
	s := ledgerSlot{consumer, dedupKey}
	l.mu.Lock()
	defer l.mu.Unlock()
	all := append(slices.Clone(l.attempts[s]), a)
	tx, ok := TxFromContext(ctx)
	if !ok {
		l.attempts[s] = all
		return slices.Clone(all), nil
	}
	err := tx.OnCommit(func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.attempts[s] = append(l.attempts[s], a)
	})
	if err != nil {
		return nil, err
	}
	return all, nil
}

// Attempts implements idem.Ledger. Returns nil when none are recorded.
func (l *Ledger) Attempts(ctx context.Context, consumer, dedupKey string) ([]idem.Attempt, error) {
	if err := checkLedger(ctx, consumer, "dedupKey", dedupKey); err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.attempts[ledgerSlot{consumer, dedupKey}]), nil
}

// ForgetAttempts implements idem.Ledger. Forgetting a message with no
// attempts is not an error.
func (l *Ledger) ForgetAttempts(ctx context.Context, consumer, dedupKey string) error {
	if err := checkLedger(ctx, consumer, "dedupKey", dedupKey); err != nil {
		return err
	}
	return inTx(ctx, func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		delete(l.attempts, ledgerSlot{consumer, dedupKey})
	})
}

// HoldBack implements idem.Ledger. Holding a key that is already held
// moves the hold to letterID. Returns an error matching
// idem.ErrInvalidArgument when consumer, key or letterID is empty.
func (l *Ledger) HoldBack(ctx context.Context, consumer, key, letterID string) error {
	if err := checkLedger(ctx, consumer, "key", key); err != nil {
		return err
	}
	if letterID == "" {
		return &idem.ArgumentError{Field: "letterID", Reason: "must not be empty"}
	}
	return inTx(ctx, func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.holds[ledgerSlot{consumer, key}] = letterID
	})
}

// HeldBack implements idem.Ledger.
func (l *Ledger) HeldBack(ctx context.Context, consumer, key string) (string, bool, error) {
	if err := checkLedger(ctx, consumer, "key", key); err != nil {
		return "", false, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	id, held := l.holds[ledgerSlot{consumer, key}]
	return id, held, nil
}

// HeldBackKeys implements idem.BatchLedger.
func (l *Ledger) HeldBackKeys(ctx context.Context, consumer string, keys []string) (map[string]string, error) {
	for _, k := range keys {
		if err := checkLedger(ctx, consumer, "key", k); err != nil {
			return nil, err
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	held := make(map[string]string)
	for _, k := range keys {
		if id, ok := l.holds[ledgerSlot{consumer, k}]; ok {
			held[k] = id
		}
	}
	return held, nil
}

// Park implements idem.Ledger: m is kept under its Key. A message whose ID
// is already parked keeps its first copy and place. Returns an error
// matching idem.ErrInvalidArgument when consumer or m.Key is empty or m
// does not validate.
func (l *Ledger) Park(ctx context.Context, consumer string, m idem.Message) error {
	if err := m.Validate(); err != nil {
		return err
	}
	if err := checkLedger(ctx, consumer, "Message.Key", m.Key); err != nil {
		return err
	}
	m = copyMessage(m)
	return inTx(ctx, func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		s := ledgerSlot{consumer, m.Key}
		if slices.ContainsFunc(l.parked[s], func(p idem.Message) bool { return p.ID == m.ID }) {
			return
		}
		l.parked[s] = append(l.parked[s], m)
	})
}

// LetGo implements idem.Ledger. Letting go of a key that is not held, with
// nothing parked, returns nothing and no error. When the write joins a Tx,
// it removes, at commit, the messages it returned: any parked meanwhile stay
// parked.
func (l *Ledger) LetGo(ctx context.Context, consumer, key string) ([]idem.Message, error) {
	if err := checkLedger(ctx, consumer, "key", key); err != nil {
		return nil, err
	}
	s := ledgerSlot{consumer, key}
	l.mu.Lock()
	defer l.mu.Unlock()
	var msgs []idem.Message
	for _, m := range l.parked[s] {
		msgs = append(msgs, copyMessage(m))
	}
	tx, ok := TxFromContext(ctx)
	if !ok {
		l.letGo(s, msgs)
		return msgs, nil
	}
	err := tx.OnCommit(func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.letGo(s, msgs)
	})
	if err != nil {
		return nil, err
	}
	return msgs, nil
}

// letGo clears the hold on s and removes msgs from those parked there.
// l.mu is held.
func (l *Ledger) letGo(s ledgerSlot, msgs []idem.Message) {
	delete(l.holds, s)
	rest := slices.DeleteFunc(l.parked[s], func(p idem.Message) bool {
		return slices.ContainsFunc(msgs, func(m idem.Message) bool { return m.ID == p.ID })
	})
	if len(rest) == 0 {
		delete(l.parked, s)
	} else {
		l.parked[s] = rest
	}
}
