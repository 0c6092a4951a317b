package idempgsql

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/pgsql"
)

// Store is an idem.Store and idem.TxStore whose records live in the table
// idem_keys of a DB's schema, next to the application's tables. It is safe
// for concurrent use, by many goroutines and many processes, and by
// idempg's Store on the same schema at once.
type Store struct {
	db *DB
}

var (
	_ idem.Store     = (*Store)(nil)
	_ idem.TxStore   = (*Store)(nil)
	_ idem.Recoverer = (*Store)(nil)
	_ idem.Restarter = (*Store)(nil)
)

// NewStore applies the store's schema migrations to db (component
// "idem_keys": the table idem_keys and the functions idem_claim,
// idem_clock_us and idem_key_lock; component "idem_waiters": the table
// idem_waiters and the function idem_refuse_completion), the same as
// idempg's NewStore, and returns a Store on it.
func NewStore(ctx context.Context, db *DB) (*Store, error) {
	if db == nil {
		return nil, &idem.ArgumentError{Field: "db", Reason: "must not be nil"}
	}
	if err := db.Migrate(ctx, pgsql.KeysComponent, pgsql.Keys); err != nil {
		return nil, err
	}
	if err := db.Migrate(ctx, pgsql.WaitersComponent, pgsql.Waiters); err != nil {
		return nil, err
	}
	return &Store{db: db}, nil
}

// Claim implements idem.Store. A new key is claimed by one INSERT ... ON
// CONFLICT DO NOTHING; a key that exists is answered by a plain SELECT
// (a replay, a duplicate in flight, a mismatch), and only a claim that
// must write (an expired key claimed anew, an ended lease taken over)
// calls the function idem_claim. These are idempg's statements: the two
// packages claim alike.
//
// On its own, the claim commits with synchronous_commit off, which is safe
// for the reason idempg's Store.Claim gives: nothing runs under a claim
// that is not in a later, synchronous commit. It waits for a transaction
// that holds the key (one that claimed it and has not ended) to end.
//
// Called with a context that carries a transaction of the DB (WithTx,
// JoinTx), the claim joins it, inside a savepoint of its own, keeps that
// transaction's durability, and commits or rolls back with it. It then
// never waits for another transaction, so claims in long transactions, in
// any order, cannot deadlock: a replay, a mismatch or a key in flight is
// answered from the key's committed row without taking a lock, and a key
// that another transaction is claiming, or has claimed and not yet
// committed (idempg's ClaimTx running its work included), is answered
// InFlight at once (its record then holds only the scope and the key). A
// key it acquires stays locked until the transaction ends, since its row
// is not committed before: claims of it in other transactions answer
// InFlight, claims on their own wait, and idempg's ClaimTx waits as long
// as it is told to, then answers InFlight. The key's lock is the
// schema's: a transaction in another schema never holds it. Above READ
// COMMITTED, a key that another transaction claimed and committed after
// the snapshot fails the claim with a serialization failure (Classify:
// transient; retry in a new transaction).
//
// With Config.Clock nil, leases and expiry are judged by the database's
// clock_timestamp() at the moment the claim runs.
//
// Errors other than an *idem.ArgumentError are ambiguous, as the idem.Store
// contract says: the claim may have been made. Do not run the effect;
// claiming again is safe.
func (s *Store) Claim(ctx context.Context, req idem.ClaimRequest) (idem.Claim, error) {
	if err := pgsql.ValidateClaim(req); err != nil {
		return idem.Claim{}, err
	}
	claim, err := s.claim(ctx, req)
	if err != nil {
		return idem.Claim{}, fmt.Errorf("idempgsql: claim: %w", err)
	}
	return claim, nil
}

func (s *Store) claim(ctx context.Context, req idem.ClaimRequest) (claim idem.Claim, err error) {
	err = s.db.statement(ctx, "Store.Claim", func(ctx context.Context, q querier, st *txState) error {
		var err error
		if st == nil {
			claim, err = s.claimAlone(ctx, q, req)
		} else {
			claim, err = s.claimInTx(ctx, q, req)
		}
		return err
	})
	return claim, err
}

