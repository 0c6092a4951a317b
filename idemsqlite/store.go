package idemsqlite

import (
	"context"
	"database/sql"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/headerjson"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// StoreComponent is the component under which NewStore records its schema
// migrations in idem_schema_migrations.
const StoreComponent = "idem_keys"

// StoreConfig configures NewStore. The zero value is ready to use.
type StoreConfig struct {
	// Clock tells the store the time, which decides lease and TTL expiry
	// and seeds fencing tokens. Defaults to idem.SystemClock.
	Clock idem.Clock
}

// Store is an idem.Store and idem.TxStore whose records live in the table
// idem_keys of a DB, next to the application's own tables.
type Store struct {
	db    *DB
	clock idem.Clock
}

var (
	_ idem.Store        = (*Store)(nil)
	_ idem.TxClaimer    = (*Store)(nil)
	_ idem.Replayer     = (*Store)(nil)
	_ idem.SerialWriter = (*Store)(nil)
	_ idem.Recoverer    = (*Store)(nil)
	_ idem.Restarter    = (*Store)(nil)
	_ idem.LocalClock   = (*Store)(nil)
)

// NewStore applies the store's schema migrations to db (component
// "idem_keys") and returns a Store on it. cfg may be nil.
func NewStore(ctx context.Context, db *DB, cfg *StoreConfig) (*Store, error) {
	if db == nil {
		return nil, &idem.ArgumentError{Field: "db", Reason: "must not be nil"}
	}
	var c StoreConfig
	if cfg != nil {
		c = *cfg
	}
	if c.Clock == nil {
		c.Clock = idem.SystemClock{}
	}
	sub, err := fs.Sub(migrationFiles, "migrations")
	if err != nil {
		return nil, fmt.Errorf("idemsqlite: %w", err)
	}
	if err := db.Migrate(ctx, StoreComponent, sub); err != nil {
		return nil, err
	}
	if err := db.prepare(ctx, StoreComponent); err != nil {
		return nil, err
	}
	return &Store{db: db, clock: c.Clock}, nil
}

const (
	stateInFlight  = "in_flight"
	stateCompleted = "completed"
)

// The store's statements, prepared once per DB.
var (
	sqlLoadKey = keysSQL(`SELECT ` + keyColumns + ` FROM idem_keys WHERE scope = ? AND key = ?`)
	// sqlAbandonedKeys lists the keys a Completer takes over.
	sqlAbandonedKeys = keysSQL(`SELECT scope, key, ` + keyColumns + ` FROM idem_keys
		WHERE state = 'in_flight' AND recovery_point IS NOT NULL AND lease_expires_at <= ?
		ORDER BY lease_expires_at LIMIT ?`)
	// sqlInFlightAtPoints lists the keys in flight with a point, held or
	// not.
	sqlInFlightAtPoints = keysSQL(`SELECT scope, key, ` + keyColumns + ` FROM idem_keys
		WHERE state = 'in_flight' AND recovery_point IS NOT NULL
		ORDER BY lease_expires_at LIMIT ?`)
	sqlYieldKey = keysSQL(`UPDATE idem_keys SET lease_expires_at = min(lease_expires_at, ?)
		WHERE scope = ? AND key = ? AND token = ? AND state = 'in_flight'`)
	// sqlRenewKey sets the lease end ?1 and moves the expiry out to it.
	sqlRenewKey = keysSQL(`UPDATE idem_keys SET lease_expires_at = ?1, expires_at = max(expires_at, ?1)
		WHERE scope = ?2 AND key = ?3 AND token = ?4 AND state = 'in_flight'`)
	// sqlYieldEarlier ends, at ?1, the live leases of replica ?2's keys
	// held under an incarnation other than ?3, through idem_keys_holders,
	// and returns the leases it ended.
	sqlYieldEarlier = keysSQL(`UPDATE idem_keys SET lease_expires_at = ?1
		WHERE state = 'in_flight' AND holder_replica = ?2 AND holder_incarnation <> ?3 AND lease_expires_at > ?1
		RETURNING scope, key, token`)
	sqlSaveRecovery = keysSQL(`UPDATE idem_keys SET recovery_point = ?, recovery_data = ?, recovery_saved_at = ?
		WHERE scope = ? AND key = ? AND token = ? AND state = 'in_flight'`)
	// sqlReplayKey reads what the replay of a completed key needs; the
	// caller judges its expiry.
	sqlReplayKey = keysSQL(`SELECT fingerprint = ?, status, header, body, body_omitted, expires_at
		FROM idem_keys WHERE scope = ? AND key = ? AND state = 'completed'`)
	sqlTakeOverKey = keysSQL(`UPDATE idem_keys SET token = ?, lease_expires_at = ?, holder_replica = ?, holder_incarnation = ?
		WHERE scope = ? AND key = ?`)
	// sqlInsertKey claims a key that has no record.
	sqlInsertKey = keysSQL(`INSERT INTO idem_keys
		(scope, key, fingerprint, state, token, created_at, lease_expires_at, expires_at, holder_replica, holder_incarnation)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (scope, key) DO NOTHING`)
	// An expired record is overwritten in place: its token is the floor of
	// the new one.
	sqlClaimKey = keysSQL(`INSERT INTO idem_keys
		(scope, key, fingerprint, state, token, created_at, lease_expires_at, expires_at, holder_replica, holder_incarnation)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (scope, key) DO UPDATE SET
			fingerprint = excluded.fingerprint, state = excluded.state, token = excluded.token,
			status = NULL, header = NULL, body = NULL, body_omitted = 0,
			created_at = excluded.created_at, lease_expires_at = excluded.lease_expires_at,
			expires_at = excluded.expires_at, completed_at = NULL,
			recovery_point = NULL, recovery_data = NULL, recovery_saved_at = NULL,
			holder_replica = excluded.holder_replica, holder_incarnation = excluded.holder_incarnation`)
	// sqlInsertCompletedKey writes the record of a key claimed in
	// ClaimTx's transaction, completed, once its work is done.
	sqlInsertCompletedKey = keysSQL(`INSERT INTO idem_keys
		(scope, key, fingerprint, state, token, created_at, lease_expires_at, expires_at,
			status, header, body, body_omitted, completed_at, holder_replica, holder_incarnation)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`)
	sqlCompleteKey = keysSQL(`UPDATE idem_keys
		SET state = ?, status = ?, header = ?, body = ?, body_omitted = ?, completed_at = ?
		WHERE scope = ? AND key = ? AND token = ? AND state = ?`)
	sqlKeyStateToken = keysSQL(`SELECT state, token FROM idem_keys WHERE scope = ? AND key = ?`)
	// sqlReleaseKey releases a key in flight without a recovery point;
	// sqlReleaseKeyWithPoint, with one or without.
	sqlReleaseKey          = keysSQL(`DELETE FROM idem_keys WHERE scope = ? AND key = ? AND token = ? AND state = ? AND recovery_point IS NULL`)
	sqlReleaseKeyWithPoint = keysSQL(`DELETE FROM idem_keys WHERE scope = ? AND key = ? AND token = ? AND state = ?`)
	// sqlKeyHeldWithPoint tells why a release deleted nothing: the key is
	// gone (no row), or held with a point under the token (1), or not
	// held under it (0).
	sqlKeyHeldWithPoint = keysSQL(`SELECT token = ? AND state = 'in_flight' AND recovery_point IS NOT NULL
		FROM idem_keys WHERE scope = ? AND key = ?`)
	sqlPurgeKeys = keysSQL(`DELETE FROM idem_keys WHERE (scope, key) IN (
		SELECT scope, key FROM idem_keys
		WHERE expires_at <= ? AND NOT (state = ? AND (lease_expires_at > ? OR recovery_point IS NOT NULL))
		LIMIT ?)`)
)

// keyColumns are the columns of a record, as keyRow scans them.
const keyColumns = `fingerprint, state, token, status, header, body, body_omitted,
	created_at, lease_expires_at, expires_at, completed_at,
	recovery_point, recovery_data, recovery_saved_at, holder_replica, holder_incarnation`

// keyRow is a row of idem_keys as keyColumns read it.
type keyRow struct {
	fingerprint, state           string
	token                        int64
	status, completedAt          sql.NullInt64
	header, recoveryPoint        sql.NullString
	body, recoveryData           []byte
	bodyOmitted                  bool
	createdAt, leaseEnd, expires int64
	recoverySavedAt              sql.NullInt64
	holderReplica, holderInc     sql.NullString
}

func (k *keyRow) dest() []any {
	return []any{&k.fingerprint, &k.state, &k.token, &k.status, &k.header, &k.body, &k.bodyOmitted,
		&k.createdAt, &k.leaseEnd, &k.expires, &k.completedAt,
		&k.recoveryPoint, &k.recoveryData, &k.recoverySavedAt, &k.holderReplica, &k.holderInc}
}

// holderArgs are h as the columns holder_replica and holder_incarnation
// keep it: NULL for an anonymous holder.
func holderArgs(h idem.Holder) (replica, incarnation sql.NullString) {
	if h.IsZero() {
		return sql.NullString{}, sql.NullString{}
	}
	return sql.NullString{String: h.Replica, Valid: true}, sql.NullString{String: h.Incarnation, Valid: true}
}

// load reads the record of scope and key, expired or not.
func load(ctx context.Context, r runner, scope idem.Scope, key idem.Key) (idem.Record, bool, error) {
	var k keyRow
	err := r.queryRow(ctx, sqlLoadKey, string(scope), string(key)).Scan(k.dest()...)
	if errors.Is(err, sql.ErrNoRows) {
		return idem.Record{}, false, nil
	}
	if err != nil {
		return idem.Record{}, false, err
	}
	rec, err := k.record(scope, key)
	return rec, err == nil, err
}

// record is the row as an idem.Record of scope and key.
func (k *keyRow) record(scope idem.Scope, key idem.Key) (idem.Record, error) {
	rec := idem.Record{
		Scope:          scope,
		Key:            key,
		Fingerprint:    idem.Fingerprint(k.fingerprint),
		Token:          idem.Token(k.token),
		CreatedAt:      fromNanos(k.createdAt),
		LeaseExpiresAt: fromNanos(k.leaseEnd),
		ExpiresAt:      fromNanos(k.expires),
		Holder:         idem.Holder{Replica: k.holderReplica.String, Incarnation: k.holderInc.String},
	}
	if k.recoveryPoint.Valid {
		rec.Recovery = idem.RecoveryPoint{Name: k.recoveryPoint.String, Data: k.recoveryData, SavedAt: fromNanos(k.recoverySavedAt.Int64)}
	}
	var err error
	switch k.state {
	case stateInFlight:
		rec.State = idem.StateInFlight
	case stateCompleted:
		rec.State = idem.StateCompleted
		resp := &idem.Response{Status: int(k.status.Int64), Body: k.body, BodyOmitted: k.bodyOmitted}
		if k.header.Valid {
			if resp.Header, err = headerjson.Decode([]byte(k.header.String)); err != nil {
				return idem.Record{}, fmt.Errorf("stored header of %q: %w", key, err)
			}
		}
		rec.Response = resp
		rec.CompletedAt = fromNanos(k.completedAt.Int64)
	default:
		return idem.Record{}, fmt.Errorf("stored state %q of %q is unknown", k.state, key)
	}
	return rec, nil
}

func fromNanos(n int64) time.Time { return time.Unix(0, n).UTC() }

// live reports whether a record still counts at now: its TTL has not passed,
// or a live lease still holds it (a takeover may push the lease past the
// TTL, and the holder must not lose the key to a newcomer meanwhile), or it
// is in flight with a recovery point (see idem.Recoverer).
func live(r idem.Record, now time.Time) bool {
	return now.Before(r.ExpiresAt) || leaseLive(r, now) ||
		(r.State == idem.StateInFlight && !r.Recovery.IsZero())
}

func leaseLive(r idem.Record, now time.Time) bool {
	return r.State == idem.StateInFlight && now.Before(r.LeaseExpiresAt)
}

// nextToken returns a token greater than prev (the record's, if there is
// one) and, after a purge, greater than the purged one as long as the clock
// did not step back by more than a TTL.
func nextToken(prev idem.Token, now time.Time) idem.Token {
	return max(prev+1, idem.Token(now.UnixNano()))
}

// Claim implements idem.Store. It is one write transaction on the writer
// connection, which makes its read and its write atomic; it commits
// unsynced, or with the group commit open when it reaches the writer (see
// the package documentation, "Group commit"). A claim that acquires the
// key in a group returns with its whole lease left, counted from when it
// returns, less at most a hundredth of it (see fullLease). A claim whose context ends
// while it waits in a group is rolled back on its own, and returns the
// context's error.
//
// Called with a context that carries a transaction of the DB (WithTx), it
// joins it, and the claim commits or rolls back with that transaction; its
// lease then counts from the claim's statement, whenever that transaction
// commits.
func (s *Store) Claim(ctx context.Context, req idem.ClaimRequest) (idem.Claim, error) {
	if err := req.Validate(); err != nil {
		return idem.Claim{}, err
	}
	carried := s.db.carried(ctx) != nil
	if !carried && !req.Unseen {
		if claim, answered, err := s.answerFromReader(ctx, req); err != nil || answered {
			return claim, err
		}
	}
	var (
		claim   idem.Claim
		grouped bool
	)
	err := s.db.withClaimTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		grouped = s.db.carried(ctx).group != nil
		var err error
		claim, err = s.claimIn(ctx, s.db.in(tx), req)
		return err
	})
	if err != nil {
		return idem.Claim{}, fmt.Errorf("idemsqlite: claim: %w", err)
	}
	if claim.Outcome == idem.Acquired && grouped && !carried {
		return s.fullLease(ctx, req, claim)
	}
	return claim, nil
}

