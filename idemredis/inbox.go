package idemredis

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idem-go/idem"
)

// Inbox defaults (see InboxConfig).
const (
	defaultInboxLease        = time.Minute
	defaultInboxRetention    = 7 * 24 * time.Hour
	defaultInboxPollInterval = 50 * time.Millisecond
)

// firstPoll is the first wait of a delivery that finds its message in
// flight: short, because the holder of a fast handler is done in a few
// milliseconds; each later wait doubles, up to InboxConfig.PollInterval.
const firstPoll = 2 * time.Millisecond

// releaseTimeout bounds the compare-and-delete that gives a key back after
// fn fails, which runs even when the caller's context is done: without it
// the key would stay claimed until its lease ends.
const releaseTimeout = 5 * time.Second

// inboxDone is the value of a key whose message was processed. The pending
// values start with inboxPending and never equal it.
const (
	inboxDone    = "done"
	inboxPending = "pending:"
)

// InboxConfig configures an Inbox. The zero value is ready to use.
type InboxConfig struct {
	// Prefix starts every key the inbox writes:
	// "<prefix>:inbox:{<consumer>}:<dedupKey>". It must not contain '{' or
	// '}'. An Inbox and a Store may share a prefix: their keys never meet.
	// Defaults to "idem".
	Prefix string

	// Lease is how long a delivery holds its message's key before another
	// delivery of the same message may take it over. It should exceed the
	// handler's longest run: a handler still running when its lease ends
	// may see another delivery run too, and then its own commit is refused
	// (Process returns an error matching idem.ErrLeaseLost) so that the
	// effect still applies once. It also bounds how long a crashed
	// delivery's message waits before a redelivery runs it. Defaults to one
	// minute.
	Lease time.Duration

	// Retention is how long Redis keeps the mark of a processed message.
	// It must exceed the longest time the transport may deliver a message
	// again (its redelivery window, including dead-letter re-drives that
	// reuse the message ID): a message redelivered after its mark expired
	// runs again. Defaults to seven days.
	Retention time.Duration

	// PollInterval is the longest a delivery waits between two looks at a
	// key another delivery holds (a concurrent duplicate): the first wait
	// is 2ms, each next one twice as long, up to PollInterval, and never
	// past the holder's lease. Defaults to 50ms.
	PollInterval time.Duration
}