// claimAlone is a claim on its own, each statement committing by itself.
func (s *Store) claimAlone(ctx context.Context, q querier, req idem.ClaimRequest) (idem.Claim, error) {
	scope, key, fp := string(req.Scope), string(req.Key), string(req.Fingerprint)
	var (
		token                        int64
		created, leaseEnd, expiresAt time.Time
	)
	hr, hi := pgsql.HolderArgs(req.Holder)
	err := q.QueryRowContext(ctx, pgsql.InsertClaim, scope, key, fp,
		pgsql.Micros(req.Lease), pgsql.Micros(req.TTL), s.db.now(), true, hr, hi,
	).Scan(&token, &created, &leaseEnd, &expiresAt)
	switch {
	case err == nil:
		return pgsql.AcquiredClaim(req, token, created, leaseEnd, expiresAt), nil
	case !errors.Is(err, sql.ErrNoRows):
		return idem.Claim{}, err
	}
	claim, answered, err := s.answer(ctx, q, req)
	if err != nil || answered {
		return claim, err
	}
	// The key must be written to be claimed (expired, its lease ended, or
	// gone since the INSERT looked): the function decides, and answers
	// whatever state it finds by then.
	return s.claimFunction(ctx, q, req, true)
}

// answer answers a claim of a key that exists from its committed row,
// without writing (answered), or says that the claim must write: the key
// is absent, or expired, or its lease ended.
func (s *Store) answer(ctx context.Context, q querier, req idem.ClaimRequest) (claim idem.Claim, answered bool, err error) {
	var (
		outcome sql.NullString
		row     pgsql.RecordRow
	)
	err = q.QueryRowContext(ctx, pgsql.Answer, string(req.Scope), string(req.Key), string(req.Fingerprint), s.db.now()).
		Scan(append([]any{&outcome}, row.Dest()...)...)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return idem.Claim{}, false, nil
	case err != nil:
		return idem.Claim{}, false, err
	case !outcome.Valid:
		return idem.Claim{}, false, nil
	}
	claim, err = pgsql.ClaimOf(outcome.String, false, row, req)
	return claim, err == nil, err
}

// claimFunction claims a key that must be written to be claimed with the
// function idem_claim. async turns synchronous_commit off for the claim's
// own transaction.
func (s *Store) claimFunction(ctx context.Context, q querier, req idem.ClaimRequest, async bool) (idem.Claim, error) {
	var (
		outcome  sql.NullString
		tookOver bool
		row      pgsql.RecordRow
	)
	hr, hi := pgsql.HolderArgs(req.Holder)
	err := q.QueryRowContext(ctx, pgsql.Claim, string(req.Scope), string(req.Key), string(req.Fingerprint),
		pgsql.Micros(req.Lease), pgsql.Micros(req.TTL), s.db.now(), async,
		s.db.channel, pgsql.NotifyID(req.Scope, req.Key), hr, hi,
	).Scan(append([]any{&outcome, &tookOver}, row.Dest()...)...)
	if err != nil {
		return idem.Claim{}, err
	}
	return pgsql.ClaimOf(outcome.String, tookOver, row, req)
}

// claimInTx is a claim in a transaction that goes on after it (the
// application's, or a WithTx): it never waits for another transaction, so
// claims made in long transactions, in any order, cannot deadlock. A key
// that exists and needs no write (a replay, a mismatch, a key in flight)
// is answered from its committed row, taking no lock; a key that another
// transaction is claiming, or has claimed and not committed, is answered
// InFlight at once (its record holds only the scope and the key); a key it
// claims stays locked until the transaction ends, as its row is
// uncommitted until then.
func (s *Store) claimInTx(ctx context.Context, q querier, req idem.ClaimRequest) (idem.Claim, error) {
	claim, answered, err := s.answer(ctx, q, req)
	if err != nil || answered {
		return claim, err
	}
	hr, hi := pgsql.HolderArgs(req.Holder)
	var (
		locked                       bool
		token                        sql.NullInt64
		created, leaseEnd, expiresAt sql.NullTime
	)
	err = q.QueryRowContext(ctx, pgsql.ClaimInTx, string(req.Scope), string(req.Key), string(req.Fingerprint),
		pgsql.Micros(req.Lease), pgsql.Micros(req.TTL), s.db.now(), hr, hi,
	).Scan(&locked, &token, &created, &leaseEnd, &expiresAt)
	switch {
	case err != nil:
		return idem.Claim{}, err
	case !locked:
		return heldElsewhere(req), nil
	case token.Valid:
		return pgsql.AcquiredClaim(req, token.Int64, created.Time, leaseEnd.Time, expiresAt.Time), nil
	}
	// The key exists: committed since the first look, or one that must be
	// written to be claimed.
	if claim, answered, err := s.answer(ctx, q, req); err != nil || answered {
		return claim, err
	}
	var rows int
	if err := q.QueryRowContext(ctx, pgsql.LockRow, string(req.Scope), string(req.Key)).Scan(&rows); err != nil {
		return idem.Claim{}, err
	}
	if rows == 0 {
		return heldElsewhere(req), nil
	}
	return s.claimFunction(ctx, q, req, false)
}

