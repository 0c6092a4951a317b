package idempg

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/pgsql"
)

// StoreComponent is the component under which NewStore records its schema
// migrations of idem_keys in idem_schema_migrations.
const StoreComponent = pgsql.KeysComponent

// WaitersComponent is the component under which NewStore records its
// schema migrations of the waiting duplicates' registry, idem_waiters (see
// Store.WaitChange), in idem_schema_migrations.
const WaitersComponent = pgsql.WaitersComponent

// refusedCode is the SQLSTATE of idem_refuse_completion: a completion found
// the key not held under its token.
const refusedCode = "IDM01"

// Store is an idem.Store, idem.TxStore and idem.Waiter whose records live in
// the table idem_keys of a DB's schema, next to the application's tables.
// It is safe for concurrent use, by many goroutines and many processes.
type Store struct {
	db      *DB
	channel string
	waits   *listener
}

var (
	_ idem.Store     = (*Store)(nil)
	_ idem.TxStore   = (*Store)(nil)
	_ idem.TxClaimer = (*Store)(nil)
	_ idem.Waiter    = (*Store)(nil)
	_ idem.Replayer  = (*Store)(nil)
	_ idem.Recoverer = (*Store)(nil)
	_ idem.Restarter = (*Store)(nil)
)

// NewStore applies the store's schema migrations to db (component
// "idem_keys": the table idem_keys and the functions idem_claim and
// idem_clock_us; component "idem_waiters": the unlogged table idem_waiters
// and the function idem_refuse_completion) and returns a Store on it. Call
// Close when done with it, before closing db.
func NewStore(ctx context.Context, db *DB) (*Store, error) {
	if db == nil {
		return nil, &idem.ArgumentError{Field: "db", Reason: "must not be nil"}
	}
	for _, m := range []struct {
		component string
		files     fs.FS
	}{
		{StoreComponent, pgsql.Keys},
		{WaitersComponent, pgsql.Waiters},
	} {
		if err := db.Migrate(ctx, m.component, m.files); err != nil {
			return nil, err
		}
	}
	channel := db.schema + pgsql.ChannelSuffix
	return &Store{db: db, channel: channel, waits: newListener(db, channel)}, nil
}

// Close stops the store's LISTEN connection, and makes waiting WaitChange
// calls return. It does not close the DB. Close is idempotent.
func (s *Store) Close() { s.waits.close() }

// q returns what a statement runs on: the transaction ctx carries (which
// begins with the statement if it has not begun), or the pool. st is the
// former, or nil.
func (s *Store) q(ctx context.Context) (q querier, st *txState, err error) {
	if st := s.db.carried(ctx); st != nil {
		if st.isEnded() {
			return nil, nil, &txError{"begin", errTxEnded}
		}
		return st.tx, st, nil
	}
	return s.db.pool, nil, nil
}

// Claim implements idem.Store. A new key, the common case, is claimed in one
// round trip by a plain INSERT ... ON CONFLICT DO NOTHING (pgsql.InsertClaim).
// A key that exists takes a second round trip: a replay, a duplicate in
// flight or a mismatch is answered by a plain SELECT (pgsql.Answer), and only a
// claim that must write (an expired key claimed anew, an ended lease taken
// over, or a key deleted since the INSERT looked) takes a third, to the
// function idem_claim, which the migration created (see its comment for why
// it is atomic under READ COMMITTED across any number of connections and
// processes). The INSERT is the function's own first step for an absent key,
// and the SELECT answers exactly as the function answers without writing,
// so together they decide as the function alone would. The function would
// cost a new key some 50µs more of the server's time than the INSERT alone
// (plpgsql, its SET clause, a second index probe), and one statement that
// held both would cost some 20µs more (the plan of the branch not taken is
// still set up): the first executions, which are what a payment service
// runs most and what costs the most, pay neither, and replays pay a round
// trip more.
//
// On its own, the claim commits with synchronous_commit off: its
// acknowledgement does not wait for the WAL flush. Losing such a claim in a
// server crash is harmless, because nothing is executed under it that is
// not in a later synchronous commit (CompleteTx's transaction holds the
// work's writes and the completion), and PostgreSQL flushes WAL in order,
// so once that later commit is durable the claim before it is durable too;
// if the crash took the claim, it took everything done under it, and the
// retry runs the work once. (The package documentation says what it means
// for effects outside the database.)
//
// Called with a context that carries a transaction of the DB (WithTx), the
// claim joins it, keeps that transaction's durability, and commits or
// rolls back with it. It then never waits for another transaction, so
// claims in long transactions, in any order, cannot deadlock, as
// idempgsql's in a transaction: a replay, a mismatch or a key in flight is
// answered from the key's committed row without taking a lock, and a key
// that another transaction is claiming, or has claimed and not yet
// committed (a ClaimTx running its work included), is answered InFlight at
// once, its record holding only the scope and the key. A key it acquires
// stays locked until the transaction ends: claims of it in other
// transactions answer InFlight, claims on their own wait, and ClaimTx
// waits as long as it is told to.
//
// With Config.Clock nil, leases and expiry are judged by the database's
// clock_timestamp() at the moment the claim runs.
//
// Errors other than an *idem.ArgumentError are ambiguous, as the idem.Store
// contract says: the claim may have been made (a connection lost after the
// server ran it). Do not run the effect; claiming again is safe.
func (s *Store) Claim(ctx context.Context, req idem.ClaimRequest) (idem.Claim, error) {
	if err := pgsql.ValidateClaim(req); err != nil {
		return idem.Claim{}, err
	}
	q, st, err := s.q(ctx)
	if err != nil {
		return idem.Claim{}, fmt.Errorf("idempg: claim: %w", err)
	}
	if st != nil {
		return s.claimInTx(ctx, q, st, req)
	}
	var (
		token                        int64
		created, leaseEnd, expiresAt time.Time
	)
	hr, hi := pgsql.HolderArgs(req.Holder)
	// A claim on its own here (one in the caller's transaction went to
	// claimInTx above): its INSERT commits asynchronously ($7).
	err = q.QueryRow(ctx, pgsql.InsertClaim,
		string(req.Scope), string(req.Key), string(req.Fingerprint),
		pgsql.Micros(req.Lease), pgsql.Micros(req.TTL), s.db.now(), true, hr, hi,
	).Scan(&token, &created, &leaseEnd, &expiresAt)
	switch {
	case err == nil:
		return pgsql.AcquiredClaim(req, token, created, leaseEnd, expiresAt), nil
	case !errors.Is(err, pgx.ErrNoRows):
		return idem.Claim{}, fmt.Errorf("idempg: claim: %w", err)
	}
	claim, answered, err := s.answer(ctx, q.QueryRow, req)
	if err != nil || answered {
		return claim, err
	}
	return s.claimExisting(ctx, q, st, req)
}

