package idemmem

import (
	"bytes"
	"context"
	"slices"
	"sync"
	"time"

	"github.com/idem-go/idem"
)

// Config configures a Store. The zero value is ready to use.
type Config struct {
	// Clock tells the store the time, which decides lease and TTL expiry
	// and seeds fencing tokens. Defaults to idem.SystemClock.
	Clock idem.Clock
}

// Store is an in-memory idem.Store and idem.Waiter. Records live in one
// map behind one mutex: every method runs entirely under the lock, which is
// what makes Claim atomic. The zero Store is not usable; call NewStore.
type Store struct {
	clock idem.Clock

	mu      sync.Mutex
	records map[slot]*entry
	// lastToken is the greatest token issued by this store. Tokens come
	// from it rather than from the record, so they keep increasing after a
	// record is released or purged, even if the clock steps back.
	lastToken idem.Token
}

var (
	_ idem.Store      = (*Store)(nil)
	_ idem.Waiter     = (*Store)(nil)
	_ idem.Recoverer  = (*Store)(nil)
	_ idem.Restarter  = (*Store)(nil)
	_ idem.LocalClock = (*Store)(nil)
)

type slot struct {
	scope idem.Scope
	key   idem.Key
}

type entry struct {
	rec idem.Record
	// changed is closed when the record is completed, taken over or
	// removed, waking every WaitChange on it.
	changed chan struct{}
}

// NewStore returns an empty Store. cfg may be nil.
func NewStore(cfg *Config) *Store {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.Clock == nil {
		c.Clock = idem.SystemClock{}
	}
	return &Store{clock: c.Clock, records: make(map[slot]*entry)}
}

// LeaseClock implements idem.LocalClock: the store decides leases by
// Config.Clock, read as each call runs.
func (s *Store) LeaseClock() idem.Clock { return s.clock }

// now reads Config.Clock without its monotonic reading: the store decides
// leases (and TTLs) by the wall clock, as idemsqlite, which keeps times as
// wall-clock nanoseconds, does, and as keyed counts a lease of a store that
// decides leases by the engine's own clock. Kept with the system clock's
// monotonic reading, a lease would end for the store on the monotonic
// clock, and after a step of the wall clock backward keyed would renew it
// only once the store had ended it.
func (s *Store) now() time.Time { return s.clock.Now().Round(0) }

// live reports whether the record still counts at now: its TTL has not
// passed, or a live lease still holds it (a takeover may push the lease past
// the TTL, and the holder must not lose the key to a newcomer meanwhile), or
// it is in flight with a recovery point (see idem.Recoverer).
func (e *entry) live(now time.Time) bool {
	return now.Before(e.rec.ExpiresAt) || e.leaseLive(now) ||
		(e.rec.State == idem.StateInFlight && !e.rec.Recovery.IsZero())
}

func (e *entry) leaseLive(now time.Time) bool {
	return e.rec.State == idem.StateInFlight && now.Before(e.rec.LeaseExpiresAt)
}

// signal wakes the waiters of the record's current state.
func (e *entry) signal() {
	close(e.changed)
	e.changed = make(chan struct{})
}

// snapshot returns a copy of the record that shares no memory with the store.
func (e *entry) snapshot() idem.Record {
	r := e.rec
	r.Response = copyResponse(r.Response)
	r.Recovery.Data = bytes.Clone(r.Recovery.Data)
	return r
}

func copyResponse(r *idem.Response) *idem.Response {
	if r == nil {
		return nil
	}
	c := *r
	c.Header = r.Header.Clone()
	c.Body = bytes.Clone(r.Body)
	return &c
}

func (s *Store) nextToken(now time.Time) idem.Token {
	s.lastToken = max(s.lastToken+1, idem.Token(now.UnixNano()))
	return s.lastToken
}

// lookup returns the live entry for k, removing a dead one. s.mu is held.
func (s *Store) lookup(k slot, now time.Time) *entry {
	e := s.records[k]
	if e != nil && !e.live(now) {
		s.remove(k, e)
		return nil
	}
	return e
}

func (s *Store) remove(k slot, e *entry) {
	delete(s.records, k)
	close(e.changed)
}

