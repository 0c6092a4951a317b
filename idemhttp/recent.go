package idemhttp

import "sync"

// recentKeys remembers the last keys this process saw completed, up to a
// bound, oldest forgotten first: a duplicate of one of them is most likely
// a replay, which one read of the store answers (see Config.RecentKeys).
// Remembering a key that has since expired, or been deleted, costs only
// that read: the request is then claimed as any other.
type recentKeys struct {
	mu   sync.Mutex
	max  int
	set  map[waitKey]struct{}
	ring []waitKey // the keys in set, oldest at next
	next int
}

func newRecentKeys(n int) *recentKeys {
	if n <= 0 {
		return nil
	}
	return &recentKeys{max: n, set: make(map[waitKey]struct{}, min(n, 1024))}
}

// has reports whether k was seen completed lately. A nil recentKeys
// remembers nothing.
func (r *recentKeys) has(k waitKey) bool {
	if r == nil {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.set[k]
	return ok
}

// add remembers k, forgetting the oldest key when full.
func (r *recentKeys) add(k waitKey) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.set[k]; ok {
		return
	}
	r.set[k] = struct{}{}
	if len(r.ring) < r.max {
		r.ring = append(r.ring, k)
		return
	}
	delete(r.set, r.ring[r.next])
	r.ring[r.next] = k
	r.next = (r.next + 1) % r.max
}
