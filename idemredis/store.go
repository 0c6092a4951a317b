package idemredis

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/secreturl"
)

// defaultPrefix is the key prefix used when Config.Prefix is empty.
const defaultPrefix = "idem"

// evictionSlack is how long Redis keeps a record after the last moment it
// could count (its TTL or its lease, whichever ends later), so that Redis
// never evicts a record the scripts would still call live, whatever the
// rounding from microseconds to milliseconds; and, being far more than the
// error of any clock estimate a process uses, so that every token a key
// had is below any estimate once Redis has expired it (doc.go, "Fencing
// tokens").
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

	// Clock decides lease and TTL expiry. Defaults to nil: Redis's clock.
	// A new key's claim then writes its creation time, token and lease
	// deadline from the process's estimate of Redis's clock (its TIME,
	// measured at NewStore and again every second, offset by the local
	// monotonic clock), which is off by at most half the round trip of the
	// TIME call that measured it (within one round trip; an estimate whose
	// call took over 50ms is not used), so a new key's lease may end that
	// much earlier or later by Redis's clock than Lease says. Everything
	// that decides between holders is judged inside Redis by its own TIME:
	// taking over an ended lease, and every completion and release. So
	// replicas whose clocks disagree still agree on every lease. Tests
	// inject a manual clock, whose time is used for all of it instead.
	Clock idem.Clock
}

// Store is an idem.Store and idem.Waiter kept in Redis. It is safe for
// concurrent use, and any number of Stores, in any number of processes,
// may share one Redis as long as they use the same Prefix. The zero Store is
// not usable; call NewStore, NewRueidisStore or Open.
type Store struct {
	conn    conn
	owned   bool
	prefix  string
	clock   idem.Clock   // injected; nil for Redis's clock
	server  *serverClock // the estimate of Redis's clock when clock is nil
	channel string
	hub     *hub

	// ifeq reports that the server takes SET … IFEQ, so that a
	// completion is a native compare-and-set; held then keeps the
	// in-flight record of each claim this process holds, the value IFEQ
	// compares with.
	ifeq atomic.Bool
	held heldRecords

	closeOnce sync.Once
	closeErr  error
}

var (
	_ idem.Store  = (*Store)(nil)
	_ idem.Waiter = (*Store)(nil)
)

// NewStore returns a Store on a go-redis client, which the caller keeps owning
// (Close does not close it). cfg may be nil. NewStore loads the Lua scripts into
// Redis, so it also checks that Redis answers; it reads Redis's clock, and
// whether the server takes SET … IFEQ.
//
// client may be a *redis.Client (standalone, or Sentinel failover) or a
// *redis.ClusterClient. A *redis.Ring is refused: its shards do not share
// pub/sub, so a waiter subscribed on one shard would miss the changes
// published on another.
func NewStore(ctx context.Context, client redis.UniversalClient, cfg *Config) (*Store, error) {
	if client == nil {
		return nil, &idem.ArgumentError{Field: "client", Reason: "must not be nil"}
	}
	if _, ok := client.(*redis.Ring); ok {
		return nil, &idem.ArgumentError{Field: "client", Reason: "a *redis.Ring is not supported: its shards do not share pub/sub; use a *redis.Client or *redis.ClusterClient"}
	}
	return newStore(ctx, goredisConn{client}, cfg)
}

// NewRueidisStore returns a Store on a rueidis client (standalone, Sentinel or
// cluster), which the caller keeps owning (Close does not close it). It is
// NewStore for rueidis, the faster client when many goroutines share the store
// (see the package documentation, "Clients"). cfg may be nil.
func NewRueidisStore(ctx context.Context, client rueidis.Client, cfg *Config) (*Store, error) {
	if client == nil {
		return nil, &idem.ArgumentError{Field: "client", Reason: "must not be nil"}
	}
	return newStore(ctx, rueidisConn{c: client, route: &router{direct: directInFlight}}, cfg)
}