// heldElsewhere is the answer of a claim in a transaction to a key that
// another transaction holds: in flight. Its record holds only the key: the
// other transaction's row is not committed, and may never be.
func heldElsewhere(req idem.ClaimRequest) idem.Claim {
	return idem.Claim{Outcome: idem.InFlight, Record: idem.Record{Scope: req.Scope, Key: req.Key, State: idem.StateInFlight}}
}

// completeArgs are the arguments of pgsql.Complete.
func (s *Store) completeArgs(ref idem.Ref, resp idem.Response) ([]any, error) {
	header, err := headerArg(resp.Header)
	if err != nil {
		return nil, err
	}
	return []any{string(ref.Scope), string(ref.Key), int64(ref.Token),
		int64(resp.Status), header, resp.Body, resp.BodyOmitted, s.db.now()}, nil
}

// headerArg is a response header as the column header takes it: the text
// of a JSON object, or NULL when there is no header. It is sent as text,
// which every driver passes to a jsonb parameter as it is (lib/pq would
// send a []byte as bytea).
func headerArg(h http.Header) (any, error) {
	if h == nil {
		return nil, nil
	}
	b, err := json.Marshal(h)
	if err != nil {
		return nil, fmt.Errorf("encoding the header: %w", err)
	}
	return string(b), nil
}

// completedBy tells, after a completion found the key not held under
// ref.Token, whether that is because the same token completed it before
// (true) or because it lost the key (idem.ErrLeaseLost).
func (s *Store) completedBy(ctx context.Context, q querier, ref idem.Ref) (bool, error) {
	var (
		state string
		token int64
	)
	err := q.QueryRowContext(ctx, `SELECT state, token FROM idem_keys WHERE scope = $1 AND key = $2`,
		string(ref.Scope), string(ref.Key)).Scan(&state, &token)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return false, idem.ErrLeaseLost
	case err != nil:
		return false, err
	case idem.Token(token) == ref.Token && state == pgsql.StateCompleted:
		return true, nil
	}
	return false, idem.ErrLeaseLost
}

// Complete implements idem.Store: a compare-and-set on the fencing token
// (UPDATE ... WHERE token = ref.Token AND state = 'in_flight'). It does not
// look at the lease: a holder whose lease ended but whom nobody took over
// still owns the key. On its own it commits durably, then wakes the key's
// waiters; called with a context that carries a transaction of the DB, it
// joins it, and the waiters wake when that transaction commits.
//
// An error other than ErrLeaseLost is ambiguous (the commit may have
// happened and only its acknowledgement been lost): calling Complete again
// with the same token is safe, and succeeds if the first one committed.
func (s *Store) Complete(ctx context.Context, ref idem.Ref, resp idem.Response) error {
	if err := s.complete(ctx, ref, resp); err != nil {
		return fmt.Errorf("idempgsql: complete: %w", err)
	}
	return nil
}

func (s *Store) complete(ctx context.Context, ref idem.Ref, resp idem.Response) error {
	args, err := s.completeArgs(ref, resp)
	if err != nil {
		return err
	}
	return s.db.statement(ctx, "Store.Complete", func(ctx context.Context, q querier, st *txState) error {
		res, err := q.ExecContext(ctx, pgsql.Complete, args...)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil {
			return err
		} else if n == 0 {
			_, err := s.completedBy(ctx, q, ref)
			return err
		}
		return s.wakeAfter(ctx, q, st, ref.Scope, ref.Key)
	})
}

