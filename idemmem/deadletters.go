package idemmem

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"

	"github.com/idem-go/idem"
)

// DeadLettersConfig configures DeadLetters. The zero value is ready to use.
type DeadLettersConfig struct {
	// Clock stamps the events of a letter's history. Defaults to
	// idem.SystemClock.
	Clock idem.Clock
}

// DeadLetters is an in-memory idem.DeadLetters. Letters are never removed:
// a resolved letter stays, in its new state, with its history. Add joins the
// Tx in its context (see Transact); Resolve applies at once, because its
// check of the letter's state and its change must not be split by another
// Resolve. Letters are handed out as deep copies. The zero DeadLetters is
// not usable; call NewDeadLetters.
type DeadLetters struct {
	clock idem.Clock

	mu      sync.Mutex
	lastID  int64
	letters map[string]*storedLetter
}

var _ idem.DeadLetters = (*DeadLetters)(nil)

type storedLetter struct {
	dl idem.DeadLetter
	// seq is the order of Add, which breaks ties between letters that
	// failed last at the same time: the later added comes first.
	seq int64
}

// NewDeadLetters returns an empty DeadLetters. cfg may be nil.
func NewDeadLetters(cfg *DeadLettersConfig) *DeadLetters {
	var c DeadLettersConfig
	if cfg != nil {
		c = *cfg
	}
	if c.Clock == nil {
		c.Clock = idem.SystemClock{}
	}
	return &DeadLetters{clock: c.Clock, letters: make(map[string]*storedLetter)}
}

// Add implements idem.DeadLetters. IDs are "dl-1", "dl-2", … in the order
// of Add. The first event of the history is "dead-lettered", by the
// consumer, with the last attempt's error as its reason.
//
// Returns an error matching idem.ErrInvalidArgument when dl has no
// Consumer, its Message does not validate, or its Class is neither
// idem.DeadPermanent nor idem.DeadExhausted.
func (d *DeadLetters) Add(ctx context.Context, dl idem.DeadLetter) (string, error) {
	switch {
	case dl.Consumer == "":
		return "", &idem.ArgumentError{Field: "DeadLetter.Consumer", Reason: "must not be empty"}
	case dl.Class != idem.DeadPermanent && dl.Class != idem.DeadExhausted:
		return "", &idem.ArgumentError{Field: "DeadLetter.Class", Reason: fmt.Sprintf("%q is neither %q nor %q", dl.Class, idem.DeadPermanent, idem.DeadExhausted)}
	}
	if err := dl.Message.Validate(); err != nil {
		return "", err
	}
	if err := ctx.Err(); err != nil {
		return "", err
	}
	now := d.clock.Now()
	d.mu.Lock()
	d.lastID++
	seq := d.lastID
	d.mu.Unlock()
	id := "dl-" + strconv.FormatInt(seq, 10)

	dl = copyLetter(dl)
	dl.ID = id
	dl.State = idem.LetterDead
	dl.History = []idem.LetterEvent{{
		At:     now,
		Actor:  dl.Consumer,
		Action: "dead-lettered",
		Reason: dl.LastError(),
		State:  idem.LetterDead,
	}}
	err := inTx(ctx, func() {
		d.mu.Lock()
		defer d.mu.Unlock()
		d.letters[id] = &storedLetter{dl: dl, seq: seq}
	})
	if err != nil {
		return "", err
	}
	return id, nil
}