// fullLease gives claim, which acquired the key in a group, its whole lease
// back when it spent more than a hundredth of it waiting for its commit: a
// claim that joins a group commit reads the time when its turn comes, and then
// waits for every member behind it in the group, one of which may hold the
// writer as long as its handler runs. Without it, the claim would return
// with part of its lease, or all of it, gone, and a duplicate could take
// the key over while the first execution runs. The lease is renewed (see
// Renew, which waits for no group, nor for the writer) from the time the
// renewal is asked for. When the claim's lease ended meanwhile and another
// claimant took the key over, fullLease answers as the key now is
// (in flight under the other holder, or completed).
func (s *Store) fullLease(ctx context.Context, req idem.ClaimRequest, claim idem.Claim) (idem.Claim, error) {
	// On the wall clock, as the stored end is judged (no monotonic reading).
	start := claim.Record.LeaseExpiresAt.Round(0).Add(-req.Lease)
	if s.clock.Now().Sub(start) <= req.Lease/100 {
		return claim, nil
	}
	end, err := s.Renew(ctx, idem.Ref{Scope: req.Scope, Key: req.Key, Token: claim.Token}, req.Lease)
	switch {
	case err == nil:
		claim.Record.LeaseExpiresAt = end
		if claim.Record.ExpiresAt.Before(end) {
			claim.Record.ExpiresAt = end
		}
		return claim, nil
	case errors.Is(err, idem.ErrLeaseLost):
		if answer, answered, rerr := s.answerFromReader(ctx, req); rerr == nil && answered {
			return answer, nil
		}
		return idem.Claim{}, errors.New("idemsqlite: claim: the claim's lease ended while it waited for its commit and another took the key over; claim again")
	}
	// The claim stands, with its lease as it was: the caller must not run
	// the effect, and its retry sees the key in flight until that lease
	// ends (the contract's ambiguous failure).
	return idem.Claim{}, fmt.Errorf("idemsqlite: claim: renewing the lease after the claim's commit: %w", err)
}

