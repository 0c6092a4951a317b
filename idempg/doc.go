// Package idempg is idem's PostgreSQL store (pgx v5): an idem.Store,
// idem.TxStore, idem.TxClaimer and idem.Waiter whose records live in one schema of a
// PostgreSQL database, next to the application's own tables, and the
// message-side stores (Inbox, Outbox, DeadLetters, Ledger) in the same
// schema. Several processes (replicas behind a load balancer) share it: a
// key claimed by one is claimed for all.
//
//	db, err := idempg.Open(ctx, "postgres://app@db/payments", &idempg.Config{Schema: "payments"})
//	...
//	defer db.Close()
//	store, err := idempg.NewStore(ctx, db) // migrates idem_keys and idem_waiters
//	...
//	defer store.Close()
//
// # The schema
//
// Open connects a pgxpool, creates Config.Schema if it is missing (default
// "idem") and sets every connection's search_path to that schema alone, so
// idem's statements and the application's use unqualified names and two
// applications on one database keep apart by schema. Everything idem creates
// lives there:
//
//   - idem_schema_migrations(component, version, name, applied_at): which
//     migration of which component is applied;
//   - idem_keys: one row per key (scope and key, the fingerprint, the state,
//     the fencing token, the stored response, created_at,
//     lease_expires_at, expires_at, completed_at), with an index on
//     expires_at for Purge;
//   - the functions idem_claim (the claim) and idem_clock_us (the clock in
//     microseconds, for tokens);
//   - idem_waiters: an unlogged table where waiting duplicates register
//     (see "Waiting"), and the function idem_refuse_completion (see
//     "Transactions: round trips").
//   - the message tables (see "Messages"): idem_inbox, idem_outbox,
//     idem_dead_letters with idem_dead_letter_attempts and
//     idem_dead_letter_events, and idem_ledger_attempts, idem_ledger_holds
//     and idem_ledger_parked, migrated under the component "idem_messages"
//     by whichever of NewInbox, NewOutbox, NewDeadLetters and NewLedger
//     runs first.
//
// # A pool of the application's
//
// An application that already has a pgxpool gives it to NewDB instead of
// opening another: idem's statements then run on the application's
// connections, and DB.WithTx and the same-transaction forms below join the
// application's writes as they do on a pool Open made.
//
//	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
//	...
//	db, err := idempg.NewDB(ctx, pool, nil) // idem's tables in the pool's current_schema()
//	store, err := idempg.NewStore(ctx, db)
//
// idem's tables are then made in the schema the pool's connections use
// first (their search_path; "public" by default), beside the application's,
// all named idem_*. DB.Close leaves the pool open. The pool is used as the
// application configured it; a pool Open makes also pings, before handing
// it out, a connection that may have died with its server.
//
// DB.Migrate applies a component's numbered .sql files, each in its own
// transaction with its record, under pg_advisory_xact_lock on a hash of the
// schema and component: replicas starting together all succeed and each
// file runs once. NewStore migrates the components "idem_keys" (the keys)
// and "idem_waiters" (the waiters' registry); the application migrates its
// own tables into the same schema under its own component name, the same
// way.
//
// # Effect and completion in one transaction
//
// Store.CompleteTx runs the caller's work and completes the key in the same
// PostgreSQL transaction: the payment row and the key's stored response
// commit together, or neither does. A crash can leave neither "charged but
// not recorded" nor "recorded but not charged".
//
// The work reaches the transaction through DB.WithTx, with the context it
// was given:
//
//	kept, err := store.CompleteTx(ctx, ref, func(ctx context.Context) (idem.Response, bool, error) {
//		err := db.WithTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
//			_, err := tx.Exec(ctx, `INSERT INTO payments (id, amount) VALUES ($1, $2)`, id, amount)
//			return err
//		})
//		if err != nil {
//			return idem.Response{}, false, err
//		}
//		return idem.Response{Status: 201, Body: body}, true, nil
//	})
//
// The context carries the transaction, not yet begun: it begins (with
// Config.TxOptions) on a pool connection with the first statement the work
// runs through WithTx or a Store method with that context, so a handler that
// first waits for something holds no connection meanwhile. WithTx joins the transaction its
// context carries and begins its own when there is none, so the same handler
// code runs inside CompleteTx and on its own. When the work returns keep=true
// and no error, CompleteTx completes the key with a compare-and-set in that
// transaction (UPDATE ... WHERE token = <the caller's> AND state =
// 'in_flight') and commits; when the work fails, does not keep its answer,
// panics, or the completion finds another holder (ErrLeaseLost), everything
// is rolled back.
//
// A duplicate arriving while the first execution is in flight cannot run
// the work again, whatever isolation level the application picks
// (Config.TxOptions, READ COMMITTED by default): the claim committed before
// the work began, so every later claim sees the key in flight. If the
// first holder's lease ends and a second takes over and completes, the first
// holder's completion is refused: its UPDATE finds another token under READ
// COMMITTED (ErrLeaseLost), or fails with a serialization failure under
// REPEATABLE READ and SERIALIZABLE when its snapshot predates the takeover;
// either way its writes roll back and one execution counts.
//
// # Claim, effect and completion in one transaction
//
// Store.ClaimTx (idem.TxClaimer) goes one step further, and is what
// idemhttp's middleware uses with this store: the claim is made in the
// transaction that then runs the work and completes the key. The claim goes
// with BEGIN in one round trip, the work's statements follow, and the
// key's row goes with the COMMIT:
//
//	claim, kept, err := store.ClaimTx(ctx, req, 5*time.Second, func(ctx context.Context, c idem.Claim) (idem.Response, bool, error) {
//		err := db.WithTx(ctx, func(ctx context.Context, tx pgx.Tx) error { ... })
//		...
//	})
//
// Nobody else ever sees the key in flight. At READ COMMITTED (the default
// of Config.TxOptions) a new key is claimed by its lock, a transaction
// advisory lock on a hash of the schema, scope and key (the function
// idem_key_lock, which every claimant of the key takes, idempgsql's
// included), and its row is written once, completed, in the transaction's last
// statement: while the work runs there is no row at all, only the lock.
// At REPEATABLE READ and SERIALIZABLE the row is inserted in flight after
// the same lock, and stays uncommitted until it is completed. A crash of
// the process, a failed or unkept work, a panic: the server or the store
// rolls the transaction back and the key is as it was, free at once for
// the client's retry, with no lease to wait out and nothing to release.
// And a first execution costs one server transaction instead of two, one
// row version (at READ COMMITTED) with no update of it, and no look for
// waiters after the commit (nobody can wait for a row nobody sees).
//
// A duplicate arriving meanwhile runs into the lock: its own claim waits
// for the first transaction to end, holding a connection, at most as long
// as the wait it was given (lock_timeout, set for that statement alone),
// and then answers as the key is: completed (a replay), or free again
// because the first rolled back (the duplicate runs). Under REPEATABLE READ
// and SERIALIZABLE the claim that waited fails with a serialization
// failure, and ClaimTx begins again with a snapshot that sees the key. A
// duplicate that waits longer than its wait is answered InFlight. Every
// other claim that could create the key's row takes the lock first too:
// Store.Claim's INSERT waits for it as it would for an uncommitted row, and
// so does the function idem_claim before it inserts. So the work runs once
// at every isolation level (TestClaimTxDuplicatesWhileInFlight,
// TestClaimTxLockHoldsOffClaim), and waiting duplicates wake the moment the
// first commits, without LISTEN.
//
// Upgrading replicas from a release whose claims did not take the lock
// (before migration 0003 of idem_keys): until the last replica of the
// earlier release stops, one of them may claim a key while a newer
// replica's ClaimTx holds it by its lock alone. The work then runs on both;
// the newer one's row then fails to insert, its transaction rolls back
// with everything its work wrote, and its ClaimTx returns
// idem.ErrLeaseLost (idemhttp answers 503, and the client's retry gets the
// other execution's answer): one execution's writes commit, but an effect
// outside the database would happen twice. Stop the earlier release's
// replicas before the newer ones take traffic when that matters.
//
// What it costs: a duplicate waits with a connection of the pool, where
// Claim's waiters hold none, so a slow first execution with many
// duplicates can take a pool's connections until they give up; and a key
// that exists takes a round trip more than with Claim (the transaction
// that found it is rolled back). Keys that exist and must be written to be
// claimed (expired, or held by a Claim whose lease ended) are claimed as
// Claim claims them, in the transaction the work then runs in, with a
// fenced completion.
//
// # Recovery points
//
// The Store is an idem.Recoverer: a handler whose work calls out of the
// database (a charge at a card network) saves how far it got with the key
// (idemhttp.SaveRecovery), in the transaction of the phase's own writes
// when the context carries one (WithTx). The points live in idem_keys (keys
// migration 0004, which idempg and idempgsql share): idem_claim returns a
// key's point, keeps it on takeover, clears it when the key is claimed
// anew, and never claims anew a key in flight with one; Abandoned reads a
// partial index that holds only those keys. See docs/recovery.md.
//
// # Leases and holders
//
// A claim that must write (a takeover, a key claimed anew) locks the key's
// row before it reads the time (keys migration 0007), so one that waited
// for a transaction holding the row counts its lease from after the wait.
//
// Renew starts a holder's lease anew, fenced by its token, in one
// statement that commits durably (a renewal the server lost in a crash
// would leave a live holder with a shorter lease than it was told); it
// moves the record's expiry out to the new lease end when that is later.
// The Store is an idem.Restarter: the claim's holder (replica and
// incarnation) lives in idem_keys (keys migration 0005, shared with
// idempgsql), written by every claim and takeover; YieldEarlier ends an
// earlier incarnation's leases through a partial index that holds only the
// keys in flight under a named holder, and wakes their waiters. The
// function idem_claim of migration 0004 (nine arguments) stays, for
// replicas not yet upgraded, and claims anonymously through the new one.
//
// # Time
//
// With Config.Clock nil, the database's clock decides: claims, Get,
// WaitChange and Purge judge leases and TTLs, and claims and completions
// record their times, with clock_timestamp() (statement_timestamp() for
// Purge) on the server, never with the process's time, so replicas whose clocks disagree still agree on when a
// lease ends. With a Clock (tests inject a manual one) its time is passed to
// every statement as a parameter instead. Times are kept with PostgreSQL's
// microsecond precision; durations are rounded up to whole microseconds.
//
// # Claims: one round trip, asynchronous commit
//
// Store.Claim of a new key, the common case, is one statement: INSERT ...
// ON CONFLICT DO NOTHING RETURNING, without plpgsql. When the key exists, a
// plain SELECT answers a replay, a duplicate in flight or a mismatch (a
// second round trip), and only a claim that must write (an expired key
// claimed anew, an ended lease taken over) calls idem_claim, a plpgsql
// function created by the migration; its comment explains why it is atomic
// under READ COMMITTED with any number of callers on any number of
// connections: a key that looks free is taken by an INSERT ... ON CONFLICT
// DO NOTHING or an UPDATE whose condition PostgreSQL re-checks on the newest
// row after waiting for concurrent writers, so exactly one claimant wins
// and the others look again; a key that looks taken is answered without a
// write, so replays take no lock. The INSERT is the function's own first
// step and the SELECT answers as the function answers when it does not
// write, so the three decide together as the function alone would. The
// split saves a first execution the function's cost on the server (some
// 50µs of CPU: plpgsql, its SET clause, a second index probe; a single
// statement holding both branches still costs some 20µs, because the plan
// of the branch not taken is set up all the same), at the price of a round
// trip more for replays, which remain several times faster than first
// executions.
//
// A claim made on its own commits with synchronous_commit off (set for its
// transaction alone): the server acknowledges it without waiting for its WAL
// record to reach the disk, so a claim never waits for a disk flush.
// Losing a claim in a server crash is harmless for the same-transaction
// form, because nothing is executed under a claim that is not in a later,
// synchronous commit (CompleteTx's transaction, with the work's writes and
// the completion), and PostgreSQL writes and flushes WAL in order: once that
// later commit is durable, the claim, whose record comes earlier in the WAL,
// is durable too. After a crash, then, either the claim survived, or it was
// lost together with everything done under it, and the client's retry
// claims the key anew and runs the work once. Complete, Release and
// CompleteTx commit synchronously (as the server's synchronous_commit
// says), and a claim that joins the caller's transaction (WithTx) leaves that
// transaction's setting alone. The window is short: the WAL writer flushes
// within about three wal_writer_delay (600ms by default), and any
// synchronous commit on the server flushes everything before it.
//
// For effects outside the database (Store.Complete after calling another
// system), a crash in that window makes the claim vanish while its holder
// still runs the effect, so a retry may run it concurrently: the same risk
// as a lease that ends too early, which such effects already bound by
// passing the key on as the downstream call's idempotency key. The holder
// then finds out: its Complete returns ErrLeaseLost.
//
// # Fencing tokens
//
// A claim's token is the database's clock in microseconds when the row is
// written, or one more than the key's previous token if that is greater.
// Tokens therefore grow strictly per key while its row exists (takeovers,
// claims of an expired row), and a key claimed after its row was released
// or purged gets a token above the deleted one as long as the database's
// clock has not stepped back meanwhile. A sequence would not survive the
// asynchronous claim: a claim lost in a crash can lose its nextval too, and
// the sequence would then hand the same value out again, typically to the
// retry of the same request, while the first holder may still complete
// under it. The clock has moved on by the time the server has recovered.
//
// # Waiting: LISTEN/NOTIFY, only for keys with waiters
//
// Complete, Release, CompleteTx and takeovers notify the channel
// "<schema>_idem_keys" with a short hash of the scope and key as payload
// (keys are not revealed), once the change has committed, to every replica.
// Each Store keeps one dedicated connection listening on that channel,
// opened by the first WaitChange, and fans notifications out to its local
// waiters. When that connection drops it reconnects with backoff (50ms
// doubling to 5s), and wakes every waiter when the connection is lost and
// again once it listens, since notifications sent meanwhile were missed:
// waiters then read the key again instead of sleeping through a change.
// WaitChange also returns when the key's lease ends, by the store's clock,
// so a waiter can take over an abandoned key. Store.Close stops the
// connection and its goroutine. LISTEN needs a session: it does not work
// through PgBouncer in transaction mode.
//
// A NOTIFY takes a lock on the whole database that it holds until its
// transaction has committed, WAL flush included: had every completion
// notified in its own transaction, the completing commits would have run
// one at a time, each waiting for the previous one's flush, instead of
// sharing flushes (group commit). Measured with idem bench (below), with
// everything else as described here, notifying in every completing
// transaction takes the middleware from about 0.9x of the hand-written
// minimum down to 0.3-0.5x.
// Completions and releases therefore notify only the keys someone waits
// for, and only after they have committed:
//
//   - a waiter (WaitChange) registers in the unlogged table idem_waiters in
//     a transaction of its own that commits, and only then reads the key,
//     all in one round trip; it deletes its row when it returns;
//   - a completion or release looks for the key in idem_waiters in a
//     statement of its own that runs after its COMMIT, in the same round
//     trip (see below), and calls pg_notify only when it finds a waiter.
//
// Whichever of the two comes first, no waiter sleeps through the change: a
// registration committed before the completion's look is found, and the
// waiter is notified; a registration committed after it is followed by the
// waiter's read, which comes after the completion's commit and sees the
// change. Both sides look after the other's commit, so this holds at every
// isolation level. A duplicate writes nothing to the key's row (which would
// make the holder's completion fail with a serialization failure under
// REPEATABLE READ or SERIALIZABLE): its registration is a row of its own.
// Rows left by a process that died while waiting stop counting when the
// lease they waited for ends: Purge deletes them, and until then they only
// cost that key a notification nobody reads. The table is unlogged: its
// rows are short-lived and cost no WAL, and a server crash, which empties
// it, also drops every LISTEN connection, which wakes every waiter.
// Takeovers and the overwrite of an expired key, which are rare, notify in
// the claim's own transaction, whether or not anyone waits. (During a
// rolling upgrade from a version that did not register waiters, the waiters
// of older replicas are not notified by newer ones: they wake when the
// lease ends, or at their caller's next poll, as idemhttp's, every 250ms at
// most.)
//
// # Transactions: round trips
//
// The transactions of WithTx and CompleteTx take a pool connection when
// their first statement runs, and send BEGIN in one pipeline with that
// statement (Exec with arguments, Query, QueryRow; the other methods of the
// pgx.Tx, and Exec without arguments, which pgx sends over the simple
// protocol, begin on a round trip of their own). CompleteTx sends the
// completion, the COMMIT and the look for waiters in one pipeline too: the
// completion fails (SQLSTATE IDM01, from idem_refuse_completion) when
// another token holds the key, so that the COMMIT behind it commits
// nothing. A payment made through the store therefore takes one round trip
// for the claim plus one per statement of the work plus one for the
// commit; the same payment hand-written as one transaction (INSERT of the
// key ... ON CONFLICT DO NOTHING, the work's statements, the update of the
// key's response) takes two more: BEGIN, the key's insert and its update
// each take one, against the store's claim (TestRoundTrips counts both with
// a pgx tracer: 4 against 6 for a work of two statements).
//
// ClaimTx sends the claim with BEGIN and the completion with COMMIT, so the
// same payment takes 4 round trips in one transaction; a replay takes 2
// (TestRoundTrips counts those too).
//
// Store.Replay, the read that answers a duplicate before any claim, is one
// SELECT of five columns, prepared once per connection under the name
// idempg_replay and run through pgconn: its three parameters go as text
// from one buffer and its row is read from the binary columns directly,
// without pgx's conversions of each argument and column (BenchmarkReplay
// measures it against the same SELECT through pgx, and against hand-written
// code's SELECT of a status and a body by key). A store with a Config.Clock,
// a call inside a carried transaction, and a URL whose
// default_query_exec_mode is not cache_statement (for a pooler that keeps
// no prepared statements) read through pgx instead.
//
// What this costs against the hand-written minimum (the same payment as one
// transaction by hand) is measured, never quoted here, by
//
//	idem bench --postgres 'postgres://postgres@127.0.0.1:5432/test?sslmode=disable'
//
// which prints both sides and their ratio, and each side's CPU per
// request. The minimum writes its key's row twice (the insert and the
// update of its response); ClaimTx writes it once, a wider row than the
// minimum's (the fingerprint, the token, the times) with a second index
// (expires_at, for Purge).
//
// # Purge
//
// Store.Purge(limit) is one DELETE of at most limit rows whose TTL has
// passed and that no live lease holds, chosen by a SELECT ... ORDER BY
// expires_at LIMIT n FOR UPDATE SKIP LOCKED over the expires_at index. It
// locks only the expired rows it deletes and skips rows anyone else holds,
// so claims of live keys never wait for it; call it with a limit of about a
// thousand until it returns less. It commits with synchronous_commit off
// too: a purge lost in a crash only leaves expired rows for the next one,
// and no flush per batch competes with the claims. BenchmarkClaimDuringPurge measures claim
// latency while a million expired keys are purged, against the same claims
// with no purge, in one run:
//
//	go test -run '^$' -bench ClaimDuringPurge -benchtime 1x ./idempg/
//
// # Messages
//
// The consumer side of a message pipeline keeps its state in the database
// its effects live in, so that one transaction holds both:
//
//	inbox, err := idempg.NewInbox(ctx, db) // migrates the message tables
//	...
//	err = inbox.Process(ctx, "settlement", msg.ID, func(ctx context.Context) error {
//		return db.WithTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
//			_, err := tx.Exec(ctx, `UPDATE totals SET total = total + $1`, amount)
//			return err
//		})
//	})
//
// Inbox.Process is the inbox's transaction contract: it inserts the row
// (consumer, dedup key) with INSERT ... ON CONFLICT DO NOTHING and runs fn
// in the same transaction, whose context fn receives; the handler's writes
// through DB.WithTx(ctx, ...) join it, and commit with the row or not at
// all. A row already there means the message was processed: Process returns
// idem.ErrDuplicate without running fn. A failing fn rolls everything back,
// row included, and its error comes back unchanged, so a redelivery runs fn
// again. Two deliveries of one message at once, on any replica, are
// serialized by the primary key: under READ COMMITTED the second INSERT
// waits for the first transaction to end, then inserts nothing (it
// committed: a duplicate) or inserts (it rolled back: fn runs). Called with
// a context that already carries a transaction (an enclosing WithTx),
// Process joins it inside a savepoint, which a failing fn rolls back to.
// Handlers must write through the context fn is given: a write on the pool,
// or in a transaction of its own, commits whatever the inbox decides.
//
// Inbox rows must be kept at least as long as the transport can deliver a
// message again: a message redelivered after its row was purged counts as
// new and runs again. Purge with Inbox.PurgeInbox(ctx, olderThan, limit)
// only rows older than the longest redelivery window of every transport the
// consumer reads, with a margin: the broker's retention of unacknowledged
// messages (JetStream's MaxAge, a RabbitMQ queue's message TTL), the time a
// consumer may stay down and then resume, and the longest retry delay.
//
// The Outbox keeps the messages a transaction announces: Outbox.Add joins
// the transaction ctx carries (the service adds the payment's event in the
// payment's transaction), so the event exists exactly when the payment
// does. Relays lease entries with Outbox.Claim, one statement that picks
// the oldest entries whose lease has ended with SELECT ... ORDER BY seq
// LIMIT n FOR UPDATE SKIP LOCKED and leases them: relays claiming at once
// skip the rows another is leasing instead of waiting for it, so they take
// disjoint entries and never queue behind one another; a lease that ended
// (its relay died) makes its entries claimable again, oldest first.
// MarkSent deletes the published entries.
//
// DeadLetters keeps what failed for good, with every attempt and its
// history; Resolve is a compare-and-set on the state, so of two people
// resolving one letter at once, one wins and the other gets
// idem.ErrInvalidTransition. The Ledger keeps a consumer's failed attempts
// and held-back keys. Both join the transaction ctx carries, so the
// consumer's Config.InTx can be DB.WithTx.
//
// BenchmarkConsumerInbox measures a consumer (consumer.New, one message at
// a time) on this inbox against a hand-written loop that does the same
// writes (INSERT INTO idem_inbox ... ON CONFLICT DO NOTHING and the
// handler's UPDATE in one transaction, then the acknowledgement), both fed
// by an in-memory transport:
//
//	go test -run '^$' -bench ConsumerInbox -benchtime 5000x ./idempg/
//
// Both take four round trips per message: the consumer's are BEGIN with the
// inbox's INSERT, the look for a held-back key, the handler's UPDATE and
// COMMIT; the loop's are BEGIN, INSERT, UPDATE and COMMIT. Both wait mostly
// on the commit's WAL flush; the benchmark above prints how the two
// compare on the machine it runs on.
//
// Times are timestamptz (microseconds). The inbox's processed_at follows
// Config.Clock (the database's clock when nil); the outbox and dead letters
// take a Clock of their own in their Config, which defaults to the same.
// Headers are jsonb; those jsonb cannot hold (bytes that are not UTF-8, NUL)
// are stored base64-encoded and come back byte for byte. Names (consumer,
// dedup key, message ID, topic, key) must be valid UTF-8 without NUL bytes,
// or the call fails with an *idem.ArgumentError; error texts and reasons
// are stored with such bytes replaced by U+FFFD.
//
// # The transport
//
// NewTransport (component "idem_transport") makes the database the broker:
// an idem.Publisher and idem.Subscriber for a service with PostgreSQL and no
// broker. Each message is appended to a log and queued once per consumer
// name of its topic. A consumer name's streams, in any number of processes,
// take the oldest visible queue row with SELECT … FOR UPDATE SKIP LOCKED, so
// no message is held by two streams at once. Attempt counts, Nack delays and
// AckWaits are stored, judged by the database's clock (or an injected one),
// and survive restarts. Publish and a delivery's Ack, Nack, Term and
// InProgress join the transaction a context carries, so a message published
// in a transaction that rolls back is never delivered. Its streams are
// idem.BatchStream and idem.BatchRenewer: NextBatch, AckBatch and
// InProgressBatch take, settle and renew many rows with one statement each,
// so a consumer's heartbeat costs one round trip a beat however many
// deliveries it holds. Waiting streams wake
// through LISTEN/NOTIFY on "<schema>_idem_xprt", with a poll as the
// fallback. Purge deletes what every consumer name has settled. Publishing
// at high volume inside callers' transactions makes each commit take
// PostgreSQL's NOTIFY lock: go through an outbox instead, as the payment
// service does.
//
// # Replication and failover
//
// With a primary and streaming standbys, give Open a URL listing every host
// with target_session_attrs=read-write
// (postgres://app@h1:5432,h2:5432/db?target_session_attrs=read-write): the
// pool connects to whichever accepts writes, so after a promotion new
// connections find the new primary by themselves, and a request that fails
// meanwhile is a transient failure its retry repeats. The Store suite
// passes through such a URL (TestClusterStore).
//
// A server that restarts, crashes or fails over ends every connection of
// the pool at once, unseen until each is used. Once one is found dead,
// the pool pings every other before handing it out again (pgxpool alone
// pings only connections idle for over a second), so the statements that
// run while the server is back get live connections, rather than one
// failing per pooled connection; the cost is a round trip per connection
// after each death.
//
// A standby streaming asynchronously may lack transactions the primary
// acknowledged. Keys and effects commit together, so a promotion loses
// both of such a transaction, never one without the other: nothing runs
// twice, but a request answered before the failover is forgotten, and its
// retry runs it again as new. Measured with the payment service
// (TestClusterPostgresFailover in payments, 150 logical payments each sent
// twice at once and once more after the failover, the primary stopped
// immediate and the standby promoted): stopped alone, nothing was lost;
// stopped after the standby's WAL receiver stalled for under a second, 16
// acknowledged payments were gone after the promotion and their retries
// made them again under new ids (no money taken twice, 17 answers
// changed). With synchronous_standby_names set on the primary (and
// synchronous_commit on), the same run lost nothing. DB.Warnings reports a
// standby streaming asynchronously, or synchronous_commit off or local
// (ErrAsyncStandby), a synchronous standby that is not streaming
// (ErrNoSyncStandby: commits hang), and a DB connected to a standby
// (ErrStandby). After a promotion, the new primary has no standby of its
// own: do not give it synchronous_standby_names until one streams from it.
//
// # Errors and ambiguous failures
//
// Errors are wrapped with the operation ("idempg: claim: ..."), keeping the
// driver's error reachable with errors.As (*pgconn.PgError for a server
// error, with its SQLSTATE) and context errors with errors.Is. Malformed
// arguments are *idem.ArgumentError. When the connection is lost after a
// statement was sent (a network failure, a server restart, a COMMIT whose
// answer never came), the caller cannot know whether it took effect:
//
//   - Claim: the claim may have been made. Do not run the effect; claim
//     again (InFlight until the lost claim's lease ends, then a takeover).
//   - Complete, Release: may have committed. Calling again with the same
//     token is safe: a completed key completes again without change, a
//     released key releases again.
//   - ClaimTx: with an Acquired claim, as CompleteTx, except that a key
//     whose transaction did not commit is free again rather than held;
//     otherwise the claim failed before any work, and claiming again is
//     safe.
//   - CompleteTx: an error of the COMMIT (it says "commit") may hide a
//     commit that happened, unless it is a serialization failure (SQLSTATE
//     40001) or pgx.ErrTxCommitRollback: do not release the key; Get tells
//     (completed under your token means it committed). Any other error
//     means nothing was committed and the key is still yours until its
//     lease ends.
//   - WithTx: a "commit" error may hide a commit; other errors do not.
//   - Purge: some rows may be deleted; calling again is safe.
//   - Inbox.Process: an error that says "commit" may hide a commit that
//     happened; a redelivery finds out (idem.ErrDuplicate, or fn runs).
//   - Outbox.Add, DeadLetters.Add on their own: may have committed; the
//     outbox's consumers de-duplicate a message added twice, and a letter
//     added twice is two letters.
//   - Outbox.Claim, MarkSent: calling again is safe; an entry published and
//     not marked sent is published again, which consumers absorb.
//   - Migrate: the file being applied may be applied; calling again is safe.
package idempg