// wakeAfter has the key's waiters woken once the change just made on q,
// in the transaction st (or on its own, when st is nil), is committed:
// at once when the change committed on its own; by st's commit when st is
// a transaction of idem's; and, in a transaction of the application's
// (JoinTx), whose commit idem does not see, by a notification sent in it,
// which PostgreSQL delivers when it commits.
//
// A waiter registers, then reads the key, and a wake looks for waiters, so
// one made after the commit misses nobody; one made inside the transaction
// can miss a waiter that registers between the look and the commit, which
// then waits until its own time is up (and claims again), no longer.
// Waking is best effort outside a transaction: the change has committed,
// and a failed wake costs the waiters only their wait.
func (s *Store) wakeAfter(ctx context.Context, q querier, st *txState, scope idem.Scope, key idem.Key) error {
	switch {
	case st == nil:
		s.db.wake(ctx, q, scope, key)
	case st.joined:
		return s.db.wake(ctx, q, scope, key)
	default:
		st.addWake(wakeKey{scope, key})
	}
	return nil
}

// Release implements idem.Store: it deletes the key if ref.Token holds it
// in flight, commits durably and wakes the key's waiters. Called with a
// context that carries a transaction of the DB, it joins it, and the
// waiters wake when that transaction commits. Releasing a key that is gone
// succeeds; one held under another token returns idem.ErrLeaseLost, and
// one in flight with a recovery point idem.ErrHasRecoveryPoint (see
// ReleaseWithPoint).
//
// An error other than those is ambiguous: calling Release again is
// safe, and succeeds if the first one committed.
func (s *Store) Release(ctx context.Context, ref idem.Ref) error {
	if err := s.release(ctx, ref, pgsql.Release); err != nil {
		return fmt.Errorf("idempgsql: release: %w", err)
	}
	return nil
}

// ReleaseWithPoint implements idem.Recoverer, as Release does for a key
// without a point.
func (s *Store) ReleaseWithPoint(ctx context.Context, ref idem.Ref) error {
	if err := s.release(ctx, ref, pgsql.ReleaseWithPoint); err != nil {
		return fmt.Errorf("idempgsql: release: %w", err)
	}
	return nil
}

func (s *Store) release(ctx context.Context, ref idem.Ref, release string) error {
	return s.db.statement(ctx, "Store.Release", func(ctx context.Context, q querier, st *txState) error {
		res, err := q.ExecContext(ctx, release, string(ref.Scope), string(ref.Key), int64(ref.Token))
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil {
			return err
		} else if n == 1 {
			return s.wakeAfter(ctx, q, st, ref.Scope, ref.Key)
		}
		var withPoint bool
		err = q.QueryRowContext(ctx, pgsql.Unreleased, string(ref.Scope), string(ref.Key), int64(ref.Token)).Scan(&withPoint)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			return nil
		case err != nil:
			return err
		case withPoint:
			return idem.ErrHasRecoveryPoint
		}
		return idem.ErrLeaseLost
	})
}

// Renew implements idem.Store: one statement (idempg's). Like Complete,
// it does not look at the lease: a holder whose lease ended but whom nobody
// took over renews it. With Config.Clock nil, the lease is counted from the
// database's clock_timestamp(), read once the statement holds the key's
// row (after any wait for a transaction holding it). On its own it
// commits durably, as idempg's does, for the reason idempg gives; called
// with a context that carries a transaction of the DB, it joins it
// (inside a savepoint of its own), and counts only once that transaction
// commits: renew with a context of its own.
//
// An error other than ErrLeaseLost or an *idem.ArgumentError is ambiguous:
// the lease may or may not have been renewed; renewing again is safe.
func (s *Store) Renew(ctx context.Context, ref idem.Ref, lease time.Duration) (time.Time, error) {
	if lease <= 0 {
		return time.Time{}, &idem.ArgumentError{Field: "lease", Reason: "must be positive"}
	}
	var end time.Time
	err := s.db.statement(ctx, "Store.Renew", func(ctx context.Context, q querier, _ *txState) error {
		err := q.QueryRowContext(ctx, pgsql.Renew, string(ref.Scope), string(ref.Key), int64(ref.Token), pgsql.Micros(lease), s.db.now()).Scan(&end)
		if errors.Is(err, sql.ErrNoRows) {
			return idem.ErrLeaseLost
		}
		return err
	})
	switch {
	case errors.Is(err, idem.ErrLeaseLost):
		return time.Time{}, idem.ErrLeaseLost
	case err != nil:
		return time.Time{}, fmt.Errorf("idempgsql: renew: %w", err)
	}
	return end.UTC(), nil
}

