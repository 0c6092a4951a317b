// Package idemsqlite is idem's embedded default: an idem.Store and
// idem.TxStore kept in one SQLite file (modernc.org/sqlite, pure Go, no cgo),
// next to the application's own tables, so that an effect and the record
// that it happened commit in one transaction. The same file holds the
// message side: an inbox, an outbox, dead letters, a consumer's ledger, and
// the database as the message transport.
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
// Every statement the package runs on a hot path is prepared once per DB,
// when the first constructor that needs its tables runs, and reused from
// then on (on the writer inside each transaction, through
// sql.Tx.StmtContext, and on the read pool), so SQLite does not parse and
// plan the same text again for every claim, delivery or inbox row. Lists of
// values travel as one JSON array argument, which keeps every statement's
// text fixed. An application's statements deserve the same on its hot
// paths, since every write holds the single writer while SQLite parses it:
// DB.Prepare prepares one on the writer, once, before serving, and
// tx.StmtContext binds it to each WithTx transaction.
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
//     writer, unless the request is Unseen (most likely a new key, which
//     the read would not find); only a claim that may write goes to the
//     writer, which reads the record again there, so exactly one claimant
//     still wins;
//   - a claim alone on the writer commits without a sync. Nothing ran
//     under a claim that is not in a later, synced commit, and a synced
//     commit fsyncs the whole WAL file, earlier unsynced frames included:
//     once anything after the claim is durable, the claim is too. Losing a
//     claim to a power failure only frees its key. The writer goes back to
//     synchronous=FULL before anyone else uses it. A claim that reaches the
//     writer while a group commit is open (see below) joins the group
//     instead, and shares its sync, rather than make it commit early; it
//     then counts its lease from when it returns, not from its turn (see
//     Store.Claim).
//
// # Group commit
//
// A synced commit waits for the disk, and on most machines that wait is
// longer than the statements of a request's transaction. So synced write
// transactions that queue for the writer one behind the other share one
// SQLite transaction and one commit: each runs in a savepoint of it, and
// the last one in line (or the one ending when the group has been open
// Config.GroupCommit, 2ms by default) commits for all. A claim that
// reaches the writer while a group is open joins it too. Each WithTx,
// CompleteTx, ClaimTx and joined Claim returns once its group has
// committed or failed, with the group's outcome, so nothing is
// acknowledged before it is on disk, and nothing is refused (an
// idem.ErrLeaseLost, an idem.ErrDuplicate) before the writes it rests on
// have committed. A lone transaction is a group of one and commits at
// once. Measured with idem
// bench on a two-core machine, eight payments in flight: the payment and
// its key's record, which committed about 3,000 times a second one by
// one, commit some 9,900 times a second in groups.
//
// What a transaction shares with its group:
//   - its commit waits for the members behind it in the group, so a
//     transaction that holds the writer long (a handler calling another
//     service inside its transaction) delays those that ran just before it,
//     not only those after. A claim that joined a group and spent more than
//     a hundredth of its lease so renews its lease before it returns (see
//     "Leases and holders"): its lease counts from then;
//   - its fate: when the group's commit fails, every member's writes are
//     lost together, and every member returns an error that says
//     "commit"; none was acknowledged;
//   - what it reads: a member sees the writes of the members before it in
//     its group, which have not committed yet. So when the group fails, a
//     member that ran after others returns the group's error, never its own
//     result, even an error of its own (an idem.ErrLeaseLost because a
//     takeover before it had changed the key, an idem.ErrDuplicate): nothing
//     a caller acts on rests on writes that never committed.
//
// A member's context does not interrupt its statements: SQLite rolls the
// whole transaction back when a write is interrupted, and a client's
// hang-up would fail every member of its group. The statements of a member
// (WithTx's fn, run with the context fn receives, and the store's own)
// finish instead, and when the member's context has ended by then, its
// part alone is rolled back (to its savepoint) and it returns the
// context's error, as database/sql rolls back a transaction whose context
// ends before its commit. A statement still running 5s after its
// context's end is interrupted all the same, failing the group, rather than
// hold the writer for ever; so is a statement run inside fn with a context
// of its own.
//
// fn must not call the *sql.Tx's Commit or Rollback: WithTx ends the
// transaction, which is the group's. Config.GroupCommit negative makes
// every transaction commit on its own. The unsynced transactions (a claim
// when no group is open, a lease's renewal when the writer is free (see
// "Leases and holders"), the inbox's and the
// transport's purges, the transport's hand-outs, settlements and
// MoveOutbox) never join a group; one waiting first in line makes the open
// group commit before it runs.
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
//
// That is why idemhttp, on this store, claims a key with Store.Claim (one
// short write) and runs the handler in CompleteTx, rather than in
// Store.ClaimTx, which claims the key in the transaction that runs the work
// and so holds the single writer from the claim to the commit: there, one
// request whose handler waited 400ms before writing held up every other
// write of the process for as long, and 8 such requests at once took 3.2s
// instead of 0.4s. The Store says so through idem.SerialWriter. ClaimTx
// saves the claim's write, and suits work that writes at once.
// When the work fails, does not keep its answer, or panics, or the lease was
// lost to another holder, everything it wrote is rolled back.
//
// # Recovery points
//
// The Store is an idem.Recoverer: a handler whose work calls out of the
// database (a charge at a card network) saves how far it got with the key
// (idemhttp.SaveRecovery), in the transaction of the phase's own writes
// when the context carries one (WithTx). The points live in idem_keys
// (migration 0002); Abandoned reads them through a partial index that holds
// only the keys in flight with one, so an idemhttp.Completer polling it
// every second reads almost nothing. A key in flight with a point never
// expires, and Release refuses it (idem.ErrHasRecoveryPoint), so that no
// failure path forgets it: ReleaseWithPoint releases it for a caller that
// learned nothing happened outside. See docs/recovery.md.
//
// # Leases and holders
//
// Renew starts a holder's lease anew, fenced by its token, counted from
// when it is called. With the writer free, it is one short write
// transaction that commits without a sync and joins no group commit: a
// renewal a power failure loses was made by a process that died with it.
// A renewal never waits for the writer to be handed over, since a
// transaction may hold it as long as its handler runs (CompleteTx's work
// once it has written), and the renewals of every execution, its own
// included, would wait for it and time out, and their executions be
// cancelled for leases nobody could take over meanwhile. With the writer
// held, a renewal is queued instead: every claim decides as if it were
// written; the writer's holder writes the queued renewals as it hands the
// writer over, ahead of whoever is next in line (into the open group when
// the next joins it, or in a transaction of their own), writes again on
// their own those of a group that failed, and keeps them queued and
// honoured when that write fails, until the next hand-over; and a Yield
// drops the queued renewals of its lease. A queued renewal is returned at
// once, as made, unless the key's committed record already shows it taken
// over or completed.
// Another process on the same file sees a queued renewal only once it is
// written: it cannot claim meanwhile while the writer's holder has written
// (it then keeps the database's write lock), but can while the holder has
// only read, so a lease shared across processes wants renewals that come
// well before its end. The Store is an idem.Restarter: the claim's holder
// lives in idem_keys (migration 0003), and YieldEarlier ends an earlier
// incarnation's leases through a partial index that holds only the keys in
// flight under a named holder.
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
//
// # Messages: inbox, outbox, dead letters, ledger and the embedded transport
//
// The message side of idem keeps its tables in the same file, under the
// migration component "idem_messages" (any of the constructors below
// creates them all):
//
//   - Inbox (NewInbox) is an idem.Inbox. Process runs in DB.WithTx: it looks
//     for the (consumer, dedup key) row in idem_inbox, returns
//     idem.ErrDuplicate if it is there, and otherwise inserts it and runs the
//     handler, whose context carries the transaction. The handler writes
//     through db.WithTx(ctx, …), which joins it, so its effect and the row
//     commit together; when it fails, both roll back and a redelivery runs it
//     again. The single writer connection makes the look and the insert one
//     step for the whole process, and SQLite's write lock for every process.
//     It is an idem.BatchInbox: ProcessBatch records many keys with one
//     statement and runs one handler call for all of them in the same
//     transaction, so a batch of messages costs one commit.
//   - Outbox (NewOutbox) is an idem.Outbox: Add joins the caller's
//     transaction, so an event commits with the payment it announces; Claim
//     leases the oldest entries to a relay (skipping live leases) in one
//     write transaction; MarkSent deletes them. A Transport on the same DB
//     moves entries straight from the outbox into its log instead
//     (Transport.MoveOutbox, idem.OutboxMover), in one transaction.
//   - DeadLetters (NewDeadLetters) keeps each letter's message (payload
//     bytes, headers as JSON, topic, key), consumer, class, state, first and
//     last failure, every attempt and every history event, and never
//     deletes any. Resolve checks and changes the state in one transaction.
//   - Ledger (NewLedger) keeps a consumer's failed attempts, the keys held
//     back behind a dead letter, and the messages parked behind them, in
//     parking order. Every method joins the caller's transaction, so the
//     consumer changes them together with its inbox row or its dead letter.
//     HeldBackKeys (idem.BatchLedger) looks up many keys at once.
//   - Transport (NewTransport) is the database as the message transport,
//     so a single process needs no broker: a log of published messages and,
//     per consumer name, a cursor and the messages handed out and not
//     settled, with their attempt counts, Nack delays and AckWaits. See
//     Transport for its semantics. Publish and the settlements join the
//     caller's transaction, so a service may publish in the transaction of
//     its effect, and a consumer may acknowledge in the one of its inbox row.
//     Its streams are idem.BatchStream: NextBatch hands out many messages
//     in one transaction, and AckBatch settles many with one statement,
//     joining the caller's transaction, so a consumer batch's inbox rows,
//     effects and acknowledgements commit together. They are
//     idem.BatchRenewer too: InProgressBatch renews many deliveries'
//     AckWait with one statement, a consumer's heartbeat with one write a
//     beat.
//     Transport.Purge deletes what every consumer name has settled.
//
// Messages keep their bytes: payloads are BLOBs, and headers a JSON object
// (base64-encoded, behind a "base64:" prefix, when a key or value is not
// valid UTF-8, which JSON could not carry).
//
// More writes commit without a sync, for the same reason as a claim: the
// purges of messages (Inbox.PurgeInbox, Transport.Purge), and the
// transport's hand-outs, settlements (Ack, AckBatch, Nack, Term,
// InProgress, InProgressBatch) and moves from the outbox (MoveOutbox) made outside a
// caller's transaction. Losing a hand-out or a settlement to a power
// failure delivers a message once more, which delivery at least once allows
// and the inbox absorbs; losing a move puts its entries back in the outbox,
// to be moved again. Publish, the inbox row, the outbox, the ledger, the
// dead letters, and the store's own Purge are synced (they join groups).
//
// # How long inbox rows are kept
//
// An inbox row must outlive every copy of its message that can still
// arrive: once it is purged, the next copy runs the handler again. Inbox
// rows are never deleted on their own; call Inbox.PurgeInbox(ctx,
// time.Now().Add(-horizon), limit) in a loop, where horizon is longer than
// the longest of:
//
//   - the transport's redelivery span: how long after its first delivery a
//     message can be delivered again. With a bounded number of attempts N,
//     a retry delay capped at C and an AckWait W, that is about N*(C+W) plus
//     the time a consumer may be down; for a broker, add its own
//     de-duplication window and redelivery limits;
//   - the outbox's re-publish span: a relay that crashes between publishing
//     and marking publishes again when its lease ends, and an outage of the
//     relay or the broker delays that copy by the length of the outage;
//   - any copy people make: re-publishing events by hand, or replaying a
//     stream or a backup.
//
// The bounds on the first two are known; the third is not, so choose a
// horizon of days, not minutes (a row costs a few dozen bytes), and make it
// longer than the longest outage you plan to recover from. A dead letter
// has no inbox row (its attempts failed), so re-driving it, however late,
// runs the handler as it should.
package idemsqlite
