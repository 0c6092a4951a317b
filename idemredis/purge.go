package idemredis

import (
	"context"
	"strconv"

	"github.com/idem-go/idem"
)

// Purge implements idem.Store. limit must be positive.
//
// Redis evicts records by itself: each one carries a PEXPIRE a little past
// the moment it stops counting, so normally Purge finds nothing to do.
// It exists for the contract (and for stores whose injected clock runs ahead
// of real time, as in tests): it walks the store's records with SCAN, a
// page at a time (on every master of a cluster), reads each page's times in
// one pipelined round trip, and replaces each record that looks dead by its
// tombstone (record.go) with a script that checks again atomically, so a
// record claimed anew or taken over in between is kept. Each SCAN step is short, so Purge
// never blocks Redis for long; but each call walks the whole prefix until it
// has deleted limit records, so its cost grows with the number of live
// records.
//
// An error may follow a partial purge; calling again is safe.
func (s *Store) Purge(ctx context.Context, limit int) (int, error) {
	if limit <= 0 {
		return 0, &idem.ArgumentError{Field: "limit", Reason: "must be positive"}
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	now := s.scriptNow()
	ref, err := s.referenceTime(ctx, now)
	if err != nil {
		return 0, err
	}
	nodes, err := s.conn.scanners(ctx)
	if err != nil {
		return 0, fail("purge: listing the cluster's masters", err)
	}
	pattern := recordPattern(s.prefix)
	n := 0
	for _, node := range nodes {
		var cursor uint64
		for {
			keys, next, err := node(ctx, cursor, pattern, scanCount)
			if err != nil {
				return n, fail("purge: scanning", err)
			}
			dead, err := s.deadKeys(ctx, keys, ref)
			if err != nil {
				return n, err
			}
			for _, k := range dead {
				if n == limit {
					return n, nil
				}
				d, err := s.conn.evalInt(ctx, purgeScript, []string{k}, now)
				if err != nil {
					return n, fail("purge", err)
				}
				n += int(d)
			}
			if n == limit {
				return n, nil
			}
			if cursor = next; cursor == 0 {
				break
			}
		}
	}
	return n, nil
}

// referenceTime is the time, in µs, against which Purge picks candidates:
// the injected clock's (as the scripts will see it) or the Redis server's.
// The scripts decide for themselves; this only saves a script call for
// each live record.
func (s *Store) referenceTime(ctx context.Context, now string) (int64, error) {
	if now != "" {
		return strconv.ParseInt(now, 10, 64)
	}
	t, err := s.conn.serverTime(ctx)
	if err != nil {
		return 0, fail("purge: reading the server time", err)
	}
	return t.UnixMicro(), nil
}

// deadKeys returns those of keys whose record is dead at ref: its TTL has
// passed and no live lease holds it. It reads only the start of each value
// (a record's body may be large). Keys that are not records (someone else's
// keys under the prefix) are skipped.
func (s *Store) deadKeys(ctx context.Context, keys []string, ref int64) ([]string, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	vals, errs := s.conn.getRanges(ctx, keys, headerReadLen-1)
	var dead []string
	for i, v := range vals {
		switch err := errs[i]; {
		case isWrongType(err):
			continue
		case err != nil:
			return nil, fail("purge: reading records", err)
		}
		h, err := parseHeader(v, false)
		if err != nil {
			continue // gone since the SCAN (empty), a tombstone, or not a record
		}
		if !h.liveAt(ref) {
			dead = append(dead, keys[i])
		}
	}
	return dead, nil
}