// claimInTx is a claim in a transaction that goes on after it (WithTx, or
// CompleteTx's work), idempgsql's own: it never waits for another
// transaction, so claims made in long transactions, in any order, cannot
// deadlock. A key that exists and needs no write (a replay, a mismatch, a
// key in flight) is answered from its committed row, taking no lock; a key
// that another transaction is claiming, or has claimed and not committed,
// is answered InFlight at once (its record holds only the scope and the
// key); a key it claims stays locked until the transaction ends, as its
// row is uncommitted until then.
func (s *Store) claimInTx(ctx context.Context, q querier, st *txState, req idem.ClaimRequest) (idem.Claim, error) {
	claim, answered, err := s.answer(ctx, q.QueryRow, req)
	if err != nil || answered {
		return claim, err
	}
	hr, hi := pgsql.HolderArgs(req.Holder)
	var (
		locked                       bool
		token                        *int64
		created, leaseEnd, expiresAt *time.Time
	)
	err = q.QueryRow(ctx, pgsql.ClaimInTx, string(req.Scope), string(req.Key), string(req.Fingerprint),
		pgsql.Micros(req.Lease), pgsql.Micros(req.TTL), s.db.now(), hr, hi,
	).Scan(&locked, &token, &created, &leaseEnd, &expiresAt)
	switch {
	case err != nil:
		return idem.Claim{}, fmt.Errorf("idempg: claim: %w", err)
	case !locked:
		return waitedInFlight(req), nil
	case token != nil:
		return pgsql.AcquiredClaim(req, *token, *created, *leaseEnd, *expiresAt), nil
	}
	// The key exists: committed since the first look, or one that must be
	// written to be claimed.
	if claim, answered, err := s.answer(ctx, q.QueryRow, req); err != nil || answered {
		return claim, err
	}
	var rows int
	if err := q.QueryRow(ctx, pgsql.LockRow, string(req.Scope), string(req.Key)).Scan(&rows); err != nil {
		return idem.Claim{}, fmt.Errorf("idempg: claim: %w", err)
	}
	if rows == 0 {
		return waitedInFlight(req), nil
	}
	return s.claimExisting(ctx, q, st, req)
}

// answer answers the claim of a key that its INSERT found existing, without
// writing (pgsql.Answer). answered is false when the claim must write: the
// key expired or its lease ended (or it is gone since the INSERT), and
// claimExisting decides.
func (s *Store) answer(ctx context.Context, queryRow func(ctx context.Context, sql string, args ...any) pgx.Row, req idem.ClaimRequest) (claim idem.Claim, answered bool, err error) {
	var (
		outcome *string
		row     pgsql.RecordRow
	)
	err = queryRow(ctx, pgsql.Answer, string(req.Scope), string(req.Key), string(req.Fingerprint), s.db.now()).
		Scan(append([]any{&outcome}, row.Dest()...)...)
	switch {
	case err == nil && outcome != nil:
		claim, err = claimOf(*outcome, false, row, req)
		return claim, true, err
	case err != nil && !errors.Is(err, pgx.ErrNoRows):
		return idem.Claim{}, true, fmt.Errorf("idempg: claim: %w", err)
	}
	return idem.Claim{}, false, nil
}

// claimExisting claims a key that must be written to be claimed (expired,
// its lease ended, or gone since the INSERT looked) with the function
// idem_claim, which also answers any other state it finds by then.
func (s *Store) claimExisting(ctx context.Context, q querier, st *txState, req idem.ClaimRequest) (idem.Claim, error) {
	var (
		tookOver bool
		row      pgsql.RecordRow
	)
	outcome := new(string)
	hr, hi := pgsql.HolderArgs(req.Holder)
	err := q.QueryRow(ctx, pgsql.Claim,
		string(req.Scope), string(req.Key), string(req.Fingerprint),
		pgsql.Micros(req.Lease), pgsql.Micros(req.TTL), s.db.now(), st == nil,
		s.channel, pgsql.NotifyID(req.Scope, req.Key), hr, hi,
	).Scan(append([]any{outcome, &tookOver}, row.Dest()...)...)
	if err != nil {
		return idem.Claim{}, fmt.Errorf("idempg: claim: %w", err)
	}
	return claimOf(*outcome, tookOver, row, req)
}

// insertClaimTxSQL is pgsql.InsertClaim for ClaimTx at an isolation level
// above READ COMMITTED, in its transaction: the key's lock and the INSERT
// may wait for another transaction that holds the key and has not ended,
// and lock_timeout ($7) bounds those waits for this statement alone: it is
// set before them and, when the INSERT returns a row, set back to what it
// was. (When it returns none, ClaimTx rolls the transaction back.)
const insertClaimTxSQL = `WITH o AS MATERIALIZED (SELECT current_setting('lock_timeout') AS lt),
s AS MATERIALIZED (SELECT set_config('lock_timeout', $7, true) FROM o),
l AS MATERIALIZED (SELECT pg_advisory_xact_lock(idem_key_lock($1::text, $2::text)) FROM s),
n AS MATERIALIZED (SELECT coalesce($6::timestamptz, clock_timestamp()) AS t FROM l)
INSERT INTO idem_keys AS k (scope, key, fingerprint, state, token, created_at, lease_expires_at, expires_at,
	holder_replica, holder_incarnation)
SELECT $1::text, $2::text, $3::text, 'in_flight', idem_clock_us(), n.t,
	n.t + $4::bigint * interval '1 microsecond', n.t + $5::bigint * interval '1 microsecond', $8::text, $9::text
FROM n
ON CONFLICT (scope, key) DO NOTHING
RETURNING k.token, k.created_at, k.lease_expires_at, k.expires_at, set_config('lock_timeout', (SELECT lt FROM o), true)`