// newStore applies cfg's defaults, checks them, and makes a Store on c.
func newStore(ctx context.Context, c conn, cfg *Config) (*Store, error) {
	var cf Config
	if cfg != nil {
		cf = *cfg
	}
	if cf.Prefix == "" {
		cf.Prefix = defaultPrefix
	}
	if strings.ContainsAny(cf.Prefix, "{}") {
		return nil, &idem.ArgumentError{Field: "Prefix", Reason: "must not contain '{' or '}': the scope is the keys' hash tag"}
	}
	// Loading the scripts up front makes their first call one round trip
	// like every other (EVALSHA finds the script), and fails early when
	// Redis is unreachable or refuses scripts.
	if err := c.load(ctx, allScripts); err != nil {
		return nil, fmt.Errorf("idemredis: loading the Lua scripts: %w", err)
	}
	s := &Store{
		conn:    c,
		prefix:  cf.Prefix,
		clock:   cf.Clock,
		channel: cf.Prefix + ":changes",
	}
	// A server without IFEQ answers the probe with a syntax error; one
	// with it compares the absent probe key and changes nothing.
	switch err := c.probeIfEq(ctx, cf.Prefix+":ifeq-probe"); {
	case err == nil:
		s.ifeq.Store(true)
	case !isRedisError(err):
		return nil, fmt.Errorf("idemredis: probing for SET IFEQ: %w", err)
	}
	if s.clock == nil {
		s.server = newServerClock(time.Now, c.serverTime)
		if err := s.server.start(ctx); err != nil {
			return nil, fmt.Errorf("idemredis: reading the Redis server's clock: %w", err)
		}
	}
	s.hub = newHub(c, s.channel)
	return s, nil
}

// Open connects to the Redis at rawURL with rueidis (redis://[user:password@]host[:port][/db]
// or rediss:// for TLS, with rueidis's query options such as dial_timeout,
// addr for more cluster nodes, or master_set for Sentinel) and returns a
// Store that owns the connection: Close closes it. cfg may be nil.
func Open(ctx context.Context, rawURL string, cfg *Config) (*Store, error) {
	opt, err := rueidis.ParseURL(rawURL)
	if err != nil {
		return nil, fmt.Errorf("idemredis: invalid Redis URL (want redis://[user:password@]host[:port][/db] or rediss://...): %w", secreturl.Scrub(redactURLError(err), rawURL))
	}
	// The store never uses client-side caching, whose tracking would cost
	// Redis work on every read.
	opt.DisableCache = true
	// Commands go on connections of their own until many are in flight,
	// and then on the shared pipeline (see router).
	opt.DisableAutoPipelining = true
	client, err := rueidis.NewClient(opt)
	if err != nil {
		return nil, fmt.Errorf("idemredis: connecting to Redis: %w", secreturl.Scrub(err, rawURL))
	}
	s, err := NewRueidisStore(ctx, client, cfg)
	if err != nil {
		client.Close()
		return nil, err
	}
	s.owned = true
	return s, nil
}

// redactURLError drops the URL that a *url.Error repeats, secrets
// included, and keeps only what is wrong with it; rueidis's other errors
// may quote parts of the URL, which Open scrubs.
func redactURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// Close stops the store's pub/sub subscription, waking every WaitChange
// with an error, stops the refreshing of its clock estimate, and closes the
// client if Open made it. Calling it again does nothing.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.hub.close()
		if s.server != nil {
			s.server.close()
		}
		if s.owned {
			if err := s.conn.close(); err != nil {
				s.closeErr = fmt.Errorf("idemredis: closing the client: %w", err)
			}
		}
	})
	return s.closeErr
}

// now is the store's time in µs as the process knows it: the injected
// clock's, or the estimate of Redis's; false when there is no estimate
// good enough to use, and a script must read TIME.
func (s *Store) now() (int64, bool) {
	if s.clock != nil {
		return s.clock.Now().UnixMicro(), true
	}
	return s.server.now()
}