// answerFromReader answers, from the read pool, the claims that find a
// record and only read it: a replay, a duplicate of a request in flight, a
// mismatch. They neither queue for the single writer nor wait behind a slow
// same-transaction execution holding it. Only a claim that may write (a
// free, expired or taken-over key) goes to the writer, which re-reads the
// record there: exactly one claimant still wins.
func (s *Store) answerFromReader(ctx context.Context, req idem.ClaimRequest) (claim idem.Claim, answered bool, err error) {
	rec, found, err := load(ctx, s.db.onReader(), req.Scope, req.Key)
	if err != nil {
		return idem.Claim{}, true, fmt.Errorf("idemsqlite: claim: %w", err)
	}
	if found {
		// A renewal queued behind the writer that shortened the key's
		// lease counts here as on the writer: the key is not answered in
		// flight past that renewal's end (the claim goes to the writer,
		// which decides), nor with an end it will not have. One that
		// moved the end out is left to the writer, which writes it before
		// it answers: read here, the committed end only answers in flight
		// sooner. A renewal written since the load is no longer queued,
		// and the record as loaded is answered, as before that renewal.
		if q := s.withQueuedRenewal(rec); q.LeaseExpiresAt.Before(rec.LeaseExpiresAt) {
			rec = q
		}
	}
	if now := s.clock.Now(); found && live(rec, now) {
		switch {
		case rec.Fingerprint != req.Fingerprint:
			return idem.Claim{Outcome: idem.Mismatch, Record: rec}, true, nil
		case rec.State == idem.StateCompleted:
			return idem.Claim{Outcome: idem.Completed, Record: rec}, true, nil
		case leaseLive(rec, now):
			return idem.Claim{Outcome: idem.InFlight, Record: rec}, true, nil
		}
	}
	return idem.Claim{}, false, nil
}