// Inbox is an idem.Inbox kept in Redis, for consumers whose effects live in
// Redis too (counters, balances, sets), or outside any SQL database. It is
// safe for concurrent use by many goroutines and processes sharing one
// Redis and one Prefix. The zero Inbox is not usable; call NewInbox.
//
// # How a message is processed
//
// Each (consumer, dedupKey) pair is one Redis string at
//
//	<prefix>:inbox:{<consumer>}:<dedupKey>
//
// Process claims it with SET key "pending:<random token>" NX PX <Lease>. A
// key holding "done" means the message was processed: Process returns
// idem.ErrDuplicate without running fn. A key holding another delivery's
// token means that delivery is running fn now: Process waits, polling the
// key (see InboxConfig.PollInterval), until it holds "done"
// (idem.ErrDuplicate) or is gone, because that delivery failed or its
// lease ended, and then claims it again. Polling rather than pub/sub keeps
// the Inbox free of a subscription to run and close; concurrent duplicates
// are rare (a redelivery usually comes after the first delivery's
// acknowledgement timeout), so the extra commands are few.
//
// fn's context carries a redis.Pipeliner, returned by InboxTx, on which fn
// queues its Redis writes. When fn returns nil, Process commits them and
// the mark in one transaction: WATCH key, check that the key still holds
// this delivery's token, then MULTI, fn's commands, SET key "done" PX
// <Retention>, EXEC. When the key changed in between, EXEC applies
// nothing, and Process returns an error matching idem.ErrLeaseLost. When
// fn fails, its queued commands are dropped, the key is deleted if it still
// holds this delivery's token (a compare-and-delete script), and fn's error
// comes back unchanged, so a redelivery runs fn again.
//
// # Sequence numbers
//
// ProcessSequence (idem.SequenceInbox) de-duplicates by aggregate and
// sequence number with the same transaction model: one string per
// (consumer, aggregate) at
//
//	<prefix>:inbox-seq:{<consumer>}:<aggregate>
//
// holds the mark, the highest sequence number committed, as 20 decimal
// digits and with no expiry, and a lease at
// "<prefix>:inbox-seq-lease:{<consumer>}:<aggregate>" lets one delivery of
// the aggregate at a time run fn; the mark commits with fn's commands in
// one MULTI/EXEC. See ProcessSequence. The limits below hold for it too.
//
// # Limits
//
// Effects outside Redis (an HTTP call, a row in another database, an
// e-mail) are at least once, not exactly once: the mark commits after them,
// so a crash between such an effect and the commit runs fn again once the
// lease has ended. Pass dedupKey on as the idempotency key of such calls.
//
// Queued commands run at EXEC, after fn has returned: fn cannot read its
// own writes, and reads fn makes through the client see the data as it
// was, unprotected by the transaction (only the inbox key is watched). For
// a read-modify-write, queue a command that computes in Redis (INCRBY,
// HINCRBY, SADD) or a Lua script (EVAL) instead. Redis does not roll back a
// transaction whose command fails as it runs (such as WRONGTYPE): the
// others and the mark apply, and Process returns an error saying so; a
// command Redis refuses as it is queued (an unknown command, wrong
// arguments, a key of another hash slot in Redis Cluster) aborts the whole
// transaction, and the key is released.
//
// Durability is Redis's. The mark and the effect commit together, so they
// are also lost together: with appendfsync everysec (the default when AOF is
// on) a crash of Redis can lose the last second of commits, marks and
// effects alike, and with RDB snapshots only, everything since the last one.
// The transport's message was acknowledged by then, so it is not delivered
// again and those effects are lost for good. Where that matters, run Redis
// with appendonly yes and appendfsync always, or follow each commit with
// WAIT for replicas. Replication is asynchronous: a failover to a replica
// that had not received a commit loses it in the same way.
//
// In Redis Cluster, MULTI runs on one node, so every key fn writes must
// share the inbox key's hash slot: put InboxHashTag(consumer) in its name.
// The price is that one consumer's inbox and effects live on one slot.
type Inbox struct {
	client    redis.UniversalClient
	prefix    string
	lease     time.Duration
	retention time.Duration
	maxPoll   time.Duration
}

var _ idem.SequenceInbox = (*Inbox)(nil)

// NewInbox returns an Inbox on client, which the caller keeps owning. cfg
// may be nil. It loads the inbox's Lua scripts into Redis, so that the
// first Process is no slower than the others, and so also checks that Redis
// answers.
//
// client may be a *redis.Client, a *redis.ClusterClient or a *redis.Ring:
// the Inbox needs no pub/sub, and WATCH and MULTI run on the node of the
// key's hash slot (or shard).
func NewInbox(ctx context.Context, client redis.UniversalClient, cfg *InboxConfig) (*Inbox, error) {
	var c InboxConfig
	if cfg != nil {
		c = *cfg
	}
	if c.Prefix == "" {
		c.Prefix = defaultPrefix
	}
	if c.Lease == 0 {
		c.Lease = defaultInboxLease
	}
	if c.Retention == 0 {
		c.Retention = defaultInboxRetention
	}
	if c.PollInterval == 0 {
		c.PollInterval = defaultInboxPollInterval
	}
	switch {
	case client == nil:
		return nil, &idem.ArgumentError{Field: "client", Reason: "must not be nil"}
	case strings.ContainsAny(c.Prefix, "{}"):
		return nil, &idem.ArgumentError{Field: "Prefix", Reason: "must not contain '{' or '}': the consumer is the keys' hash tag"}
	case c.Lease < time.Millisecond:
		return nil, &idem.ArgumentError{Field: "Lease", Reason: "must be at least 1ms (Redis expires keys in milliseconds)"}
	case c.Retention < time.Millisecond:
		return nil, &idem.ArgumentError{Field: "Retention", Reason: "must be at least 1ms (Redis expires keys in milliseconds)"}
	case c.PollInterval < 0:
		return nil, &idem.ArgumentError{Field: "PollInterval", Reason: "must not be negative"}
	}
	for _, sc := range []*redis.Script{inboxClaimScript, inboxReleaseScript, inboxSequenceClaimScript} {
		if err := sc.Load(ctx, client).Err(); err != nil {
			return nil, fmt.Errorf("idemredis: inbox: loading the Lua scripts: %w", err)
		}
	}
	return &Inbox{
		client:    client,
		prefix:    c.Prefix,
		lease:     c.Lease,
		retention: c.Retention,
		maxPoll:   max(c.PollInterval, firstPoll),
	}, nil
}

