package pgsql

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/headerjson"
)

// The states of a row of idem_keys.
const (
	StateInFlight  = "in_flight"
	StateCompleted = "completed"
)

// InsertClaim claims a new key, the common case, without entering
// plpgsql: it returns the new row's token and times, or no row when the key
// exists (ON CONFLICT waited for any concurrent inserter and found its row
// committed), and then idem_claim decides (Claim).
//
// $7 turns synchronous_commit off for the rest of the transaction (see
// idempg's Store.Claim); CASE calls set_config only when it is set. $8 and
// $9 are the claimant's holder (HolderArgs).
//
// It first takes the key's lock (see idem_key_lock), waiting for a ClaimTx that
// holds the key without a row to end, and reads the time after the wait.
const InsertClaim = `WITH l AS MATERIALIZED (SELECT pg_advisory_xact_lock(idem_key_lock($1::text, $2::text))),
n AS MATERIALIZED (
	SELECT coalesce($6::timestamptz, clock_timestamp()) AS t,
		CASE WHEN $7::boolean THEN set_config('synchronous_commit', 'off', true) END AS async FROM l)
INSERT INTO idem_keys AS k (scope, key, fingerprint, state, token, created_at, lease_expires_at, expires_at,
	holder_replica, holder_incarnation)
SELECT $1::text, $2::text, $3::text, 'in_flight', idem_clock_us(), n.t,
	n.t + $4::bigint * interval '1 microsecond', n.t + $5::bigint * interval '1 microsecond', $8::text, $9::text
FROM n
ON CONFLICT (scope, key) DO NOTHING
RETURNING k.token, k.created_at, k.lease_expires_at, k.expires_at`

// Answer answers a claim of a key that exists without writing: the
// outcome and the record, as the function idem_claim would answer them, or
// a NULL outcome when the claim must write (the record expired and is
// claimed anew, or its lease ended and is taken over), which only the
// function does. It reads the newest committed row: under READ COMMITTED
// its snapshot is taken after the INSERT of InsertClaim waited for any
// concurrent inserter.
const Answer = `SELECT CASE
		WHEN NOT ` + Live + ` THEN NULL
		WHEN fingerprint <> $3 THEN 'mismatch'
		WHEN state = 'completed' THEN 'completed'
		WHEN lease_expires_at > n.t THEN 'in_flight'
	END, ` + RecordColumns + `
	FROM idem_keys, (SELECT coalesce($4::timestamptz, clock_timestamp()) AS t) AS n
	WHERE scope = $1 AND key = $2`

// Claim claims a key that exists, or answers with its record: see the
// function idem_claim. $10 and $11 are the claimant's holder (HolderArgs).
const Claim = `SELECT o_outcome, o_took_over, o_fingerprint, o_state, o_token, o_status, o_header,
	o_body, o_body_omitted, o_created_at, o_lease_expires_at, o_expires_at, o_completed_at,
	o_recovery_point, o_recovery_data, o_recovery_saved_at, o_holder_replica, o_holder_incarnation
	FROM idem_claim($1, $2, $3, $4, $5, $6::timestamptz, $7, $8, $9, $10::text, $11::text)`

// ClaimInTx claims a new key in a transaction that goes on after the
// claim, without waiting for any other: it takes the key's lock
// (idem_key_lock, a hash of the schema, the scope and the key) only if no
// other transaction holds it, and then inserts the key unless it exists.
// It returns whether it took the lock, and the new row's token and times
// when it inserted one.
//
// Every claimant that could create the key's row takes that lock first and
// holds it until its transaction ends: a claim in a transaction (this one,
// of idempg or idempgsql), idempg's ClaimTx, which holds a new key by
// the lock alone while its work runs, and a claim on its own for the
// moment of its statement. A lock held by another transaction therefore
// means that it is claiming the key, or has claimed it and not committed:
// the key is in flight. Claims on their own and ClaimTx, which may wait,
// wait for the lock; this one answers InFlight at once, so claims in
// transactions, made in any order, never deadlock. $7 and $8 are the
// claimant's holder (HolderArgs).
const ClaimInTx = `WITH l AS MATERIALIZED (SELECT pg_try_advisory_xact_lock(idem_key_lock($1::text, $2::text)) AS locked),
n AS MATERIALIZED (SELECT coalesce($6::timestamptz, clock_timestamp()) AS t FROM l WHERE l.locked),
ins AS (
	INSERT INTO idem_keys AS k (scope, key, fingerprint, state, token, created_at, lease_expires_at, expires_at,
		holder_replica, holder_incarnation)
	SELECT $1::text, $2::text, $3::text, 'in_flight', idem_clock_us(), n.t,
		n.t + $4::bigint * interval '1 microsecond', n.t + $5::bigint * interval '1 microsecond', $7::text, $8::text
	FROM n
	ON CONFLICT (scope, key) DO NOTHING
	RETURNING k.token, k.created_at, k.lease_expires_at, k.expires_at)
SELECT l.locked, ins.token, ins.created_at, ins.lease_expires_at, ins.expires_at FROM l LEFT JOIN ins ON true`