// withQueuedRenewal returns rec, read from the database, as the renewals
// of its lease queued behind the writer leave it once written (see
// renewal): their end, the last one asked for, replaces the key's, sooner
// too (a renewal with a shorter lease). One to the lease end the key has
// still moves its expiry out to that end when written (a takeover late in
// the TTL leaves a lease that outlasts the expiry). Claims on the writer
// and those answered from the read pool decide by it alike.
func (s *Store) withQueuedRenewal(rec idem.Record) idem.Record {
	if rec.State != idem.StateInFlight {
		return rec
	}
	if end := s.db.queue.pendingLeaseEnd(idem.Ref{Scope: rec.Scope, Key: rec.Key, Token: rec.Token}); end != 0 {
		rec.LeaseExpiresAt = fromNanos(end)
		if rec.ExpiresAt.Before(rec.LeaseExpiresAt) {
			rec.ExpiresAt = rec.LeaseExpiresAt
		}
	}
	return rec
}

// claimIn claims req with r, which runs on the writer: it reads the record
// and writes the claim, if it acquires the key.
func (s *Store) claimIn(ctx context.Context, r runner, req idem.ClaimRequest) (idem.Claim, error) {
	// The time is read once the writer is ours, so a claim that queued
	// behind others judges leases by when it runs.
	now := s.clock.Now()
	// A new key, the common case, is claimed by one INSERT that finds no
	// row in its way; only a key that exists is read and decided on.
	fresh := freshRecord(req, now)
	hr, hi := holderArgs(req.Holder)
	res, err := r.exec(ctx, sqlInsertKey, string(fresh.Scope), string(fresh.Key), string(fresh.Fingerprint), stateInFlight, int64(fresh.Token),
		fresh.CreatedAt.UnixNano(), fresh.LeaseExpiresAt.UnixNano(), fresh.ExpiresAt.UnixNano(), hr, hi)
	if err != nil {
		return idem.Claim{}, err
	}
	if n, err := res.RowsAffected(); err != nil {
		return idem.Claim{}, err
	} else if n == 1 {
		return idem.Claim{Outcome: idem.Acquired, Token: fresh.Token, Record: fresh}, nil
	}
	rec, found, err := load(ctx, r, req.Scope, req.Key)
	if err != nil {
		return idem.Claim{}, err
	}
	return s.claimFound(ctx, r, req, fresh, rec, found, now)
}

// freshRecord is the record a claim of req made at now writes for a key
// that has none.
func freshRecord(req idem.ClaimRequest, now time.Time) idem.Record {
	return idem.Record{
		Scope:          req.Scope,
		Key:            req.Key,
		Fingerprint:    req.Fingerprint,
		State:          idem.StateInFlight,
		Token:          nextToken(0, now),
		CreatedAt:      now,
		LeaseExpiresAt: now.Add(req.Lease),
		ExpiresAt:      now.Add(req.TTL),
		Holder:         req.Holder,
	}
}

// claimFound decides the claim of req on the writer, given the key's
// record as load found it (found false: none), and writes the claim when it
// acquires the key. fresh is the record a claim of an absent key writes.
func (s *Store) claimFound(ctx context.Context, r runner, req idem.ClaimRequest, fresh, rec idem.Record, found bool, now time.Time) (idem.Claim, error) {
	if found {
		// now was read after the renewals it honours were queued.
		rec = s.withQueuedRenewal(rec)
	}
	if found && live(rec, now) {
		switch {
		case rec.Fingerprint != req.Fingerprint:
			return idem.Claim{Outcome: idem.Mismatch, Record: rec}, nil
		case rec.State == idem.StateCompleted:
			return idem.Claim{Outcome: idem.Completed, Record: rec}, nil
		case leaseLive(rec, now):
			return idem.Claim{Outcome: idem.InFlight, Record: rec}, nil
		}
		rec.Token = nextToken(rec.Token, now)
		rec.LeaseExpiresAt = now.Add(req.Lease)
		rec.Holder = req.Holder
		hr, hi := holderArgs(req.Holder)
		if _, err := r.exec(ctx, sqlTakeOverKey, int64(rec.Token), rec.LeaseExpiresAt.UnixNano(), hr, hi, string(req.Scope), string(req.Key)); err != nil {
			return idem.Claim{}, err
		}
		return idem.Claim{Outcome: idem.Acquired, Token: rec.Token, Record: rec, TookOver: true}, nil
	}
	// No live record: the key's is expired (or gone since the INSERT
	// looked) and is overwritten, its token the floor of the new one.
	if found {
		fresh.Token = nextToken(rec.Token, now)
	}
	hr, hi := holderArgs(req.Holder)
	if _, err := r.exec(ctx, sqlClaimKey, string(fresh.Scope), string(fresh.Key), string(fresh.Fingerprint), stateInFlight, int64(fresh.Token),
		fresh.CreatedAt.UnixNano(), fresh.LeaseExpiresAt.UnixNano(), fresh.ExpiresAt.UnixNano(), hr, hi); err != nil {
		return idem.Claim{}, err
	}
	return idem.Claim{Outcome: idem.Acquired, Token: fresh.Token, Record: fresh}, nil
}

// WritesSerially implements idem.SerialWriter: it is true, as every write
// transaction of a DB runs on its single writer connection. So idemhttp
// claims a key with Claim, a short write, and runs the handler in
// CompleteTx, whose transaction takes the writer at the handler's first
// write, rather than in ClaimTx, which would hold the writer from the claim
// on, through whatever the handler does before it writes.
func (s *Store) WritesSerially() bool { return true }