// inboxTagEscaper percent-encodes what would end the hash tag early ('}'),
// make it hard to read ('{'), or make the encoding ambiguous ('%').
var inboxTagEscaper = strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D")

// InboxHashTag returns the Redis Cluster hash tag of consumer's inbox keys,
// braces included. Keys that fn writes in Redis Cluster must contain it, so
// that they hash to the inbox key's slot: for example
// "balance:" + InboxHashTag("billing") + ":" + account.
//
// The consumer is escaped ('%', '{' and '}' become "%25", "%7B" and "%7D"),
// so that a '}' in it cannot end the tag early; a consumer is never empty,
// so neither is the tag, which Redis Cluster would otherwise ignore.
func InboxHashTag(consumer string) string {
	return "{" + inboxTagEscaper.Replace(consumer) + "}"
}

// inboxKey is "<prefix>:inbox:{<consumer>}:<dedupKey>". It is one-to-one:
// the prefix has no braces, so the first '{' opens the tag; the escaped
// consumer has no '}', so the first '}' closes it; what follows ":" is the
// dedupKey as it is. No Store key has this shape: they continue the prefix
// with ":{".
func (in *Inbox) inboxKey(consumer, dedupKey string) string {
	return in.prefix + ":inbox:" + InboxHashTag(consumer) + ":" + dedupKey
}

// inboxClaimScript claims the key for a delivery, or says who holds it.
//
// KEYS: the inbox key. ARGV: "pending:<token>", the lease in ms.
//
// Returns 1 when it claimed the key, or {value, PTTL} of the key that stops
// the claim: a delivery that finds another's token waits no longer than
// that lease. One script rather than SET NX then PTTL, so that a waiting
// delivery costs one round trip per look.
var inboxClaimScript = redis.NewScript(`
local v = redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2], 'GET')
if not v then
  return 1
end
return {v, redis.call('PTTL', KEYS[1])}
`)

