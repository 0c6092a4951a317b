package idemredis

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/rueidis"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/secreturl"
)

// ErrNotReplicated is the error (under the method's own) of a write that
// the master made but fewer replicas than ReplicaConfig.Replicas confirmed
// within ReplicaConfig.Timeout. It is an ambiguous failure like a dropped
// connection (see "Ambiguous failures" in the package documentation): the
// write stands on the master and may survive a failover or not, so a Claim
// that fails with it must not run the effect, and a retry is safe.
var ErrNotReplicated = errors.New("idemredis: the write did not reach enough replicas in time")

// ReplicaConfig makes a Store wait, after each write, until replicas have
// it (Redis's WAIT), so that a failover to one of them cannot lose a claim
// or a completion the Store reported. The zero value waits for one replica
// for at most 100ms.
type ReplicaConfig struct {
	// Replicas is how many replicas of the key's master must confirm a
	// write before the Store reports it. Defaults to 1.
	Replicas int
	// Timeout bounds each wait; a write not confirmed by then fails with
	// ErrNotReplicated. Defaults to 100ms.
	Timeout time.Duration
}

// Defaults of ReplicaConfig.
const (
	defaultReplicaAcks    = 1
	defaultReplicaTimeout = 100 * time.Millisecond
)

// OpenReplicated is Open for a replicated Redis (a Redis Cluster, or a
// master with replicas behind Sentinel): every write the Store makes is
// followed, on the same connection, by WAIT, and reported only once
// rc.Replicas replicas have it. cfg and rc may be nil.
//
// A new key's claim, a takeover, a completion and a release are writes; a
// claim that finds the record already there (a duplicate in flight, a
// replay, a mismatch) writes nothing and waits for nothing. Each write
// then costs one more round trip's worth of time, the master's to its
// replica and back; run Redis with min-replicas-to-write too, so that a
// master cut off from its replicas refuses writes at once rather than after
// the timeout.
func OpenReplicated(ctx context.Context, rawURL string, cfg *Config, rc *ReplicaConfig) (*Store, error) {
	acks, timeout, err := replicaSettings(rc)
	if err != nil {
		return nil, err
	}
	opt, err := rueidis.ParseURL(rawURL)
	if err != nil {
		return nil, fmt.Errorf("idemredis: invalid Redis URL (want redis://[user:password@]host[:port][/db] or rediss://...): %w", secreturl.Scrub(redactURLError(err), rawURL))
	}
	opt.DisableCache = true
	client, err := rueidis.NewClient(opt)
	if err != nil {
		return nil, fmt.Errorf("idemredis: connecting to Redis: %w", secreturl.Scrub(err, rawURL))
	}
	s, err := NewReplicatedRueidisStore(ctx, client, cfg, &ReplicaConfig{Replicas: acks, Timeout: timeout})
	if err != nil {
		client.Close()
		return nil, err
	}
	s.owned = true
	return s, nil
}

// NewReplicatedRueidisStore is NewRueidisStore with every write confirmed by
// replicas, as OpenReplicated describes. The caller keeps owning client.
// cfg and rc may be nil.
func NewReplicatedRueidisStore(ctx context.Context, client rueidis.Client, cfg *Config, rc *ReplicaConfig) (*Store, error) {
	if client == nil {
		return nil, &idem.ArgumentError{Field: "client", Reason: "must not be nil"}
	}
	acks, timeout, err := replicaSettings(rc)
	if err != nil {
		return nil, err
	}
	return newStore(ctx, &replicaConn{
		rueidisConn: rueidisConn{c: client},
		acks:        int64(acks),
		timeoutMs:   max(1, timeout.Milliseconds()),
	}, cfg)
}

// replicaSettings applies rc's defaults and checks them.
func replicaSettings(rc *ReplicaConfig) (acks int, timeout time.Duration, err error) {
	acks, timeout = defaultReplicaAcks, defaultReplicaTimeout
	if rc != nil {
		if rc.Replicas < 0 {
			return 0, 0, &idem.ArgumentError{Field: "Replicas", Reason: "must not be negative"}
		}
		if rc.Timeout < 0 {
			return 0, 0, &idem.ArgumentError{Field: "Timeout", Reason: "must not be negative"}
		}
		if rc.Replicas > 0 {
			acks = rc.Replicas
		}
		if rc.Timeout > 0 {
			timeout = rc.Timeout
		}
	}
	return acks, timeout, nil
}