// SQLSTATEs ClaimTx tells apart.
const (
	lockNotAvailable     = "55P03" // lock_timeout ended a wait
	serializationFailure = "40001"
)

// maxClaimTxAttempts bounds how often ClaimTx begins again after a
// serialization failure of its claim (under REPEATABLE READ or
// SERIALIZABLE, a key committed by another transaction after this one's
// snapshot): the next attempt's snapshot sees that key.
const maxClaimTxAttempts = 5

// ClaimTx implements idem.TxClaimer: the claim, work's writes and the
// completion are one transaction (with Config.TxOptions), so the key is
// never seen in flight by anyone else, and a crash, a failed work or a
// rollback leave no trace of the claim.
//
// At READ COMMITTED (the default), a new key is claimed by its lock, an
// advisory lock on a hash of the schema, scope and key (the function
// idem_key_lock) that the transaction holds until it ends, and its row is written once,
// completed, with the COMMIT: BEGIN, the lock (with a new fencing token
// and the time) and a read of the key go in one round trip, then work's
// statements, then the row's INSERT with COMMIT in one more, and one
// server transaction. Against an INSERT of the key in flight first and an
// UPDATE at the end, that is one row version and one WAL record less per
// first execution, which is what makes the server's share of a first
// execution no more than a hand-written minimum's. Every other claim that
// could create the key's row takes the same lock first (Claim, the
// function idem_claim, and idempgsql's claims), so none can claim the key while work runs; and
// should a row of the key appear anyway (a replica of an earlier release,
// which does not take the lock, claimed it meanwhile), the INSERT fails,
// everything work wrote is rolled back, and ClaimTx returns
// idem.ErrLeaseLost.
//
// At a stricter isolation level the key's row is inserted in flight first,
// after the same lock, and completed at the end: the transaction's
// snapshot is taken by its first statement, before the lock could be
// waited for.
//
// A key that exists costs one round trip more than Claim: the answer is
// read in the transaction, which is then rolled back.
//
// A concurrent ClaimTx of the same key waits for the first transaction to
// end, holding its connection, at most wait (lock_timeout): when the first
// commits, it answers Completed (or Mismatch); when the first rolls back,
// it claims the key itself. After wait it answers InFlight. Under
// REPEATABLE READ and SERIALIZABLE, a claim that waited fails with a
// serialization failure, and ClaimTx begins again (up to five times) with
// a snapshot that sees the key.
//
// A key that exists and must be written to be claimed (its TTL passed, or
// its lease ended: taken over) is claimed as Claim does, in a new
// transaction in which work then runs; its completion is then fenced and
// wakes waiters as CompleteTx's.
//
// Errors as idem.TxClaimer says; ErrNestedCompleteTx when ctx already
// carries a transaction of the same DB.
func (s *Store) ClaimTx(ctx context.Context, req idem.ClaimRequest, wait time.Duration, work idem.ClaimedWork) (idem.Claim, bool, error) {
	if err := pgsql.ValidateClaim(req); err != nil {
		return idem.Claim{}, false, err
	}
	if work == nil {
		return idem.Claim{}, false, &idem.ArgumentError{Field: "work", Reason: "must not be nil"}
	}
	if s.db.carried(ctx) != nil {
		return idem.Claim{}, false, ErrNestedCompleteTx
	}
	lockTimeout := strconv.FormatInt(max(wait.Milliseconds(), 1), 10) + "ms"
	if s.db.readCommitted {
		return s.claimTxLocked(ctx, req, lockTimeout, work)
	}
	for attempt := 1; ; attempt++ {
		if err := ctx.Err(); err != nil {
			return idem.Claim{}, false, err
		}
		claim, kept, inserted, done, err := s.claimTxOnce(ctx, req, lockTimeout, work)
		var pgErr *pgconn.PgError
		switch {
		case done:
			return claim, kept, err
		case errors.As(err, &pgErr) && pgErr.Code == lockNotAvailable:
			return waitedInFlight(req), false, nil
		case errors.As(err, &pgErr) && pgErr.Code == serializationFailure && attempt < maxClaimTxAttempts:
			continue
		case err != nil:
			return idem.Claim{}, false, fmt.Errorf("idempg: claim: %w", err)
		case !inserted:
			// The key exists and must be written to be claimed.
			return s.claimTxExisting(ctx, req, work)
		}
	}
}

// lockClaimSQL takes the key's lock if no other transaction holds it, and
// reads a new fencing token and the time: ClaimTx's claim of a new key at
// READ COMMITTED, whose row insertCompletedSQL writes once work is done.
const lockClaimSQL = `SELECT pg_try_advisory_xact_lock(idem_key_lock($1::text, $2::text)), idem_clock_us(),
	coalesce($3::timestamptz, clock_timestamp())`

// waitLockClaimSQL is lockClaimSQL for a key whose lock another
// transaction holds: it waits for the lock, at most lock_timeout ($3), set
// for this statement alone and set back after the wait, and reads the
// token and the time after it.
const waitLockClaimSQL = `WITH o AS MATERIALIZED (SELECT current_setting('lock_timeout') AS lt),
s AS MATERIALIZED (SELECT set_config('lock_timeout', $3, true) FROM o),
l AS MATERIALIZED (SELECT pg_advisory_xact_lock(idem_key_lock($1::text, $2::text)) FROM s)
SELECT set_config('lock_timeout', (SELECT lt FROM o), true), idem_clock_us(),
	coalesce($4::timestamptz, clock_timestamp()) FROM l`