// Get implements idem.DeadLetters.
func (d *DeadLetters) Get(ctx context.Context, id string) (idem.DeadLetter, error) {
	if err := ctx.Err(); err != nil {
		return idem.DeadLetter{}, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.letters[id]
	if s == nil {
		return idem.DeadLetter{}, fmt.Errorf("dead letter %q: %w", id, idem.ErrNotFound)
	}
	return copyLetter(s.dl), nil
}

// List implements idem.DeadLetters. Letters that failed last at the same
// time come most recently added first. Returns an error matching
// idem.ErrInvalidArgument when f.Limit is negative.
func (d *DeadLetters) List(ctx context.Context, f idem.DeadLetterFilter) ([]idem.DeadLetter, error) {
	if f.Limit < 0 {
		return nil, &idem.ArgumentError{Field: "DeadLetterFilter.Limit", Reason: "must not be negative"}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	var found []*storedLetter
	for _, s := range d.letters {
		l := &s.dl
		if (f.Consumer != "" && l.Consumer != f.Consumer) ||
			(f.Class != "" && l.Class != f.Class) ||
			(f.State != "" && l.State != f.State) ||
			(!f.Since.IsZero() && l.LastFailedAt.Before(f.Since)) {
			continue
		}
		found = append(found, s)
	}
	slices.SortFunc(found, func(a, b *storedLetter) int {
		if c := b.dl.LastFailedAt.Compare(a.dl.LastFailedAt); c != 0 {
			return c
		}
		return cmp.Compare(b.seq, a.seq)
	})
	if f.Limit > 0 && len(found) > f.Limit {
		found = found[:f.Limit]
	}
	out := make([]idem.DeadLetter, len(found))
	for i, s := range found {
		out[i] = copyLetter(s.dl)
	}
	return out, nil
}

// Resolve implements idem.DeadLetters. ev.State is set to to, and a zero
// ev.At to the clock's time.
//
// Returns an error matching idem.ErrInvalidTransition when to is
// idem.LetterDead or the letter is no longer dead, and one matching
// idem.ErrInvalidArgument when to is not a state at all.
func (d *DeadLetters) Resolve(ctx context.Context, id string, to idem.LetterState, ev idem.LetterEvent) (idem.DeadLetter, error) {
	switch to {
	case idem.LetterRedriven, idem.LetterDiscarded:
	case idem.LetterDead:
		return idem.DeadLetter{}, fmt.Errorf("dead letter %q: to %s: %w", id, to, idem.ErrInvalidTransition)
	default:
		return idem.DeadLetter{}, &idem.ArgumentError{Field: "state", Reason: fmt.Sprintf("%q is not a dead-letter state", to)}
	}
	if err := ctx.Err(); err != nil {
		return idem.DeadLetter{}, err
	}
	if ev.At.IsZero() {
		ev.At = d.clock.Now()
	}
	ev.State = to
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.letters[id]
	switch {
	case s == nil:
		return idem.DeadLetter{}, fmt.Errorf("dead letter %q: %w", id, idem.ErrNotFound)
	case s.dl.State != idem.LetterDead:
		return idem.DeadLetter{}, fmt.Errorf("dead letter %q: %s to %s: %w", id, s.dl.State, to, idem.ErrInvalidTransition)
	}
	s.dl.State = to
	s.dl.History = append(s.dl.History, ev)
	return copyLetter(s.dl), nil
}

// Stats implements idem.DeadLetters, in order of consumer name.
func (d *DeadLetters) Stats(ctx context.Context) ([]idem.DeadLetterStats, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	by := make(map[string]*idem.DeadLetterStats)
	for _, s := range d.letters {
		if s.dl.State != idem.LetterDead {
			continue
		}
		st := by[s.dl.Consumer]
		if st == nil {
			st = &idem.DeadLetterStats{Consumer: s.dl.Consumer, Oldest: s.dl.FirstFailedAt}
			by[s.dl.Consumer] = st
		}
		st.Count++
		if s.dl.FirstFailedAt.Before(st.Oldest) {
			st.Oldest = s.dl.FirstFailedAt
		}
	}
	out := make([]idem.DeadLetterStats, 0, len(by))
	for _, st := range by {
		out = append(out, *st)
	}
	slices.SortFunc(out, func(a, b idem.DeadLetterStats) int { return cmp.Compare(a.Consumer, b.Consumer) })
	return out, nil
}

// copyLetter returns a copy of dl that shares no memory with it.
func copyLetter(dl idem.DeadLetter) idem.DeadLetter {
	dl.Message = copyMessage(dl.Message)
	dl.Attempts = slices.Clone(dl.Attempts)
	dl.History = slices.Clone(dl.History)
	return dl
}