// YieldEarlier implements idem.Restarter: one statement (idempg's),
// through a partial index that holds only the keys in flight under a named
// holder, then the wake-ups of the keys it ended once the change is
// committed (see wakeAfter). Called with a context that carries a
// transaction of the DB, it joins it. With Config.Clock nil, leases are
// ended at the database's time.
func (s *Store) YieldEarlier(ctx context.Context, current idem.Holder) (int, error) {
	if err := pgsql.ValidateCurrent(current); err != nil {
		return 0, err
	}
	n, err := s.yieldEarlier(ctx, current)
	if err != nil {
		return 0, fmt.Errorf("idempgsql: yield earlier: %w", err)
	}
	return n, nil
}

func (s *Store) yieldEarlier(ctx context.Context, current idem.Holder) (n int, err error) {
	err = s.db.statement(ctx, "Store.YieldEarlier", func(ctx context.Context, q querier, st *txState) error {
		rows, err := q.QueryContext(ctx, pgsql.YieldEarlier, current.Replica, current.Incarnation, s.db.now())
		if err != nil {
			return err
		}
		var ended []wakeKey
		for rows.Next() {
			var scope, key string
			if err := rows.Scan(&scope, &key); err != nil {
				rows.Close()
				return err
			}
			ended = append(ended, wakeKey{idem.Scope(scope), idem.Key(key)})
		}
		if err := rows.Close(); err != nil {
			return err
		}
		if err := rows.Err(); err != nil {
			return err
		}
		for _, w := range ended {
			if err := s.wakeAfter(ctx, q, st, w.scope, w.key); err != nil {
				return err
			}
		}
		n = len(ended)
		return nil
	})
	return n, err
}

// Get implements idem.Store. With Config.Clock nil, expiry is judged by the
// database's clock. Called with a context whose transaction of the DB has
// begun, it reads in that transaction and sees its writes.
func (s *Store) Get(ctx context.Context, scope idem.Scope, key idem.Key) (idem.Record, error) {
	var row pgsql.RecordRow
	err := s.db.read(ctx, "Store.Get", func(ctx context.Context, q querier) error {
		return q.QueryRowContext(ctx, pgsql.Get, string(scope), string(key), s.db.now()).Scan(row.Dest()...)
	})
	if errors.Is(err, sql.ErrNoRows) {
		return idem.Record{}, idem.ErrNotFound
	}
	if err != nil {
		return idem.Record{}, fmt.Errorf("idempgsql: get: %w", err)
	}
	rec, err := row.Record(scope, key)
	if err != nil {
		return idem.Record{}, fmt.Errorf("idempgsql: get: %w", err)
	}
	return rec, nil
}

// Purge implements idem.Store. limit must be positive. It deletes up to
// limit records whose TTL has passed and that no live lease holds, oldest
// first, skipping rows another transaction holds (so claims of live keys
// never wait for it), and the registrations of waiters that died waiting.
// With Config.Clock nil, expiry is judged by the database's clock. Called
// with a context that carries a transaction of the DB, it joins it.
func (s *Store) Purge(ctx context.Context, limit int) (int, error) {
	if limit <= 0 {
		return 0, &idem.ArgumentError{Field: "limit", Reason: "must be positive"}
	}
	n, err := s.purge(ctx, limit)
	if err != nil {
		return 0, fmt.Errorf("idempgsql: purge: %w", err)
	}
	return n, nil
}