// insertCompletedSQL writes the row of a key claimed by its lock, completed
// (see ClaimTx). A row of the key that is there already (which only a
// claimant that did not take the lock can have written) fails it with a
// unique violation.
const insertCompletedSQL = `INSERT INTO idem_keys (scope, key, fingerprint, state, token, status, header, body, body_omitted,
	created_at, lease_expires_at, expires_at, completed_at, holder_replica, holder_incarnation)
VALUES ($1, $2, $3, 'completed', $4, $5, $6, $7, $8, $9::timestamptz,
	$9::timestamptz + $10::bigint * interval '1 microsecond', $9::timestamptz + $11::bigint * interval '1 microsecond',
	coalesce($12::timestamptz, clock_timestamp()), $13::text, $14::text)`

// uniqueViolation is the SQLSTATE of insertCompletedSQL's refusal.
const uniqueViolation = "23505"

// claimTxLocked is ClaimTx at READ COMMITTED: BEGIN, the key's lock and a
// read of the key in one round trip. The read is a statement of its own
// after the lock's, so that its snapshot sees whatever a transaction that
// held the lock before committed.
func (s *Store) claimTxLocked(ctx context.Context, req idem.ClaimRequest, lockTimeout string, work idem.ClaimedWork) (idem.Claim, bool, error) {
	st, txCtx := s.db.newTx(ctx)
	defer st.rollback(false)
	c, err := st.use()
	if err != nil {
		return idem.Claim{}, false, fmt.Errorf("idempg: claim: %w", err)
	}
	scope, key := string(req.Scope), string(req.Key)
	var (
		locked bool
		token  int64
		now    time.Time
		ans    answerRow
	)
	b := &pgx.Batch{}
	b.Queue(st.beginSQL)
	b.Queue(lockClaimSQL, scope, key, s.db.now()).QueryRow(func(row pgx.Row) error {
		return row.Scan(&locked, &token, &now)
	})
	b.Queue(pgsql.Answer, scope, key, string(req.Fingerprint), s.db.now()).QueryRow(ans.scan)
	if err := c.SendBatch(ctx, b).Close(); err != nil {
		return idem.Claim{}, false, fmt.Errorf("idempg: claim: %w", err)
	}
	if !locked {
		// Another transaction holds the key: wait for it to end, then
		// read the key again.
		ans = answerRow{}
		b := &pgx.Batch{}
		b.Queue(waitLockClaimSQL, scope, key, lockTimeout, s.db.now()).QueryRow(func(row pgx.Row) error {
			return row.Scan(nil, &token, &now)
		})
		b.Queue(pgsql.Answer, scope, key, string(req.Fingerprint), s.db.now()).QueryRow(ans.scan)
		err := c.SendBatch(ctx, b).Close()
		var pgErr *pgconn.PgError
		switch {
		case errors.As(err, &pgErr) && pgErr.Code == lockNotAvailable:
			return waitedInFlight(req), false, nil
		case err != nil:
			return idem.Claim{}, false, fmt.Errorf("idempg: claim: %w", err)
		}
	}
	switch {
	case ans.found && ans.outcome != nil:
		claim, err := claimOf(*ans.outcome, false, ans.row, req)
		return claim, false, err
	case ans.found:
		// The key must be written to be claimed (expired, or its lease
		// ended): claimed as Claim claims it, in a new transaction.
		st.rollback(false)
		return s.claimTxExisting(ctx, req, work)
	}
	claim := pgsql.AcquiredClaim(req, token, now,
		now.Add(time.Duration(pgsql.Micros(req.Lease))*time.Microsecond), now.Add(time.Duration(pgsql.Micros(req.TTL))*time.Microsecond))
	resp, keep, err := work(txCtx, claim)
	if err != nil || !keep {
		return claim, false, err
	}
	header, err := headerArg(resp.Header)
	if err != nil {
		return claim, false, fmt.Errorf("idempg: complete: %w", err)
	}
	hr, hi := pgsql.HolderArgs(req.Holder)
	_, err = st.commit(&stmt{insertCompletedSQL, []any{scope, key, string(req.Fingerprint), token,
		int32(resp.Status), header, resp.Body, resp.BodyOmitted, now, pgsql.Micros(req.Lease), pgsql.Micros(req.TTL), s.db.now(), hr, hi}}, false)
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == uniqueViolation:
		return claim, false, fmt.Errorf("idempg: complete: the key was claimed by a claimant that did not take its lock, and this execution was rolled back: %w", idem.ErrLeaseLost)
	case err != nil:
		return claim, false, fmt.Errorf("idempg: complete: %w", err)
	}
	return claim, true, nil
}

// waitedInFlight is ClaimTx's answer when lock_timeout ended its wait for
// another transaction that holds the key, and a claim's in a transaction
// when another holds it (claimInTx).
func waitedInFlight(req idem.ClaimRequest) idem.Claim {
	return idem.Claim{Outcome: idem.InFlight, Record: idem.Record{
		Scope: req.Scope, Key: req.Key, State: idem.StateInFlight,
	}}
}

// answerRow is pgsql.Answer's row, read in a batch.
type answerRow struct {
	found   bool
	outcome *string
	row     pgsql.RecordRow
}

func (a *answerRow) scan(row pgx.Row) error {
	err := row.Scan(append([]any{&a.outcome}, a.row.Dest()...)...)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil
	case err != nil:
		return err
	}
	a.found = true
	return nil
}

// claimTxOnce begins a transaction and claims a new key in it. When the
// INSERT claims the key (inserted), work runs and done is true: claim,
// kept and err are ClaimTx's. When the key exists and is answered without
// a write, done is true too: claim is that answer (or err the answer's
// failure). Otherwise (not done) err is the INSERT's failure, or nil when
// the key must be written to be claimed.
func (s *Store) claimTxOnce(ctx context.Context, req idem.ClaimRequest, lockTimeout string, work idem.ClaimedWork) (claim idem.Claim, kept, inserted, done bool, err error) {
	st, txCtx := s.db.newTx(ctx)
	defer st.rollback(false)
	var (
		token                        int64
		created, leaseEnd, expiresAt time.Time
	)
	hr, hi := pgsql.HolderArgs(req.Holder)
	err = st.tx.QueryRow(txCtx, insertClaimTxSQL,
		string(req.Scope), string(req.Key), string(req.Fingerprint),
		pgsql.Micros(req.Lease), pgsql.Micros(req.TTL), s.db.now(), lockTimeout, hr, hi,
	).Scan(&token, &created, &leaseEnd, &expiresAt, nil) // nil: lock_timeout set back
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		// The key exists. Whatever the answer, this transaction has
		// nothing more to do (a key that must be written is claimed in a
		// new one), so it is rolled back in the answer's round trip.
		claim, answered, err := s.answer(txCtx, st.queryRowThenRollback, req)
		return claim, false, false, answered, err
	case err != nil:
		return idem.Claim{}, false, false, false, err
	}
	claim = pgsql.AcquiredClaim(req, token, created, leaseEnd, expiresAt)
	ref := idem.Ref{Scope: req.Scope, Key: req.Key, Token: claim.Token}
	kept, err = s.workAndComplete(ctx, st, txCtx, ref, true, func(ctx context.Context) (idem.Response, bool, error) {
		return work(ctx, claim)
	})
	return claim, kept, true, true, err
}

