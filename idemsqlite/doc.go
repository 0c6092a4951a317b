// Package idemsqlite is idem's embedded default: an idem.Store and
// idem.TxStore kept in one SQLite file (modernc.org/sqlite, pure Go, no cgo),
// next to the application's own tables, so that an effect and the record
// that it happened commit in one transaction.
//
// # One file, one writer
//
// Open opens the file twice over:
//
//   - a writer pool of exactly one connection. Every write transaction of
//     the process runs on it, one after the other. SQLite allows one writer
//     at a time anyway; queueing for the connection inside database/sql is
//     fair and cheap, where several connections would spin on SQLITE_BUSY
//     and could fail under load. It also makes Claim atomic: its read and
//     its write are one transaction that nothing can interleave with.
//     Transactions begin with BEGIN IMMEDIATE, so another process writing
//     the same file makes them wait (up to Config.BusyTimeout) instead of
//     failing half-way.
//   - a pool of read-only connections (Config.ReadConns) for Store.Get and
//     the application's reads, which never wait for the writer.
//
// The file is in WAL mode, so readers and the writer do not block each
// other, with synchronous=FULL: the WAL is synced on every commit, so a
// commit that returned survives a power failure, not only a crash of the
// process. Foreign keys are enforced. Every connection gets these settings
// from the DSN, including connections database/sql opens later.
//
// Two exceptions make first executions and replays cheaper without giving
// any of that up:
//   - a Claim that finds a live record (a replay, a duplicate in flight, a
//     mismatch) is answered from the read pool and never queues for the
//     writer; only a claim that may write goes to the writer, which reads
//     the record again there, so exactly one claimant still wins;
//   - a claim (and a purge) commits without a sync. Nothing ran under a
//     claim that is not in a later, synced commit, and a synced commit
//     fsyncs the whole WAL file, earlier unsynced frames included: once
//     anything after the claim is durable, the claim is too. Losing a claim
//     to a power failure only frees its key. The writer goes back to
//     synchronous=FULL before anyone else uses it.
//
// # Schemas
//
// DB.Migrate applies numbered .sql files for a named component, each in its
// own transaction with its record in idem_schema_migrations. NewStore
// migrates the store's table, idem_keys; the application migrates its own
// tables into the same file with its own component name.
//
// # Effect and completion in one transaction
//
// Store.CompleteTx runs the caller's work and completes the key in the same
// transaction: the payment row and the key's stored response commit
// together, or neither does. A crash can leave neither "charged but not
// recorded" nor "recorded but not charged".
//
// The work reaches the transaction through DB.WithTx, with the context it
// was given:
//
//	kept, err := store.CompleteTx(ctx, ref, func(ctx context.Context) (idem.Response, bool, error) {
//		err := db.WithTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
//			_, err := tx.ExecContext(ctx, `INSERT INTO payments (id, amount) VALUES (?, ?)`, id, amount)
//			return err
//		})
//		if err != nil {
//			return idem.Response{}, false, err
//		}
//		return idem.Response{Status: 201, Body: body}, true, nil
//	})
//
// WithTx joins the transaction that its context carries, and begins its own
// when there is none, so the same handler code runs inside CompleteTx and on
// its own. Store methods called with such a context join it too. The
// transaction of CompleteTx begins only when first used, so a handler that
// waits for something before writing does not hold the writer meanwhile.
// When the work fails, does not keep its answer, or panics, or the lease was
// lost to another holder, everything it wrote is rolled back.
//
// # The deadlock to avoid
//
// Inside WithTx's fn, or CompleteTx's work once it has written, use only the
// *sql.Tx that WithTx passes and the context; never DB.Writer(). The
// transaction holds the writer's only connection, so a statement on
// DB.Writer() waits for a connection that is only given back when the
// transaction ends, which waits for that statement: the goroutine hangs
// forever. The same goes for any code that opens a second transaction on
// the writer while holding one.
package idemsqlite
