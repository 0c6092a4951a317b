package idemredis

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

// conn is what a Store asks of its Redis client: a handful of native
// commands, the scripts, a subscription and the walk Purge makes. Two
// clients implement it, go-redis (NewStore) and rueidis (NewRueidisStore, Open), so
// that the store's logic is written once and the client is a choice of
// speed and of what the caller already has.
type conn interface {
	// setNXGet runs SET key value NX PX ms GET: it returns the value the
	// key held, and false when the key was absent and is now set.
	setNXGet(ctx context.Context, key, value string, ms int64) (old string, existed bool, err error)
	// setIfEq runs SET key value IFEQ old KEEPTTL (Redis 8.4, Valkey 8.1)
	// and reports whether the key was set.
	setIfEq(ctx context.Context, key, value, old string) (bool, error)
	// get runs GET; false when the key is absent.
	get(ctx context.Context, key string) (string, bool, error)
	// serverTime runs TIME.
	serverTime(ctx context.Context) (time.Time, error)
	// evalText runs a script whose reply is a string; errNilReply when it
	// returns false (a nil reply).
	evalText(ctx context.Context, sc *script, keys []string, args ...string) (string, error)
	// evalInt runs a script whose reply is an integer.
	evalInt(ctx context.Context, sc *script, keys []string, args ...string) (int64, error)
	// load loads the scripts on every node.
	load(ctx context.Context, scripts []*script) error
	// probeIfEq sends a SET … IFEQ on key that cannot change anything (the
	// key does not exist) and returns the server's answer: nil when the
	// server knows IFEQ, a Redis error reply when it does not.
	probeIfEq(ctx context.Context, key string) error
	// scanners returns what Purge runs SCAN on: every master of a cluster,
	// or the one server.
	scanners(ctx context.Context) ([]scanFunc, error)
	// getRanges reads bytes [0, end] of each key in one pipelined round
	// trip; errs[i] is the error of keys[i].
	getRanges(ctx context.Context, keys []string, end int64) (vals []string, errs []error)
	// subscribe starts a subscription to channel that outlives any caller
	// and reconnects by itself. onSubscribed is called on each
	// confirmation (the first one, and again after every reconnection),
	// onMessage with each message's payload, both from one goroutine.
	// stop ends the subscription and waits for that goroutine.
	subscribe(channel string, onSubscribed func(), onMessage func(payload string)) (stop func())
	// replication reads INFO replication and min-replicas-to-write from
	// every node the client reaches (Warnings).
	replication(ctx context.Context) ([]nodeReplication, error)
	// close closes the client (only called when the Store owns it).
	close() error
}

// scanFunc runs one SCAN step on one node.
type scanFunc func(ctx context.Context, cursor uint64, match string, count int64) (keys []string, next uint64, err error)

// errNilReply is what conn.evalText returns for a script's nil reply.
var errNilReply = errors.New("idemredis: nil reply")

// script is one Lua script as each client runs it: EVALSHA, falling back
// to EVAL when Redis has lost it (SCRIPT FLUSH, a restart, a failover).
type script struct {
	src string
	sha string // the SHA-1 of src, in hex, which EVALSHA names it by
	gr  *redis.Script
}

func newScript(src string) *script {
	sum := sha1.Sum([]byte(src))
	return &script{src: src, sha: hex.EncodeToString(sum[:]), gr: redis.NewScript(src)}
}

// isRedisError reports whether err is an error reply from Redis (as
// opposed to a network or client error), whichever client gave it.
func isRedisError(err error) bool {
	var gr redis.Error
	if errors.As(err, &gr) {
		return true
	}
	var ru *rueidis.RedisError
	return errors.As(err, &ru) && !rueidis.IsRedisNil(ru)
}

// isWrongType reports whether err is Redis's WRONGTYPE reply.
func isWrongType(err error) bool {
	return err != nil && isRedisError(err) && strings.HasPrefix(err.Error(), "WRONGTYPE")
}