// scriptNow is the scripts' ARGV[1]: the injected clock's time in µs, or
// empty for Redis's clock, which the scripts read themselves.
func (s *Store) scriptNow() string {
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

// fail translates a client error at the package's edge. A nil reply never
// means anything to callers here (the scripts always answer), so it is
// reported as the protocol surprise it is rather than leaked.
func fail(op string, err error) error {
	if errors.Is(err, redis.Nil) || errors.Is(err, errNilReply) || rueidis.IsRedisNil(err) {
		return fmt.Errorf("idemredis: %s: unexpected nil reply from Redis", op)
	}
	return fmt.Errorf("idemredis: %s: %w", op, err)
}

// Claim implements idem.Store. A new key's claim is one native command,
// SET … NX PX … GET, writing a record made from the process's estimate of
// Redis's clock; it either sets the key or returns the record already
// there, which decides the claim when it is a mismatch, completed (the
// replay), or in flight under a live lease. Otherwise (a tombstone, a
// record dead or whose lease ended by the estimate) the claim script
// judges by Redis's clock and claims, takes over, or returns the record.
//
// Ambiguous failures: on an error other than an *idem.ArgumentError (a
// timeout, a dropped connection, a cancelled context after the command was
// sent) the key may have been claimed. The caller must not run the effect;
// claiming again is safe: if the lost claim was made, the retry sees
// InFlight until that lease ends and then takes the key over.
func (s *Store) Claim(ctx context.Context, req idem.ClaimRequest) (idem.Claim, error) {
	if err := req.Validate(); err != nil {
		return idem.Claim{}, err
	}
	if err := ctx.Err(); err != nil {
		return idem.Claim{}, err
	}
	lease, ttl := micros(req.Lease), micros(req.TTL)
	rk := recordKey(s.prefix, req.Scope, req.Key)
	suffix := claimSuffix(make([]byte, 0, 64+len(req.Fingerprint)), lease, ttl, req.Fingerprint)
	// Redis keeps the record until the later of its TTL and its lease has
	// passed, and a little more (evictionSlack), in whole milliseconds.
	lifetime := (max(ttl, lease)+999)/1000 + evictionSlack.Milliseconds()
	if now, ok := s.now(); ok {
		rec := string(newRecord(make([]byte, 0, 64+len(suffix)), now, now, suffix))
		old, existed, err := s.conn.setNXGet(ctx, rk, rec, lifetime)
		if err != nil {
			return idem.Claim{}, fail("claim", err)
		}
		if !existed {
			s.hold(rk, now, rec)
			return acquired(req, now, now, lease, ttl), nil
		}
		c, decided, err := decide(req, old, now)
		if err != nil {
			return idem.Claim{}, fmt.Errorf("idemredis: claim: %w", err)
		}
		if decided {
			return c, nil
		}
	}
	reply, err := s.conn.evalText(ctx, claimScript, []string{rk},
		s.scriptNow(), string(suffix), strconv.FormatInt(lifetime, 10))
	if err != nil {
		return idem.Claim{}, fail("claim", err)
	}
	c, err := claimResult(req, lease, ttl, reply)
	if err != nil {
		return idem.Claim{}, fmt.Errorf("idemredis: claim: %w", err)
	}
	if c.Outcome == idem.Acquired && s.ifeq.Load() {
		v := reply[1:] // a takeover's reply is the record
		if !c.TookOver {
			v = string(newRecord(nil, int64(c.Token), c.Record.CreatedAt.UnixMicro(), suffix))
		}
		s.hold(rk, int64(c.Token), v)
	}
	return c, nil
}

// acquired is the claim of a new record, made of what the request said.
func acquired(req idem.ClaimRequest, token, now, lease, ttl int64) idem.Claim {
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
	}
}