// LockRow locks the key's row for the claim that must write it, unless
// another transaction holds it: it counts the rows it locked.
const LockRow = `WITH r AS (SELECT 1 FROM idem_keys WHERE scope = $1 AND key = $2 FOR UPDATE SKIP LOCKED)
SELECT count(*) FROM r`

// HolderArgs are h as the columns holder_replica and holder_incarnation
// take it: NULL for an anonymous holder.
func HolderArgs(h idem.Holder) (replica, incarnation any) {
	if h.IsZero() {
		return nil, nil
	}
	return h.Replica, h.Incarnation
}

// RecordRow is a row of idem_keys as the statements return it.
type RecordRow struct {
	fingerprint, state                   string
	token                                int64
	status                               *int32
	header, body                         []byte
	bodyOmitted                          bool
	createdAt, leaseExpiresAt, expiresAt time.Time
	completedAt                          *time.Time
	recoveryPoint                        *string
	recoveryData                         []byte
	recoverySavedAt                      *time.Time
	holderReplica, holderIncarnation     *string
}

func (r *RecordRow) Dest() []any {
	return []any{&r.fingerprint, &r.state, &r.token, &r.status, &r.header, &r.body, &r.bodyOmitted,
		&r.createdAt, &r.leaseExpiresAt, &r.expiresAt, &r.completedAt,
		&r.recoveryPoint, &r.recoveryData, &r.recoverySavedAt, &r.holderReplica, &r.holderIncarnation}
}

const RecordColumns = `fingerprint, state, token, status, header, body, body_omitted,
	created_at, lease_expires_at, expires_at, completed_at,
	recovery_point, recovery_data, recovery_saved_at, holder_replica, holder_incarnation`

func (r *RecordRow) Record(scope idem.Scope, key idem.Key) (idem.Record, error) {
	rec := idem.Record{
		Scope:          scope,
		Key:            key,
		Fingerprint:    idem.Fingerprint(r.fingerprint),
		Token:          idem.Token(r.token),
		CreatedAt:      r.createdAt.UTC(),
		LeaseExpiresAt: r.leaseExpiresAt.UTC(),
		ExpiresAt:      r.expiresAt.UTC(),
	}
	if r.holderReplica != nil && r.holderIncarnation != nil {
		rec.Holder = idem.Holder{Replica: *r.holderReplica, Incarnation: *r.holderIncarnation}
	}
	if r.recoveryPoint != nil {
		rec.Recovery = idem.RecoveryPoint{Name: *r.recoveryPoint, Data: r.recoveryData}
		if r.recoverySavedAt != nil {
			rec.Recovery.SavedAt = r.recoverySavedAt.UTC()
		}
	}
	switch r.state {
	case StateInFlight:
		rec.State = idem.StateInFlight
	case StateCompleted:
		rec.State = idem.StateCompleted
		resp := &idem.Response{Body: r.body, BodyOmitted: r.bodyOmitted}
		if r.status != nil {
			resp.Status = int(*r.status)
		}
		if r.header != nil {
			h, err := headerjson.Decode(r.header)
			if err != nil {
				return idem.Record{}, fmt.Errorf("stored header of %v: %w", key, err)
			}
			resp.Header = h
		}
		rec.Response = resp
		if r.completedAt != nil {
			rec.CompletedAt = r.completedAt.UTC()
		}
	default:
		return idem.Record{}, fmt.Errorf("stored state %q of %v is unknown", r.state, key)
	}
	return rec, nil
}

