// Package payments is the reference payment service: the lab that shows
// why at-least-once delivery needs de-duplication on the receiving side, and
// the proof that idem's toolkit is usable by an ordinary service.
//
// # The problem it demonstrates
//
// A customer presses "Pay" and the screen freezes. Did the payment go
// through? The client cannot tell a lost request from a lost
// acknowledgement, so it does the only safe thing for not losing the
// payment: it sends the request again. If the server processes both, the
// customer is charged twice.
//
// The service can be run both ways:
//
//   - Unsafe mode (Config.Unsafe) is the "before". The Idempotency-Key header
//     is ignored, every response carries "Idem-Mode: unsafe", and every
//     duplicate is a new charge: a frozen screen and a second press, a
//     client library that retries on a timeout, or a lost acknowledgement
//     followed by a retry each charge the account again. The balance never
//     goes negative (the debit is a conditional UPDATE), so what goes wrong
//     is precisely the double charge, not corruption.
//   - Protected mode (the default) is the "after". POST /v1/payments and
//     POST /v1/accounts/{id}/deposits require an Idempotency-Key; the key is
//     claimed atomically (scoped to the tenant), the payment and the stored
//     answer commit in one SQLite transaction, and every duplicate, however
//     concurrent, gets the first answer replayed with
//     "Idempotent-Replayed: true". The same key with a different body is
//     refused with 422; a key is forgotten after Config.KeyTTL (24 hours by
//     default) and a background purger deletes it.
//
// # Failures are classified
//
// Deterministic answers are stored and replayed: 201, 402 insufficient
// funds (even if a later deposit would make the payment possible: retrying
// a key repeats its answer, a new attempt needs a new key), 404 unknown
// account. Transient failures are not stored: a 503 rolls the work back and
// releases the key, so the retry really runs. A 400 (malformed JSON, an
// amount of 0, the wrong currency) is not stored either: nothing ran, so
// the corrected request may reuse its key.
//
// # Request bodies are read strictly
//
// A body's meaning must not depend on the parser that reads it, so a body
// that two JSON parsers could read differently is refused with 400
// (invalid-request, the detail naming the member) before anything runs:
//
//   - a member name that is not exactly, case for case, one of the
//     request's names ("AMOUNT" or "Amount" for "amount": encoding/json
//     would take it for the field, other parsers would not);
//   - a name given twice in one object, at any depth, exactly or differing
//     only in case ({"amount":1,"AMOUNT":1000}: encoding/json keeps the
//     last, other parsers the first);
//   - an unknown name, a second JSON value, trailing bytes.
//
// This is also what keeps the idempotency fingerprint honest. The
// middleware fingerprints the canonical form of a JSON body, its members
// sorted by name, so {"amount":1,"AMOUNT":1000,…} and its reordering
// {"AMOUNT":1000,…,"amount":1,…} are one request to it, while a decoder
// that keeps the last duplicate reads 1000 from one and 1 from the other:
// the second would have been answered with the first's payment. Refused,
// both get the same 400, under one key or two, and nothing is charged.
// Fingerprinting what was decoded instead would still let one body mean
// two things to two parsers on its way (a proxy, a log, an audit).
//
// A body that cannot be read (the client's connection failed) is refused
// with the fixed detail "the request body could not be read"; the read
// error, which names the server's socket, goes to the log only. No detail
// of a 400 carries anything but what the client sent.
//
// # Faults on demand
//
// With Config.Faults on, a request may carry an Idem-Fault header (see
// HeaderFault) to make the failures of the story happen when a test or a
// demonstration wants them:
//
//	Idem-Fault: delay=300ms            the frozen screen: the request stays in flight
//	Idem-Fault: drop-after-commit      the lost acknowledgement: charged, no answer
//	Idem-Fault: fail-before-commit     a transient failure: 503, nothing charged
//	Idem-Fault: crash-after-commit     the process dies (SIGKILL) right after the commit
//	Idem-Fault: crash-after-charge     the card network charged; the process dies before the commit
//	Idem-Fault: drop-charge-answer     the card network charged; its answer is lost on the way back
//
// crash-after-commit is for tests with several processes: the replica dies
// and the client retries on another one. Where it fires depends on where the
// keys live (see HeaderFault): after the key's completion when it commits
// with the payment, between the payment's commit and the key's completion
// when the keys are in another store. Config.Crash replaces the SIGKILL in
// tests that run in one process.
//
// Send the same payment twice with delay=1s: unsafe mode charges twice,
// protected mode charges once and answers both with the same payment. Send
// it with drop-after-commit and retry: unsafe mode charges again, protected
// mode replays the payment the client never saw.
//
// # The card network
//
// With Config.Acquirer (idem serve --acquirer URL), a payment moves money
// past the service's database: it charges the account's card at a card
// network (package acquirer, run by idem acquirer) over HTTP, then records
// the payment, with the charge's ID, in its own database. The two share no
// transaction, and the charge is a call that may be slow, fail, or succeed
// with its answer lost. The service makes it once all the same:
//
//   - The charge is sent with an idempotency key derived from the client's
//     key and tenant (chargeKey), through idemhttp.RoundTripper: every
//     execution of the payment, on every replica, after a crash, a lost
//     answer or a transient failure, sends the same key, and the network,
//     itself behind idem's middleware, answers with the charge it made.
//   - The account is checked before the charge, so a payment the service
//     refuses charges nothing; one refused after the charge all the same
//     (the account changed meanwhile) refunds it, under a derived key too.
//   - A client that never comes back after a crash between the charge and
//     the commit leaves the key in flight at its "charging" point, which
//     the completer finishes. idem reconcile (Reconcile) reports such a
//     payment as being finished within the completer's bound
//     (ReconcileOptions.Bound) and as an unknown outcome past it, with
//     every difference between the books and the network; it reads while
//     the service runs without reporting what is made between its reads.
//
// The faults crash-after-charge and drop-charge-answer open that window on
// demand. In the unsafe mode every attempt sends a fresh key, and a retry
// charges the card again.
//
// # API
//
// Every /v1 route needs "Authorization: Bearer <api key>"; the key names
// the tenant (Config.APIKeys, ParseAPIKeys). Amounts are integers of minor
// units; currencies are three upper-case letters.
//
//	POST /v1/accounts                 {"balance":10000,"currency":"KRW"}       201 account
//	GET  /v1/accounts/{id}                                                     200 account
//	POST /v1/accounts/{id}/deposits   {"amount":100}                           201 deposit (key required)
//	POST /v1/payments                 {"account_id","amount","currency","description"?}
//	                                                                           201 payment (key required)
//	GET  /v1/payments/{id}                                                     200 payment
//	GET  /v1/accounts/{id}/payments   ?limit&starting_after&ending_before      200 {"data":[…],"has_more"} newest first
//	GET  /v1/accounts/{id}/deposits   ?limit&starting_after&ending_before      200 {"data":[…],"has_more"} newest first
//	POST /v1/refunds                  {"payment_id","amount"?,"reason"?}      201 refund (key required)
//	GET  /v1/refunds/{id}                                                      200 refund
//	GET  /v1/settlement                                                        200 {"currency","total","events","refunds"}
//	GET  /healthz, GET /readyz, GET /metrics
//	GET  /openapi.json                the API as an OpenAPI 3.1 document (no API key needed); each write's idempotency policy in x-idempotency
//
// # Lists
//
// Lists page as Stripe's do: newest first, by (created_at, id) so that
// items made in the same instant keep one order; limit is 1 to 1000
// (default 100); starting_after=<id> gives the items older than that one,
// ending_before=<id> the items newer than it (still newest first), and
// has_more says whether more exist beyond the page in the direction
// walked. A cursor must be an item of that same list (the tenant's, the
// account's, of that kind): one that is malformed, names anything else,
// or comes with the other cursor gets 400 (invalid-request, with the field,
// matching ErrInvalidCursor) and changes nothing.
//
// # Refunds
//
// POST /v1/refunds gives part or all of a payment back to its account:
// amount defaults to what is left of the payment. It needs an
// Idempotency-Key (its own middleware, "refunds"). Each payment carries its
// refunded total (payments.refunded); the refund's transaction raises it
// with a conditional UPDATE (refunded + amount <= amount), under the
// payment's row lock on PostgreSQL and the single writer on SQLite, and a
// CHECK backs it, so the refunds of a payment never sum past it, even when
// requests with different keys race. A refund that would is refused with
// 409 urn:idem:problem:refund-exceeds-payment: 409 because the request
// conflicts with the payment's state, not with the client's funds (402 is
// insufficient-funds), and deterministic, so the key keeps and replays it
// (the middleware's own 409, a duplicate in flight, has the type
// urn:idem:problem:request-in-flight and Retry-After). Each refund writes a
// refund.succeeded event in its transaction, on the payments' topic and
// keyed by the account, which the settlement subtracts (below).
//
// Every error is an RFC 9457 application/problem+json document whose type is
// urn:idem:problem:<slug>, for example urn:idem:problem:insufficient-funds.
// Another tenant's account or payment is indistinguishable from a missing
// one (404).
//
// /healthz, /readyz and /metrics need no API key, so probes and Prometheus
// can reach them; expose them only where they belong.
//
// # Health, readiness, and a database that stops answering
//
// /healthz says the process is alive and its database answers a read;
// /readyz says a write commits, durably, as every payment's must: a full,
// read-only or stalled disk, or a database refusing writes, makes /readyz
// 503 while /healthz may still be 200. Each waits at most
// Config.ProbeTimeout (2s); a /readyz write that a stalled disk holds is
// not repeated, later checks answer from it. Every API request is bounded
// by Config.RequestTimeout (15s): past it the client gets 503
// (urn:idem:problem:request-timeout, Retry-After), whatever the request
// waits for; what it was writing commits or not as a whole, and the retry
// with the same Idempotency-Key replays it or runs it. A gRPC call is
// bounded the same, with or without a deadline of its own, and past it
// ends Unavailable (request-timeout).
//
// # Metrics
//
// /metrics serves Config.Registry: idem_http_requests_total{middleware,
// outcome} for the four idempotency middlewares (middleware="payments",
// "deposits", "refunds", "accounts"; outcome executed, replayed,
// mismatch, …), and with Config.GRPC the gRPC face's as
// idem_grpc_requests_total (middleware="grpc-payments", "grpc-refunds"),
// each face's latencies and completer under its own names likewise
// (idem_http_…, idem_grpc_…), and the committed totals read from the database, payments_created_total,
// payments_deposits_total and payments_accounts. In unsafe mode, sending N
// duplicates and watching payments_created_total grow by N is the lab's
// "before"; in protected mode it grows by one and outcome="replayed" by N-1.
//
// Dead letters: idem_dead_letters{consumer} and
// idem_dead_letter_oldest_age_seconds{consumer}, gauges read from the
// database at each scrape (letters in state dead; an explicit 0 for the
// settlement consumer before its first), so an alert on a queue of failed
// messages is one rule; and the settlement consumer's counters since start,
// idem_consumer_messages_total{consumer,outcome} (outcome processed,
// duplicate, retried, dead_lettered, parked).
//
// # Events and settlement
//
// Every payment is announced: in the payment's own transaction (so a
// payment without its event, or an event without its payment, cannot
// commit) the service writes the event payment.succeeded (PaymentEvent:
// {"event_id","type","payment_id","tenant","account_id","amount","currency",
// "occurred_at"}) to the outbox of its database (idemsqlite.Outbox or
// idempg.Outbox), with event_id as the message ID, topic payments.succeeded
// and the account as the ordering key. A payment re-found through its
// idempotency origin writes no second event. Every refund is announced the
// same way, as refund.succeeded with its refund_id, on the same topic and
// key, so one consumer settles an account's payments and refunds in order. A relay (package outbox)
// started by New publishes the outbox to Config.Broker, or, without one, to
// the database's embedded transport (idemsqlite.Transport, idempg.Transport),
// and is woken after each payment answer; Close stops it. Several replicas
// may each run a relay: the outbox's leases (SKIP LOCKED on PostgreSQL) keep
// them from publishing an event twice in normal operation, and a relay that
// dies between publishing and marking an event sent makes a duplicate that
// the consumer absorbs.
//
// The consumer "settlement" (package consumer) adds each event's payment to
// its tenant's total in the table settlements, in the transaction of its
// inbox row (the database's Inbox). Two guards, each committed with the
// increment, keep a payment from counting twice. The inbox, keyed by the
// body's event_id rather than the transport's ID (so a copy re-published
// under another ID is caught too), absorbs redeliveries of one event. And
// each payment carries whether it was settled (the column
// payments.settled): the statement that reads a batch's payments marks the
// unsettled ones settled (UPDATE … WHERE NOT settled … RETURNING), and only
// the payments it marked are added, so a second event for a payment, under
// an event_id of its own (a producer announcing it twice, an event
// re-published by hand), adds nothing; it is processed, logged as a
// warning, and its inbox row kept. The settlement's total is the sum of the
// payments settled less the refunds settled, events how many payments
// and refunds how many refunds; a refund is marked settled the same way
// (refunds.settled), so it is subtracted at most once. Payments made before that column
// existed start unsettled, so that none whose event was still on its way
// loses its settlement; a second event for one of them could still be
// added once, as it could before the column. The amount added is always
// the recorded payment's. Malformed JSON, a body
// without event_id, and an event of an unknown payment (or one disagreeing
// with the recorded payment) are permanent (idem.Permanent): dead-lettered
// at once. Other failures are retried up to Config.MaxAttempts with full
// jitter between Config.RetryBase and Config.RetryCap, then dead-lettered as
// exhausted. With Config.Faults, the message header Idem-Fault of an event
// injects faults: fail-times=N fails its first N attempts transiently, and
// crash-after-settle kills the process (Config.Crash) once its settlement
// and inbox row have committed, before the transport is told, so that the
// transport delivers it again after the restart. Events are ordered by
// account: once one is dead-lettered, the account's later events are parked
// (the consumer's default) and settled, in order, when the letter is
// re-driven or discarded. DeadLetterService and DeadLetterServicePostgres
// give the dead letters to people (`idem dlq`); a re-driven letter goes back
// through the outbox, under a new message ID (deadletter.SuffixIDs) that no
// broker's duplicate window drops, and keeps its event_id.
//
// Which guarantee comes from where: the outbox makes "the payment committed"
// and "its event will be published" one fact; the relay and the transport
// (JetStream, RabbitMQ with publisher confirms, or the database) deliver it
// at least once; the inbox, committed with the increment, makes the effect
// happen once. JetStream's duplicate window (Nats-Msg-Id, 2 minutes by
// default) also drops a copy a relay publishes again soon after; that is an
// optimisation, not the guarantee. Inbox rows are kept for
// Config.MessageRetention, which must exceed the longest time a transport
// may still deliver a message again: a settled message is never delivered
// again by the embedded transports; a relay's copy arrives within its lease
// (30s); a broker redelivers unacknowledged messages as long as it keeps
// them, so a consumer stopped for longer than the retention must not be
// restarted without thought.
//
// # Storage
//
// The service keeps its accounts, payments and deposits in one database,
// with its own embedded migrations (component "payments"): SQLite
// (Config.DB, an idemsqlite.DB; Migrate) or PostgreSQL (Config.Postgres, an
// idempg.DB, in its schema; MigratePostgres). Migrations are idempotent;
// PostgreSQL's are serialised by an advisory lock, so replicas starting
// together neither fail nor apply twice.
//
// Unless Config.Keys is set, the idempotency keys live in the same database
// (idemsqlite.NewStore, idempg.NewStore), and the middleware runs every
// protected handler inside the key store's CompleteTx. Every write goes
// through the database's WithTx with the request's context, which joins
// that transaction: the payment, the debit and the stored answer commit
// together, so "charged but no answer stored" and "answer stored but not
// charged" cannot happen, and a crash at any point leaves either everything
// or nothing. In unsafe mode the same call commits on its own.
//
// On PostgreSQL every write locks the account's row (SELECT … FOR UPDATE)
// before checking it, so concurrent payments from one account queue up and
// the debit, still guarded by "balance >= amount", never drives a balance
// below zero. A failure of the connection or the server inside a write
// answers 503 (the write's transaction cannot have committed), so the retry
// with the same key really runs.
//
// # At rest
//
// With Config.BodyKeys, a payment's description and a refund's reason are
// sealed in their rows (AES-256-GCM under a key derived from the first body
// key, bound to the column, the tenant and the row's ID) and opened as they
// are read; reconcile reads none of them. SealKeys seals those kept in
// clear, and, after a rotation, seals again with the new first key those
// sealed with another. What stays readable in the service's own tables:
// the IDs, tenants, accounts, amounts, currencies, balances, statuses,
// times, refunded totals, settled marks, the card network's charge IDs,
// the origins' digests or sealed keys and their claim times, the
// settlements, and the events in the outbox and inbox (IDs, tenant,
// account, amounts; never a description, a reason or a key).
//
// Rows and records written before a secret was given keep what they were
// written with until `idem keys seal` (SealKeys) runs: the idempotency
// keys in idem_keys as the clients sent them (before KeySecret; the
// service's own tables keep a digest then, or, for rows of versions before
// the digest, the key itself, which SealKeys seals too), and the kept
// answers, the "charging" points' data (which holds the client's key) and
// the descriptions and reasons in clear (before BodyKeys). SealKeys
// rewrites every one of them in one transaction, the gRPC face's records
// with the HTTP face's; give it both secrets. Until it runs, a dump shows
// them. On SQLite it then rebuilds the file and empties the WAL, so the
// old bytes of the rows it rewrote are gone from the disk; on PostgreSQL
// the old row versions stay in the tables' files (never in a pg_dump)
// until VACUUM FULL rewrites them: run it after the seal.
//
// # Two stores
//
// With Config.Keys (an idemredis.Store, for example) the keys and the money
// live in two systems that share no transaction. The middleware then claims
// the key, runs the handler, whose writes commit on their own, and completes
// the key afterwards. Between the handler's commit and the key's completion
// there is a window, and the service closes it in its own database.
//
// Every payment and deposit records the execution of the key that made it,
// idempotency_key and key_claimed_at (idemhttp.Execution.ClaimedAt: the key
// record's creation time, the same for every execution of one logical
// request, new once the key has expired and is claimed again). The key
// recorded is never the client's: with Config.KeySecret it is the sealed
// key, without it a digest of tenant and key (the execution's
// DownstreamKey "payments", "origin", "idg1_…"); rows of earlier versions
// that kept the key as it was are still found under it. They are under a
// UNIQUE constraint on (tenant, idempotency_key, key_claimed_at). Rows made
// without a key (unsafe mode, a key-less account) hold NULLs there, which
// never conflict. A write first looks for the row of its own execution; if
// there is one it writes nothing and answers with it (201, the same id), or
// with 422 idempotency-key-conflict if that row has another account, amount
// or currency. (The look-up comes before the balance check so that a re-run
// is not refused with 402 because of its own earlier debit.) Otherwise it
// inserts its row with ON CONFLICT DO NOTHING and debits (or credits) only
// if the row was inserted, all in one transaction: the constraint, not the
// look-up, has the last word.
//
// A write looks further than its own execution: a key store that loses a
// claim it acknowledged (a Redis master that fails over before its replica
// has the claim, a Redis without persistence that restarts) sees the retry
// as a new key, claimed at a new time, which the constraint alone would
// let pay again. So a payment, a deposit or a refund also finds, and
// answers with, the row made under the same key by another claim within
// the key's TTL (Config.KeyTTL) on either side of its own: earlier, when
// the lost claim's execution committed first; later, when it was still
// running while the retry's committed. The earliest such row answers.
// Writes to one account are ordered by its row lock (on PostgreSQL taken
// in a statement of its own before the look-up, so the look-up reads after
// any other write of the account committed) or by SQLite's single writer,
// so of two executions the second sees the first's row.
// TestClusterRedisFailover loses claims so and counts no payment twice;
// TestStorageClaimsOfALostKey commits them in either order and races
// eight; `idem torture requests --keys private-volatile` restarts a Redis
// that keeps nothing on disk under the load. Two executions in two claims
// the store granted at once (the old master still answering while the new
// one takes over) are ordered the same way and pay once;
// idemredis.OpenReplicated with min-replicas-to-write keeps such claims
// from being lost in the first place.
//
// What can still go wrong, exactly:
//
//   - The process dies (or loses the key store) after the payment commits and
//     before the key is completed. The payment is made; the key stays in
//     flight in the key store until its lease ends (Config.KeyLease, 1m by
//     default). Retries during the lease wait (up to Config.InflightWait),
//     then get 409 with Retry-After; none runs the handler.
//   - After the lease, the next retry, on any replica, takes the key over: a
//     new fencing token, the same claim time. It runs the handler again,
//     which finds the payment through the unique constraint, charges
//     nothing, and answers 201 with the first payment's id; the key is
//     completed with that answer, and every later retry gets it replayed.
//     The client's cost is the wait for the lease.
//   - A client that never retries never learns the outcome: the payment
//     stands (the money moved) and the key, never completed, expires with
//     its TTL. Nothing is charged twice, but the client must reconcile by
//     reading the account's payments (GET /v1/accounts/{id}/payments), as
//     with any request whose answer was lost. A retry after the key's TTL is
//     a new payment: the key has been forgotten.
//   - An execution that outlives its lease (a stalled process, a long pause)
//     while a retry takes the key over: both carry the same claim time, so
//     whichever commits second meets the unique constraint and charges
//     nothing (on PostgreSQL it waits on the account's row lock or on the
//     first's uncommitted row first); it answers with the first's payment.
//     The slow one's completion is refused by the key store's fencing token.
//     The handler's context is also cancelled at 90% of the lease, so a
//     well-behaved handler rarely gets that far.
//   - A commit whose outcome is unknown (the connection to the database
//     drops while committing) is treated like a crash: the connection to the
//     client is cut and the key stays in flight until its lease ends,
//     because releasing it would let the retry claim the key anew, with a new
//     claim time the constraint does not know.
//   - What the constraint cannot catch: a key store that loses a completed
//     or in-flight record before its TTL (a Redis failover that loses the
//     last writes, eviction under maxmemory, a FLUSHALL) makes the next retry
//     claim the key anew, with a new claim time, so it runs as a new
//     payment. Run Redis with persistence and without eviction of these
//     keys. Account creation is not covered either: a re-run after a crash
//     opens a second account.
//
// In the same-transaction form (keys in the service's database) none of this
// arises: a crash before the commit leaves nothing, after it leaves both the
// payment and the completed key. The columns are filled there too, as a
// second line of defence.
package payments
