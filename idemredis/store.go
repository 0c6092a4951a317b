package idemredis

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idem-go/idem"
)

// defaultPrefix is the key prefix used when Config.Prefix is empty.
const defaultPrefix = "idem"

// evictionSlack is how long Redis keeps a record after the last moment it
// could count (its TTL or its lease, whichever ends later), so that Redis
// never evicts a record the scripts would still call live, whatever the
// rounding from microseconds to milliseconds.
const evictionSlack = time.Second

// scanCount is the COUNT hint of each SCAN step of Purge: enough keys per
// round trip to be efficient, few enough that a step stays short.
const scanCount = 256

// Config configures a Store. The zero value is ready to use.
type Config struct {
	// Prefix starts every key the store writes. Keys are
	// "<prefix>:{<scope>}:<key>": the (escaped) scope is the Redis Cluster
	// hash tag, so a scope's keys live on one slot. It must not contain '{'
	// or '}'. Stores that share a prefix share their records. Defaults to
	// "idem".
	Prefix string

	// Clock decides lease and TTL expiry. Defaults to nil: the Redis
	// server's clock (TIME, read inside each script) decides, so replicas
	// whose clocks disagree still agree on every lease. Tests inject a
	// manual clock, whose time is passed to the scripts instead.
	Clock idem.Clock
}

// Store is an idem.Store and idem.Waiter kept in Redis. It is safe for
// concurrent use, and any number of Stores, in any number of processes,
// may share one Redis as long as they use the same Prefix. The zero Store is
// not usable; call New or Open.
type Store struct {
	client  redis.UniversalClient
	owned   bool
	prefix  string
	clock   idem.Clock
	channel string
	hub     *hub

	closeOnce sync.Once
	closeErr  error
}

var (
	_ idem.Store  = (*Store)(nil)
	_ idem.Waiter = (*Store)(nil)
)

// New returns a Store on client, which the caller keeps owning (Close does
// not close it). cfg may be nil. New loads the Lua scripts into Redis, so it
// also checks that Redis answers.
//
// client may be a *redis.Client (standalone, or Sentinel failover) or a
// *redis.ClusterClient. A *redis.Ring is refused: its shards do not share
// pub/sub, so a waiter subscribed on one shard would miss the changes
// published on another.
func New(ctx context.Context, client redis.UniversalClient, cfg *Config) (*Store, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.Prefix == "" {
		c.Prefix = defaultPrefix
	}
	switch {
	case client == nil:
		return nil, &idem.ArgumentError{Field: "client", Reason: "must not be nil"}
	case strings.ContainsAny(c.Prefix, "{}"):
		return nil, &idem.ArgumentError{Field: "Prefix", Reason: "must not contain '{' or '}': the scope is the keys' hash tag"}
	}
	if _, ok := client.(*redis.Ring); ok {
		return nil, &idem.ArgumentError{Field: "client", Reason: "a *redis.Ring is not supported: its shards do not share pub/sub; use a *redis.Client or *redis.ClusterClient"}
	}
	// Loading the scripts up front makes the first Claim one round trip
	// like every other (EVALSHA finds the script), and fails early when
	// Redis is unreachable or refuses scripts.
	for _, sc := range allScripts {
		if err := sc.Load(ctx, client).Err(); err != nil {
			return nil, fmt.Errorf("idemredis: loading the Lua scripts: %w", err)
		}
	}
	channel := c.Prefix + ":changes"
	return &Store{
		client:  client,
		prefix:  c.Prefix,
		clock:   c.Clock,
		channel: channel,
		hub:     newHub(client, channel),
	}, nil
}

// Open connects to the Redis at rawURL (redis://[user:password@]host[:port][/db]
// or rediss:// for TLS, with go-redis's query options such as
// dial_timeout) and returns a Store that owns the connection: Close closes
// it. cfg may be nil.
func Open(ctx context.Context, rawURL string, cfg *Config) (*Store, error) {
	opt, err := redis.ParseURL(rawURL)
	if err != nil {
		return nil, fmt.Errorf("idemredis: invalid Redis URL (want redis://[user:password@]host[:port][/db] or rediss://...): %w", redactURLError(err))
	}
	client := redis.NewClient(opt)
	s, err := New(ctx, client, cfg)
	if err != nil {
		client.Close()
		return nil, err
	}
	s.owned = true
	return s, nil
}

