package idemredis

import (
	"context"
	"slices"
	"strings"

	"github.com/idem-go/idem"
)

// InFlight lists up to limit keys in flight, whether their holder's lease
// has ended or not, oldest lease end first: every execution whose outcome
// is not in the books yet, as an audit of those books wants them (idem
// reconcile). The records carry no recovery point: the Store keeps none
// (see "Recovery points" in the package documentation), so this is what
// idemsqlite's, idempg's and idempgsql's InFlightAtPoints list, without the
// points.
// limit must be positive.
//
// It only reads: SCAN over the store's records (on every master of a
// cluster) and GET of each, judged live by Redis's clock (TIME) or the
// injected one; it runs no script and changes no key, so it may run
// against a replica. It holds every key in flight at once, to sort them:
// as many as the requests running and those stopped, a bounded number. A
// key claimed, completed or released while it walks may be listed or not.
func (s *Store) InFlight(ctx context.Context, limit int) ([]idem.Record, error) {
	if limit <= 0 {
		return nil, &idem.ArgumentError{Field: "limit", Reason: "must be positive"}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	now, err := s.referenceTime(ctx, s.scriptNow())
	if err != nil {
		return nil, fail("in flight: reading the server time", err)
	}
	nodes, err := s.conn.scanners(ctx)
	if err != nil {
		return nil, fail("in flight: listing the cluster's masters", err)
	}
	pattern := recordPattern(s.prefix)
	var out []idem.Record
	for _, node := range nodes {
		var cursor uint64
		for {
			keys, next, err := node(ctx, cursor, pattern, scanCount)
			if err != nil {
				return nil, fail("in flight: scanning", err)
			}
			recs, err := s.inFlightOf(ctx, keys, now)
			if err != nil {
				return nil, err
			}
			out = append(out, recs...)
			if cursor = next; cursor == 0 {
				break
			}
		}
	}
	slices.SortFunc(out, func(a, b idem.Record) int {
		if c := a.LeaseExpiresAt.Compare(b.LeaseExpiresAt); c != 0 {
			return c
		}
		return strings.Compare(string(a.Scope)+"\x00"+string(a.Key), string(b.Scope)+"\x00"+string(b.Key))
	})
	if len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

// inFlightOf returns the records of keys that are in flight and live at
// now. The start of each value is read first (a completed record's body
// may be large), then the whole of those in flight, which end with their
// fingerprint. Keys that are not records (someone else's keys under the
// prefix, a tombstone, a key gone since the SCAN) are skipped.
func (s *Store) inFlightOf(ctx context.Context, keys []string, now int64) ([]idem.Record, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	vals, errs := s.conn.getRanges(ctx, keys, headerReadLen-1)
	var out []idem.Record
	for i, v := range vals {
		switch err := errs[i]; {
		case isWrongType(err):
			continue
		case err != nil:
			return nil, fail("in flight: reading records", err)
		}
		h, err := parseHeader(v, false)
		if err != nil || h.state != stateInFlight || !h.liveAt(now) {
			continue
		}
		scope, key, ok := parseRecordKey(s.prefix, keys[i])
		if !ok {
			continue
		}
		whole, found, err := s.conn.get(ctx, keys[i])
		if err != nil {
			return nil, fail("in flight: reading a record", err)
		}
		if !found {
			continue
		}
		rec, h, err := parseRecordHeader(scope, key, whole)
		if err != nil || rec.State != idem.StateInFlight || !h.liveAt(now) {
			continue // changed since the first read
		}
		out = append(out, rec)
	}
	return out, nil
}

// scopeUnescaper undoes scopeEscaper.
var scopeUnescaper = strings.NewReplacer("%25", "%", "%7B", "{", "%7D", "}")

// parseRecordKey is the inverse of recordKey: the scope and key that a
// record's Redis key names under prefix; false when it names none.
func parseRecordKey(prefix, rk string) (idem.Scope, idem.Key, bool) {
	rest, ok := strings.CutPrefix(rk, prefix+":{")
	if !ok {
		return "", "", false
	}
	tag, key, ok := strings.Cut(rest, "}:")
	if !ok || tag == "" {
		return "", "", false
	}
	if tag == emptyScopeTag {
		return "", idem.Key(key), true
	}
	return idem.Scope(scopeUnescaper.Replace(tag)), idem.Key(key), true
}

// HoldsKeys reports whether any key under the Store's prefix is named as
// the Store names its records' (in flight, completed, or the tombstone of
// a released key), whatever it holds: SCAN until the first, on every
// master of a cluster. An audit that lists the keys in flight (InFlight)
// learns from it whether it reads a prefix in use: none at all is a
// prefix that no Store wrote to within its keys' TTL, such as one that
// differs from the service's, or another database of the server, where
// InFlight finding none in flight tells nothing. It only reads, and
// changes no key.
func (s *Store) HoldsKeys(ctx context.Context) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	nodes, err := s.conn.scanners(ctx)
	if err != nil {
		return false, fail("holds keys: listing the cluster's masters", err)
	}
	pattern := recordPattern(s.prefix)
	for _, node := range nodes {
		var cursor uint64
		for {
			keys, next, err := node(ctx, cursor, pattern, scanCount)
			if err != nil {
				return false, fail("holds keys: scanning", err)
			}
			if len(keys) > 0 {
				return true, nil
			}
			if cursor = next; cursor == 0 {
				break
			}
		}
	}
	return false, nil
}