// claimTxExisting claims, in a new transaction, a key that must be written
// to be claimed, and runs work under the claim when it acquires the key.
func (s *Store) claimTxExisting(ctx context.Context, req idem.ClaimRequest, work idem.ClaimedWork) (idem.Claim, bool, error) {
	st, txCtx := s.db.newTx(ctx)
	defer st.rollback(false)
	claim, err := s.claimExisting(txCtx, st.tx, st, req)
	if err != nil || claim.Outcome != idem.Acquired {
		return claim, false, err
	}
	ref := idem.Ref{Scope: req.Scope, Key: req.Key, Token: claim.Token}
	kept, err := s.workAndComplete(ctx, st, txCtx, ref, false, func(ctx context.Context) (idem.Response, bool, error) {
		return work(ctx, claim)
	})
	return claim, kept, err
}

// completeOrRefuseSQL is pgsql.Complete for a completion sent in one pipeline
// with its COMMIT: when the token does not hold the key, it fails (with
// refusedCode), so that the transaction is rolled back instead of
// committed. The function runs only then: CASE evaluates it lazily.
const completeOrRefuseSQL = `WITH done AS (` + pgsql.Complete + `
	RETURNING 1)
SELECT CASE WHEN EXISTS (SELECT FROM done) THEN true ELSE idem_refuse_completion() END`

// completeArgs are the arguments of pgsql.Complete and completeOrRefuseSQL.
func (s *Store) completeArgs(ref idem.Ref, resp idem.Response) ([]any, error) {
	header, err := headerArg(resp.Header)
	if err != nil {
		return nil, err
	}
	return []any{string(ref.Scope), string(ref.Key), int64(ref.Token),
		int32(resp.Status), header, resp.Body, resp.BodyOmitted, s.db.now()}, nil
}

// headerArg is a response header as the column header takes it: NULL
// unless there is a header.
func headerArg(h http.Header) (any, error) {
	if h == nil {
		return nil, nil
	}
	b, err := json.Marshal(h)
	if err != nil {
		return nil, fmt.Errorf("encoding the header: %w", err)
	}
	return json.RawMessage(b), nil
}

// refused reports the failure of completeOrRefuseSQL's refusal.
func refused(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == refusedCode
}

// completedBy tells, after a completion found the key not held under
// ref.Token, whether that is because the same token completed it before
// (true) or because it lost the key (idem.ErrLeaseLost). It reads the
// newest committed row: the only way it can show this token completed is
// that this token completed it.
func (s *Store) completedBy(ctx context.Context, q querier, ref idem.Ref) (bool, error) {
	var (
		state string
		token int64
	)
	err := q.QueryRow(ctx, `SELECT state, token FROM idem_keys WHERE scope = $1 AND key = $2`,
		string(ref.Scope), string(ref.Key)).Scan(&state, &token)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return false, idem.ErrLeaseLost
	case err != nil:
		return false, err
	case idem.Token(token) == ref.Token && state == pgsql.StateCompleted:
		return true, nil
	}
	return false, idem.ErrLeaseLost
}

// Complete implements idem.Store. It does not look at the lease: a holder
// whose lease ended but whom nobody took over still owns the key. It commits
// durably (synchronous_commit as the server has it) and wakes the key's
// waiters on every replica once it has committed. Called with a context
// that carries a transaction of the DB, it joins it, and the waiters wake
// when that transaction commits.
//
// On its own it is one round trip: BEGIN, the completion, COMMIT and the
// wake-up in one pipeline.
//
// An error other than ErrLeaseLost is ambiguous (the commit may have
// happened and only its acknowledgement been lost): calling Complete again
// with the same token is safe, and succeeds if the first one committed.
func (s *Store) Complete(ctx context.Context, ref idem.Ref, resp idem.Response) error {
	if err := s.complete(ctx, ref, resp); err != nil {
		return fmt.Errorf("idempg: complete: %w", err)
	}
	return nil
}

func (s *Store) complete(ctx context.Context, ref idem.Ref, resp idem.Response) error {
	args, err := s.completeArgs(ref, resp)
	if err != nil {
		return err
	}
	w := wake{s.channel, string(ref.Scope), string(ref.Key)}
	q, st, err := s.q(ctx)
	if err != nil {
		return err
	}
	if st != nil {
		tag, err := q.Exec(ctx, pgsql.Complete, args...)
		switch {
		case err != nil:
			return err
		case tag.RowsAffected() == 1:
			st.addWake(w)
			return nil
		}
		_, err = s.completedBy(ctx, q, ref)
		return err
	}
	own := s.db.ownTx(ctx, "begin", "commit")
	own.addWake(w)
	_, err = own.commit(&stmt{completeOrRefuseSQL, args}, false)
	if refused(err) {
		_, err = s.completedBy(ctx, s.db.pool, ref)
	}
	return err
}

// Release implements idem.Store. It commits durably and wakes the key's
// waiters. Called with a context that carries a transaction of the DB, it
// joins it, and the waiters wake when that transaction commits. It refuses
// a key with a recovery point (idem.ErrHasRecoveryPoint): see
// ReleaseWithPoint.
//
// An error other than ErrLeaseLost or ErrHasRecoveryPoint is ambiguous: calling Release again is
// safe, and succeeds if the first one committed.
func (s *Store) Release(ctx context.Context, ref idem.Ref) error {
	if err := s.release(ctx, ref, pgsql.Release); err != nil {
		return fmt.Errorf("idempg: release: %w", err)
	}
	return nil
}