// decide decides a claim from the record v that a native claim found, at
// now by the process's clock, when no judge is needed: the record is live
// and refuses the claim (a mismatch, completed, or in flight under a live
// lease). Deciding so from an estimate is safe because none of these runs
// the effect: at worst a lease that has just ended by Redis's clock is
// reported InFlight, and the next claim takes it over. decided is false
// when the claim could succeed (a tombstone; a record dead, or whose lease
// ended, by the estimate): the claim script must judge.
func decide(req idem.ClaimRequest, v string, now int64) (c idem.Claim, decided bool, err error) {
	if v != "" && v[0] == stateTombstone {
		return idem.Claim{}, false, nil
	}
	rec, h, err := parseRecordHeader(req.Scope, req.Key, v)
	if err != nil {
		return idem.Claim{}, false, err
	}
	if !h.liveAt(now) {
		return idem.Claim{}, false, nil
	}
	c = idem.Claim{Record: rec}
	switch {
	case rec.Fingerprint != req.Fingerprint:
		c.Outcome = idem.Mismatch
	case rec.State == idem.StateCompleted:
		c.Outcome = idem.Completed
	case now < h.leased+h.lease:
		c.Outcome = idem.InFlight
	default:
		return idem.Claim{}, false, nil
	}
	return c, true, nil
}

// hold remembers the in-flight record this process wrote for a claim, for
// a completion by SET … IFEQ; only when the server takes IFEQ.
func (s *Store) hold(rk string, token int64, v string) {
	if s.ifeq.Load() {
		s.held.put(rk, token, v)
	}
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
		return acquired(req, token, now, lease, ttl), nil
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
// On a server with SET … IFEQ (Redis 8.4, Valkey 8.1), when this process
// made the claim, it is that native command, comparing with the in-flight
// record the claim wrote; it falls back to the complete script when the
// record has changed since (a waiter flagged it, or another holder took
// it over), and always on older servers.
//
// Ambiguous failures: on an error other than idem.ErrLeaseLost the
// response may or may not have been stored. Completing again with the same
// token and response is safe: a completed record accepts it without change.
func (s *Store) Complete(ctx context.Context, ref idem.Ref, resp idem.Response) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	rk := recordKey(s.prefix, ref.Scope, ref.Key)
	completion := appendCompletion(make([]byte, 0, completionLen(&resp)), &resp)
	if s.ifeq.Load() {
		if old, ok := s.held.take(rk, int64(ref.Token)); ok {
			if now, ok := s.now(); ok {
				v := completedRecord(make([]byte, 0, len(old)+24+len(completion)), old, now, completion)
				set, err := s.conn.setIfEq(ctx, rk, rueidis.BinaryString(v), old)
				switch {
				case err == nil && set:
					return nil
				case err == nil:
					// The record is no longer the one this claim wrote: the
					// script tells a flagged record from a lost lease.
				case isRedisError(err) && strings.Contains(err.Error(), "syntax"):
					// A node without IFEQ after all (a mixed cluster, a
					// failover to an older replica): stop using it.
					s.ifeq.Store(false)
				default:
					return fail("complete", err)
				}
			}
		}
	}
	var tok [24]byte
	p := append(strconv.AppendInt(tok[:0], int64(ref.Token), 10), ' ')
	// The completion time only records when it happened (nothing is judged
	// by it), so the estimate saves the script its TIME call.
	now := s.scriptNow()
	if us, ok := s.now(); ok && s.clock == nil {
		now = strconv.FormatInt(us, 10)
	}
	// The encoded response goes to Redis as it is, without another copy.
	ok, err := s.conn.evalInt(ctx, completeScript, []string{rk},
		now, string(p), rueidis.BinaryString(completion))
	if err != nil {
		return fail("complete", err)
	}
	if ok != 1 {
		return idem.ErrLeaseLost
	}
	return nil
}

// Release implements idem.Store: a compare-and-set on the fencing token,
// which leaves a tombstone in place of the record (see record.go).
//
// Ambiguous failures: on an error other than idem.ErrLeaseLost the key may
// or may not have been released. Releasing again is safe: a key already
// gone counts as released.
func (s *Store) Release(ctx context.Context, ref idem.Ref) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	rk := recordKey(s.prefix, ref.Scope, ref.Key)
	s.held.take(rk, int64(ref.Token))
	ok, err := s.conn.evalInt(ctx, releaseScript, []string{rk},
		s.scriptNow(), strconv.FormatInt(int64(ref.Token), 10))
	if err != nil {
		return fail("release", err)
	}
	if ok != 1 {
		return idem.ErrLeaseLost
	}
	return nil
}

