package idemhttp

import (
	"sync"
	"time"

	"github.com/idem-go/idem"
)

// recentKeys remembers the last keys this process saw completed, up to a
// bound, oldest forgotten first: a duplicate of one of them is most likely
// a replay, which one read of the store answers (see Config.RecentKeys).
// Remembering a key that has since expired, or been deleted, costs only
// that read: the request is then claimed as any other.
//
// For a while after the completion it also keeps the answer itself (see
// Config.MemoryReplayFor), so that a duplicate reaching this process then
// is answered with no read at all. A completed record does not change
// until it expires, so the kept answer is the one the store would give,
// as long as the record lives: an answer is kept no longer than
// MemoryReplayFor, and never past the record's expiry less
// MemoryReplayFor, which leaves that much room for the difference between
// the store's clock and this process's.
type recentKeys struct {
	clock    idem.Clock
	keepFor  time.Duration // 0: no answers kept
	maxBytes int

	mu      sync.Mutex
	entries map[waitKey]*recentKey
	// fifo holds the keys of entries, oldest at head, in a ring of
	// cap(fifo) = the most keys remembered.
	fifo  []waitKey
	head  int
	n     int
	bytes int // the sizes of the answers kept
}

// recentKey is one key remembered: with its answer while that is kept.
type recentKey struct {
	fp    idem.Fingerprint
	resp  *idem.Response // nil: only the key is remembered
	until time.Time      // the answer is kept before it
	size  int
}

// newRecentKeys remembers up to n keys (none when n <= 0), and with
// keepFor > 0 their answers for that long, up to maxBytes of them.
func newRecentKeys(n int, keepFor time.Duration, maxBytes int, clock idem.Clock) *recentKeys {
	if n <= 0 {
		return nil
	}
	return &recentKeys{clock: clock, keepFor: max(keepFor, 0), maxBytes: maxBytes,
		entries: make(map[waitKey]*recentKey, min(n, 1024)), fifo: make([]waitKey, n)}
}

// lookup reports whether k was seen completed lately, and returns the
// answer kept for it when its request had fingerprint fp and the answer is
// still kept; nil otherwise (the store then answers, a mismatch
// included). A nil recentKeys remembers nothing.
func (r *recentKeys) lookup(k waitKey, fp idem.Fingerprint) (resp *idem.Response, seen bool) {
	if r == nil {
		return nil, false
	}
	now := r.clock.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.entries[k]
	switch {
	case !ok:
		return nil, false
	case e.resp == nil || e.fp != fp:
		return nil, true
	case !now.Before(e.until):
		r.bytes -= e.size
		e.resp, e.size = nil, 0
		return nil, true
	}
	return e.resp, true
}

// keep remembers k, completed with resp for a request of fingerprint fp,
// in a record that expires at expires (by the store's clock). The answer
// is kept when there is time and room for it; resp must not change after.
func (r *recentKeys) keep(k waitKey, fp idem.Fingerprint, resp *idem.Response, expires time.Time) {
	if r == nil {
		return
	}
	var until time.Time
	size := 0
	if resp != nil && r.keepFor > 0 {
		now := r.clock.Now()
		until = now.Add(r.keepFor)
		if last := expires.Add(-r.keepFor); last.Before(until) {
			until = last
		}
		size = answerSize(resp)
		if !now.Before(until) || size > r.maxBytes/64 {
			resp, size = nil, 0
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.entries[k]
	if !ok {
		if r.n == len(r.fifo) {
			r.forgetOldest()
		}
		e = &recentKey{}
		r.entries[k] = e
		r.fifo[(r.head+r.n)%len(r.fifo)] = k
		r.n++
	}
	if resp == nil {
		return // a key remembered keeps the answer it has, if still kept
	}
	r.bytes += size - e.size
	e.fp, e.resp, e.until, e.size = fp, resp, until, size
	for r.bytes > r.maxBytes && r.n > 1 {
		r.forgetOldest()
	}
}

// forgetOldest forgets the oldest key. r.mu is held.
func (r *recentKeys) forgetOldest() {
	k := r.fifo[r.head]
	r.fifo[r.head] = waitKey{}
	r.head = (r.head + 1) % len(r.fifo)
	r.n--
	if e := r.entries[k]; e != nil {
		r.bytes -= e.size
	}
	delete(r.entries, k)
}

// answerSize approximates the memory resp holds.
func answerSize(resp *idem.Response) int {
	n := 64 + len(resp.Body)
	for k, vs := range resp.Header {
		n += len(k) + 16
		for _, v := range vs {
			n += len(v) + 16
		}
	}
	return n
}
