package idemredis

import (
	"context"
	"encoding/json"
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
	keys := []string{recordKey(s.prefix, req.Scope, req.Key), seqKey(s.prefix, req.Scope)}
	reply, err := claimScript.Run(ctx, s.client, keys,
		s.now(), string(req.Fingerprint), micros(req.Lease), micros(req.TTL), s.channel, evictionSlack.Milliseconds()).Slice()
	if err != nil {
		return idem.Claim{}, fail("claim", err)
	}
	if len(reply) != 2 {
		return idem.Claim{}, fmt.Errorf("idemredis: claim: unexpected reply %v", reply)
	}
	outcome, _ := reply[0].(string)
	fields, _ := reply[1].([]any)
	rec, err := parseRecord(req.Scope, req.Key, fields)
	if err != nil {
		return idem.Claim{}, fmt.Errorf("idemredis: claim: %w", err)
	}
	c := idem.Claim{Record: rec}
	switch outcome {
	case "acquired":
		c.Outcome, c.Token = idem.Acquired, rec.Token
	case "took_over":
		c.Outcome, c.Token, c.TookOver = idem.Acquired, rec.Token, true
	case "in_flight":
		c.Outcome = idem.InFlight
	case "completed":
		c.Outcome = idem.Completed
	case "mismatch":
		c.Outcome = idem.Mismatch
	default:
		return idem.Claim{}, fmt.Errorf("idemredis: claim: unexpected outcome %q", outcome)
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
	header := ""
	if len(resp.Header) > 0 {
		b, err := json.Marshal(resp.Header)
		if err != nil {
			return fmt.Errorf("idemredis: complete: encoding the header: %w", err)
		}
		header = string(b)
	}
	omitted := "0"
	if resp.BodyOmitted {
		omitted = "1"
	}
	ok, err := completeScript.Run(ctx, s.client, []string{recordKey(s.prefix, ref.Scope, ref.Key)},
		s.now(), strconv.FormatInt(int64(ref.Token), 10), resp.Status, header, resp.Body, omitted, s.channel).Int()
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
	ok, err := releaseScript.Run(ctx, s.client, []string{recordKey(s.prefix, ref.Scope, ref.Key)},
		s.now(), strconv.FormatInt(int64(ref.Token), 10), s.channel).Int()
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
	fields, err := getScript.Run(ctx, s.client, []string{recordKey(s.prefix, scope, key)}, s.now()).Slice()
	if err != nil {
		return idem.Record{}, fail("get", err)
	}
	if len(fields) == 0 {
		return idem.Record{}, idem.ErrNotFound
	}
	rec, err := parseRecord(scope, key, fields)
	if err != nil {
		return idem.Record{}, fmt.Errorf("idemredis: get: %w", err)
	}
	return rec, nil
}

// Positions of the values the claim and get scripts return, in the order
// of recordFields in scripts.go.
const (
	fFingerprint = iota
	fState
	fToken
	fCreatedAt
	fLeaseUntil
	fExpiresAt
	fCompletedAt
	fStatus
	fHeader
	fBody
	fBodyOmitted
	numFields
)

// parseRecord builds a Record from the values of recordFields, in order.
// The list may be shorter (a new record has no response fields yet) and
// absent fields are nil.
func parseRecord(scope idem.Scope, key idem.Key, values []any) (idem.Record, error) {
	if len(values) > numFields {
		return idem.Record{}, fmt.Errorf("record has %d fields, want at most %d", len(values), numFields)
	}
	var v [numFields]string
	var present [numFields]bool
	for i, x := range values {
		switch x := x.(type) {
		case nil:
		case string:
			v[i], present[i] = x, true
		default:
			return idem.Record{}, fmt.Errorf("record field %d is a %T, want a string", i, x)
		}
	}
	var perr error
	num := func(i int) int64 {
		n, err := strconv.ParseInt(v[i], 10, 64)
		if err != nil && perr == nil {
			perr = fmt.Errorf("record field %d = %q is not an integer", i, v[i])
		}
		return n
	}
	at := func(i int) time.Time {
		if !present[i] {
			return time.Time{}
		}
		return time.UnixMicro(num(i)).UTC()
	}
	rec := idem.Record{
		Scope:          scope,
		Key:            key,
		Fingerprint:    idem.Fingerprint(v[fFingerprint]),
		Token:          idem.Token(num(fToken)),
		CreatedAt:      at(fCreatedAt),
		LeaseExpiresAt: at(fLeaseUntil),
		ExpiresAt:      at(fExpiresAt),
		CompletedAt:    at(fCompletedAt),
	}
	switch v[fState] {
	case "in_flight":
		rec.State = idem.StateInFlight
	case "completed":
		rec.State = idem.StateCompleted
		resp := &idem.Response{
			Status:      int(num(fStatus)),
			Body:        []byte(v[fBody]),
			BodyOmitted: v[fBodyOmitted] == "1",
		}
		if h := v[fHeader]; h != "" {
			if err := json.Unmarshal([]byte(h), &resp.Header); err != nil {
				return idem.Record{}, fmt.Errorf("record header is not valid JSON: %w", err)
			}
		}
		rec.Response = resp
	default:
		return idem.Record{}, fmt.Errorf("record state %q is unknown", v[fState])
	}
	if perr != nil {
		return idem.Record{}, perr
	}
	return rec, nil
}