// ReleaseWithPoint implements idem.Recoverer, as Release does for a key
// without a point: it commits durably, wakes the key's waiters, and joins
// the transaction ctx carries, if any.
func (s *Store) ReleaseWithPoint(ctx context.Context, ref idem.Ref) error {
	if err := s.release(ctx, ref, pgsql.ReleaseWithPoint); err != nil {
		return fmt.Errorf("idempg: release: %w", err)
	}
	return nil
}

func (s *Store) release(ctx context.Context, ref idem.Ref, release string) error {
	args := []any{string(ref.Scope), string(ref.Key), int64(ref.Token)}
	w := wake{s.channel, string(ref.Scope), string(ref.Key)}
	q, st, err := s.q(ctx)
	if err != nil {
		return err
	}
	var tag pgconn.CommandTag
	if st != nil {
		if tag, err = q.Exec(ctx, release, args...); err == nil && tag.RowsAffected() == 1 {
			st.addWake(w)
		}
	} else {
		// One round trip; a wake-up after a release that deleted nothing
		// is spurious, which waiters allow.
		own := s.db.ownTx(ctx, "begin", "commit")
		own.addWake(w)
		tag, err = own.commit(&stmt{release, args}, false)
	}
	if err != nil {
		return err
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	var withPoint bool
	err = q.QueryRow(ctx, pgsql.Unreleased, args...).Scan(&withPoint)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil
	case err != nil:
		return err
	case withPoint:
		return idem.ErrHasRecoveryPoint
	}
	return idem.ErrLeaseLost
}

// Renew implements idem.Store: one statement, one round trip (pgsql.Renew).
// Like Complete, it does not look at the lease: a holder whose lease ended
// but whom nobody took over renews it. With Config.Clock nil, the lease is
// counted from the database's clock_timestamp(), read once the statement
// holds the key's row (after any wait for a transaction holding it).
//
// On its own it commits durably (synchronous_commit as the server has it):
// a renewal lost in a crash of the database server would leave a holder
// that lives on with a lease shorter than it was told. Called with a
// context that carries a transaction of the DB, it joins it, and counts
// only once that transaction commits: renew with a context of its own.
//
// An error other than ErrLeaseLost or an *idem.ArgumentError is ambiguous:
// the lease may or may not have been renewed; renewing again is safe.
func (s *Store) Renew(ctx context.Context, ref idem.Ref, lease time.Duration) (time.Time, error) {
	if lease <= 0 {
		return time.Time{}, &idem.ArgumentError{Field: "lease", Reason: "must be positive"}
	}
	q, _, err := s.q(ctx)
	if err != nil {
		return time.Time{}, fmt.Errorf("idempg: renew: %w", err)
	}
	var end time.Time
	err = q.QueryRow(ctx, pgsql.Renew, string(ref.Scope), string(ref.Key), int64(ref.Token), pgsql.Micros(lease), s.db.now()).Scan(&end)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return time.Time{}, idem.ErrLeaseLost
	case err != nil:
		return time.Time{}, fmt.Errorf("idempg: renew: %w", err)
	}
	return end.UTC(), nil
}

// YieldEarlier implements idem.Restarter: one statement through a partial
// index that holds only the keys in flight under a named holder, then the
// wake-ups of the keys it ended, so that duplicates waiting for them take
// them over at once. On its own it commits durably; called with a context
// that carries a transaction of the DB, it joins it, and the waiters wake
// when that transaction commits. With Config.Clock nil, leases are ended
// at the database's time.
func (s *Store) YieldEarlier(ctx context.Context, current idem.Holder) (int, error) {
	if err := pgsql.ValidateCurrent(current); err != nil {
		return 0, err
	}
	_, st, err := s.q(ctx)
	if err != nil {
		return 0, fmt.Errorf("idempg: yield earlier: %w", err)
	}
	query := s.db.pool.Query
	if st != nil {
		query = st.tx.Query
	}
	rows, err := query(ctx, pgsql.YieldEarlier, current.Replica, current.Incarnation, s.db.now())
	if err != nil {
		return 0, fmt.Errorf("idempg: yield earlier: %w", err)
	}
	var ended []wake
	for rows.Next() {
		w := wake{channel: s.channel}
		if err := rows.Scan(&w.scope, &w.key); err != nil {
			rows.Close()
			return 0, fmt.Errorf("idempg: yield earlier: %w", err)
		}
		ended = append(ended, w)
	}
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("idempg: yield earlier: %w", err)
	}
	if st != nil {
		for _, w := range ended {
			st.addWake(w)
		}
		return len(ended), nil
	}
	if len(ended) > 0 {
		// Committed: a wake-up that fails costs the waiters only their
		// wait.
		b := &pgx.Batch{}
		for _, w := range ended {
			b.Queue(pgsql.Wake, w.channel, pgsql.NotifyID(idem.Scope(w.scope), idem.Key(w.key)), w.scope, w.key)
		}
		s.db.pool.SendBatch(ctx, b).Close()
	}
	return len(ended), nil
}

// Get implements idem.Store. With Config.Clock nil, expiry is judged by the
// database's clock. Called with a context whose transaction of the DB has
// begun, it reads in that transaction and sees its writes.
func (s *Store) Get(ctx context.Context, scope idem.Scope, key idem.Key) (idem.Record, error) {
	q := s.db.readQuerier(ctx)
	var row pgsql.RecordRow
	err := q.QueryRow(ctx, pgsql.Get, string(scope), string(key), s.db.now()).Scan(row.Dest()...)
	if errors.Is(err, pgx.ErrNoRows) {
		return idem.Record{}, idem.ErrNotFound
	}
	if err != nil {
		return idem.Record{}, fmt.Errorf("idempg: get: %w", err)
	}
	rec, err := row.Record(scope, key)
	if err != nil {
		return idem.Record{}, fmt.Errorf("idempg: get: %w", err)
	}
	return rec, nil
}