// inboxReleaseScript deletes the key if it still holds the delivery's
// token: a plain DEL could delete another delivery's claim, or the mark of
// a commit, once this delivery's lease has ended.
//
// KEYS: the inbox key. ARGV: "pending:<token>". Returns 1 when it deleted.
var inboxReleaseScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
`)

type inboxTxKey struct{}

// InboxTx returns the pipeliner that Inbox.Process puts in the context it
// gives fn, and false when ctx carries none. Commands fn queues on it run in
// the transaction that records the message, after fn returns nil; they are
// dropped when fn fails. Their results are not available inside fn. Do not
// Exec it: its Exec, Pipelined and TxPipelined return an error, since
// commands sent before the mark would not commit with it.
func InboxTx(ctx context.Context) (redis.Pipeliner, bool) {
	p, ok := ctx.Value(inboxTxKey{}).(*inboxPipe)
	return p, ok
}

// errInboxExec is what the pipeliner given to fn returns when fn tries to
// send its commands itself.
var errInboxExec = errors.New("idemredis: inbox: the commands queued in fn run when Process commits; do not Exec them")

// inboxPipe is the pipeliner fn queues on: a plain pipeline that is never
// sent itself (Process hands its commands to the commit's MULTI), with the
// methods that would send it refused.
type inboxPipe struct {
	redis.Pipeliner
}

func (p *inboxPipe) Exec(context.Context) ([]redis.Cmder, error) { return nil, errInboxExec }

func (p *inboxPipe) Pipelined(context.Context, func(redis.Pipeliner) error) ([]redis.Cmder, error) {
	return nil, errInboxExec
}

func (p *inboxPipe) TxPipelined(context.Context, func(redis.Pipeliner) error) ([]redis.Cmder, error) {
	return nil, errInboxExec
}

func (p *inboxPipe) Pipeline() redis.Pipeliner   { return p }
func (p *inboxPipe) TxPipeline() redis.Pipeliner { return p }

// Process implements idem.Inbox (see the Inbox type for how). fn's context
// carries the pipeliner that InboxTx returns.
//
// Returns an error matching idem.ErrInvalidArgument, without touching
// Redis, when consumer or dedupKey is empty or fn is nil; ctx's error when
// it is done before the message was claimed or while waiting for another
// delivery; and an error matching idem.ErrLeaseLost, having applied
// nothing, when this delivery's lease ended during fn and another delivery
// claimed the key (a redelivery then finds out whether that one
// committed). When fn panics, the key is released and the panic goes on.
//
// Ambiguous failures: on other errors (a timeout, a dropped connection) the
// claim or the commit may or may not have happened. A redelivery finds
// out: idem.ErrDuplicate, or fn runs, at the latest once the lease has
// ended.
func (in *Inbox) Process(ctx context.Context, consumer, dedupKey string, fn func(ctx context.Context) error) error {
	switch {
	case consumer == "":
		return &idem.ArgumentError{Field: "consumer", Reason: "must not be empty"}
	case dedupKey == "":
		return &idem.ArgumentError{Field: "dedupKey", Reason: "must not be empty"}
	case fn == nil:
		return &idem.ArgumentError{Field: "fn", Reason: "must not be nil"}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	key := in.inboxKey(consumer, dedupKey)
	token := inboxPending + rand.Text()
	if err := in.claim(ctx, key, token); err != nil {
		return err
	}

	pipe := &inboxPipe{in.client.Pipeline()}
	fctx := context.WithValue(ctx, inboxTxKey{}, pipe)
	if err := in.run(ctx, key, token, pipe, fn, fctx); err != nil {
		// fn's error, unchanged.
		return err
	}
	if err := ctx.Err(); err != nil {
		// Cancelled during fn: commit nothing, as a cancelled transaction
		// would not.
		in.release(ctx, key, token)
		return err
	}
	return in.commit(ctx, key, token, pipe.Cmds())
}

// poller spaces a delivery's looks at a key another delivery holds: the
// first wait is firstPoll, each next one twice as long, up to the
// configured PollInterval, and never past the holder's lease.
type poller struct {
	wait, max time.Duration
	timer     *time.Timer
}

func (in *Inbox) newPoller() *poller { return &poller{wait: firstPoll, max: in.maxPoll} }

// sleep waits before the next look: the current wait, or until the
// holder's lease ends (pttl, in milliseconds) if that is sooner. pttl <= 0
// (the key is gone already, or has no expiry, which the Inbox never
// writes) falls back on the backoff. Returns ctx's error if it ends first.
func (p *poller) sleep(ctx context.Context, pttl int64) error {
	d := p.wait
	if pttl > 0 {
		d = min(d, time.Duration(pttl)*time.Millisecond+time.Millisecond)
	}
	p.wait = min(2*p.wait, p.max)
	if p.timer == nil {
		p.timer = time.NewTimer(d)
	} else {
		p.timer.Reset(d)
	}
	select {
	case <-p.timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (p *poller) stop() {
	if p.timer != nil {
		p.timer.Stop()
	}
}

// claim claims key for token, waiting while another delivery holds it.
// Returns idem.ErrDuplicate when the key holds the mark of a commit.
func (in *Inbox) claim(ctx context.Context, key, token string) error {
	leaseMs := max(in.lease.Milliseconds(), 1)
	p := in.newPoller()
	defer p.stop()
	for {
		res, err := inboxClaimScript.Run(ctx, in.client, []string{key}, token, leaseMs).Result()
		if err != nil {
			return fmt.Errorf("idemredis: inbox: claim: %w", err)
		}
		var pttl int64
		switch r := res.(type) {
		case int64:
			return nil
		case []any:
			v, _ := r[0].(string)
			pttl, _ = r[1].(int64)
			switch {
			case v == inboxDone:
				return idem.ErrDuplicate
			case v == token:
				// go-redis resent the claim after losing the reply to the
				// first one, which had claimed the key.
				return nil
			case !strings.HasPrefix(v, inboxPending):
				return fmt.Errorf("idemredis: inbox: %s holds %q, not an inbox mark", key, v)
			}
		default:
			return fmt.Errorf("idemredis: inbox: claim: unexpected reply %v", res)
		}

		// Another delivery holds the key: look again later.
		if err := p.sleep(ctx, pttl); err != nil {
			return err
		}
	}
}

// run calls fn. When fn fails or panics, it drops fn's commands and
// releases the key; it returns fn's error unchanged.
func (in *Inbox) run(ctx context.Context, key, token string, pipe *inboxPipe, fn func(context.Context) error, fctx context.Context) (err error) {
	defer func() {
		if r := recover(); r != nil {
			pipe.Discard()
			in.release(ctx, key, token)
			panic(r)
		}
	}()
	if err := fn(fctx); err != nil {
		pipe.Discard()
		in.release(ctx, key, token)
		return err
	}
	return nil
}

// release deletes key if it still holds token, even when ctx is done. A
// failure is not reported: fn's error is what the caller must see, and a
// key left behind only makes a redelivery wait until the lease ends.
func (in *Inbox) release(ctx context.Context, key, token string) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	_ = inboxReleaseScript.Run(rctx, in.client, []string{key}, token).Err()
}

// errInboxLost says why a commit applied nothing.
var errInboxLost = fmt.Errorf("idemredis: inbox: commit refused, the key changed since it was claimed (the lease ended during fn): %w", idem.ErrLeaseLost)

// commit applies cmds and the mark in one MULTI/EXEC, if key still holds
// token.
//
// It also commits when the key is gone: then the lease ended during fn and
// nobody holds the key, or a later holder failed and released it, so no
// commit of the message exists and none is under way; one that starts
// after the GET below changes the key and aborts the EXEC. Committing saves
// re-running a handler that was merely slow. (The one exception, a mark
// that expired after Retention while fn ran, needs a handler slower than
// the transport's whole redelivery window.)
func (in *Inbox) commit(ctx context.Context, key, token string, cmds []redis.Cmder) error {
	var mark *redis.StatusCmd
	err := in.client.Watch(ctx, func(tx *redis.Tx) error {
		v, err := tx.Get(ctx, key).Result()
		switch {
		case errors.Is(err, redis.Nil):
		case err != nil:
			return err
		case v != token:
			return errInboxLost
		}
		_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
			if len(cmds) > 0 {
				if err := p.BatchProcess(ctx, cmds...); err != nil {
					return err
				}
			}
			mark = p.Set(ctx, key, inboxDone, in.retention)
			return nil
		})
		return err
	}, key)
	return in.commitOutcome(ctx, err, mark, key, token)
}

// commitOutcome turns the error of a commit's WATCH/MULTI/EXEC into what
// Process or ProcessSequence returns. mark is the command of the commit
// that sets the mark, nil if it was not queued; key is the key the
// delivery claimed with token.
func (in *Inbox) commitOutcome(ctx context.Context, err error, mark *redis.StatusCmd, key, token string) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, idem.ErrLeaseLost):
		return err
	case errors.Is(err, redis.TxFailedErr):
		return errInboxLost
	case mark != nil && mark.Err() == nil && mark.Val() == "OK":
		// EXEC ran: the mark applied, and so did every command but the
		// failed one (Redis does not roll a transaction back).
		return fmt.Errorf("idemredis: inbox: committed, but a command fn queued failed: %w", err)
	}
	// EXEC aborted (a command refused as it was queued), or the commit's
	// fate is unknown. Releasing is right either way: it deletes the key
	// only if it still holds this delivery's token, which it does only if
	// the commit did not apply, and an EXEC still on its way is then
	// aborted by the WATCH.
	in.release(ctx, key, token)
	return fmt.Errorf("idemredis: inbox: commit: %w", err)
}

// Sequence marks (idem.SequenceInbox) are kept as 20-digit decimal
// strings, zero-padded, so that comparing two of them byte by byte (in
// Lua, which has only float64 numbers, exact to 2^53) compares the
// numbers, for every uint64.
const zeroMark = "00000000000000000000"

func formatMark(n uint64) string { return fmt.Sprintf("%020d", n) }

// sequenceKeys returns the keys of (consumer, aggregate):
// "<prefix>:inbox-seq:{<consumer>}:<aggregate>" holds its mark, and
// "<prefix>:inbox-seq-lease:{<consumer>}:<aggregate>" the token of the
// delivery processing it. Both carry the consumer's hash tag, as the
// message keys do, so they share a slot with those and with fn's keys.
// They are one-to-one for the reasons inboxKey is, and never meet an
// inbox key or each other: the text before the tag differs.
func (in *Inbox) sequenceKeys(consumer, aggregate string) (mark, lease string) {
	tag := InboxHashTag(consumer)
	return in.prefix + ":inbox-seq:" + tag + ":" + aggregate, in.prefix + ":inbox-seq-lease:" + tag + ":" + aggregate
}

// inboxSequenceClaimScript reads an aggregate's mark and, when seq may be
// applied on top of it, claims the aggregate's lease for a delivery.
//
// KEYS: the mark key, the lease key. ARGV: "pending:<token>", the lease in
// ms, seq and seq-1 as formatMark writes them, "1" when gaps are allowed.
//
// Returns {"duplicate", mark} when seq <= mark, {"gap", mark} when seq >
// mark+1 and gaps are held, {"claimed", mark} when it took the lease,
// {"busy", mark, value, PTTL} with the value of the lease someone holds,
// and {"corrupt", value} when the mark key holds what formatMark never
// writes.
// The mark is compared before the lease is looked at: it only grows, so a
// duplicate is one whoever holds the lease.
var inboxSequenceClaimScript = redis.NewScript(`
local mark = redis.call('GET', KEYS[1])
if not mark then
  mark = '00000000000000000000'