// redactURLError drops the URL that a *url.Error repeats, password
// included, and keeps only what is wrong with it.
func redactURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// Close stops the store's pub/sub subscription, waking every WaitChange
// with an error, and closes the client if Open made it. Calling it again
// does nothing.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.hub.close()
		if s.owned {
			if err := s.client.Close(); err != nil {
				s.closeErr = fmt.Errorf("idemredis: closing the client: %w", err)
			}
		}
	})
	return s.closeErr
}

// now is the scripts' ARGV[1]: the injected clock's time in µs, or empty
// for the Redis server's clock.
func (s *Store) now() string {
	if s.clock == nil {
		return ""
	}
	return strconv.FormatInt(s.clock.Now().UnixMicro(), 10)
}

// micros converts a positive duration to whole microseconds, rounding up
// so that a positive duration never becomes zero.
func micros(d time.Duration) int64 {
	return int64((d + time.Microsecond - 1) / time.Microsecond)
}

// fail translates an error from go-redis at the package's edge. redis.Nil
// never means anything to callers here (the scripts always answer), so it
// is reported as the protocol surprise it is rather than leaked.
func fail(op string, err error) error {
	if errors.Is(err, redis.Nil) {
		return fmt.Errorf("idemredis: %s: unexpected nil reply from Redis", op)
	}
	return fmt.Errorf("idemredis: %s: %w", op, err)
}

// Claim implements idem.Store in one round trip: one script either claims
// the key (absent, dead by the store's clock, or in flight under an ended
// lease with the same fingerprint) or returns the record that stops it.
//
// Ambiguous failures: on an error other than an *idem.ArgumentError (a
// timeout, a dropped connection, a cancelled context after the script was
// sent) the script may have run and claimed the key. The caller must not run
// the effect; claiming again is safe: if the lost claim was made, the retry
// sees InFlight until that lease ends and then takes the key over.
func (s *Store) Claim(ctx context.Context, req idem.ClaimRequest) (idem.Claim, error) {
	if err := req.Validate(); err != nil {
		return idem.Claim{}, err
	}
	if err := ctx.Err(); err != nil {
		return idem.Claim{}, err
	}
	lease, ttl := micros(req.Lease), micros(req.TTL)
	// " <lease> <ttl> <fplen> <fingerprint>": a new record after its times
	// (record.go).
	suffix := make([]byte, 0, 64+len(req.Fingerprint))
	suffix = append(suffix, ' ')
	suffix = strconv.AppendInt(suffix, lease, 10)
	suffix = append(suffix, ' ')
	suffix = strconv.AppendInt(suffix, ttl, 10)
	suffix = append(suffix, ' ')
	suffix = strconv.AppendInt(suffix, int64(len(req.Fingerprint)), 10)
	suffix = append(suffix, ' ')
	suffix = append(suffix, req.Fingerprint...)
	// Redis keeps the record until the later of its TTL and its lease has
	// passed, and a little more (evictionSlack), in whole milliseconds.
	lifetime := (max(ttl, lease)+999)/1000 + evictionSlack.Milliseconds()
	reply, err := claimScript.Run(ctx, s.client,
		[]string{recordKey(s.prefix, req.Scope, req.Key), seqKey(s.prefix, req.Scope)},
		s.now(), suffix, lifetime).Text()
	if err != nil {
		return idem.Claim{}, fail("claim", err)
	}
	c, err := claimResult(req, lease, ttl, reply)
	if err != nil {
		return idem.Claim{}, fmt.Errorf("idemredis: claim: %w", err)
	}
	return c, nil
}