// Renew implements idem.Store: one script, judged by Redis's clock (or
// the injected one), which starts the lease anew at that time if the token
// holds the key in flight, stretches the record's TTL to the lease end if
// it would end before, and keeps the record in Redis at least that long.
// Like Complete, it does not look at the lease: a holder whose lease ended
// but whom nobody took over renews it (so long as Redis still keeps the
// record).
//
// Ambiguous failures: on an error other than idem.ErrLeaseLost or an
// *idem.ArgumentError the lease may or may not have been renewed; renewing
// again is safe.
func (s *Store) Renew(ctx context.Context, ref idem.Ref, lease time.Duration) (time.Time, error) {
	if lease <= 0 {
		return time.Time{}, &idem.ArgumentError{Field: "lease", Reason: "must be positive"}
	}
	if err := ctx.Err(); err != nil {
		return time.Time{}, err
	}
	rk := recordKey(s.prefix, ref.Scope, ref.Key)
	v, err := s.conn.evalText(ctx, renewScript, []string{rk},
		s.scriptNow(), strconv.FormatInt(int64(ref.Token), 10), strconv.FormatInt(micros(lease), 10))
	if errors.Is(err, errNilReply) {
		return time.Time{}, idem.ErrLeaseLost
	}
	if err != nil {
		return time.Time{}, fail("renew", err)
	}
	h, err := parseHeader(v, false)
	if err != nil {
		return time.Time{}, fmt.Errorf("idemredis: renew: %w", err)
	}
	if s.ifeq.Load() {
		// The record a completion by IFEQ compares with is the renewed one.
		if _, ok := s.held.take(rk, int64(ref.Token)); ok {
			s.held.put(rk, int64(ref.Token), v)
		}
	}
	return usTime(h.leased + h.lease), nil
}

// Get implements idem.Store: a GET, judged by the process's clock (a read
// decides nothing between holders), or the get script while the process
// has no usable estimate of Redis's clock. An error other than
// idem.ErrNotFound says nothing about the record; Get changes nothing, so
// it may be retried.
func (s *Store) Get(ctx context.Context, scope idem.Scope, key idem.Key) (idem.Record, error) {
	if err := ctx.Err(); err != nil {
		return idem.Record{}, err
	}
	rk := recordKey(s.prefix, scope, key)
	if now, ok := s.now(); ok {
		v, found, err := s.conn.get(ctx, rk)
		if err != nil {
			return idem.Record{}, fail("get", err)
		}
		if !found || (v != "" && v[0] == stateTombstone) {
			return idem.Record{}, idem.ErrNotFound
		}
		rec, h, err := parseRecordHeader(scope, key, v)
		if err != nil {
			return idem.Record{}, fmt.Errorf("idemredis: get: %w", err)
		}
		if !h.liveAt(now) {
			return idem.Record{}, idem.ErrNotFound
		}
		return rec, nil
	}
	v, err := s.conn.evalText(ctx, getScript, []string{rk}, s.scriptNow())
	if errors.Is(err, errNilReply) {
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

// maxHeld bounds how many in-flight records a Store remembers for IFEQ:
// claims that are never completed nor released (a caller that gave up)
// must not grow it without end. Past it the map starts again empty, and
// the completions of the claims it forgot take the script.
const maxHeld = 1 << 14

// heldRecords maps each claim this process holds (record key, token) to
// the in-flight record it wrote, the value SET … IFEQ compares with.
type heldRecords struct {
	mu sync.Mutex
	m  map[heldKey]string
}

type heldKey struct {
	rk    string
	token int64
}

func (h *heldRecords) put(rk string, token int64, v string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.m == nil || len(h.m) >= maxHeld {
		h.m = make(map[heldKey]string)
	}
	h.m[heldKey{rk, token}] = v
}

func (h *heldRecords) take(rk string, token int64) (string, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	k := heldKey{rk, token}
	v, ok := h.m[k]
	if ok {
		delete(h.m, k)
	}
	return v, ok
}