// Claim implements idem.Store.
func (s *Store) Claim(ctx context.Context, req idem.ClaimRequest) (idem.Claim, error) {
	if err := req.Validate(); err != nil {
		return idem.Claim{}, err
	}
	if err := ctx.Err(); err != nil {
		return idem.Claim{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	k := slot{req.Scope, req.Key}
	e := s.lookup(k, now)
	switch {
	case e == nil:
		e = &entry{
			rec: idem.Record{
				Scope:          req.Scope,
				Key:            req.Key,
				Fingerprint:    req.Fingerprint,
				State:          idem.StateInFlight,
				Token:          s.nextToken(now),
				CreatedAt:      now,
				LeaseExpiresAt: now.Add(req.Lease),
				ExpiresAt:      now.Add(req.TTL),
				Holder:         req.Holder,
			},
			changed: make(chan struct{}),
		}
		s.records[k] = e
		return idem.Claim{Outcome: idem.Acquired, Token: e.rec.Token, Record: e.snapshot()}, nil
	case e.rec.Fingerprint != req.Fingerprint:
		return idem.Claim{Outcome: idem.Mismatch, Record: e.snapshot()}, nil
	case e.rec.State == idem.StateCompleted:
		return idem.Claim{Outcome: idem.Completed, Record: e.snapshot()}, nil
	case e.leaseLive(now):
		return idem.Claim{Outcome: idem.InFlight, Record: e.snapshot()}, nil
	default:
		e.rec.Token = s.nextToken(now)
		e.rec.LeaseExpiresAt = now.Add(req.Lease)
		e.rec.Holder = req.Holder
		e.signal()
		return idem.Claim{Outcome: idem.Acquired, Token: e.rec.Token, Record: e.snapshot(), TookOver: true}, nil
	}
}

// Complete implements idem.Store. It does not look at the lease: a holder
// whose lease ended but whom nobody took over still owns the key.
func (s *Store) Complete(ctx context.Context, ref idem.Ref, resp idem.Response) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.records[slot{ref.Scope, ref.Key}]
	switch {
	case e == nil || e.rec.Token != ref.Token:
		return idem.ErrLeaseLost
	case e.rec.State == idem.StateCompleted:
		return nil
	}
	e.rec.State = idem.StateCompleted
	e.rec.Response = copyResponse(&resp)
	e.rec.CompletedAt = s.now()
	e.signal()
	return nil
}

// Release implements idem.Store. It refuses a key with a recovery point
// (idem.ErrHasRecoveryPoint): see ReleaseWithPoint.
func (s *Store) Release(ctx context.Context, ref idem.Ref) error {
	return s.release(ctx, ref, false)
}

// ReleaseWithPoint implements idem.Recoverer.
func (s *Store) ReleaseWithPoint(ctx context.Context, ref idem.Ref) error {
	return s.release(ctx, ref, true)
}

func (s *Store) release(ctx context.Context, ref idem.Ref, withPoint bool) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	k := slot{ref.Scope, ref.Key}
	e := s.records[k]
	switch {
	case e == nil:
		return nil
	case e.rec.Token != ref.Token || e.rec.State != idem.StateInFlight:
		return idem.ErrLeaseLost
	case !withPoint && !e.rec.Recovery.IsZero():
		return idem.ErrHasRecoveryPoint
	}
	s.remove(k, e)
	return nil
}

