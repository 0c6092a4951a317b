// Package idemredis is an idem.Store and idem.Waiter kept in Redis (7 or
// later; go-redis v9), for several replicas of a service that must agree on
// which of them runs a request: a key claimed through one replica is claimed
// for all of them.
//
//	store, err := idemredis.Open(ctx, "redis://127.0.0.1:6379/0", nil)
//
// or, with a client the caller configures and keeps owning (a
// *redis.ClusterClient works too):
//
//	store, err := idemredis.New(ctx, client, &idemredis.Config{Prefix: "payments"})
//
// # One round trip
//
// Each of Claim, Complete, Release and Get is one Lua script, run with
// EVALSHA: one round trip, atomic because Redis runs a script without
// interleaving any other command. Claim's script either claims the key (a
// new record; or replacing a record that is dead by the store's clock; or
// taking over an in-flight record whose lease ended, with the same
// fingerprint) or returns the record that stops it: in flight, completed
// (with its response, to replay), or a mismatch. Complete and Release are
// compare-and-set on the fencing token. New loads the scripts, so the first
// call is one round trip too; if Redis loses them (SCRIPT FLUSH, a restart,
// a failover), go-redis falls back to EVAL for that call.
//
// # Cost
//
// A first execution takes two round trips (Claim, then Complete), as does
// the least anyone could write by hand for "at most one claimant" (SET NX
// PX, then SET): what the store adds is Lua on the server and a little
// encoding on the client. Measured on Redis 7.0 on two cores, an EVALSHA
// costs 2 to 3µs of server time more than a native command before it does
// anything, each redis.call about 1µs more, a PUBLISH 1 to 2µs, a
// string.format or a closure a fraction of a microsecond; the round trip
// itself (system calls on both sides) costs far more than any of them, so
// there is no third. Hence:
//
//   - a new key's claim is TIME, one SET … NX PX … GET that writes the
//     whole record with its Redis lifetime, and one GET of the scope's
//     token floor: no hash fields, no separate PEXPIRE, no counter write,
//     no number formatting (the time is concatenated as TIME gives it);
//   - Complete is GET, TIME and one SET … KEEPTTL that splices the
//     response onto the record; it publishes only when a waiter has
//     flagged the record;
//   - the client sends the new record's tail ready-made and gets back only
//     "a<token> <time>", and the response header is encoded as netstrings
//     rather than JSON.
//
// Measured on a shared two-core machine (medians of interleaved runs), the
// store alone (BenchmarkClaimComplete: Claim and Complete against SET NX PX
// and SET) went from about 0.6 to about 0.83 of the minimum's throughput,
// and its CPU per first execution, Redis's and the client's together, from
// about 1.35 to about 1.15 times the minimum's; `idem bench` (the idemhttp
// middleware on this store) from about 0.55 to about 0.62, the rest of its
// gap being the middleware's own work. A Redis function (FCALL) instead of
// EVALSHA would save about another microsecond per call; scripts are kept
// because go-redis reloads them transparently (EVAL on NOSCRIPT, on each
// cluster node) when a Redis restarts without persistence.
//
// # Keys and hash tags
//
// A record is one Redis string at
//
//	<prefix>:{<scope>}:<key>
//
// starting with its state ('i' in flight, 'c' completed) and a waiter flag,
// then the fencing token, the times and durations in microseconds, the
// fingerprint and, once completed, the completion time and the response
// (record.go has the exact layout). A string rather than a hash, so that a
// new key's claim is the single command SET … NX PX … GET: it creates the
// record with its Redis lifetime, or returns the one already there.
//
// The braces make the scope the key's Redis Cluster hash tag: Redis Cluster
// hashes only the text between the first '{' and the next '}', so all of a
// scope's keys live on one slot, and a script may touch several of them.
// To keep that true whatever the scope holds, the scope is escaped: '%',
// '{' and '}' become "%25", "%7B" and "%7D", so a '}' in a scope cannot end
// the tag early. The empty scope would give "{}", which Redis Cluster
// ignores (the whole key would be hashed, scattering the global scope over
// every slot), so its tag is "%", which no escaped scope can be. The prefix
// may not contain braces, since the first '{' must be the store's. The
// price of the tag is that one scope cannot spread over the cluster: a
// single very hot scope loads one node.
//
// Next to the records, a scope may have a token floor, a string at
//
//	<prefix>:seq:{<scope>}
//
// (same tag, so the scripts can read it on the record's slot; the ":seq:"
// segment keeps it apart from every record, whatever the key). It is
// written only when a record is released or purged, or when a token is
// issued above the clock, and never expires: at most one small key per
// scope. Changes to records that a duplicate waits on are published on the
// pub/sub channel "<prefix>:changes". Every key a script touches is passed
// to it in KEYS.
//
// Records written by earlier versions of this package, which kept hashes,
// are not read (Redis answers WRONGTYPE): give a new version a new Prefix,
// or let the old records expire.
//
// # Fencing tokens
//
// Every successful Claim of a key gets a token greater than any issued for
// it before. A new record's token is the store's time in microseconds,
// unless the scope's floor is not below it; a record taken over or replaced
// gets the greatest of the time, the floor plus one and its previous token
// plus one; and a token issued above the time raises the floor to it. The
// previous tokens of a key that is absent were either deleted by Release
// or Purge, which first raise the floor to them, or expired by Redis,
// which happens only once the server's clock has passed the record's end,
// so past its token (unless that token was above the clock, and so is in
// the floor). Tokens therefore keep increasing after a key expires, is
// released, purged or claimed anew, and after the clock steps back.
//
// Compared with a per-scope counter written by every claim, this saves a
// write on the common path: a new key's claim only reads the floor. The
// cost is that with the server's clock, tokens rely on that clock once a
// record has expired; as before, a Redis without persistence that restarts
// loses every floor, and tokens keep increasing only as long as its clock
// moves forward. With an injected Clock that runs behind real time, Redis
// may expire a record the store still counts as live (see "Expiry"), and a
// claim after that may repeat its token; only a test clock does that.
//
// # Time
//
// With Config.Clock nil, the Redis server's clock decides leases and
// expiry: each script reads TIME (allowed before writes because Redis
// replicates a script's effects, not the script), so replicas whose clocks
// disagree still agree. With a Clock, its time is passed to the scripts
// instead; tests use that to move time without sleeping. Times are kept in
// microseconds: Lua numbers are doubles, exact up to 2^53, which microsecond
// Unix times stay below until the year 2255 and nanosecond times exceed
// today. A lease or TTL is rounded up to a whole microsecond.
//
// # Expiry
//
// Redis deletes dead records by itself: the claim's SET gives each a
// lifetime (the later of its TTL and its lease, measured from the claim)
// plus a second, extended when a takeover's lease ends later and never
// shortened; completing keeps it. The scripts still judge liveness by the store's clock, not by
// the key's existence, so an injected clock that runs ahead of real time
// sees records expire on its own schedule. (One that runs behind real time
// by more than the second of slack would see Redis evict records it still
// considers live; only a test clock does that.)
//
// Purge honours the idem.Store contract: it deletes at most limit records
// whose TTL has passed by the store's clock and that no live lease holds. It
// SCANs the prefix (on every master of a cluster), filters each page with one
// pipelined read of the start of each record (never its response), and
// deletes each candidate with a script that checks again, atomically, and
// raises the scope's token floor. Normally it finds nothing, because Redis has already
// evicted those records; there is no need to call it on a schedule.
//
// Redis must not evict records under memory pressure: a record evicted
// early is a key forgotten, and its duplicate runs the effect again. Run it
// with maxmemory-policy noeviction (the volatile-* policies would pick
// exactly these records, which all have a TTL), and size memory for the
// TTL you choose.
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
// When the subscription's connection drops, go-redis reconnects and
// resubscribes, and since changes published meanwhile were lost, every
// waiter is woken to look again. Close stops the subscription. A
// *redis.Ring is refused by New: its shards do not share pub/sub.
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
//     (an absent key counts as released).
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
// writes must carry InboxHashTag(consumer).
package idemredis