// Complete completes the key if the token holds it. Its command tag
// counts the rows completed.
const Complete = `UPDATE idem_keys SET state = 'completed', status = $4, header = $5, body = $6, body_omitted = $7,
		completed_at = coalesce($8::timestamptz, clock_timestamp())
	WHERE scope = $1 AND key = $2 AND token = $3 AND state = 'in_flight'`

// Wake wakes the waiters of a key, if it has any (see idempg's Store.WaitChange).
// It runs after the change committed, in a transaction of its own: NOTIFY
// takes a database-wide lock held until its transaction commits, so a
// NOTIFY in the completing transaction would serialise the commits of every
// completion, and here it is skipped for the keys nobody waits for.
const Wake = `SELECT pg_notify($1, $2) FROM idem_waiters WHERE scope = $3 AND key = $4 LIMIT 1`

// Release deletes the key if the token holds it in flight without a
// recovery point (see idem.ErrHasRecoveryPoint). Its command tag counts the
// rows deleted.
const Release = `DELETE FROM idem_keys WHERE scope = $1 AND key = $2 AND token = $3 AND state = 'in_flight'
	AND recovery_point IS NULL`

// ReleaseWithPoint deletes the key if the token holds it in flight, with a
// recovery point or without. Its command tag counts the rows deleted.
const ReleaseWithPoint = `DELETE FROM idem_keys WHERE scope = $1 AND key = $2 AND token = $3 AND state = 'in_flight'`

// Unreleased tells why a release deleted nothing: no row when the key is
// gone (released already), true when the token holds it in flight with a
// recovery point, false when the token does not hold it.
const Unreleased = `SELECT token = $3 AND state = 'in_flight' AND recovery_point IS NOT NULL
	FROM idem_keys WHERE scope = $1 AND key = $2`

// Live is true when a record counts at the statement's time: its TTL has
// not passed, or a live lease still holds it (a takeover may push the lease
// past the TTL, and the holder must not lose the key meanwhile), or it is
// in flight with a recovery point (see idem.Recoverer).
const Live = `(expires_at > n.t OR (state = 'in_flight' AND (lease_expires_at > n.t OR recovery_point IS NOT NULL)))`

const Get = `SELECT ` + RecordColumns + `
	FROM idem_keys, (SELECT coalesce($3::timestamptz, clock_timestamp()) AS t) AS n
	WHERE scope = $1 AND key = $2 AND ` + Live

// Purge deletes up to $2 records whose TTL has passed and that no live
// lease holds.
//
// The victims are found in expires_at order through its index: the time is
// a stable expression (the injected clock's, or statement_timestamp(), the
// statement's start on the database's clock), so it bounds the index scan
// instead of filtering every row, and a purge with little to do reads
// little. They are locked with SKIP LOCKED, so a row that a claim is
// overwriting (or any transaction holds) is left for a later call instead
// of waited for. A claim waits for a purge only when it claims anew one of
// the expired keys that this very statement is deleting, and only until the
// statement commits; claims of any other key never wait for it. The rows
// are then deleted by
// their physical address (ctid), which the row lock keeps valid until the
// statement ends; the expiry is checked again on delete all the same.
const Purge = `WITH victims AS (
	SELECT k.ctid FROM idem_keys AS k
	WHERE k.expires_at <= coalesce($1::timestamptz, statement_timestamp())
	  AND NOT (k.state = 'in_flight' AND (k.lease_expires_at > coalesce($1::timestamptz, statement_timestamp())
	           OR k.recovery_point IS NOT NULL))
	ORDER BY k.expires_at
	LIMIT $2
	FOR UPDATE OF k SKIP LOCKED)
DELETE FROM idem_keys AS k
WHERE k.ctid = ANY (ARRAY(SELECT ctid FROM victims))
  AND k.expires_at <= coalesce($1::timestamptz, statement_timestamp())`

