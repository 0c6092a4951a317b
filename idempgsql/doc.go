// Package idempgsql is idem's PostgreSQL store through database/sql: an
// idem.Store and idem.TxStore, and the Inbox and Outbox, on the
// application's own *sql.DB, whatever its driver (pgx's stdlib, driver
// name "pgx", or lib/pq, "postgres"). It is for applications that reach
// PostgreSQL through database/sql and the libraries built on it (sqlx,
// sqlc, Bun, GORM, ent): their effect, the key's record and the inbox row
// commit in one *sql.Tx. The package imports nothing but idem and the
// standard library; the driver is the application's.
//
//	sqldb, err := sql.Open("postgres", os.Getenv("DATABASE_URL")) // or "pgx"
//	...
//	db, err := idempgsql.NewDB(ctx, sqldb, nil)
//	store, err := idempgsql.NewStore(ctx, db) // migrates idem_keys and idem_waiters
//
// # The schema: idempg's
//
// The tables are idempg's, created by the same migrations and recorded in
// the same idem_schema_migrations, and the statements that claim, answer,
// complete, release and purge a key, record an inbox row and add and lease
// outbox entries are idempg's too. The two packages therefore work on one
// schema at once: a key claimed through one is claimed for the other, and
// an outbox entry added in an application's *sql.Tx is published by a
// relay on idempg (its Outbox, or its Transport's MoveOutbox) as by one on
// this package's Outbox. An application can move from one to the other
// without migrating anything.
//
// Every statement names its tables unqualified, so they live in the schema
// the connections use first: their current_schema(), "public" unless the
// connection string sets a search_path (both drivers take
// "postgres://.../db?search_path=app"). The tables are all named idem_*, beside the
// application's. Migrate applies the application's own migrations the
// same way, under its own component name.
//
// # Effect and completion in one transaction
//
// Store.CompleteTx runs the caller's work and completes the key in the same
// transaction: the order row and the key's stored response commit
// together, or neither does. The work reaches the transaction with
// DB.WithTx and the context it was given; WithTx hands fn the *sql.Tx,
// which any library over database/sql can run its statements on:
//
//	kept, err := store.CompleteTx(ctx, ref, func(ctx context.Context) (idem.Response, bool, error) {
//		err := db.WithTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
//			_, err := tx.ExecContext(ctx, `INSERT INTO orders (id, item) VALUES ($1, $2)`, id, item)
//			return err
//		})
//		...
//	})
//
// The idemhttp middleware does this by itself for a Store that is an
// idem.TxStore: a handler behind it writes through
// db.WithTx(r.Context(), ...) and joins the transaction in which the
// middleware keeps its answer (see Example). The transaction begins with
// the first statement, so a handler that waits on something before it
// writes holds no connection meanwhile.
//
// # A transaction of the application's
//
// An application whose ORM begins the transaction (GORM's Transaction,
// sqlx's Beginx, ent's Tx) hands it to DB.JoinTx, and the context it gets
// back carries it: an Outbox.Add, an Inbox.Process or a Store's Claim,
// Complete and Release made with that context write in the application's
// transaction and commit or roll back with it. idem never ends a joined
// transaction. Store.CompleteTx is the one call that refuses it
// (ErrNestedCompleteTx): it must own its transaction, to roll the work back
// when the work fails or the key was lost.
//
//	tx, err := sqldb.BeginTx(ctx, nil) // or the ORM's *sql.Tx
//	ctx := db.JoinTx(ctx, tx)
//	... the application's writes on tx ...
//	err = outbox.Add(ctx, idem.Message{ID: orderID, Topic: "orders.created", Payload: body})
//	err = tx.Commit() // the order and its announcement, or neither
//
// A transaction a context carries is the transaction of its database, not
// of one DB: every DB made on the same *sql.DB (or on another *sql.DB whose
// connections reach the same schema of the same database) joins it. Only
// a transaction of another database or schema is left alone, and a call
// through a DB of that one commits in a transaction of its own.
//
// Each call of idem's in a transaction (joined, or begun by WithTx,
// CompleteTx or Process) runs inside a savepoint of its own, named for
// that call alone and released when it ends, also after a rollback to it.
// When the call fails, the transaction rolls back to its savepoint: its
// own writes are undone, those of the application and of calls before it
// are not, and the transaction goes on (the error says "rolled back to its
// savepoint"; one that could not roll back matches ErrTxAborted, and only
// a rollback ends the transaction then). Inbox.Process's savepoint holds
// its handler's writes too, and the Process calls the handler makes with
// its context nest inside it: a handler for message A that processes
// message B, whose handler fails, keeps its own writes and loses B's; when
// A's handler then fails, A's writes and B's row go, and both messages are
// delivered again. Two round trips per call (SAVEPOINT, RELEASE) are what
// this costs.
//
// A transaction is one connection, used by one goroutine at a time. idem
// serialises its own calls in one transaction (each waits for the one
// before it), except while an Inbox.Process handler runs in it: then a
// call made from outside that handler (another goroutine, or the handler
// with a context from outside it) is refused with ErrTxBusy, having done
// nothing, since it would run inside the handler's savepoint and be undone
// by the handler's failure after it had reported success, or wait for a
// handler that waits for it. A handler's context used after its Process
// returned is refused too (an error matching sql.ErrTxDone). A call that
// code left running in another goroutine when it returned ends before what
// encloses it does: Process ends the handler's savepoint, and WithTx,
// CompleteTx and Process commit their own transactions, only after it. Statements
// the application runs on the *sql.Tx itself from several goroutines are
// beyond idem's sight: they may land inside a call's savepoint, and be
// undone with it. Join a transaction once and pass the context down: the
// contexts of two separate JoinTx of one transaction cannot see each
// other's calls.
//
// The module idempgsql/internal/ormtest runs the Inbox, the Outbox and the
// middleware this way under GORM (its nested Transaction included) and
// sqlx, on both drivers.
//
// # Isolation levels
//
// How idem answers at each isolation level, each tested
// (isolation_test.go, on both drivers):
//
//   - READ COMMITTED, the default: a delivery of a message that another
//     transaction is processing waits for it, and is a duplicate when it
//     commits (idem.ErrDuplicate) or runs when it rolls back; a claim in a
//     transaction of a key another transaction claimed answers InFlight;
//     CompleteTx whose key was taken over meanwhile returns
//     idem.ErrLeaseLost.
//   - REPEATABLE READ and SERIALIZABLE, in transactions idem begins
//     (Config.TxOptions): the same answers. Where the snapshot predates
//     another transaction's commit, PostgreSQL fails the statement with a
//     serialization failure (40001) instead: Process then begins again
//     (its handler has not run), and CompleteTx reads the key anew and
//     returns idem.ErrLeaseLost, or true when its token completed the key,
//     or the failure when the key is still its own (nothing committed).
//   - REPEATABLE READ and SERIALIZABLE, in the application's transaction
//     (JoinTx): idem cannot begin it again, so a delivery or a claim of a
//     key that another transaction committed after the snapshot returns
//     the serialization failure (Classify: transient), rolled back to its
//     savepoint; the transaction stays usable, and the same call in a new
//     transaction answers as at READ COMMITTED. SERIALIZABLE may also fail
//     the application's COMMIT (40001), which rolls back idem's writes with
//     the application's: retry the transaction.
//
// # Errors by SQLSTATE
//
// SQLState reads the code of a server's error with either driver (lib/pq's
// *pq.Error, pgx's *pgconn.PgError), and Classify classes an error as idem
// does (idem.Classify): a serialization failure, a deadlock, a lock not
// available, a cancelled statement, a server restarting, a lost
// connection, a server refusing the connection's credentials or database,
// and a statement's plan made stale by a migration are transient, retried
// (inside a transaction, by running the whole transaction again); a
// unique violation, a data exception, an index row over PostgreSQL's limit
// or a missing table are permanent. Classified marks the permanent ones with
// idem.Permanent, for a consumer's handler to return, so that the consumer
// dead-letters them at once and retries the rest.
//
// # What idempg adds
//
// idempg, on pgx, is the faster of the two and does more: it pipelines a
// statement with its BEGIN and COMMIT (a first execution in fewer round
// trips), claims a key inside the effect's transaction (idem.TxClaimer),
// wakes waiting duplicates through LISTEN/NOTIFY (idem.Waiter; here the
// middleware polls, every Config.PollInterval of idemhttp), answers
// replays in one read (idem.Replayer), and has dead letters, a ledger and
// a transport. database/sql has no portable LISTEN, pipeline or COPY, so
// this package keeps to what every driver runs. Its completions still wake
// idempg's waiters on the same schema.
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
// partial index that holds only those keys, and so does InFlightAtPoints,
// which lists them whether their holder's lease ended or not, for an audit
// of the books (idem reconcile), as idempg's and idemsqlite's do. See
// docs/recovery.md.
//
// # Leases and holders
//
// Renew and YieldEarlier (idem.Restarter) run idempg's statements, on the
// same columns (keys migration 0005): a renewal commits durably, and
// YieldEarlier wakes the waiters of the keys whose leases it ended once
// the change is committed.
//
// # Errors
//
// Bad arguments return an error matching idem.ErrInvalidArgument and change
// nothing. An error that says "commit" is ambiguous (the transaction may
// have committed); so is any error of Claim, Complete and Release on their
// own, whose retry is safe, as the idem.Store contract says. In a
// transaction, a call's error means its writes were rolled back to its
// savepoint (or, matching ErrTxAborted, that the transaction is aborted).
// A call made in a transaction with a context that has already ended
// sends nothing and returns the context's error: the transaction goes on.
// A context that ends while a statement runs may end the connection with
// it (pgx's driver closes it), and with it the transaction.
package idempgsql