// Renew implements idem.Store. Like Complete, it does not look at the
// lease: a holder whose lease ended but whom nobody took over renews it.
func (s *Store) Renew(ctx context.Context, ref idem.Ref, lease time.Duration) (time.Time, error) {
	if lease <= 0 {
		return time.Time{}, &idem.ArgumentError{Field: "lease", Reason: "must be positive"}
	}
	if err := ctx.Err(); err != nil {
		return time.Time{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.held(ref)
	if e == nil {
		return time.Time{}, idem.ErrLeaseLost
	}
	end := s.now().Add(lease)
	e.rec.LeaseExpiresAt = end
	if e.rec.ExpiresAt.Before(end) {
		e.rec.ExpiresAt = end
	}
	return end, nil
}

// YieldEarlier implements idem.Restarter. It walks every record.
func (s *Store) YieldEarlier(ctx context.Context, current idem.Holder) (int, error) {
	if err := validateCurrent(current); err != nil {
		return 0, err
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	n := 0
	for _, e := range s.records {
		h := e.rec.Holder
		if h.Replica != current.Replica || h.Incarnation == current.Incarnation || !e.leaseLive(now) {
			continue
		}
		e.rec.LeaseExpiresAt = now
		e.signal()
		n++
	}
	return n, nil
}

// validateCurrent checks the Holder given to YieldEarlier.
func validateCurrent(h idem.Holder) error {
	if h.IsZero() {
		return &idem.ArgumentError{Field: "current", Reason: "must name a replica and its incarnation"}
	}
	return h.Validate()
}

// Get implements idem.Store.
func (s *Store) Get(ctx context.Context, scope idem.Scope, key idem.Key) (idem.Record, error) {
	if err := ctx.Err(); err != nil {
		return idem.Record{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.records[slot{scope, key}]
	if e == nil || !e.live(s.now()) {
		return idem.Record{}, idem.ErrNotFound
	}
	return e.snapshot(), nil
}

// Purge implements idem.Store. limit must be positive.
func (s *Store) Purge(ctx context.Context, limit int) (int, error) {
	if limit <= 0 {
		return 0, &idem.ArgumentError{Field: "limit", Reason: "must be positive"}
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	n := 0
	for k, e := range s.records {
		if n == limit {
			break
		}
		if !e.live(now) {
			s.remove(k, e)
			n++
		}
	}
	return n, nil
}

// WaitChange implements idem.Waiter. It returns at once when the key is not
// in flight under a live lease (absent, completed, or claimable by takeover),
// since a Claim would then make progress; otherwise it waits until the
// record is completed, released, taken over or purged, or ctx is done. It
// does not wake when a lease merely ends, because the store has no timer on
// its clock: callers bound the wait with ctx.
func (s *Store) WaitChange(ctx context.Context, scope idem.Scope, key idem.Key) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	e := s.records[slot{scope, key}]
	now := s.now()
	if e == nil || !e.live(now) || !e.leaseLive(now) {
		s.mu.Unlock()
		return nil
	}
	changed := e.changed
	s.mu.Unlock()
	select {
	case <-changed:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// SaveRecovery implements idem.Recoverer. The store has no transactions:
// the point is saved at once.
func (s *Store) SaveRecovery(ctx context.Context, ref idem.Ref, rp idem.RecoveryPoint) error {
	if err := rp.Validate(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.held(ref)
	if e == nil {
		return idem.ErrLeaseLost
	}
	e.rec.Recovery = idem.RecoveryPoint{Name: rp.Name, Data: bytes.Clone(rp.Data), SavedAt: s.now()}
	return nil
}

// held returns ref's entry when ref.Token holds it in flight, else nil.
// s.mu is held.
func (s *Store) held(ref idem.Ref) *entry {
	e := s.records[slot{ref.Scope, ref.Key}]
	if e == nil || e.rec.Token != ref.Token || e.rec.State != idem.StateInFlight {
		return nil
	}
	return e
}

// Yield implements idem.Recoverer.
func (s *Store) Yield(ctx context.Context, ref idem.Ref) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.held(ref)
	if e == nil {
		return idem.ErrLeaseLost
	}
	if now := s.now(); e.rec.LeaseExpiresAt.After(now) {
		e.rec.LeaseExpiresAt = now
	}
	e.signal()
	return nil
}

// Abandoned implements idem.Recoverer.
func (s *Store) Abandoned(ctx context.Context, limit int) ([]idem.Record, error) {
	if limit <= 0 {
		return nil, &idem.ArgumentError{Field: "limit", Reason: "must be positive"}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	var out []idem.Record
	for _, e := range s.records {
		if e.rec.State == idem.StateInFlight && !e.rec.Recovery.IsZero() && !e.leaseLive(now) {
			out = append(out, e.snapshot())
		}
	}
	slices.SortFunc(out, func(a, b idem.Record) int { return a.LeaseExpiresAt.Compare(b.LeaseExpiresAt) })
	if len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}