elseif #mark ~= 20 or string.find(mark, '%D') then
  return {'corrupt', mark}
end
local function less(a, b)
  for i = 1, 20 do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then
      return x < y
    end
  end
  return false
end
if not less(mark, ARGV[3]) then
  return {'duplicate', mark}
end
if ARGV[5] ~= '1' and less(mark, ARGV[4]) then
  return {'gap', mark}
end
local v = redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2], 'GET')
if not v then
  return {'claimed', mark}
end
return {'busy', mark, v, redis.call('PTTL', KEYS[2])}
`)

// errSequenceLost says why a sequence commit applied nothing.
var errSequenceLost = fmt.Errorf("idemredis: inbox: commit refused, the aggregate's mark changed since it was read (the lease ended during fn and another delivery committed): %w", idem.ErrLeaseLost)

// ProcessSequence implements idem.SequenceInbox, with the transaction model
// of Process (see the Inbox type): one script reads the mark of (consumer,
// aggregate) and, when seq may be applied on top of it, claims the
// aggregate's lease with SET NX PX <Lease>; a delivery that finds another
// holding the lease waits, polling, and reads the mark again once that one
// committed (then it is usually a duplicate) or failed. fn queues its Redis
// writes on the pipeliner InboxTx returns, and when it returns nil they
// commit with the new mark in one WATCH/MULTI/EXEC that also deletes the
// lease, and applies only while the lease is this delivery's (or nobody's)
// and the mark is the one read. A failing fn releases the lease and leaves
// the mark. Every caveat of Process holds: effects outside Redis are at
// least once, fn cannot read its own queued writes, a command failing in
// EXEC does not roll the others back, durability is Redis's, and in Redis
// Cluster fn's keys must carry InboxHashTag(consumer).
//
// Marks never expire (InboxConfig.Retention is for the message marks of
// Process): one that went would let every earlier message of its aggregate
// run again, and under GapHold it would hold the next message for good.
// Each aggregate costs one key, plus its lease while a delivery holds it.
//
// Returns an error matching idem.ErrInvalidArgument, without touching
// Redis, for the arguments idem.CheckSequenceArgs refuses; ctx's error when
// it is done before the lease was claimed or while waiting for another
// delivery; and an error matching idem.ErrLeaseLost, having applied
// nothing, when this delivery's lease ended during fn and another delivery
// took it or committed. Ambiguous failures: on other errors the commit may
// or may not have happened; a redelivery finds out (idem.ErrDuplicate, or
// fn runs, at the latest once the lease has ended).
func (in *Inbox) ProcessSequence(ctx context.Context, consumer, aggregate string, seq uint64, gap idem.GapPolicy, fn func(ctx context.Context) error) error {
	if err := idem.CheckSequenceArgs(consumer, aggregate, seq, gap, fn); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	markKey, leaseKey := in.sequenceKeys(consumer, aggregate)
	token := inboxPending + rand.Text()
	mark, err := in.claimSequence(ctx, markKey, leaseKey, token, aggregate, seq, gap)
	if err != nil {
		return err
	}

	pipe := &inboxPipe{in.client.Pipeline()}
	fctx := context.WithValue(ctx, inboxTxKey{}, pipe)
	if err := in.run(ctx, leaseKey, token, pipe, fn, fctx); err != nil {
		// fn's error, unchanged.
		return err
	}
	if err := ctx.Err(); err != nil {
		in.release(ctx, leaseKey, token)
		return err
	}
	return in.commitSequence(ctx, markKey, leaseKey, token, mark, seq, pipe.Cmds())
}

// claimSequence claims the aggregate's lease for token, waiting while
// another delivery holds it, and returns the mark it read. Returns
// idem.ErrDuplicate or an *idem.SequenceGapError when the mark says so.
func (in *Inbox) claimSequence(ctx context.Context, markKey, leaseKey, token, aggregate string, seq uint64, gap idem.GapPolicy) (uint64, error) {
	leaseMs := max(in.lease.Milliseconds(), 1)
	allow := "0"
	if gap == idem.GapAllow {
		allow = "1"
	}
	p := in.newPoller()
	defer p.stop()
	for {
		res, err := inboxSequenceClaimScript.Run(ctx, in.client, []string{markKey, leaseKey},
			token, leaseMs, formatMark(seq), formatMark(seq-1), allow).Slice()
		if err != nil {
			return 0, fmt.Errorf("idemredis: inbox: claim: %w", err)
		}
		if len(res) < 2 {
			return 0, fmt.Errorf("idemredis: inbox: claim: unexpected reply %v", res)
		}
		verdict, _ := res[0].(string)
		text, _ := res[1].(string)
		if verdict == "corrupt" {
			return 0, fmt.Errorf("idemredis: inbox: %s holds %q, not a sequence mark", markKey, text)
		}
		mark, err := strconv.ParseUint(text, 10, 64)
		if err != nil {
			// 20 digits past the largest uint64, which formatMark never
			// writes, or a reply of another script.
			if verdict == "claimed" {
				in.release(ctx, leaseKey, token)
			}
			return 0, fmt.Errorf("idemredis: inbox: %s holds %q, not a sequence mark", markKey, text)
		}
		switch verdict {
		case "duplicate":
			return 0, idem.ErrDuplicate
		case "gap":
			return 0, &idem.SequenceGapError{Aggregate: aggregate, Mark: mark, Seq: seq}
		case "claimed":
			return mark, nil
		case "busy":
		default:
			return 0, fmt.Errorf("idemredis: inbox: claim: unexpected reply %v", res)
		}
		var holder string
		var pttl int64
		if len(res) == 4 {
			holder, _ = res[2].(string)
			pttl, _ = res[3].(int64)
		}
		switch {
		case holder == token:
			// go-redis resent the script after losing the reply to the
			// first run, which had claimed the lease; the mark cannot have
			// moved since, as only the lease's holder commits.
			return mark, nil
		case !strings.HasPrefix(holder, inboxPending):
			return 0, fmt.Errorf("idemredis: inbox: %s holds %q, not an inbox lease", leaseKey, holder)
		}
		// Another delivery holds the lease: look again later.
		if err := p.sleep(ctx, pttl); err != nil {
			return 0, err
		}
	}
}

// commitSequence applies cmds, the new mark and the release of the lease
// in one MULTI/EXEC, if the lease still holds token (or has ended with no
// other holder, as commit allows) and the mark is still the one read.
func (in *Inbox) commitSequence(ctx context.Context, markKey, leaseKey, token string, read, seq uint64, cmds []redis.Cmder) error {
	var mark *redis.StatusCmd
	err := in.client.Watch(ctx, func(tx *redis.Tx) error {
		vals, err := tx.MGet(ctx, leaseKey, markKey).Result()
		if err != nil {
			return err
		}
		if v, ok := vals[0].(string); ok && v != token {
			return errInboxLost
		}
		current := zeroMark
		if v, ok := vals[1].(string); ok {
			current = v
		}
		if current != formatMark(read) {
			return errSequenceLost
		}
		_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
			if len(cmds) > 0 {
				if err := p.BatchProcess(ctx, cmds...); err != nil {
					return err
				}
			}
			mark = p.Set(ctx, markKey, formatMark(seq), 0)
			p.Del(ctx, leaseKey)
			return nil
		})
		return err
	}, markKey, leaseKey)
	return in.commitOutcome(ctx, err, mark, leaseKey, token)
}