// LeaseClock implements idem.LocalClock: the store decides leases by
// StoreConfig.Clock, read when a claim's turn on the writer comes (see
// Claim) and when a renewal is asked for (see Renew).
func (s *Store) LeaseClock() idem.Clock { return s.clock }

// ClaimTx implements idem.TxClaimer: the claim, work's writes and the
// completion are one write transaction, one synced commit, where Claim
// and CompleteTx take two. A new key's record is written once, completed,
// with work's writes (see claimTxIn). No other connection sees the key in flight: a
// crash, a failed or unkept work, or a panic rolls the claim back with the
// rest, leaving the key free at once.
//
// A claim that only reads (a replay, a mismatch, a duplicate of a key that
// Claim holds in flight) is answered from the read pool, as Claim's is,
// unless the request is Unseen (most likely a new key: the read would
// find nothing, and costs a first execution some 5%). Otherwise the transaction takes the single writer, and so waits for any
// transaction holding it, another ClaimTx's included, whose key it then
// finds completed or free: in this process the idemhttp middleware holds a
// key's duplicates at its gate instead, so wait only bounds the read; a
// duplicate in another process waits for the database's write lock, up to
// Config.BusyTimeout, and fails with SQLITE_BUSY after it, without having
// run anything. Returns ErrNestedCompleteTx when ctx already carries a
// transaction of the same DB.
//
// The transaction holds the DB's single writer from the claim to the
// commit, whatever work does meanwhile: every other write of the process
// waits for all of it. Use ClaimTx for work that writes at once; for work
// that may wait on something first, Claim and CompleteTx hold the writer
// only while they write (see WritesSerially).
func (s *Store) ClaimTx(ctx context.Context, req idem.ClaimRequest, wait time.Duration, work idem.ClaimedWork) (idem.Claim, bool, error) {
	if err := req.Validate(); err != nil {
		return idem.Claim{}, false, err
	}
	if work == nil {
		return idem.Claim{}, false, &idem.ArgumentError{Field: "work", Reason: "must not be nil"}
	}
	if s.db.carried(ctx) != nil {
		return idem.Claim{}, false, ErrNestedCompleteTx
	}
	if !req.Unseen {
		if claim, answered, err := s.answerFromReader(ctx, req); err != nil || answered {
			return claim, false, err
		}
	}
	st, txCtx := s.db.newTx(ctx)
	defer st.end(false)
	tx, err := st.begin()
	if err != nil {
		return idem.Claim{}, false, fmt.Errorf("idemsqlite: claim: begin: %w", err)
	}
	sctx := st.stmtContext(ctx)
	claim, absent, err := s.claimTxIn(sctx, s.db.in(tx), req)
	if err != nil {
		return idem.Claim{}, false, fmt.Errorf("idemsqlite: claim: %w", st.fail(err))
	}
	if claim.Outcome != idem.Acquired {
		// The answer may come from a transaction of the group not yet
		// committed: it stands once the group has.
		if err := st.end(false); err != nil {
			return idem.Claim{}, false, fmt.Errorf("idemsqlite: claim: %w", err)
		}
		return claim, false, nil
	}
	resp, keep, err := work(txCtx, claim)
	if err != nil || !keep {
		if gerr := st.end(false); gerr != nil {
			return claim, false, fmt.Errorf("idemsqlite: claim: commit: %w", gerr)
		}
		return claim, false, err
	}
	if tx = st.begun(); tx == nil {
		return claim, false, fmt.Errorf("idemsqlite: complete: %w", errTxEnded)
	}
	if absent {
		err = s.insertCompleted(sctx, tx, claim.Record, resp)
	} else {
		_, err = s.complete(sctx, tx, idem.Ref{Scope: req.Scope, Key: req.Key, Token: claim.Token}, resp)
	}
	if err != nil {
		return claim, false, fmt.Errorf("idemsqlite: complete: %w", st.fail(err))
	}
	if err := st.finish(); err != nil {
		return claim, false, fmt.Errorf("idemsqlite: complete: %w", err)
	}
	return claim, true, nil
}

// claimTxIn is ClaimTx's claim, on the writer: the key is read first, and
// an absent key is claimed without a write (absent): the transaction holds
// the writer, so nobody else can claim the key before it ends, and the
// record is written once, completed, with the work's writes
// (insertCompleted), where a claim written first would be updated at the
// end. A key that exists is claimed as Claim claims it.
func (s *Store) claimTxIn(ctx context.Context, r runner, req idem.ClaimRequest) (claim idem.Claim, absent bool, err error) {
	now := s.clock.Now()
	rec, found, err := load(ctx, r, req.Scope, req.Key)
	if err != nil {
		return idem.Claim{}, false, err
	}
	fresh := freshRecord(req, now)
	if !found {
		return idem.Claim{Outcome: idem.Acquired, Token: fresh.Token, Record: fresh}, true, nil
	}
	claim, err = s.claimFound(ctx, r, req, fresh, rec, found, now)
	return claim, false, err
}

// insertCompleted writes rec, claimed by claimTxIn without a write,
// completed with resp, in tx.
func (s *Store) insertCompleted(ctx context.Context, tx *sql.Tx, rec idem.Record, resp idem.Response) error {
	header, err := headerText(resp.Header)
	if err != nil {
		return err
	}
	hr, hi := holderArgs(rec.Holder)
	_, err = s.db.in(tx).exec(ctx, sqlInsertCompletedKey, string(rec.Scope), string(rec.Key), string(rec.Fingerprint),
		stateCompleted, int64(rec.Token), rec.CreatedAt.UnixNano(), rec.LeaseExpiresAt.UnixNano(), rec.ExpiresAt.UnixNano(),
		resp.Status, header, resp.Body, resp.BodyOmitted, s.clock.Now().UnixNano(), hr, hi)
	return err
}

