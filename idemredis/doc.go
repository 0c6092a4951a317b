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
// # Keys and hash tags
//
// A record is a hash at
//
//	<prefix>:{<scope>}:<key>
//
// with the fields fingerprint, state ("in_flight" or "completed"), token,
// created_at, lease_until, expires_at, completed_at (microseconds since the
// Unix epoch), status, header (JSON), body and body_omitted.
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
// Next to the records, each scope has a token counter, a string at
//
//	<prefix>:seq:{<scope>}
//
// (same tag, so the claim script can update it on the record's slot; the
// ":seq:" segment keeps it apart from every record, whatever the key). It
// never expires: it is one small key per scope. Changes are published on the
// pub/sub channel "<prefix>:changes". Every key a script touches is passed to
// it in KEYS.
//
// # Fencing tokens
//
// Every successful Claim of a key gets a token greater than any issued for
// it before: the script takes the greatest of the scope's counter plus one,
// the replaced record's token plus one, and the store's time in
// microseconds, and writes it back to the counter. Because the counter
// outlives the records, tokens keep increasing after a key expires, is
// released, purged or claimed anew, and after the (injected) clock steps
// back. Because they are at least the server's time, they also keep
// increasing when a Redis without persistence restarts and loses every
// counter, as long as its clock moves forward.
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
// Redis deletes dead records by itself: each carries a PEXPIRE of its
// lifetime (the later of its TTL and its lease, measured from the claim)
// plus a second, extended when a takeover's lease ends later and never
// shortened. The scripts still judge liveness by the store's clock, not by
// the key's existence, so an injected clock that runs ahead of real time
// sees records expire on its own schedule. (One that runs behind real time
// by more than the second of slack would see Redis evict records it still
// considers live; only a test clock does that.)
//
// Purge honours the idem.Store contract: it deletes at most limit records
// whose TTL has passed by the store's clock and that no live lease holds. It
// SCANs the prefix (on every master of a cluster), filters each page with one
// pipelined read, and deletes each candidate with a script that checks
// again, atomically. Normally it finds nothing, because Redis has already
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
// Complete, Release and a takeover PUBLISH the record's key on
// "<prefix>:changes" from inside their scripts. A Store keeps one
// subscription to that channel, started by its first WaitChange, and wakes
// the local waiters on the key named by each message. WaitChange registers
// before it reads the record and reads it only once the subscription is
// confirmed, so no change is lost between the two; it also returns when the
// lease ends, so a duplicate takes over a crashed holder's key promptly.
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
//   - Get, WaitChange: they change nothing; retry.
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
package idemredis