// replicaConn is a rueidisConn whose writes are each followed by WAIT on
// the connection that carried them. WAIT counts the replicas that have
// every write the connection sent before it, so the two must share one
// connection: a dedicated one, on the key's master in a cluster, rather
// than rueidis's shared pipeline (which would make the WAIT block every
// other caller's commands) or its pool of connections for blocking commands
// (on which WAIT would count none of this write).
type replicaConn struct {
	rueidisConn
	acks      int64
	timeoutMs int64
}

// doAcked sends cmd then WAIT on one dedicated connection, and returns
// cmd's result and, when the reply shows a write (wrote says so), an error
// unless enough replicas confirmed it.
func (r *replicaConn) doAcked(ctx context.Context, cmd rueidis.Completed, wrote func(rueidis.RedisResult) bool) (rueidis.RedisResult, error) {
	var res, ack rueidis.RedisResult
	err := r.c.Dedicated(func(dc rueidis.DedicatedClient) error {
		rs := dc.DoMulti(ctx, cmd, dc.B().Wait().Numreplicas(r.acks).Timeout(r.timeoutMs).Build())
		res, ack = rs[0], rs[1]
		return nil
	})
	if err != nil {
		return res, err
	}
	if rerr := res.Error(); (rerr != nil && !rueidis.IsRedisNil(rerr)) || !wrote(res) {
		return res, nil
	}
	n, err := ack.AsInt64()
	if err != nil {
		return res, fmt.Errorf("WAIT: %w", err)
	}
	if n < r.acks {
		return res, fmt.Errorf("%w: %d of %d replicas within %dms", ErrNotReplicated, n, r.acks, r.timeoutMs)
	}
	return res, nil
}

// always reports a write whatever the reply: the scripts' replies do not
// say whether they wrote.
func always(rueidis.RedisResult) bool { return true }

func (r *replicaConn) setNXGet(ctx context.Context, key, value string, ms int64) (string, bool, error) {
	cmd := r.c.B().Set().Key(key).Value(value).Nx().Get().PxMilliseconds(ms).Build()
	// The key was set only when the reply is nil (it was absent).
	res, err := r.doAcked(ctx, cmd, func(res rueidis.RedisResult) bool { return rueidis.IsRedisNil(res.Error()) })
	v, rerr := res.ToString()
	switch {
	case rueidis.IsRedisNil(rerr):
		return "", false, err
	case rerr != nil:
		return "", false, rerr
	}
	return v, true, err
}

func (r *replicaConn) setIfEq(ctx context.Context, key, value, old string) (bool, error) {
	cmd := r.c.B().Set().Key(key).Value(value).Ifeq(old).Keepttl().Build()
	res, err := r.doAcked(ctx, cmd, func(res rueidis.RedisResult) bool { return res.Error() == nil })
	switch rerr := res.Error(); {
	case rueidis.IsRedisNil(rerr):
		return false, nil
	case rerr != nil:
		return false, rerr
	}
	return err == nil, err
}

// eval runs sc by EVALSHA, and by EVAL when Redis has lost it, each
// followed by WAIT.
func (r *replicaConn) eval(ctx context.Context, sc *script, keys, args []string) (rueidis.RedisResult, error) {
	res, err := r.doAcked(ctx, r.evalsha(sc, keys, args), always)
	if isNoScript(res.Error()) {
		res, err = r.doAcked(ctx, r.evalSource(sc, keys, args), always)
	}
	return res, err
}

func (r *replicaConn) evalText(ctx context.Context, sc *script, keys []string, a ...string) (string, error) {
	res, err := r.eval(ctx, sc, keys, a)
	v, rerr := res.ToString()
	switch {
	case rueidis.IsRedisNil(rerr):
		return "", errNilReply
	case rerr != nil:
		return "", rerr
	}
	return v, err
}

func (r *replicaConn) evalInt(ctx context.Context, sc *script, keys []string, a ...string) (int64, error) {
	res, err := r.eval(ctx, sc, keys, a)
	v, rerr := res.AsInt64()
	switch {
	case rueidis.IsRedisNil(rerr):
		return 0, errNilReply
	case rerr != nil:
		return 0, rerr
	}
	return v, err
}