func (s *Store) purge(ctx context.Context, limit int) (n int, err error) {
	err = s.db.statement(ctx, "Store.Purge", func(ctx context.Context, q querier, _ *txState) error {
		res, err := q.ExecContext(ctx, pgsql.Purge, s.db.now(), int64(limit))
		if err != nil {
			return err
		}
		deleted, err := res.RowsAffected()
		if err != nil {
			return err
		}
		if _, err := q.ExecContext(ctx, pgsql.PurgeWaiters, s.db.now()); err != nil {
			return fmt.Errorf("waiters: %w", err)
		}
		n = int(deleted)
		return nil
	})
	return n, err
}

// CompleteTx implements idem.TxStore.
//
// work receives a context carrying a transaction of the DB that has not
// begun yet: it begins (with Config.TxOptions) with the first statement
// work runs through WithTx (or a Store method) with that context, or else
// with the completion, so a handler that waits on something before it
// writes holds no connection meanwhile. work reaches the transaction with
// db.WithTx(ctx, ...), whose fn gets the *sql.Tx.
//
// When work returns keep=true and no error, the record is completed in the
// same transaction (a compare-and-set on ref.Token), which then commits
// durably: the work's writes and the key's completion are durable together
// or not at all. When work returns keep=false or an error, when the
// completion finds the key no longer held by ref.Token (ErrLeaseLost), or
// when work panics (the panic goes on), the transaction is rolled back. A
// second CompleteTx with a token that already completed the key returns
// true and rolls back what work wrote this time: the first execution's
// effect is the one that counts.
//
// Errors: work's error is returned unchanged; ErrNestedCompleteTx when ctx
// already carries a transaction of the same DB. An error that says
// "commit" is ambiguous: the writes and the completion may have committed,
// so do not release the key; Get tells which (completed under ref.Token
// means it committed). Any other error means nothing was committed and the
// key is still held by ref.Token, unless its lease ends.
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
	defer st.end(false)
	resp, keep, err := work(txCtx)
	if err != nil || !keep {
		return false, err
	}
	// The completion and the commit come after the calls work left
	// running: neither may land in their savepoints.
	st.drain()
	args, err := s.completeArgs(ref, resp)
	if err != nil {
		return false, fmt.Errorf("idempgsql: complete: %w", err)
	}
	tx, err := st.begin()
	if err != nil {
		return false, fmt.Errorf("idempgsql: complete: begin: %w", err)
	}
	res, err := tx.ExecContext(ctx, pgsql.Complete, args...)
	if SQLState(err) == serializationFailure {
		// Above READ COMMITTED: the key's row changed after the
		// transaction's snapshot. Rolled back; whoever changed it decides.
		st.end(false)
		if kept, lerr := s.changedUnder(ctx, ref); lerr != nil || kept {
			return kept, lerr
		}
	}
	if err != nil {
		return false, fmt.Errorf("idempgsql: complete: %w", err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return false, fmt.Errorf("idempgsql: complete: %w", err)
	} else if n == 0 {
		// Rolled back. Completed by this token before: the first
		// execution's effect is the one that counts.
		st.end(false)
		if _, err := s.completedBy(ctx, s.db.sql, ref); err != nil {
			return false, fmt.Errorf("idempgsql: complete: %w", err)
		}
		return true, nil
	}
	st.addWake(wakeKey{ref.Scope, ref.Key})
	if err := st.end(true); err != nil {
		return false, fmt.Errorf("idempgsql: complete: commit: %w", err)
	}
	return true, nil
}

// changedUnder tells, after CompleteTx's completion failed with a
// serialization failure and was rolled back, what became of the key: kept
// when this token completed it before (the first execution's effect is the
// one that counts), idem.ErrLeaseLost when another token holds it or it is
// gone, and neither (false, nil) when this token still holds it in flight,
// and the failure stands: nothing was committed, and the key is still held.
func (s *Store) changedUnder(ctx context.Context, ref idem.Ref) (kept bool, err error) {
	var (
		state string
		token int64
	)
	err = s.db.sql.QueryRowContext(ctx, `SELECT state, token FROM idem_keys WHERE scope = $1 AND key = $2`,
		string(ref.Scope), string(ref.Key)).Scan(&state, &token)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return false, fmt.Errorf("idempgsql: complete: %w", idem.ErrLeaseLost)
	case err != nil:
		return false, fmt.Errorf("idempgsql: complete: %w", err)
	case idem.Token(token) != ref.Token:
		return false, fmt.Errorf("idempgsql: complete: %w", idem.ErrLeaseLost)
	case state == pgsql.StateCompleted:
		return true, nil
	}
	return false, nil
}