// SaveRecovery sets the key's recovery point if the token holds it in
// flight. Its command tag counts the rows changed.
const SaveRecovery = `UPDATE idem_keys SET recovery_point = $4, recovery_data = $5,
		recovery_saved_at = coalesce($6::timestamptz, clock_timestamp())
	WHERE scope = $1 AND key = $2 AND token = $3 AND state = 'in_flight'`

// Yield ends the key's lease now if the token holds it in flight. Its
// command tag counts the rows changed.
const Yield = `UPDATE idem_keys SET lease_expires_at = least(lease_expires_at, coalesce($4::timestamptz, clock_timestamp()))
	WHERE scope = $1 AND key = $2 AND token = $3 AND state = 'in_flight'`

// Renew starts a new lease of $4 µs at the statement's time if the token
// holds the key in flight, moving the record's expiry out to the lease end
// when it would end before, and returns the lease end; no row when the
// token does not hold the key.
//
// The row is locked first, waiting for any transaction that holds it (a
// phase's transaction that saved a recovery point, say), and the time is
// read after, as idem_claim does since keys migration 0007: read before,
// it would count the lease from before the wait, and the holder would be
// told of a lease longer than it has. After the wait the lock rechecks the
// token and the state on the row as it is then.
const Renew = `WITH l AS MATERIALIZED (
	SELECT 1 FROM idem_keys
	WHERE scope = $1 AND key = $2 AND token = $3 AND state = 'in_flight'
	FOR UPDATE),
n AS MATERIALIZED (SELECT coalesce($5::timestamptz, clock_timestamp()) AS t FROM l)
UPDATE idem_keys AS k SET lease_expires_at = n.t + $4::bigint * interval '1 microsecond',
		expires_at = greatest(k.expires_at, n.t + $4::bigint * interval '1 microsecond')
	FROM n
	WHERE k.scope = $1 AND k.key = $2 AND k.token = $3 AND k.state = 'in_flight'
	RETURNING k.lease_expires_at`

// YieldEarlier ends, at the statement's time, the live leases of the keys
// in flight held by replica $1 under an incarnation other than $2, through
// the partial index idem_keys_holders, and returns their scopes and keys.
const YieldEarlier = `UPDATE idem_keys AS k SET lease_expires_at = n.t
	FROM (SELECT coalesce($3::timestamptz, clock_timestamp()) AS t) AS n
	WHERE k.state = 'in_flight' AND k.holder_replica = $1 AND k.holder_incarnation <> $2
	  AND k.lease_expires_at > n.t
	RETURNING k.scope, k.key`

// ValidateCurrent checks the Holder given to YieldEarlier, and that
// PostgreSQL's text type can hold it.
func ValidateCurrent(h idem.Holder) error {
	if h.IsZero() {
		return &idem.ArgumentError{Field: "current", Reason: "must name a replica and its incarnation"}
	}
	return h.Validate()
}

// atPoints selects the keys in flight with a recovery point: its WHERE is
// the predicate of the partial index idem_keys_recovering (migration 0004),
// which the planner uses only for a query whose WHERE implies it.
const atPoints = `SELECT scope, key, ` + RecordColumns + `
	FROM idem_keys
	WHERE state = 'in_flight' AND recovery_point IS NOT NULL`

// Abandoned lists up to $2 keys in flight with a recovery point whose lease
// ended, oldest lease end first, through the partial index
// idem_keys_recovering.
const Abandoned = atPoints + `
	  AND lease_expires_at <= coalesce($1::timestamptz, statement_timestamp())
	ORDER BY lease_expires_at
	LIMIT $2`

// InFlightAtPoints lists up to $1 keys in flight with a recovery point,
// whether their holder's lease ended or not (Abandoned lists those whose
// lease did), oldest lease end first, through the index Abandoned uses.
const InFlightAtPoints = atPoints + `
	ORDER BY lease_expires_at
	LIMIT $1`

// ValidateRecovery checks rp, and that PostgreSQL's text type can hold its
// name.
func ValidateRecovery(rp idem.RecoveryPoint) error {
	if err := rp.Validate(); err != nil {
		return err
	}
	return CheckText("RecoveryPoint.Name", rp.Name)
}