// Purge implements idem.Store. limit must be positive. Each call is one
// statement in its own short transaction (see pgsql.Purge) that locks only the
// expired rows it deletes, skipping rows others hold, so claims of live keys
// never wait for it. A limit of about a thousand keeps each call to some
// milliseconds (BenchmarkClaimDuringPurge measures it). With Config.Clock
// nil, expiry is judged by the database's clock.
//
// On its own, the purge is sent in one round trip as BEGIN, SET LOCAL
// synchronous_commit TO off, the DELETE and COMMIT: a purge lost in a crash
// only leaves expired rows for the next one, and a purge that does not wait
// for its WAL flush spares the claims' WAL traffic a flush per batch. Called
// with a context that carries a transaction of the DB, it joins it, keeps
// that transaction's durability, and holds the row locks until that
// transaction ends.
func (s *Store) Purge(ctx context.Context, limit int) (int, error) {
	if limit <= 0 {
		return 0, &idem.ArgumentError{Field: "limit", Reason: "must be positive"}
	}
	n, err := s.purge(ctx, limit)
	if err != nil {
		return 0, fmt.Errorf("idempg: purge: %w", err)
	}
	return n, nil
}

func (s *Store) purge(ctx context.Context, limit int) (int, error) {
	q, st, err := s.q(ctx)
	if err != nil {
		return 0, err
	}
	if st != nil {
		tag, err := q.Exec(ctx, pgsql.Purge, s.db.now(), int64(limit))
		if err != nil {
			return 0, err
		}
		if _, err := q.Exec(ctx, pgsql.PurgeWaiters, s.db.now()); err != nil {
			return 0, err
		}
		return int(tag.RowsAffected()), nil
	}
	b := &pgx.Batch{}
	b.Queue(`BEGIN`)
	b.Queue(`SET LOCAL synchronous_commit TO off`)
	b.Queue(pgsql.Purge, s.db.now(), int64(limit))
	b.Queue(pgsql.PurgeWaiters, s.db.now())
	b.Queue(`COMMIT`)
	res := s.db.pool.SendBatch(ctx, b)
	n, err := purgeResults(res)
	// Close reports the first error again, or one of its own; a failed
	// batch's connection is left in a transaction, so the pool drops it.
	if cerr := res.Close(); err == nil {
		err = cerr
	}
	return n, err
}

// purgeResults reads the results of Purge's batch.
func purgeResults(res pgx.BatchResults) (int, error) {
	for _, stmt := range []string{"BEGIN", "SET"} {
		if _, err := res.Exec(); err != nil {
			return 0, fmt.Errorf("%s: %w", stmt, err)
		}
	}
	tag, err := res.Exec()
	if err != nil {
		return 0, err
	}
	if _, err := res.Exec(); err != nil {
		return 0, fmt.Errorf("waiters: %w", err)
	}
	commit, err := res.Exec()
	if err != nil {
		return 0, fmt.Errorf("commit: %w", err)
	}
	if commit.String() == "ROLLBACK" {
		return 0, pgx.ErrTxCommitRollback
	}
	return int(tag.RowsAffected()), nil
}

// CompleteTx implements idem.TxStore.
//
// work receives a context carrying a transaction of the DB that has not
// begun yet: it begins (with Config.TxOptions) on a pool connection with the
// first statement work runs through WithTx (or another Store method) with
// that context, BEGIN travelling in the same round trip as that statement,
// or else with the completion. A handler that waits on something before it
// writes therefore holds no connection meanwhile. work reaches the
// transaction with db.WithTx(ctx, ...), whose fn joins it.
//
// When work returns keep=true and no error, the record is completed in the
// same transaction (UPDATE ... WHERE token = ref.Token AND state =
// 'in_flight', a compare-and-set), which then commits durably: the work's
// writes and the key's completion are durable together or not at all. The
// completion, the COMMIT and the wake-up of the key's waiters, if it has
// any (see WaitChange), go in one round trip: a completion that finds the
// key no longer held by ref.Token fails on purpose (SQLSTATE IDM01), so the
// COMMIT behind it commits nothing. When work returns keep=false or an
// error, when the completion finds the key no longer held by ref.Token
// (ErrLeaseLost), or when work panics (the panic goes on), the transaction
// is rolled back.
//
// A duplicate cannot run the work while this one is in flight, at any
// isolation level: the claim committed before the work began, so it is
// visible to every later claim, and the completion is fenced. If the lease
// ends and another holder takes over and completes first, this completion
// finds another token (ErrLeaseLost) under READ COMMITTED, or fails with a
// serialization failure (SQLSTATE 40001) under REPEATABLE READ or
// SERIALIZABLE; either way nothing of this work is committed.
//
// A second CompleteTx with a token that already completed the key returns
// true and rolls back what work wrote this time: the first execution's
// effect is the one that counts, so it is not applied twice.
//
// Errors: work's error is returned unchanged; ErrNestedCompleteTx when ctx
// already carries a transaction of the same DB. Any other error after work
// returned is ambiguous only when it is the COMMIT's (it says "commit": for
// example the connection was lost after the completion and the COMMIT were
// sent) and is neither a
// serialization failure (SQLSTATE 40001) nor pgx.ErrTxCommitRollback: the
// writes and the completion may have committed, so do not release the key;
// Get tells which (completed under ref.Token means it committed). Any other
// error means nothing was committed and the key is still held by ref.Token,
// unless its lease ends.
func (s *Store) CompleteTx(ctx context.Context, ref idem.Ref, work idem.TxWork) (bool, error) {
	if work == nil {
		return false, &idem.ArgumentError{Field: "work", Reason: "must not be nil"}
	}
	if s.db.carried(ctx) != nil {
		return false, ErrNestedCompleteTx
	}
	if err := ctx.Err(); err != nil {
		return false, err
	}
	st, txCtx := s.db.newTx(ctx)
	defer st.rollback(false)
	return s.workAndComplete(ctx, st, txCtx, ref, false, work)
}

