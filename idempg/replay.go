package idempg

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/headerjson"
)

// replaySQL reads what the replay of a completed, live key needs: whether
// its fingerprint is $3, and the kept response. A completed record is live
// while its TTL has not passed (pgsql.Live's lease clause is for keys in
// flight).
const replaySQL = `SELECT fingerprint = $3, status, header, body, body_omitted
	FROM idem_keys
	WHERE scope = $1 AND key = $2 AND state = 'completed'
	  AND expires_at > coalesce($4::timestamptz, clock_timestamp())`

// replayNowSQL is replaySQL on the database's clock, the statement
// replayStatement names on each connection.
const replayNowSQL = `SELECT fingerprint = $3, status, header, body, body_omitted
	FROM idem_keys
	WHERE scope = $1 AND key = $2 AND state = 'completed'
	  AND expires_at > clock_timestamp()`

// replayStatement is the name replayNowSQL is prepared under, once per
// connection.
const replayStatement = "idempg_replay"

// replayResultFormats asks for replayNowSQL's five columns in binary.
var replayResultFormats = []int16{1, 1, 1, 1, 1}

// Replay implements idem.Replayer: one SELECT of five columns, where Get
// reads eleven and turns them into a Record. With Config.Clock nil, expiry
// is judged by the database's clock. Called with a context whose
// transaction of the DB has begun, it reads in that transaction.
//
// Replays are the requests a store answers most, so on its own (no
// transaction carried, the database's clock, prepared statements allowed)
// Replay runs a statement prepared once per connection, sends its three
// parameters as text without boxing each, and reads the row's binary
// columns itself: what a replay costs the process is then close to what
// the one SELECT of hand-written code costs.
func (s *Store) Replay(ctx context.Context, scope idem.Scope, key idem.Key, fp idem.Fingerprint) (*idem.Response, bool, error) {
	if s.db.clock == nil && s.db.namedStatements {
		if st := s.db.carried(ctx); st == nil || st.begun() == nil {
			return s.replayPrepared(ctx, scope, key, fp)
		}
	}
	q := s.db.readQuerier(ctx)
	// One allocation holds every scan target and the response returned,
	// where separate variables would each escape to the heap on their own.
	r := new(replayRow)
	err := q.QueryRow(ctx, replaySQL, string(scope), string(key), string(fp), s.db.now()).
		Scan(&r.same, &r.status, &r.header, &r.resp.Body, &r.resp.BodyOmitted)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil, false, nil
	case err != nil:
		return nil, false, fmt.Errorf("idempg: replay: %w", err)
	}
	return r.answer(key)
}

// replayRow is what Replay reads.
type replayRow struct {
	resp   idem.Response
	same   bool
	status pgtype.Int4
	header []byte
}

// answer returns Replay's results for the row read.
func (r *replayRow) answer(key idem.Key) (*idem.Response, bool, error) {
	if !r.same {
		return nil, true, nil
	}
	r.resp.Status = int(r.status.Int32)
	if r.header != nil {
		var err error
		if r.resp.Header, err = headerjson.Decode(r.header); err != nil {
			return nil, false, fmt.Errorf("idempg: replay: stored header of %v: %w", key, err)
		}
	}
	return &r.resp, false, nil
}

// replayPrepared is Replay through replayStatement.
func (s *Store) replayPrepared(ctx context.Context, scope idem.Scope, key idem.Key, fp idem.Fingerprint) (*idem.Response, bool, error) {
	conn, err := s.db.pool.Acquire(ctx)
	if err != nil {
		return nil, false, fmt.Errorf("idempg: replay: %w", err)
	}
	defer conn.Release()
	// pgx keeps the statements a connection prepared by name: after the
	// first call on a connection this is a map lookup.
	sd, err := conn.Conn().Prepare(ctx, replayStatement, replayNowSQL)
	if err != nil {
		return nil, false, fmt.Errorf("idempg: replay: %w", err)
	}
	// The three text parameters share one buffer. None is nil (which
	// would send NULL): make returns a non-nil slice even of length 0.
	buf := make([]byte, 0, len(scope)+len(key)+len(fp))
	buf = append(append(append(buf, scope...), key...), fp...)
	a, b := len(scope), len(scope)+len(key)
	params := [3][]byte{buf[:a:a], buf[a:b:b], buf[b:]}
	rr := conn.Conn().PgConn().ExecPrepared(ctx, sd.Name, params[:], nil, replayResultFormats)
	var (
		r         *replayRow
		decodeErr error
	)
	for rr.NextRow() {
		if r == nil && decodeErr == nil { // (scope, key) is the primary key: one row at most
			r, decodeErr = decodeReplayRow(rr.Values())
		}
	}
	if _, err := rr.Close(); err != nil {
		return nil, false, fmt.Errorf("idempg: replay: %w", err)
	}
	if decodeErr != nil {
		return nil, false, fmt.Errorf("idempg: replay: %v: %w", key, decodeErr)
	}
	if r == nil {
		return nil, false, nil
	}
	return r.answer(key)
}

// decodeReplayRow reads replayNowSQL's row from its binary columns: bool,
// int4, jsonb (a version byte, then the JSON text), bytea, bool; NULL
// status and header read as none. The bytes are copied: vals is valid only
// until the next row is read.
func decodeReplayRow(vals [][]byte) (*replayRow, error) {
	if len(vals) != 5 {
		return nil, fmt.Errorf("replay read %d columns, want 5", len(vals))
	}
	r := new(replayRow)
	var ok bool
	if r.same, ok = binaryBool(vals[0]); !ok {
		return nil, errors.New("unreadable fingerprint comparison")
	}
	if v := vals[1]; v != nil {
		if len(v) != 4 {
			return nil, errors.New("unreadable stored status")
		}
		r.status = pgtype.Int4{Int32: int32(binary.BigEndian.Uint32(v)), Valid: true}
	}
	// Header and body share one copy.
	header, body := vals[2], vals[3]
	if header != nil && (len(header) == 0 || header[0] != 1) {
		return nil, errors.New("stored header in an unknown jsonb format")
	}
	kept := make([]byte, 0, len(header)+len(body))
	if header != nil {
		kept = append(kept, header[1:]...)
		r.header = kept[:len(kept):len(kept)]
	}
	if body != nil {
		start := len(kept)
		kept = append(kept, body...)
		r.resp.Body = kept[start:len(kept):len(kept)]
	}
	if r.resp.BodyOmitted, ok = binaryBool(vals[4]); !ok {
		return nil, errors.New("unreadable body_omitted")
	}
	return r, nil
}

// binaryBool reads a bool column in binary format.
func binaryBool(v []byte) (bool, bool) {
	if len(v) != 1 {
		return false, false
	}
	return v[0] != 0, true
}