// PurgeWaiters deletes the registrations of waiters past the lease end
// they waited for at most: left by a process that died waiting (see
// Store.WaitChange).
const PurgeWaiters = `DELETE FROM idem_waiters WHERE until <= coalesce($1::timestamptz, statement_timestamp())`

// CheckText reports a string PostgreSQL's text type cannot hold.
func CheckText(field, s string) error {
	switch {
	case !utf8.ValidString(s):
		return &idem.ArgumentError{Field: field, Reason: "must be valid UTF-8"}
	case strings.IndexByte(s, 0) >= 0:
		return &idem.ArgumentError{Field: field, Reason: "must not contain NUL bytes"}
	}
	return nil
}

// ValidateClaim checks req, and that PostgreSQL's text type can hold it.
func ValidateClaim(req idem.ClaimRequest) error {
	if err := req.Validate(); err != nil {
		return err
	}
	for _, f := range []struct{ name, v string }{
		{"Scope", string(req.Scope)}, {"Key", string(req.Key)}, {"Fingerprint", string(req.Fingerprint)},
	} {
		if err := CheckText(f.name, f.v); err != nil {
			return err
		}
	}
	return nil
}

// Micros converts a positive duration to whole microseconds, PostgreSQL's
// precision, rounding up so that no positive lease becomes zero.
func Micros(d time.Duration) int64 {
	return int64((d + time.Microsecond - 1) / time.Microsecond)
}

// NotifyID is the payload that tells waiters which key changed: a short hash
// of scope and key, so that any key fits in a notification and none is
// revealed in the server's logs. Two keys sharing one only wake each other's
// waiters spuriously.
func NotifyID(scope idem.Scope, key idem.Key) string {
	h := sha256.New()
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(scope)))
	h.Write(n[:])
	h.Write([]byte(scope))
	h.Write([]byte(key))
	return hex.EncodeToString(h.Sum(nil)[:8])
}

// AcquiredClaim is the claim of req that acquired a new key, with the
// token and times the database gave it.
func AcquiredClaim(req idem.ClaimRequest, token int64, created, leaseEnd, expires time.Time) idem.Claim {
	return idem.Claim{Outcome: idem.Acquired, Token: idem.Token(token), Record: idem.Record{
		Scope: req.Scope, Key: req.Key, Fingerprint: req.Fingerprint,
		State: idem.StateInFlight, Token: idem.Token(token),
		CreatedAt: created.UTC(), LeaseExpiresAt: leaseEnd.UTC(), ExpiresAt: expires.UTC(),
		Holder: req.Holder,
	}}
}

// ClaimOf is the claim of req whose outcome and record the database
// returned.
func ClaimOf(outcome string, tookOver bool, row RecordRow, req idem.ClaimRequest) (idem.Claim, error) {
	rec, err := row.Record(req.Scope, req.Key)
	if err != nil {
		return idem.Claim{}, fmt.Errorf("%w", err)
	}
	c := idem.Claim{Record: rec}
	switch outcome {
	case "acquired":
		c.Outcome, c.Token, c.TookOver = idem.Acquired, rec.Token, tookOver
	case "in_flight":
		c.Outcome = idem.InFlight
	case "completed":
		c.Outcome = idem.Completed
	case "mismatch":
		c.Outcome = idem.Mismatch
	default:
		return idem.Claim{}, fmt.Errorf("unknown outcome %q", outcome)
	}
	return c, nil
}

// Rows is what pgx.Rows and *sql.Rows both offer.
type Rows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
}

// AbandonedRecords reads the rows of Abandoned or InFlightAtPoints. The
// caller closes rows.
func AbandonedRecords(rows Rows) ([]idem.Record, error) {
	var out []idem.Record
	for rows.Next() {
		var scope, key string
		var row RecordRow
		if err := rows.Scan(append([]any{&scope, &key}, row.Dest()...)...); err != nil {
			return nil, err
		}
		rec, err := row.Record(idem.Scope(scope), idem.Key(key))
		if err != nil {
			return nil, err
		}
		out = append(out, rec)
	}
	return out, rows.Err()
}
