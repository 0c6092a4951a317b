// Package idemhttp makes unsafe HTTP requests idempotent with the
// Idempotency-Key header (draft-ietf-httpapi-idempotency-key-header).
//
// A client makes one unique key per intended operation and sends it with
// every attempt of that operation. The middleware claims the key atomically
// in an idem.Store the moment the request arrives, runs the handler at most
// once per key, keeps the answer, and replays it to every duplicate:
//
//	m, err := idemhttp.New(&idemhttp.Config{
//		Store: store,
//		// Keys belong to whoever the request authenticated as: the same key
//		// from two callers names two operations.
//		Scope: func(r *http.Request) (idem.Scope, error) { return idem.Scope(tenantOf(r)), nil },
//	})
//	if err != nil { … }
//	mux.Handle("POST /v1/payments", m.Handler(payments))
//
// The middleware is a face of the engine (package keyed): it reads the
// key, the scope and a fingerprint from the request and speaks the
// engine's answers as HTTP; every decision about a key is the engine's,
// the same as on idemgrpc's interceptor, and keyed's documentation has the
// table of what each case gets on each.
//
// A Config must say whose keys are whose: Scope, keyed by whoever the
// request authenticated as, or SharedScope, for a service with one caller,
// knowing that a key is then the same key for every caller, replays
// included.
//
// What each request gets:
//
//   - no key where one is required: 400; a malformed key: 400; a body over
//     MaxBodyBytes: 413. These run nothing and keep nothing.
//   - the first request with a key: the handler runs. Its answer is kept if
//     it is deterministic (2xx, 3xx and 4xx by default, see DefaultKeep) and
//     replayed to every later duplicate with Idempotent-Replayed: true. A
//     transient failure (5xx, a panic, a timeout) keeps nothing and
//     releases the key, so a retry really runs again; after a recovery
//     point it keeps the key in flight with its point instead.
//   - a duplicate while the first is still running: it waits (InflightWait,
//     5s by default, never past the request context's deadline, and not at
//     all once its client has gone) and gets the first's answer; if the
//     first is still running after that, 409 with Retry-After (when the
//     holder's lease ends).
//   - the same key with a different request (method, path, query or body;
//     JSON bodies compared canonically, so key order and white space do not
//     matter): 422, whether the first is finished or still running.
//   - the store unreachable: 503 with Retry-After. The middleware fails
//     closed: it never runs the handler unprotected.
//
// Errors are RFC 9457 problem+json documents whose type is a stable URN
// (the Problem… constants). Their details speak of the client's own
// request only: what went wrong inside (a store's error, a connection's
// addresses, the Scope function's error) goes to Config.Logger, and the
// client gets a fixed sentence saying what to do.
//
// # Two forms
//
// With a plain idem.Store (idemmem, a shared key store), the key is claimed,
// the handler runs, and the answer is stored afterwards. A crash between the
// effect and that store leaves the key in flight until its lease ends; a
// retry then runs the handler again, so effects outside the store should
// themselves be keyed (pass a key on downstream: DownstreamKey).
//
// With an idem.TxStore (idemsqlite), the handler runs inside the store's
// transaction: its writes to that database and the kept answer commit
// together, and nothing reaches the client before the commit. "Charged but
// not recorded" and "recorded but not charged" cannot happen. An execution
// that outlives its lease and was taken over is refused at commit and its
// writes are rolled back (fencing), so even then the effect happens once.
//
// Where the store's write transactions run one at a time (an
// idem.SerialWriter: idemsqlite, SQLite having one writer per file), the
// key is claimed with one short write before the handler runs, and the
// transaction begins at the handler's first write: a handler that waits
// for something before writing (a validation, a call to another service)
// holds the writer only while it writes, and other requests' writes go on
// meanwhile. A duplicate sees the key in flight and waits for the answer.
//
// With an idem.TxClaimer that does not write serially (idempg), the key is
// also claimed in that transaction (ClaimTx): claim, writes and answer
// commit together, a crash or a failed handler leaves the key free for the
// retry at once, and a duplicate arriving meanwhile waits in the database
// (at most
// Config.InflightWait) for the first transaction, then replays its answer.
// That wait holds a pool connection, so the duplicates of a key the same
// process is executing wait in the process instead, holding none: a burst
// of them cannot starve other keys. (Duplicates reaching another replica
// still wait in the database, one connection each, until the first
// execution commits.)
//
// # Where a replay comes from
//
// A duplicate reaching the process that completed its key, within
// Config.MemoryReplayFor (10s by default: retries come soon after the
// first try), is answered from that process's memory, without reaching
// the store at all; later, and for keys it saw completed (up to
// Config.RecentKeys), by one read of the record (idem.Replayer where the
// store has it); anywhere else, by the claim, which finds the key
// completed. Every path gives the same answer: a completed record does not
// change until it expires, and an answer is kept in memory no longer than
// MemoryReplayFor, and never past its record's expiry less
// MemoryReplayFor, room left for the store's clock to differ from
// Config.Clock by that much. A request that does not match the kept one
// is refused from the store's record, never from memory. The one change
// memory does not see is a record deleted before its expiry, by hand in
// the database (Purge deletes only expired ones): the process may replay
// it for up to MemoryReplayFor more.
//
// # Leases and fencing
//
// Each claim holds the key under a lease (Config.Lease) and a fencing token,
// which the engine renews while the handler runs, so a live handler keeps
// its key however long it runs (up to Config.Timeout). If the process dies
// mid-request, the lease ends and a retry takes the key over with a new
// token; a handler whose lease cannot be renewed (the store unreachable)
// has its context cancelled before the lease ends, so a well-behaved
// handler never outlives it. It is not cancelled when the client goes
// away: the client's retry is then due, and gets the answer kept rather
// than an execution cut off half-way to run again. A completion that
// arrives after its lease was taken over is refused and logged. The
// engine's table (package keyed) says what happens in every case, the same
// as on idemgrpc.
//
// # Effects past the database's edge
//
// A handler whose work calls another service (a charge at a card network)
// cannot commit that call with the key's answer. It sends the call with a
// key derived from its own and named for the call (DownstreamKey, or
// WithCallName for a RoundTripper's request), so every execution makes the
// same one, whatever order its calls start in, and it runs in phases, in the claim-first form
// (Config.SeparateTx): SaveRecovery records the phase reached with the
// key's record (in the phase's own transaction when the context carries
// one), and a later execution reads it from Execution.Recovery and goes on
// from there. A key with a recovery point is never released after a
// failure: the failed execution yields its lease (OutcomeUnfinished), so the
// client's retry takes the key over at once. An execution that died is
// finished, with nobody asking, by a Completer (Middleware.NewCompleter):
// within Completer.Bound of the death, or, when the outcome cannot be
// learned, kept in flight and counted as unknown, never released. The store
// must be an idem.Recoverer (idemmem, idemsqlite, idempg, idempgsql).
// docs/recovery.md tells the whole story.
//
// # Replayed headers
//
// Only Content-Type, Content-Language, Location and Config.ReplayHeaders are
// kept and replayed. Set-Cookie, Authorization and other credentials never
// are: a replay goes to whoever presents the key.
//
// # Keys and answers at rest
//
// A store keeps, for each key, the key itself and the answer given, so a
// dump of it (a backup, a replica, a debugging session) shows every key a
// client sent and every answer. Three settings keep them out, the same on
// every store, because the middleware applies them before the store sees
// anything:
//
//   - Config.KeySecret seals keys: the store keeps SealKey(secret, scope,
//     key), "hk1_" and a base64url HMAC-SHA-256 of the scope and the key,
//     never the key. The scope is kept as it is (stores group and shard
//     by it); being part of the digest, it makes one key sent by two
//     tenants two unrelated records. Execution.Key is the sealed key, so
//     an effect recorded under it (the payment service's idempotency_key
//     column) is sealed too. A sealed key is a valid Idempotency-Key, for
//     passing downstream. The secret must be the same on every replica
//     and must not live in the store. It cannot be rotated in place: a
//     key kept under the old secret is not found under the new one, and a
//     duplicate of it would run again; change it only when no key of the
//     old one is still within its TTL, or accept that risk knowingly.
//     Turning it on for a store that kept keys in clear needs the keys
//     rewritten while no replica runs (payments.SealKeys, `idem keys
//     seal`); a store that cannot be rewritten (Redis) is switched over
//     by waiting out the TTL with the service stopped, or by accepting
//     that a duplicate of a key sent before the switch may run again.
//   - Config.BodyKeys encrypts the kept bodies with AES-256-GCM, each with
//     a fresh nonce, bound to its record's scope and key (a body copied to
//     another record does not open there). The first key seals; all open.
//     To rotate, put a new key first and keep the old one until the TTL
//     has passed since the switch; then remove it. A body that no key
//     opens (its key was removed too soon, or the store was altered) is
//     answered with 500 ProblemAnswerUnreadable and never run again.
//     Headers are kept in clear: keep secrets out of ReplayHeaders.
//   - Config.DiscardBodies keeps no body at all, only the status and the
//     replayed headers: replays carry Idempotent-Body-Omitted: true.
//   - Recovery points' data (SaveRecovery) is sealed with the same
//     BodyKeys, rotated the same way, bound to its record and to the
//     point's name; a point no key opens is answered 500
//     ProblemAnswerUnreadable, and nothing runs (the key stays in flight
//     with its point until a key that opens it is given back). Without
//     BodyKeys the data is kept as it was saved. `idem keys seal` rebinds
//     sealed bodies and points to the sealed keys, and seals the points
//     and bodies it finds in clear when BodyKeys are given.
//
// What stays readable: the scope, the request's fingerprint (a SHA-256 of
// the method, path, query, content type and body, which reveals a body
// only to someone who can guess it whole), the state (in flight or
// completed), the status, the replayed headers and whether the body was
// discarded, the recovery point's name (a phase such as "charging", chosen
// by the application), the fencing token, the holder (replica and
// incarnation) and the times. Everything else of a record (the key, the
// body, the point's data) is sealed when both settings are given. What an
// application writes to its own tables, and what it sends downstream, is
// its own business: keyed.DownstreamKey gives a digest to send instead of
// the client's key.
//
// The settings act on what is written from then on. Records written before
// a setting was given keep what they were written with: before
// Config.KeySecret, the raw keys; before Config.BodyKeys, the bodies and
// the points' data in clear (with the client's key inside them, when an
// application saved it in a point). They stay so, readable in every dump,
// until `idem keys seal` (payments.SealKeys) rewrites them, or until they
// expire and are purged; the rewrite covers every record of the table,
// whichever face (idemhttp, idemgrpc) wrote it. A Redis store is not
// rewritten: its records in clear are gone only once their TTL has passed.
//
// # Publishing the policy
//
// The IETF draft asks a resource to publish its idempotency policy.
// Middleware.Policy describes it from the middleware's own configuration:
// whether the key is required and for which methods, its expiry and lease,
// the replayed headers, and every answer the middleware gives itself (400,
// 409 and 503 with Retry-After, 413, 422, 500), each a problem+json.
// Policy.OpenAPI renders it as an OpenAPI 3.1 fragment: the
// Idempotency-Key header parameter with the key's syntax (KeyPattern), the
// answers with RFC 9457 schemas narrowed to their problem types, the
// Idempotent-Replayed header, and an x-idempotency extension (expiry and
// lease in seconds). The fragment is plain JSON values rather than a
// library's types, so that the package keeps to the standard library and a
// document built any way can take it in (OpenAPIFragment.ApplyTo merges it
// into an operation).
//
// # Observability
//
// Every protected request ends in one Outcome, counted (Counts; see package
// idemprom for Prometheus) and logged through log/slog. The key is logged
// as idem.KeyDigest of its scope and key, a keyed digest that correlates
// the lines about one key without revealing it; set the same secret on
// every replica (idem.SetKeyDigestSecret) to correlate theirs.
//
// Config.Observer sees more: each protected request as PhaseRequest, with
// its Outcome and duration, around its phases (PhaseClaim, waits for an
// execution in flight included; PhaseHandler; PhaseComplete; PhaseReplay),
// and every round trip to the store. Begin returns the context a phase
// runs with, and the handler's context is derived from PhaseHandler's, so
// a tracing observer's span is the parent of what the handler does
// (package idemotel); a histogram observer ignores the context and keeps
// the durations (package idemprom's MiddlewareObserver). Observers puts
// several on one middleware. With no Observer the middleware calls nothing
// and allocates nothing for it: the request path is what it was without
// the seam.
package idemhttp