// headerText is a response header as the column header keeps it: NULL
// unless there is a header.
func headerText(h http.Header) (sql.NullString, error) {
	if h == nil {
		return sql.NullString{}, nil
	}
	b, err := json.Marshal(h)
	if err != nil {
		return sql.NullString{}, fmt.Errorf("encoding the header: %w", err)
	}
	return sql.NullString{String: string(b), Valid: true}, nil
}

// complete marks ref's record completed with resp, in tx. already reports
// that the same token had completed it before, in which case nothing was
// written.
func (s *Store) complete(ctx context.Context, tx *sql.Tx, ref idem.Ref, resp idem.Response) (already bool, err error) {
	header, err := headerText(resp.Header)
	if err != nil {
		return false, err
	}
	r := s.db.in(tx)
	res, err := r.exec(ctx, sqlCompleteKey, stateCompleted, resp.Status, header, resp.Body, resp.BodyOmitted, s.clock.Now().UnixNano(),
		string(ref.Scope), string(ref.Key), int64(ref.Token), stateInFlight)
	if err != nil {
		return false, err
	}
	if n, err := res.RowsAffected(); err != nil {
		return false, err
	} else if n == 1 {
		return false, nil
	}
	var (
		state string
		token int64
	)
	err = r.queryRow(ctx, sqlKeyStateToken, string(ref.Scope), string(ref.Key)).Scan(&state, &token)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return false, idem.ErrLeaseLost
	case err != nil:
		return false, err
	case idem.Token(token) == ref.Token && state == stateCompleted:
		return true, nil
	}
	return false, idem.ErrLeaseLost
}

// Complete implements idem.Store. It does not look at the lease: a holder
// whose lease ended but whom nobody took over still owns the key. Called
// with a context that carries a transaction of the DB, it joins it.
func (s *Store) Complete(ctx context.Context, ref idem.Ref, resp idem.Response) error {
	err := s.db.withTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		_, err := s.complete(ctx, tx, ref, resp)
		return err
	})
	if err != nil {
		return fmt.Errorf("idemsqlite: complete: %w", err)
	}
	return nil
}

// Release implements idem.Store. It refuses a key with a recovery point
// (idem.ErrHasRecoveryPoint): see ReleaseWithPoint. Called with a context
// that carries a transaction of the DB, it joins it.
func (s *Store) Release(ctx context.Context, ref idem.Ref) error {
	return s.release(ctx, ref, sqlReleaseKey)
}

// ReleaseWithPoint implements idem.Recoverer. Called with a context that
// carries a transaction of the DB, it joins it.
func (s *Store) ReleaseWithPoint(ctx context.Context, ref idem.Ref) error {
	return s.release(ctx, ref, sqlReleaseKeyWithPoint)
}

func (s *Store) release(ctx context.Context, ref idem.Ref, stmt *statement) error {
	err := s.db.withTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		r := s.db.in(tx)
		res, err := r.exec(ctx, stmt, string(ref.Scope), string(ref.Key), int64(ref.Token), stateInFlight)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil || n == 1 {
			return err
		}
		var withPoint bool
		err = r.queryRow(ctx, sqlKeyHeldWithPoint, int64(ref.Token), string(ref.Scope), string(ref.Key)).Scan(&withPoint)
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
	if err != nil {
		return fmt.Errorf("idemsqlite: release: %w", err)
	}
	return nil
}

// Renew implements idem.Store. Like Complete, it does not look at the
// lease: a holder whose lease ended but whom nobody took over renews it.
// The new lease counts from when Renew is called.
//
// On its own it never waits for the writer's turn to be handed over. With
// the writer free, it is one short write transaction that commits without
// a sync, and joins no group commit (see the package documentation): a
// renewal that a power failure loses was made by a process that died with
// it, and holds nothing any more. With the writer held (by a transaction
// that may hold it as long as its handler runs, the renewing execution's
// own included), the renewal is queued: every claim of this process
// decides as if it were written, and it is written as the writer is next
// handed over, ahead of whoever is next in line (see renewal). Renew then
// returns at once, the renewal as made, unless the key's committed record
// already shows it taken over or completed (idem.ErrLeaseLost).
// A process that shares the file sees a queued renewal only once it is
// written: before then it cannot write, and so claim, while the writer's
// holder has written (which keeps the database's write lock), but can
// while the holder has only read.
//
// Called with a context that carries a transaction of the DB, it joins
// it, and counts only once that transaction commits: renew with a context
// of its own.
func (s *Store) Renew(ctx context.Context, ref idem.Ref, lease time.Duration) (time.Time, error) {
	if lease <= 0 {
		return time.Time{}, &idem.ArgumentError{Field: "lease", Reason: "must be positive"}
	}
	if s.db.carried(ctx) != nil {
		var end time.Time
		err := s.db.withUnsyncedTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
			end = s.clock.Now().Add(lease)
			return s.fencedUpdateIn(ctx, tx, sqlRenewKey, end.UnixNano(), string(ref.Scope), string(ref.Key), int64(ref.Token))
		})
		if err != nil {
			return time.Time{}, fmt.Errorf("idemsqlite: renew: %w", err)
		}
		return end, nil
	}
	if err := ctx.Err(); err != nil {
		return time.Time{}, fmt.Errorf("idemsqlite: renew: %w", err)
	}
	r, queued := s.db.queue.queueRenewal(ref, lease, s.clock.Now)
	end := fromNanos(r.end)
	if !queued {
		// The turn is ours: unsyncedTxHeld ends it.
		err := s.db.unsyncedTxHeld(ctx, false, func(ctx context.Context, tx *sql.Tx) error {
			return renewIn(ctx, s.db.in(tx), r)
		})
		if err != nil {
			return time.Time{}, fmt.Errorf("idemsqlite: renew: %w", err)
		}
		return end, nil
	}
	// Queued, so honoured from now on: Renew does not wait for the write,
	// which may come only when a handler holding the writer ends, but
	// tells a lease already lost when the key's committed record shows
	// it taken over or completed.
	s.db.queue.leave(r)
	rec, found, err := load(ctx, s.db.onReader(), ref.Scope, ref.Key)
	if err == nil && found && (rec.Token != ref.Token || rec.State != idem.StateInFlight) {
		return time.Time{}, fmt.Errorf("idemsqlite: renew: %w", idem.ErrLeaseLost)
	}
	return end, nil
}

