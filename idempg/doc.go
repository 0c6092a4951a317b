// Package idempg is idem's PostgreSQL store (pgx v5): an idem.Store,
// idem.TxStore and idem.Waiter whose records live in one schema of a
// PostgreSQL database, next to the application's own tables. Several
// processes (replicas behind a load balancer) share it: a key claimed by one
// is claimed for all.
//
//	db, err := idempg.Open(ctx, "postgres://app@db/payments", &idempg.Config{Schema: "payments"})
//	...
//	defer db.Close()
//	store, err := idempg.NewStore(ctx, db) // migrates idem_keys
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
//     microseconds, for tokens).
//
// DB.Migrate applies a component's numbered .sql files, each in its own
// transaction with its record, under pg_advisory_xact_lock on a hash of the
// schema and component: replicas starting together all succeed and each
// file runs once. NewStore migrates the component "idem_keys"; the
// application migrates its own tables into the same schema under its own
// component name, the same way.
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
// Config.TxOptions) on a pool connection when the work first calls WithTx or
// a Store method with that context, so a handler that first waits for
// something holds no connection meanwhile. WithTx joins the transaction its
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
// Store.Claim is one statement, SELECT ... FROM idem_claim(...), a plpgsql
// function created by the migration; its comment explains why it is atomic
// under READ COMMITTED with any number of callers on any number of
// connections: a key that looks free is taken by an INSERT ... ON CONFLICT
// DO NOTHING or an UPDATE whose condition PostgreSQL re-checks on the newest
// row after waiting for concurrent writers, so exactly one claimant wins
// and the others look again; a key that looks taken is answered without a
// write, so replays take no lock.
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
// # Waiting: LISTEN/NOTIFY
//
// Complete, Release, CompleteTx and takeovers call pg_notify on the channel
// "<schema>_idem_keys" in their transaction, with a short hash of the scope
// and key as payload (keys are not revealed), so the notification is sent
// when, and only if, the change commits, to every replica. Each Store keeps
// one dedicated connection listening on that channel, opened by the first
// WaitChange, and fans notifications out to its local waiters. When that
// connection drops it reconnects with backoff (50ms doubling to 5s), and
// wakes every waiter when the connection is lost and again once it listens,
// since notifications sent meanwhile were missed: waiters then read the key
// again instead of sleeping through a change. WaitChange also returns when
// the key's lease ends, by the store's clock, so a waiter can take over an
// abandoned key. Store.Close stops the connection and its goroutine. LISTEN
// needs a session: it does not work through PgBouncer in transaction mode.
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
//   - CompleteTx: an error of the COMMIT (it says "commit") may hide a
//     commit that happened, unless it is a serialization failure (SQLSTATE
//     40001) or pgx.ErrTxCommitRollback: do not release the key; Get tells
//     (completed under your token means it committed). Any other error
//     means nothing was committed and the key is still yours until its
//     lease ends.
//   - WithTx: a "commit" error may hide a commit; other errors do not.
//   - Purge: some rows may be deleted; calling again is safe.
//   - Migrate: the file being applied may be applied; calling again is safe.
package idempg
