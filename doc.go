// Package idem is the vocabulary of effectively-once effects.
//
// "Exactly-once delivery" is a myth: a sender that gets no acknowledgement
// cannot tell a lost message from a lost acknowledgement, so it retries, and
// retries make duplicates. What is real is at-least-once delivery plus
// de-duplication at the receiver. idem is the receiver's half, for both
// ways work arrives: HTTP requests that carry an Idempotency-Key, and
// messages from a broker.
//
// This package holds the types every other idem package speaks, and nothing
// but the standard library. The other packages each do one thing, and each
// dependency (a database, a broker, a metrics library) has a package of its
// own, so a program imports only what it uses.
//
// # The request half
//
//   - Key (ParseKey: the IETF draft's structured-field string and Stripe's
//     bare token), Scope (who owns a key; keys never cross scopes) and
//     Fingerprint (method, path, query and body, JSON canonicalised by
//     CanonicalJSON, RFC 8785), so that a key reused for another request is
//     refused.
//   - Store: claim a key atomically (exactly one caller wins), Complete it
//     with the answer every duplicate gets, or Release it after a transient
//     failure so that a retry runs again; a lease with a fencing Token
//     covers the key in flight. TxStore completes a key in the caller's own
//     transaction, with the effect; TxClaimer claims it there too, so no
//     one ever sees it in flight; SerialWriter says that the store's
//     writes run one at a time, so that such a transaction would hold up
//     every other write; Replayer answers replays with one narrow
//     read; Waiter wakes duplicates waiting for a key.
//   - keyed: the engine, the one place where a key's protocol is written
//     (claim, wait for a duplicate in flight within the caller's deadline,
//     run once, keep or release, replay, renew the lease while the handler
//     runs, recovery points and the Completer that finishes abandoned
//     executions, keys passed on downstream by name), whatever carries the
//     request. Its documentation has the table of what every case gets.
//   - idemhttp: the engine's HTTP face, server middleware (refusals as
//     problem+json: 422 for a mismatch, 409 for a key in flight), and the
//     client half, a RoundTripper that gives each operation one key and
//     retries it safely.
//   - idemgrpc (a module of its own, on grpc-go): the engine's gRPC face,
//     a unary interceptor (refusals as gRPC statuses) and a client
//     interceptor that keys and retries calls. A face of your own is a few
//     hundred lines: examples/jsonrpc is one, for JSON-RPC 2.0.
//
// # The message half
//
//   - Message, and the transports' seams: Publisher, Subscriber, Stream,
//     Delivery (BatchStream for transports that take and acknowledge many
//     at once, BatchRenewer for those that renew many deliveries' AckWait
//     in one round trip).
//   - Inbox: a consumer records each message's de-duplication key in the
//     same transaction as its effect, so a redelivery is a duplicate
//     (ErrDuplicate) and a failure leaves nothing; BatchInbox does a batch
//     in one transaction; SequenceInbox de-duplicates by aggregate and
//     sequence number, one high-water mark per aggregate.
//   - Outbox: events written with the effect they announce, relayed later
//     (OutboxMover for transports that live in the same database).
//   - DeadLetters and Ledger: what failed for good, with every attempt and
//     its history, and the attempts and held-back keys of messages still
//     being retried. ErrorClass, Permanent and RetryAfter classify failures;
//     RetryPolicy spaces retries with jittered exponential backoff.
//   - consumer: subscribe, de-duplicate in the inbox, run the handler in the
//     inbox's transaction, retry or dead-letter, keep each key's order.
//     outbox: the relay from an Outbox to a Publisher. deadletter: list,
//     show, re-drive (edited or not) and discard dead letters, with an
//     audit trail.
//
// # Backends
//
// Each backend is a module of its own, so a program gets only the
// dependencies of the backends it imports; this module (the vocabulary,
// keyed, idemhttp, idemmem, consumer and consumertest, outbox, deadletter,
// console) requires nothing outside the standard library. Every backend
// passes the conformance suites of idemtest (a module of its own) for each
// seam it implements (TestStore, TestMiddleware, TestFace, TestInbox,
// TestTransport, TestOutbox, TestDeadLetters, TestLedger), including a
// linearizability check of its concurrent histories by Porcupine:
//
//   - idemsqlite: the embedded default, one file; every interface.
//   - idempg: PostgreSQL through pgx; every interface, with a SKIP LOCKED
//     transport and LISTEN/NOTIFY wake-ups.
//   - idempgsql: PostgreSQL through database/sql, on the application's own
//     *sql.DB and driver, so that sqlx, sqlc, Bun, GORM or ent commit
//     their effect with the key's record or the inbox row.
//   - idemredis: a Store (a claim in one command) and an Inbox.
//   - idemnats (JetStream), idemamqp (RabbitMQ) and idemkafka (Kafka, on
//     franz-go): transports.
//   - idemmem: everything in memory, the reference the suites are checked
//     against, and a store for tests.
//
// Names agree across backends: Open connects to a URL or a file and
// returns the handle the caller closes (a *DB for the databases, a
// *Transport for the brokers, the *Store itself for Redis); NewStore,
// NewInbox, NewTransport and the other New functions build one thing on a
// handle or client the caller already has, which they never close.
//
// idemprom turns the toolkit's counters into Prometheus metrics, and
// idemotel into OpenTelemetry spans. idemprobe (a module of its own)
// checks from outside whether any HTTP endpoint honours idempotency keys,
// from an API team's go test or the command. The examples module shows the
// middleware under net/http's ServeMux, chi, echo and gin, an effect in
// the key's own transaction (sqltx), and a third face (jsonrpc). The command, cmd/idem (a module
// apart: go install github.com/idem-go/idem/cmd/idem@latest), runs the
// reference payment service, the lab that shows all of this (it
// double-charges in its unsafe mode and never otherwise), tells the lab's
// story (idem demo), measures idem against hand-written minimums (idem
// bench), checks any API's Idempotency-Key handling from outside (idem
// probe), puts the promise under load and faults (idem torture), and
// operates dead letters and keys (idem dlq, idem console, idem keys).
//
// # A key's life
//
//	Claim ──► Acquired ──► effect ──► Complete ──► Completed (replayed until ExpiresAt)
//	   │                         └──► Release  ──► gone (a retry runs again)
//	   ├────► InFlight   (another holder; wait and claim again)
//	   ├────► Completed  (replay Record.Response)
//	   └────► Mismatch   (same key, different fingerprint: refuse)
//
// # A message's life
//
//	Outbox.Add (with the effect) ──► relay ──► Publisher ──► Stream ──► Delivery
//	   Inbox.Process ──► ErrDuplicate ──► Ack            (a redelivery: nothing runs)
//	                ├──► handler ok ──► commit ──► Ack   (effect and inbox row together)
//	                ├──► transient  ──► Nack, retried after a backoff, in key order
//	                └──► permanent, or attempts exhausted ──► DeadLetters ──► re-drive or discard
//
// # Keys in logs
//
// A Key logs (Key.LogValue) as "hmac:" and 16 hex characters: 64 bits of an
// HMAC-SHA-256 of the key, enough to correlate the lines about one key and
// useless for finding it. Where the scope is known, KeyDigest digests scope
// and key together, so one key in two tenants logs as two. The HMAC's
// secret is drawn at random once per process, so an unkeyed hash of a
// guessed key matches nothing and one process's digests say nothing about
// another's. To correlate the logs of several replicas, give every one
// the same secret with SetKeyDigestSecret, and keep it secret.
package idem