// YieldEarlier implements idem.Restarter: one synced write transaction,
// through an index that holds only the keys in flight under a named
// holder. As Yield does, it drops the renewals of the leases it ends that
// are queued behind the writer (see Renew), so that none gives such a key
// a live lease again once written. Called with a context that carries a
// transaction of the DB, it joins it.
func (s *Store) YieldEarlier(ctx context.Context, current idem.Holder) (int, error) {
	if current.IsZero() {
		return 0, &idem.ArgumentError{Field: "current", Reason: "must name a replica and its incarnation"}
	}
	if err := current.Validate(); err != nil {
		return 0, err
	}
	var n int
	err := s.db.withTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		n = 0
		rows, err := s.db.in(tx).query(ctx, sqlYieldEarlier, s.clock.Now().UnixNano(), current.Replica, current.Incarnation)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var scope, key string
			var token int64
			if err := rows.Scan(&scope, &key, &token); err != nil {
				return err
			}
			// The writer's turn is held: no queued renewal of a lease
			// ended here is written after it (see Yield).
			s.db.queue.dropRenewals(idem.Ref{Scope: idem.Scope(scope), Key: idem.Key(key), Token: idem.Token(token)})
			n++
		}
		return rows.Err()
	})
	if err != nil {
		return 0, fmt.Errorf("idemsqlite: yield earlier: %w", err)
	}
	return n, nil
}

// Get implements idem.Store. It reads on a reader connection, so it never
// waits for the writer; called with a context whose transaction of the DB
// has begun, it reads in that transaction and sees its writes.
func (s *Store) Get(ctx context.Context, scope idem.Scope, key idem.Key) (idem.Record, error) {
	r := s.reader(ctx)
	rec, found, err := load(ctx, r, scope, key)
	if err != nil {
		return idem.Record{}, fmt.Errorf("idemsqlite: get: %w", err)
	}
	if !found || !live(rec, s.clock.Now()) {
		return idem.Record{}, idem.ErrNotFound
	}
	return rec, nil
}

// reader is what Get and Replay read on: the transaction ctx carries when
// it has begun, so that they see its writes, or else the read pool.
func (s *Store) reader(ctx context.Context) runner {
	if st := s.db.carried(ctx); st != nil {
		if tx := st.begun(); tx != nil {
			return s.db.in(tx)
		}
	}
	return s.db.onReader()
}

// Replay implements idem.Replayer: one read of six columns on a reader
// connection, where Get reads eleven and turns them into a Record. Called
// with a context whose transaction of the DB has begun, it reads in that
// transaction.
func (s *Store) Replay(ctx context.Context, scope idem.Scope, key idem.Key, fp idem.Fingerprint) (*idem.Response, bool, error) {
	r := s.reader(ctx)
	var (
		same    bool
		status  sql.NullInt64
		header  sql.NullString
		expires int64
		resp    idem.Response
	)
	err := r.queryRow(ctx, sqlReplayKey, string(fp), string(scope), string(key)).
		Scan(&same, &status, &header, &resp.Body, &resp.BodyOmitted, &expires)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return nil, false, nil
	case err != nil:
		return nil, false, fmt.Errorf("idemsqlite: replay: %w", err)
	case !s.clock.Now().Before(fromNanos(expires)):
		return nil, false, nil // expired: the claim decides
	case !same:
		return nil, true, nil
	}
	resp.Status = int(status.Int64)
	if header.Valid {
		if resp.Header, err = headerjson.Decode([]byte(header.String)); err != nil {
			return nil, false, fmt.Errorf("idemsqlite: replay: stored header of %q: %w", key, err)
		}
	}
	return &resp, false, nil
}

// Purge implements idem.Store. limit must be positive. Each call is one
// short write transaction, deleting by primary key the records a limited
// subquery finds through the expires_at index.
func (s *Store) Purge(ctx context.Context, limit int) (int, error) {
	if limit <= 0 {
		return 0, &idem.ArgumentError{Field: "limit", Reason: "must be positive"}
	}
	var n int64
	err := s.db.withTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		now := s.clock.Now().UnixNano()
		res, err := s.db.in(tx).exec(ctx, sqlPurgeKeys, now, stateInFlight, now, limit)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("idemsqlite: purge: %w", err)
	}
	return int(n), nil
}