// SaveRecovery implements idem.Recoverer. Called with a context that
// carries a transaction of the DB (WithTx, JoinTx, CompleteTx), it writes
// in it, inside a savepoint of its own, so the point commits or rolls back
// with the phase's writes; otherwise it commits on its own. With
// Config.Clock nil, SavedAt is the database's time.
func (s *Store) SaveRecovery(ctx context.Context, ref idem.Ref, rp idem.RecoveryPoint) error {
	if err := pgsql.ValidateRecovery(rp); err != nil {
		return err
	}
	data := rp.Data
	if data == nil {
		data = []byte{}
	}
	err := s.db.statement(ctx, "Store.SaveRecovery", func(ctx context.Context, q querier, _ *txState) error {
		res, err := q.ExecContext(ctx, pgsql.SaveRecovery, string(ref.Scope), string(ref.Key), int64(ref.Token), rp.Name, data, s.db.now())
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil {
			return err
		} else if n != 1 {
			return idem.ErrLeaseLost
		}
		return nil
	})
	switch {
	case errors.Is(err, idem.ErrLeaseLost):
		return idem.ErrLeaseLost
	case err != nil:
		return fmt.Errorf("idempgsql: save recovery point: %w", err)
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
	return s.atPoints(ctx, "Store.Abandoned", "abandoned", pgsql.Abandoned, s.db.now(), limit)
}

// InFlightAtPoints lists up to limit keys in flight with a recovery
// point, whether their holder's lease has ended or not (Abandoned lists
// those whose lease has), oldest lease end first: every execution past
// the database's edge whose outcome is not in the books yet, as an audit
// of those books wants them (idem reconcile). It reads through the partial
// index Abandoned uses and writes nothing. Called with a context whose
// transaction of the DB has begun, it reads in that transaction.
func (s *Store) InFlightAtPoints(ctx context.Context, limit int) ([]idem.Record, error) {
	if limit <= 0 {
		return nil, &idem.ArgumentError{Field: "limit", Reason: "must be positive"}
	}
	return s.atPoints(ctx, "Store.InFlightAtPoints", "in flight at points", pgsql.InFlightAtPoints, limit)
}

// atPoints reads the records that query (Abandoned or InFlightAtPoints)
// lists, for call, in the transaction ctx carries if it has begun; op names
// the listing in its error.
func (s *Store) atPoints(ctx context.Context, call, op, query string, args ...any) (out []idem.Record, err error) {
	err = s.db.read(ctx, call, func(ctx context.Context, q querier) error {
		rows, err := q.QueryContext(ctx, query, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		out, err = pgsql.AbandonedRecords(rows)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("idempgsql: %s: %w", op, err)
	}
	return out, nil
}

// Yield implements idem.Recoverer, and wakes the key's waiters once the
// change is committed (see wakeAfter). Called with a context that carries a
// transaction of the DB, it joins it, inside a savepoint of its own.
func (s *Store) Yield(ctx context.Context, ref idem.Ref) error {
	err := s.db.statement(ctx, "Store.Yield", func(ctx context.Context, q querier, st *txState) error {
		res, err := q.ExecContext(ctx, pgsql.Yield, string(ref.Scope), string(ref.Key), int64(ref.Token), s.db.now())
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil {
			return err
		} else if n != 1 {
			return idem.ErrLeaseLost
		}
		return s.wakeAfter(ctx, q, st, ref.Scope, ref.Key)
	})
	switch {
	case errors.Is(err, idem.ErrLeaseLost):
		return idem.ErrLeaseLost
	case err != nil:
		return fmt.Errorf("idempgsql: yield: %w", err)
	}
	return nil
}