// claimResult decodes the claim script's reply (see claimScript).
func claimResult(req idem.ClaimRequest, lease, ttl int64, reply string) (idem.Claim, error) {
	if reply == "" {
		return idem.Claim{}, errors.New("empty reply")
	}
	switch reply[0] {
	case 'a':
		// "a<token> <now>": a new record, made of what the request said.
		sc := fieldReader{s: reply, pos: 1}
		token := sc.int(' ')
		now, err := strconv.ParseInt(reply[sc.pos:], 10, 64)
		if sc.err != nil || err != nil {
			return idem.Claim{}, fmt.Errorf("unexpected reply %q", reply)
		}
		return idem.Claim{
			Outcome: idem.Acquired,
			Token:   idem.Token(token),
			Record: idem.Record{
				Scope:          req.Scope,
				Key:            req.Key,
				Fingerprint:    req.Fingerprint,
				State:          idem.StateInFlight,
				Token:          idem.Token(token),
				CreatedAt:      usTime(now),
				LeaseExpiresAt: usTime(now + lease),
				ExpiresAt:      usTime(now + ttl),
			},
		}, nil
	case 't':
		rec, err := parseRecord(req.Scope, req.Key, reply[1:])
		if err != nil {
			return idem.Claim{}, err
		}
		return idem.Claim{Outcome: idem.Acquired, Token: rec.Token, Record: rec, TookOver: true}, nil
	}
	rec, err := parseRecord(req.Scope, req.Key, reply)
	if err != nil {
		return idem.Claim{}, err
	}
	c := idem.Claim{Record: rec}
	switch {
	case rec.Fingerprint != req.Fingerprint:
		c.Outcome = idem.Mismatch
	case rec.State == idem.StateCompleted:
		c.Outcome = idem.Completed
	default:
		c.Outcome = idem.InFlight
	}
	return c, nil
}

// Complete implements idem.Store: a compare-and-set on the fencing token.
//
// Ambiguous failures: on an error other than idem.ErrLeaseLost the
// response may or may not have been stored. Completing again with the same
// token and response is safe: a completed record accepts it without change.
func (s *Store) Complete(ctx context.Context, ref idem.Ref, resp idem.Response) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	var tok [24]byte
	p := append(strconv.AppendInt(tok[:0], int64(ref.Token), 10), ' ')
	// The encoded response goes to Redis as it is: go-redis writes a []byte
	// argument without copying it again.
	completion := appendCompletion(make([]byte, 0, completionLen(&resp)), &resp)
	ok, err := completeScript.Run(ctx, s.client, []string{recordKey(s.prefix, ref.Scope, ref.Key)},
		s.now(), p, completion).Int()
	if err != nil {
		return fail("complete", err)
	}
	if ok != 1 {
		return idem.ErrLeaseLost
	}
	return nil
}

// Release implements idem.Store: a compare-and-delete on the fencing token.
//
// Ambiguous failures: on an error other than idem.ErrLeaseLost the key may
// or may not have been released. Releasing again is safe: a key already
// gone counts as released.
func (s *Store) Release(ctx context.Context, ref idem.Ref) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	ok, err := releaseScript.Run(ctx, s.client,
		[]string{recordKey(s.prefix, ref.Scope, ref.Key), seqKey(s.prefix, ref.Scope)},
		int64(ref.Token)).Int()
	if err != nil {
		return fail("release", err)
	}
	if ok != 1 {
		return idem.ErrLeaseLost
	}
	return nil
}

// Get implements idem.Store. An error other than idem.ErrNotFound says
// nothing about the record; Get changes nothing, so it may be retried.
func (s *Store) Get(ctx context.Context, scope idem.Scope, key idem.Key) (idem.Record, error) {
	if err := ctx.Err(); err != nil {
		return idem.Record{}, err
	}
	v, err := getScript.Run(ctx, s.client, []string{recordKey(s.prefix, scope, key)}, s.now()).Text()
	if errors.Is(err, redis.Nil) {
		return idem.Record{}, idem.ErrNotFound
	}
	if err != nil {
		return idem.Record{}, fail("get", err)
	}
	rec, err := parseRecord(scope, key, v)
	if err != nil {
		return idem.Record{}, fmt.Errorf("idemredis: get: %w", err)
	}
	return rec, nil
}