// workAndComplete runs work in the transaction st and, when work keeps its
// answer, completes ref with it and commits (see CompleteTx). inserted
// says that this transaction inserted the key's row: nobody else can have
// seen it, changed it or waited for it, so the completion is a plain
// UPDATE, sure to find the row, and has nobody to wake. The caller rolls
// st back when it is not committed.
func (s *Store) workAndComplete(ctx context.Context, st *txState, txCtx context.Context, ref idem.Ref, inserted bool, work idem.TxWork) (bool, error) {
	resp, keep, err := work(txCtx)
	if err != nil || !keep {
		return false, err
	}
	args, err := s.completeArgs(ref, resp)
	if err != nil {
		return false, fmt.Errorf("idempg: complete: %w", err)
	}
	if inserted {
		tag, err := st.commit(&stmt{pgsql.Complete, args}, false)
		switch {
		case err != nil:
			return false, fmt.Errorf("idempg: complete: %w", err)
		case tag.RowsAffected() != 1:
			// Only work itself could have deleted the row, in this
			// transaction: its effect committed without the key.
			return false, fmt.Errorf("idempg: complete: the key's row was changed by the work itself and the work committed without it")
		}
		return true, nil
	}
	st.addWake(wake{s.channel, string(ref.Scope), string(ref.Key)})
	_, err = st.commit(&stmt{completeOrRefuseSQL, args}, false)
	if refused(err) {
		// Rolled back. Completed by this token before: the first
		// execution's effect is the one that counts.
		if _, err = s.completedBy(ctx, s.db.pool, ref); err == nil {
			return true, nil
		}
	}
	if err != nil {
		return false, fmt.Errorf("idempg: complete: %w", err)
	}
	return true, nil
}

// claimOf is the claim a row of pgsql.Answer or pgsql.Claim answers.
func claimOf(outcome string, tookOver bool, row pgsql.RecordRow, req idem.ClaimRequest) (idem.Claim, error) {
	c, err := pgsql.ClaimOf(outcome, tookOver, row, req)
	if err != nil {
		return idem.Claim{}, fmt.Errorf("idempg: claim: %w", err)
	}
	return c, nil
}

// SaveRecovery implements idem.Recoverer. Called with a context that
// carries a transaction of the DB (WithTx, CompleteTx), it writes in it, so
// the point commits or rolls back with the phase's writes; otherwise it
// commits on its own, durably. With Config.Clock nil, SavedAt is the
// database's time.
func (s *Store) SaveRecovery(ctx context.Context, ref idem.Ref, rp idem.RecoveryPoint) error {
	if err := pgsql.ValidateRecovery(rp); err != nil {
		return err
	}
	q, _, err := s.q(ctx)
	if err != nil {
		return fmt.Errorf("idempg: save recovery point: %w", err)
	}
	data := rp.Data
	if data == nil {
		data = []byte{}
	}
	tag, err := q.Exec(ctx, pgsql.SaveRecovery, string(ref.Scope), string(ref.Key), int64(ref.Token), rp.Name, data, s.db.now())
	if err != nil {
		return fmt.Errorf("idempg: save recovery point: %w", err)
	}
	if tag.RowsAffected() != 1 {
		return idem.ErrLeaseLost
	}
	return nil
}

// Abandoned implements idem.Recoverer, through a partial index that holds
// only the keys in flight with a point. With Config.Clock nil, leases are
// judged by the database's clock.
func (s *Store) Abandoned(ctx context.Context, limit int) ([]idem.Record, error) {
	if limit <= 0 {
		return nil, &idem.ArgumentError{Field: "limit", Reason: "must be positive"}
	}
	rows, err := s.db.readQuerier(ctx).Query(ctx, pgsql.Abandoned, s.db.now(), limit)
	if err != nil {
		return nil, fmt.Errorf("idempg: abandoned: %w", err)
	}
	defer rows.Close()
	out, err := pgsql.AbandonedRecords(rows)
	if err != nil {
		return nil, fmt.Errorf("idempg: abandoned: %w", err)
	}
	return out, nil
}

// InFlightAtPoints lists up to limit keys in flight with a recovery
// point, whether their holder's lease has ended or not (Abandoned lists
// those whose lease has), oldest lease end first: every execution past
// the database's edge whose outcome is not in the books yet, as an audit
// of those books wants them (idem reconcile). It writes nothing, and runs
// on a read-only pool.
func (s *Store) InFlightAtPoints(ctx context.Context, limit int) ([]idem.Record, error) {
	if limit <= 0 {
		return nil, &idem.ArgumentError{Field: "limit", Reason: "must be positive"}
	}
	rows, err := s.db.readQuerier(ctx).Query(ctx, pgsql.InFlightAtPoints, limit)
	if err != nil {
		return nil, fmt.Errorf("idempg: in flight at points: %w", err)
	}
	defer rows.Close()
	out, err := pgsql.AbandonedRecords(rows)
	if err != nil {
		return nil, fmt.Errorf("idempg: in flight at points: %w", err)
	}
	return out, nil
}

// Yield implements idem.Recoverer. On its own it commits in one round trip
// and wakes the key's waiters, so a duplicate waiting for the key takes it
// over at once; called with a context that carries a transaction of the
// DB, it joins it, and the waiters wake when that transaction commits.
func (s *Store) Yield(ctx context.Context, ref idem.Ref) error {
	args := []any{string(ref.Scope), string(ref.Key), int64(ref.Token), s.db.now()}
	w := wake{s.channel, string(ref.Scope), string(ref.Key)}
	q, st, err := s.q(ctx)
	if err != nil {
		return fmt.Errorf("idempg: yield: %w", err)
	}
	var tag pgconn.CommandTag
	if st != nil {
		if tag, err = q.Exec(ctx, pgsql.Yield, args...); err == nil && tag.RowsAffected() == 1 {
			st.addWake(w)
		}
	} else {
		own := s.db.ownTx(ctx, "begin", "commit")
		own.addWake(w)
		tag, err = own.commit(&stmt{pgsql.Yield, args}, false)
	}
	if err != nil {
		return fmt.Errorf("idempg: yield: %w", err)
	}
	if tag.RowsAffected() != 1 {
		return idem.ErrLeaseLost
	}
	return nil
}