// CompleteTx implements idem.TxStore.
//
// work receives a context carrying a transaction of the DB that has not
// begun yet: it begins on the writer connection when work first calls
// WithTx (or another Store method) with that context, or for the
// completion. A handler that waits on something before it writes therefore
// does not hold the single writer meanwhile. work reaches the transaction
// with db.WithTx(ctx, ...), whose fn joins it.
//
// When work returns keep=true and no error, the record is completed in the
// same transaction, which then commits: the work's writes and the key's
// completion are durable together or not at all. When work returns
// keep=false or an error, when the completion is refused (ErrLeaseLost), or
// when work panics (the panic goes on), the transaction is rolled back; so
// it is when ctx ends before the commit, and CompleteTx returns ctx's
// error. Every outcome, a refusal included, is returned once the group the
// transaction committed with (see the package documentation) has
// committed or failed; when the group failed, CompleteTx returns an error
// that says "commit".
//
// A second CompleteTx with a token that already completed the key returns
// true and rolls back what work wrote this time: the first execution's
// effect is the one that counts, so it is not applied twice.
//
// Returns ErrNestedCompleteTx when ctx already carries a transaction of the
// same DB.
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
		if gerr := st.end(false); gerr != nil {
			return false, fmt.Errorf("idemsqlite: complete: commit: %w", gerr)
		}
		return false, err
	}
	tx, err := st.begin()
	if err != nil {
		return false, fmt.Errorf("idemsqlite: complete: begin: %w", err)
	}
	already, err := s.complete(st.stmtContext(ctx), tx, ref, resp)
	if err != nil {
		// Returned once the group's fate is known: a refusal may rest on
		// a takeover before it in the group, which counts only if the
		// group commits.
		return false, fmt.Errorf("idemsqlite: complete: %w", st.fail(err))
	}
	if already {
		if err := st.end(false); err != nil {
			return false, fmt.Errorf("idemsqlite: complete: commit: %w", err)
		}
		return true, nil
	}
	if err := st.finish(); err != nil {
		return false, fmt.Errorf("idemsqlite: complete: %w", err)
	}
	return true, nil
}

// SaveRecovery implements idem.Recoverer. Called with a context that
// carries a transaction of the DB (WithTx, CompleteTx), it writes in it, so
// the point commits or rolls back with the phase's writes; otherwise it is
// one short write transaction of its own.
func (s *Store) SaveRecovery(ctx context.Context, ref idem.Ref, rp idem.RecoveryPoint) error {
	if err := rp.Validate(); err != nil {
		return err
	}
	data := rp.Data
	if data == nil {
		data = []byte{}
	}
	err := s.fencedUpdate(ctx, sqlSaveRecovery, rp.Name, data, s.clock.Now().UnixNano(), string(ref.Scope), string(ref.Key), int64(ref.Token))
	if err != nil {
		return fmt.Errorf("idemsqlite: save recovery point: %w", err)
	}
	return nil
}

// fencedUpdate runs stmt, which changes the row of a key its token holds
// in flight, in the transaction ctx carries or in one of its own, and
// returns idem.ErrLeaseLost when it changed no row.
func (s *Store) fencedUpdate(ctx context.Context, stmt *statement, args ...any) error {
	return s.db.withTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		return s.fencedUpdateIn(ctx, tx, stmt, args...)
	})
}

// fencedUpdateIn is fencedUpdate's statement, in tx.
func (s *Store) fencedUpdateIn(ctx context.Context, tx *sql.Tx, stmt *statement, args ...any) error {
	res, err := s.db.in(tx).exec(ctx, stmt, args...)
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil || n == 1 {
		return err
	}
	return idem.ErrLeaseLost
}

// Yield implements idem.Recoverer. Called with a context that carries a
// transaction of the DB, it joins it.
func (s *Store) Yield(ctx context.Context, ref idem.Ref) error {
	err := s.db.withTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		// The writer's turn is held: no queued renewal of the lease is
		// written after the yield.
		s.db.queue.dropRenewals(ref)
		return s.fencedUpdateIn(ctx, tx, sqlYieldKey, s.clock.Now().UnixNano(), string(ref.Scope), string(ref.Key), int64(ref.Token))
	})
	if err != nil {
		return fmt.Errorf("idemsqlite: yield: %w", err)
	}
	return nil
}

// Abandoned implements idem.Recoverer. It reads on a reader connection,
// through an index that holds only the keys in flight with a point.
func (s *Store) Abandoned(ctx context.Context, limit int) ([]idem.Record, error) {
	if limit <= 0 {
		return nil, &idem.ArgumentError{Field: "limit", Reason: "must be positive"}
	}
	rows, err := s.reader(ctx).query(ctx, sqlAbandonedKeys, s.clock.Now().UnixNano(), limit)
	if err != nil {
		return nil, fmt.Errorf("idemsqlite: abandoned: %w", err)
	}
	return scanAtPoints(rows, "abandoned")
}

// InFlightAtPoints lists up to limit keys in flight with a recovery
// point, whether their holder's lease has ended or not (Abandoned lists
// those whose lease has), oldest lease end first: every execution past
// the database's edge whose outcome is not in the books yet, as an audit
// of those books wants them (idem reconcile). It reads on a reader
// connection, through the index Abandoned uses; it writes nothing.
func (s *Store) InFlightAtPoints(ctx context.Context, limit int) ([]idem.Record, error) {
	if limit <= 0 {
		return nil, &idem.ArgumentError{Field: "limit", Reason: "must be positive"}
	}
	rows, err := s.reader(ctx).query(ctx, sqlInFlightAtPoints, limit)
	if err != nil {
		return nil, fmt.Errorf("idemsqlite: in flight at points: %w", err)
	}
	return scanAtPoints(rows, "in flight at points")
}

// scanAtPoints reads the records of Abandoned or InFlightAtPoints (op).
func scanAtPoints(rows *sql.Rows, op string) ([]idem.Record, error) {
	defer rows.Close()
	var out []idem.Record
	for rows.Next() {
		var scope, key string
		var k keyRow
		if err := rows.Scan(append([]any{&scope, &key}, k.dest()...)...); err != nil {
			return nil, fmt.Errorf("idemsqlite: %s: %w", op, err)
		}
		rec, err := k.record(idem.Scope(scope), idem.Key(key))
		if err != nil {
			return nil, fmt.Errorf("idemsqlite: %s: %w", op, err)
		}
		out = append(out, rec)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("idemsqlite: %s: %w", op, err)
	}
	return out, nil
}
