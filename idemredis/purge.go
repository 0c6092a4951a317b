package idemredis

import (
	"context"
	"strconv"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/idem-go/idem"
)

// Purge implements idem.Store. limit must be positive.
//
// Redis evicts records by itself: each one carries a PEXPIRE a little past
// the moment it stops counting, so normally Purge finds nothing to do.
// It exists for the contract (and for stores whose injected clock runs ahead
// of real time, as in tests): it walks the store's records with SCAN, a
// page at a time (on every master of a cluster), reads each page's times in
// one pipelined round trip, and deletes each record that looks dead with a
// script that checks again and deletes atomically, so a record claimed
// anew or taken over in between is kept. Each SCAN step is short, so Purge
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
	now := s.now()
	ref, err := s.referenceTime(ctx, now)
	if err != nil {
		return 0, err
	}
	nodes, err := s.scanners(ctx)
	if err != nil {
		return 0, err
	}
	pattern := recordPattern(s.prefix)
	n := 0
	for _, node := range nodes {
		var cursor uint64
		for {
			keys, next, err := node.Scan(ctx, cursor, pattern, scanCount).Result()
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
				sk, ok := seqKeyOf(s.prefix, k)
				if !ok {
					continue
				}
				d, err := purgeScript.Run(ctx, s.client, []string{k, sk}, now).Int()
				if err != nil {
					return n, fail("purge", err)
				}
				n += d
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
	t, err := s.client.Time(ctx).Result()
	if err != nil {
		return 0, fail("purge: reading the server time", err)
	}
	return t.UnixMicro(), nil
}

type scanner interface {
	Scan(ctx context.Context, cursor uint64, match string, count int64) *redis.ScanCmd
}

// scanners returns what Purge runs SCAN on: every master of a cluster (a
// cluster client's own SCAN reaches only one node), or the client itself.
func (s *Store) scanners(ctx context.Context) ([]scanner, error) {
	cc, ok := s.client.(*redis.ClusterClient)
	if !ok {
		return []scanner{s.client}, nil
	}
	var (
		mu    sync.Mutex
		nodes []scanner
	)
	err := cc.ForEachMaster(ctx, func(_ context.Context, c *redis.Client) error {
		mu.Lock()
		defer mu.Unlock()
		nodes = append(nodes, c)
		return nil
	})
	if err != nil {
		return nil, fail("purge: listing the cluster's masters", err)
	}
	return nodes, nil
}

// deadKeys returns those of keys whose record is dead at ref: its TTL has
// passed and no live lease holds it. It reads only the start of each value
// (a record's body may be large). Keys that are not records (someone else's
// keys under the prefix) are skipped.
func (s *Store) deadKeys(ctx context.Context, keys []string, ref int64) ([]string, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	pipe := s.client.Pipeline()
	cmds := make([]*redis.StringCmd, len(keys))
	for i, k := range keys {
		cmds[i] = pipe.GetRange(ctx, k, 0, headerReadLen-1)
	}
	// Exec reports the first failed command; each is checked below.
	_, _ = pipe.Exec(ctx)
	var dead []string
	for i, cmd := range cmds {
		v, err := cmd.Result()
		switch {
		case redis.HasErrorPrefix(err, "WRONGTYPE"):
			continue
		case err != nil:
			return nil, fail("purge: reading records", err)
		}
		h, err := parseHeader(v, false)
		if err != nil {
			continue // gone since the SCAN (empty), or not a record
		}
		if !h.liveAt(ref) {
			dead = append(dead, keys[i])
		}
	}
	return dead, nil
}
