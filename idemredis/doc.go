// Package idemredis is an idem.Store and idem.Waiter kept in Redis (7 or
// later; go-redis v9 or rueidis), for several replicas of a service that
// must agree on which of them runs a request: a key claimed through one
// replica is claimed for all of them.
//
//	store, err := idemredis.Open(ctx, "redis://127.0.0.1:6379/0", nil)
//
// or, with a client the caller configures and keeps owning (a
// *redis.ClusterClient works too):
//
//	store, err := idemredis.NewStore(ctx, client, &idemredis.Config{Prefix: "payments"})
//	store, err := idemredis.NewRueidisStore(ctx, rueidisClient, &idemredis.Config{Prefix: "payments"})
//
// # Clients
//
// The store runs on either client behind the same API. Open connects with
// rueidis; NewStore takes the go-redis client a service already has;
// NewRueidisStore takes a rueidis one. BenchmarkClients measures the two
// side by side, in alternating batches on one Redis, at 4, 16 and 64
// goroutines:
//
//	go test -run '^$' -bench Clients ./idemredis/
//
// rueidis is the faster from a few goroutines up, the more so the more
// there are, for first executions and replays alike: go-redis has a
// connection per goroutine, and past a few goroutines each of its round
// trips is a system call on each side for one command, where rueidis
// pipelines the commands of concurrent callers, writing and reading many
// per call.
//
// A pipeline has its price at low concurrency: a command is handed to the
// connection's writing goroutine and its reply back from the reading one,
// two more wake-ups per round trip than a command that its caller writes
// and reads itself. So Open makes its client with DisableAutoPipelining and
// the store routes each command: while at most 16 of its commands are in
// flight, each goes on a connection of its own from rueidis's pool; beyond
// that, on the shared pipeline. In idem bench (first executions, two
// cores) that made the store 5 to 10 points faster relative to the
// hand-written minimum at 4 to 16 requests in flight than pipelining all of
// them, level at 32, and it left 64 as it was. A client given to
// NewRueidisStore with DisableAutoPipelining is routed the same way; one
// without it pipelines every command, as rueidis does by default.
//
// # Round trips
//
// Every method is one round trip. The common ones are one native command,
// judged by the client; what decides between holders is judged by Redis,
// atomically, in a Lua script (EVALSHA), or in a native compare-and-set
// where the server has one:
//
//   - a new key's claim is SET <key> <record> NX PX <lifetime> GET: it
//     writes the whole in-flight record with its Redis lifetime, or returns
//     the record already there, from which the client decides a duplicate
//     (in flight under a live lease), a replay (completed: the reply holds
//     the response) or a mismatch, with no second call;
//   - only when that record could be claimed (a tombstone; a record dead,
//     or whose lease ended, by the process's clock) does the claim script
//     run, judging by Redis's clock: it claims the key, takes an ended
//     lease over with a greater token, or returns the record after all;
//   - Complete is the complete script, a compare-and-set on the fencing
//     token that splices the response onto the record; on Redis 8.4 or
//     Valkey 8.1 it is SET … IFEQ (see "Newer servers");
//   - Release is the release script (compare-and-set, leaving a
//     tombstone); Get is a GET judged by the process's clock; WaitChange
//     and Purge use scripts.
//
// NewStore loads the scripts, so their first call is one round trip too; if
// Redis loses them (SCRIPT FLUSH, a restart, a failover), either client
// falls back to EVAL for that call.
//
// # Cost
//
// A first execution takes two round trips (Claim, then Complete), as does
// the least anyone could write by hand for "at most one claimant" (SET NX
// PX, then SET). Measured on Redis 7.0 on two cores, an EVALSHA costs 2 to
// 3µs of server time more than a native command before it does anything,
// each redis.call about 1µs more, a PUBLISH 1 to 2µs; the round trip
// itself (system calls on both sides) costs far more than any of them, so
// there is no third, and the claim and the replay, being native, cost the
// server what the minimum's SET NX and GET cost. What remains is the
// completion's script (on servers without IFEQ) and a little encoding on
// the client: the client sends records ready-made, and the response
// header is encoded as netstrings rather than JSON.
//
// BenchmarkClaimComplete and BenchmarkReplay measure the store on go-redis
// against SET NX PX and SET, and against GET (4 goroutines, throughput as
// a fraction of the minimum's). Making the claim native, and the replay
// with it, took them from about 0.63 to 0.70 and from about 0.55 to 0.77
// (medians of interleaved runs on a shared two-core machine); `idem bench`
// (the idemhttp middleware on this store, on go-redis) moved its replays
// from about 0.69 to 0.89 of the minimum, its first executions, whose gap
// is mostly the middleware's own work and the completion, not measurably
// from about 0.7. A Redis function
// (FCALL) instead of EVALSHA would save about another microsecond per
// script; scripts are kept because both clients reload them transparently
// (EVAL on NOSCRIPT, on each cluster node) when a Redis restarts without
// persistence.
//
// # Keys and hash tags
//
// A record is one Redis string at
//
//	<prefix>:{<scope>}:<key>
//
// starting with its state ('i' in flight, 'c' completed, 'r' a tombstone)
// and a waiter flag, then the fencing token, the times and durations in
// microseconds, the fingerprint and, once completed, the completion time
// and the response (record.go has the exact layout). A string rather than
// a hash, so that a new key's claim is the single command SET … NX PX …
// GET: it creates the record with its Redis lifetime, or returns the one
// already there.
//
// The braces make the scope the key's Redis Cluster hash tag: Redis Cluster
// hashes only the text between the first '{' and the next '}', so all of a
// scope's keys live on one slot. To keep that true whatever the scope
// holds, the scope is escaped: '%', '{' and '}' become "%25", "%7B" and
// "%7D", so a '}' in a scope cannot end the tag early. The empty scope would
// give "{}", which Redis Cluster ignores (the whole key would be hashed,
// scattering the global scope over every slot), so its tag is "%", which no
// escaped scope can be. The prefix may not contain braces, since the first
// '{' must be the store's. The price of the tag is that one scope cannot
// spread over the cluster: a single very hot scope loads one node.
//
// Nothing else is written but the tombstones that Release and Purge leave
// at a record's key ("r-<token>", kept about ten seconds), and the
// changes that a duplicate waits on, published on the pub/sub channel
// "<prefix>:changes". Every key a script touches is passed to it in KEYS.
//
// Records written by versions of this package that kept hashes are not
// read (Redis answers WRONGTYPE): give a new version a new Prefix, or let
// the old records expire. Versions before the tombstones kept a per-scope
// token floor at "<prefix>:seq:{<scope>}"; it is no longer read, and may
// be deleted. Those versions do not read tombstones either (a claim or Get
// of a key released in the last ten seconds fails there), so do not run
// both against one prefix for long.
//
// # Fencing tokens
//
// Every successful Claim of a key gets a token greater than any issued for
// it before. A new key's token is the time of its claim in microseconds
// (the process's estimate of Redis's clock, increasing within the
// process); a record written over another or over a tombstone gets the
// greater of the time and the previous token plus one. A key is absent
// only once Redis has expired what it held, since Release and Purge
// leave a tombstone instead of deleting; and Redis expires a record or a
// tombstone only once its clock has passed the token by at least a second
// (a lifetime is stretched when a token was issued above the clock, after
// a clock stepped back). So any token issued after, from Redis's clock or
// from an estimate that is off by less than a second (see "Time"), is
// greater. Tokens therefore keep increasing after a key expires, is
// released, purged or claimed anew, and after the clock steps back.
//
// They rely on Redis's clock once a key is absent: a Redis without
// persistence that restarts, or a failover to a replica, forgets the
// tombstones, and tokens keep increasing only as long as the new server's
// clock has passed the old one's. With an injected Clock that runs behind
// real time, Redis may expire a record the store still counts as live (see
// "Expiry"), and a claim after that may repeat its token; only a test
// clock does that.
//
// # Time
//
// With Config.Clock nil, Redis's clock decides leases and expiry, as each
// process estimates it within a round trip. NewStore reads Redis's TIME (three
// times, keeping the call with the shortest round trip); the process then
// estimates Redis's time as that TIME plus the time elapsed on its own
// monotonic clock since the middle of the call, and measures again, in the
// background, whenever a claim finds the estimate a second old. Redis read
// its clock somewhere within the call, so the estimate is off by at most
// half its round trip, plus the local clock's drift over a second or two
// (microseconds); an estimate older than two seconds, or measured by a
// call that took over 50ms, is not used, and the claim goes to the claim
// script, which reads TIME itself.
//
// A new key's creation time, token and lease deadline come from that
// estimate, so its lease may end earlier or later, by Redis's clock, by
// that bound: with a lease of seconds, a fraction of a millisecond. The
// same estimate decides, on the client, what a native claim found: a
// record it calls completed, mismatched or in flight is so within the
// bound, and a claim so refused runs no effect, so an error there only
// delays a takeover by as much. What must not depend on it stays judged
// atomically by Redis's own clock, inside the scripts: taking over an
// ended lease, replacing a dead record, and every completion and release
// (compare-and-set on the fencing token). In a cluster, the estimate is of
// the node that answered TIME, so the nodes' clocks should agree (NTP
// keeps them within milliseconds, far inside the second of slack below).
//
// With a Clock, its time is used for all of it (tests move time without
// sleeping). Times are kept in microseconds: Lua numbers are doubles,
// exact up to 2^53, which microsecond Unix times stay below until the year
// 2255 and nanosecond times exceed today. A lease or TTL is rounded up to
// a whole microsecond.
//
// # Expiry
//
// Redis deletes dead records by itself: the claim's SET gives each a
// lifetime (the later of its TTL and its lease, measured from the claim)
// plus a second, extended when a takeover's lease ends later and never
// shortened; completing keeps it. The scripts still judge liveness by the
// store's clock, not by the key's existence, so an injected clock that
// runs ahead of real time sees records expire on its own schedule. (One
// that runs behind real time by more than the second of slack would see
// Redis evict records it still considers live; only a test clock does
// that.)
//
// Purge honours the idem.Store contract: it purges at most limit records
// whose TTL has passed by the store's clock and that no live lease holds. It
// SCANs the prefix (on every master of a cluster), filters each page with one
// pipelined read of the start of each record (never its response), and
// replaces each candidate by its tombstone with a script that checks again,
// atomically. Normally it finds nothing, because Redis has already evicted
// those records; there is no need to call it on a schedule.
//
// Redis must not evict records under memory pressure: a record evicted
// early is a key forgotten, and its duplicate runs the effect again. Run it
// with maxmemory-policy noeviction (the volatile-* policies would pick
// exactly these records, which all have a TTL), and size memory for the
// TTL you choose.
//
// # Newer servers
//
// NewStore finds out whether the server takes SET … IFEQ (Redis 8.4, Valkey
// 8.1) by sending one that cannot change anything; Redis 7.0 answers it
// with a syntax error. Where it does, a completion of a claim this process
// made is the native SET <key> <completed record> IFEQ <in-flight record>
// KEEPTTL: the process keeps the in-flight record each of its claims
// wrote, builds the completed record as the script would, and Redis
// compares and sets atomically with no Lua at all. When the record has
// changed since the claim (a waiter flagged it, another holder took it
// over, it was released or expired), the comparison fails and the complete
// script decides, publishing the change or refusing the stale token; a
// completion from another process than the claim's, or one whose claim
// this process no longer remembers (it keeps at most 16384), takes the
// script too. A node that refuses IFEQ later (a failover to an older
// replica) turns it off for the store. On Redis 7.0 every completion is
// the script, as before; nothing else changes with the server.
//
// # Waiting duplicates
//
// A Store keeps one subscription to "<prefix>:changes", started by its
// first WaitChange, and wakes the local waiters on the record key named by
// each message. WaitChange registers before it reads the record and reads
// it only once the subscription is confirmed; the script that reads it
// also flags it as waited on (its second byte), and Complete and Release
// PUBLISH a flagged record's key from inside their scripts (a takeover
// always does). So no change is lost between the read and the wait, and a
// first execution that nobody waits for, the common case, publishes
// nothing. WaitChange also returns when the lease ends, so a duplicate
// takes over a crashed holder's key promptly.
// When the subscription's connection drops, the client reconnects and
// resubscribes (go-redis by itself; with rueidis the store subscribes a
// new dedicated connection), and since changes published meanwhile were
// lost, every waiter is woken to look again. Close stops the subscription. A
// *redis.Ring is refused by NewStore: its shards do not share pub/sub.
//
// # Recovery points
//
// The Store is no idem.Recoverer. A recovery point could live in the key's
// hash, fenced by the token in the same script, but it could not commit
// with the writes of the phase it describes, which live in another
// database: it could say a phase was reached whose writes rolled back. With
// the keys in Redis, keep what resuming needs in the effect's own database,
// under the request's origin (scope, key and Execution.ClaimedAt, which a
// takeover keeps), as the lab's payment service does in its two-store form.
// A client's retry then finishes the execution; there is no Completer.
// An audit of the effect's books (idem reconcile --keys) learns which
// executions are not finished from InFlight, which lists the keys in
// flight, held or not, as idemsqlite's, idempg's and idempgsql's
// InFlightAtPoints do theirs, reading only.
//
// # Leases and holders
//
// Renew is one script, judged by Redis's clock: it starts the lease anew
// if the token holds the key in flight, stretches the record's TTL to the
// new lease end when it would end before, and keeps the key in Redis at
// least that long. The Store is no idem.Restarter, and keeps no holder
// (Record.Holder is zero): finding a replica's keys would take an index
// that one script could update with the record only on one node, and on
// Redis Cluster a scope's keys and a replica's index live on different
// slots.
//
// # Ambiguous failures
//
// An error from Redis or the network (a timeout, a dropped connection, a
// context cancelled after the command was sent) may come after the script
// ran. For each method:
//
//   - Claim: the key may have been claimed, under a token the caller never
//     saw. The caller must not run the effect. Claiming again is safe: the
//     retry sees InFlight until that lease ends, then takes the key over.
//   - Complete: the response may have been stored. Completing again with
//     the same token succeeds (a completed record accepts it unchanged).
//   - Release: the key may have been released. Releasing again succeeds
//     (an absent key, or its tombstone, counts as released).
//   - Get: it changes nothing; retry.
//   - WaitChange: it changes nothing but the record's waiter flag, which
//     only makes the record's next change be published; retry.
//   - Purge: some records may have been deleted; call again.
//
// # When the effect lives elsewhere
//
// Redis is not in the effect's transaction, so the window the seed warns
// about stays open: a process can commit its effect (a charge in
// PostgreSQL, a call to a payment provider) and crash, or lose Redis,
// before Complete. The key then stays in flight until its lease ends, and a
// retry takes it over and runs the effect again. What bounds the damage:
//
//   - The lease: at most one holder works on a key until its lease ends.
//     Choose a lease longer than the effect can take (idemhttp cancels the
//     handler before its lease ends).
//   - The fencing token: a holder whose lease was taken over cannot
//     complete or release the key (ErrLeaseLost), and a downstream system
//     that records the token with the effect can refuse a write that
//     carries a smaller one.
//   - Passing the key downstream: make the effect itself idempotent by
//     handing the scope and key on, as the idempotency key of the next API
//     call, or as a unique column of the row the effect writes (a payment
//     that carries its key under a unique constraint), so that a re-run
//     after a lost lease finds the first effect instead of repeating it.
//
// Where the effect and the keys can share a database, prefer a TxStore
// (idempg, idemsqlite), which commits both in one transaction. Redis
// replication is asynchronous too: a failover can lose a claim or a
// completion the old primary acknowledged, with the same consequence as a
// crash before Complete, and the same remedies.
//
// # Replication and failover
//
// Open, NewStore and NewRueidisStore work on a Redis Cluster unchanged:
// give Open a URL naming one node, or several (redis://h1:p1?addr=h2:p2&addr=h3:p3),
// or NewStore a *redis.ClusterClient. Every key of a scope shares its
// hash tag, so a claim is one command on one slot, and both clients follow
// MOVED and ASK (the conformance suite passes on three masters with a
// replica each, TestClusterConformance).
//
// Redis acknowledges a write before its replicas have it. When a master is
// lost and its replica promoted, what the replica had not received is gone:
// a claim the store reported, and with it the claim time that the payment
// service's unique constraint carries, so a duplicate of that request
// claims the key afresh and runs again. Measured with the payment service
// (TestClusterRedisFailover in payments, 150 logical payments each sent
// twice at once and once more after the failover, the master of the busy
// scope's slot SIGKILLed and its replica promoted): killed alone, nothing
// was lost (on loopback the replica had every write); killed after its
// replica's link was cut for under a second, 27 payments ran twice and 19,100
// was taken for 16,179 owed.
//
// OpenReplicated (and NewReplicatedRueidisStore) close that hole: every
// write is followed by WAIT on the same connection, and is reported only
// once ReplicaConfig.Replicas replicas have it; otherwise it fails with
// ErrNotReplicated, which, like any ambiguous failure, makes the caller not
// run the effect. With it and min-replicas-to-write 1, the same run lost
// nothing (150 payments, 16,179 taken). min-replicas-to-write alone only
// narrows the window (a master refuses writes once no replica is linked,
// or after min-replicas-max-lag), and with a single replica per master, the
// replica that confirmed a write is the one promoted. The price is the
// round trip to the replica on each write, and writes fail while a master
// has too few replicas (after a failover, until the old master is back as
// a replica). Store.Warnings reports a replicated master written without
// replica acknowledgements (ErrUnconfirmedReplication) and, with them, a
// master with too few replicas (ErrTooFewReplicas). OpenReplicated takes
// the rueidis client; with go-redis, NewStore does not wait for replicas.
//
// # Inbox
//
// Inbox is an idem.Inbox for consumers whose effects live in Redis. Each
// (consumer, message) pair is a string at <prefix>:inbox:{<consumer>}:<dedupKey>,
// claimed with SET NX PX for a lease and marked "done" for a retention
// period. The handler queues its Redis writes on the pipeliner InboxTx
// returns; Process commits them with the mark in one WATCH/MULTI/EXEC that
// applies only while the delivery still holds the key, so a handler whose
// lease ended commits nothing, and a failed one leaves no mark. A
// concurrent duplicate waits, polling, for the first delivery to commit
// (idem.ErrDuplicate) or fail (it runs). Effects outside Redis stay
// at-least-once. Marks and effects are as durable as Redis makes them, and
// are lost together after the message was acknowledged: use appendfsync
// always or WAIT where that matters. In Redis Cluster, the keys a handler
// writes must carry InboxHashTag(consumer). The Inbox takes a go-redis
// client only, since the handler's writes are queued on a go-redis
// pipeliner.
package idemredis
