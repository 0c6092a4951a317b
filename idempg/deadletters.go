package idempg

import (
	"context"
	"crypto/rand"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/internal/pgsql"
)

// DeadLettersConfig configures NewDeadLetters. The zero value is ready to
// use.
type DeadLettersConfig struct {
	// Clock stamps the history's events that come without a time. Defaults
	// to the DB's: Config.Clock, or the database's clock when that is nil.
	Clock idem.Clock
}

// DeadLetters is an idem.DeadLetters whose letters live in the tables
// idem_dead_letters (the message as it arrived, its consumer, class, state,
// first and last failure), idem_dead_letter_attempts (every attempt) and
// idem_dead_letter_events (the history) of a DB's schema. Nothing is ever
// deleted. It is safe for concurrent use.
//
// IDs are "dl_" and 26 random base32 characters, so they can be made
// without asking the database and never collide across databases.
//
// Error texts, actors, actions and reasons are stored as text: bytes that
// are not UTF-8, and NUL bytes, become U+FFFD rather than make the letter
// unstorable. Times are kept to the microsecond.
type DeadLetters struct {
	db    *DB
	clock idem.Clock // nil: the DB's
}

var _ idem.DeadLetters = (*DeadLetters)(nil)

// NewDeadLetters applies the message tables' migrations to db (component
// "idem_messages") and returns a DeadLetters on it. cfg may be nil.
func NewDeadLetters(ctx context.Context, db *DB, cfg *DeadLettersConfig) (*DeadLetters, error) {
	var c DeadLettersConfig
	if cfg != nil {
		c = *cfg
	}
	if err := migrateMessages(ctx, db); err != nil {
		return nil, err
	}
	return &DeadLetters{db: db, clock: c.Clock}, nil
}

// addLetterSQL writes a letter, its attempts (arrays $14 to $17, in order)
// and its first event in one statement: the foreign keys are checked at its
// end, once every row is there.
const addLetterSQL = `WITH n AS MATERIALIZED (SELECT coalesce($18::timestamptz, clock_timestamp()) AS t),
letter AS (
	INSERT INTO idem_dead_letters (id, consumer, message_id, topic, key, headers, headers_base64, payload, msg_time,
		class, state, first_failed_at, last_failed_at)
	VALUES ($1, $2, $3, $4, $5, $6::text::jsonb, $7, $8, $9, $10, 'dead', $11, $12)),
attempts AS (
	INSERT INTO idem_dead_letter_attempts (letter_id, ord, number, at, class, error)
	SELECT $1, a.ord, a.number, a.at, a.class, a.error
	FROM unnest($14::integer[], $15::timestamptz[], $16::text[], $17::text[]) WITH ORDINALITY AS a(number, at, class, error, ord))
INSERT INTO idem_dead_letter_events (letter_id, ord, at, actor, action, reason, state)
SELECT $1, 1, n.t, $2, 'dead-lettered', $13, 'dead' FROM n`

// Add implements idem.DeadLetters, in one statement, in the transaction
// ctx carries (the consumer's, which also settles the message) or on its
// own. The first history event is "dead-lettered", by the consumer, with
// the last error as its reason, at the store's clock. Returns an error
// matching idem.ErrInvalidArgument when dl has no Consumer, its Message
// does not validate, its Class is unknown, or its consumer, message ID,
// topic or key is not storable as text (not UTF-8, or holding a NUL byte).
func (d *DeadLetters) Add(ctx context.Context, dl idem.DeadLetter) (string, error) {
	if err := pgsql.CheckName("DeadLetter.Consumer", dl.Consumer); err != nil {
		return "", err
	}
	if dl.Class != idem.DeadPermanent && dl.Class != idem.DeadExhausted {
		return "", &idem.ArgumentError{Field: "DeadLetter.Class", Reason: fmt.Sprintf("%q is neither %q nor %q", dl.Class, idem.DeadPermanent, idem.DeadExhausted)}
	}
	if err := pgsql.CheckMessage(dl.Message); err != nil {
		return "", err
	}
	msg, err := pgsql.MessageArgs(dl.Message)
	if err != nil {
		return "", fmt.Errorf("idempg: add dead letter: %w", err)
	}
	var (
		numbers        []int32
		ats            []*time.Time
		classes, texts []string
	)
	for _, a := range dl.Attempts {
		var at *time.Time
		if !a.At.IsZero() {
			at = &a.At
		}
		numbers, ats = append(numbers, int32(a.Number)), append(ats, at)
		classes, texts = append(classes, freeText(string(a.Class))), append(texts, freeText(a.Error))
	}
	if err := ctx.Err(); err != nil {
		return "", err
	}
	id := "dl_" + strings.ToLower(rand.Text())
	args := append([]any{id, dl.Consumer}, msg...)
	args = append(args, string(dl.Class), pgsql.TimeArg(dl.FirstFailedAt), pgsql.TimeArg(dl.LastFailedAt), freeText(dl.LastError()),
		numbers, ats, classes, texts, d.db.storeNow(d.clock))
	q, err := d.db.writeQuerier(ctx)
	if err == nil {
		_, err = q.Exec(ctx, addLetterSQL, args...)
	}
	if err != nil {
		return "", fmt.Errorf("idempg: add dead letter: %w", err)
	}
	return id, nil
}

// Get implements idem.DeadLetters. Called with a context whose
// transaction of the DB has begun, it reads in that transaction. Returns an
// error matching idem.ErrNotFound when there is no such letter.
func (d *DeadLetters) Get(ctx context.Context, id string) (idem.DeadLetter, error) {
	dl, err := getLetter(ctx, d.db.readQuerier(ctx), id)
	if err != nil {
		return idem.DeadLetter{}, fmt.Errorf("idempg: get dead letter: %w", err)
	}
	return dl, nil
}

const letterColumns = `id, consumer, message_id, topic, key, headers, headers_base64, payload, msg_time,
	class, state, first_failed_at, last_failed_at`

func getLetter(ctx context.Context, q msgQuerier, id string) (idem.DeadLetter, error) {
	if pgsql.CheckText("id", id) != nil {
		// No letter has such an ID.
		return idem.DeadLetter{}, fmt.Errorf("dead letter %q: %w", id, idem.ErrNotFound)
	}
	found, err := queryLetters(ctx, q, `SELECT `+letterColumns+` FROM idem_dead_letters WHERE id = $1`, id)
	if err != nil {
		return idem.DeadLetter{}, err
	}
	if len(found) == 0 {
		return idem.DeadLetter{}, fmt.Errorf("dead letter %q: %w", id, idem.ErrNotFound)
	}
	return found[0], nil
}

// queryLetters runs a query of letterColumns and reads the letters'
// attempts and histories: three statements, however many letters.
func queryLetters(ctx context.Context, q msgQuerier, query string, args ...any) ([]idem.DeadLetter, error) {
	rows, err := q.Query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	letters, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (idem.DeadLetter, error) {
		var (
			dl           idem.DeadLetter
			m            pgsql.MessageRow
			class, state string
			first, last  *time.Time
		)
		dest := append(append([]any{&dl.ID, &dl.Consumer}, m.Dest()...), &class, &state, &first, &last)
		if err := row.Scan(dest...); err != nil {
			return dl, err
		}
		var err error
		dl.Message, err = m.Message()
		dl.Class, dl.State = idem.DeadLetterClass(class), idem.LetterState(state)
		dl.FirstFailedAt, dl.LastFailedAt = pgsql.TimeOf(first), pgsql.TimeOf(last)
		return dl, err
	})
	if err != nil || len(letters) == 0 {
		return nil, err
	}
	ids := make([]string, len(letters))
	index := make(map[string]int, len(letters))
	for i, dl := range letters {
		ids[i], index[dl.ID] = dl.ID, i
	}

	rows, err = q.Query(ctx, `SELECT letter_id, number, at, class, error FROM idem_dead_letter_attempts
		WHERE letter_id = ANY ($1) ORDER BY letter_id, ord`, ids)
	if err != nil {
		return nil, err
	}
	var (
		letterID string
		a        idem.Attempt
		at       *time.Time
		class    string
	)
	_, err = pgx.ForEachRow(rows, []any{&letterID, &a.Number, &at, &class, &a.Error}, func() error {
		dl := &letters[index[letterID]]
		dl.Attempts = append(dl.Attempts, idem.Attempt{Number: a.Number, At: pgsql.TimeOf(at), Class: idem.ErrorClass(class), Error: a.Error})
		return nil
	})
	if err != nil {
		return nil, err
	}

	rows, err = q.Query(ctx, `SELECT letter_id, at, actor, action, reason, state FROM idem_dead_letter_events
		WHERE letter_id = ANY ($1) ORDER BY letter_id, ord`, ids)
	if err != nil {
		return nil, err
	}
	var (
		ev    idem.LetterEvent
		state string
	)
	_, err = pgx.ForEachRow(rows, []any{&letterID, &at, &ev.Actor, &ev.Action, &ev.Reason, &state}, func() error {
		dl := &letters[index[letterID]]
		dl.History = append(dl.History, idem.LetterEvent{At: pgsql.TimeOf(at), Actor: ev.Actor, Action: ev.Action, Reason: ev.Reason, State: idem.LetterState(state)})
		return nil
	})
	if err != nil {
		return nil, err
	}
	return letters, nil
}

// List implements idem.DeadLetters. Letters that failed last at the same
// time come most recently added first. Called with a context whose
// transaction of the DB has begun, it reads in that transaction. Returns an
// error matching idem.ErrInvalidArgument when f.Limit is negative.
func (d *DeadLetters) List(ctx context.Context, f idem.DeadLetterFilter) ([]idem.DeadLetter, error) {
	if f.Limit < 0 {
		return nil, &idem.ArgumentError{Field: "DeadLetterFilter.Limit", Reason: "must not be negative"}
	}
	var (
		where []string
		args  []any
	)
	cond := func(sql string, arg any) {
		args = append(args, arg)
		where = append(where, fmt.Sprintf(sql, len(args)))
	}
	for _, f := range []struct{ field, v string }{
		{"DeadLetterFilter.Consumer", f.Consumer}, {"DeadLetterFilter.Class", string(f.Class)}, {"DeadLetterFilter.State", string(f.State)},
	} {
		if err := pgsql.CheckText(f.field, f.v); err != nil {
			return nil, err
		}
	}
	if f.Consumer != "" {
		cond("consumer = $%d", f.Consumer)
	}
	if f.Class != "" {
		cond("class = $%d", string(f.Class))
	}
	if f.State != "" {
		cond("state = $%d", string(f.State))
	}
	if !f.Since.IsZero() {
		cond("last_failed_at >= $%d", f.Since)
	}
	query := `SELECT ` + letterColumns + ` FROM idem_dead_letters`
	if len(where) > 0 {
		query += ` WHERE ` + strings.Join(where, " AND ")
	}
	query += ` ORDER BY last_failed_at DESC NULLS LAST, added DESC`
	if f.Limit > 0 {
		args = append(args, int64(f.Limit))
		query += fmt.Sprintf(` LIMIT $%d`, len(args))
	}
	out, err := queryLetters(ctx, d.db.readQuerier(ctx), query, args...)
	if err != nil {
		return nil, fmt.Errorf("idempg: list dead letters: %w", err)
	}
	return out, nil
}

// resolveSQL moves a dead letter to $2 and appends its event, in one
// statement. The UPDATE is a compare-and-set on the state: of concurrent
// resolutions, the later ones wait for the first to commit, find the state
// changed, and update nothing. It returns whether the letter was updated
// and whether it exists (as of the statement's start).
const resolveSQL = `WITH upd AS (
	UPDATE idem_dead_letters SET state = $2 WHERE id = $1 AND state = 'dead' RETURNING id),
ev AS (
	INSERT INTO idem_dead_letter_events (letter_id, ord, at, actor, action, reason, state)
	SELECT upd.id, (SELECT coalesce(max(ord), 0) + 1 FROM idem_dead_letter_events WHERE letter_id = $1),
		coalesce($3::timestamptz, clock_timestamp()), $4, $5, $6, $2
	FROM upd)
SELECT EXISTS (SELECT FROM upd), EXISTS (SELECT FROM idem_dead_letters WHERE id = $1)`

// Resolve implements idem.DeadLetters, in the transaction ctx carries or
// one of its own: the state is changed and the event appended in one
// statement (see resolveSQL), so of two concurrent resolutions one wins and
// the other gets idem.ErrInvalidTransition, and the letter is then read
// back. ev.State is set to to; a zero ev.At is the store's clock. Returns an
// error matching idem.ErrInvalidArgument when to is not a state at all.
func (d *DeadLetters) Resolve(ctx context.Context, id string, to idem.LetterState, ev idem.LetterEvent) (idem.DeadLetter, error) {
	switch to {
	case idem.LetterRedriven, idem.LetterDiscarded:
	case idem.LetterDead:
		return idem.DeadLetter{}, fmt.Errorf("idempg: resolve %q to %s: %w", id, to, idem.ErrInvalidTransition)
	default:
		return idem.DeadLetter{}, &idem.ArgumentError{Field: "to", Reason: fmt.Sprintf("%q is not a dead-letter state", to)}
	}
	if pgsql.CheckText("id", id) != nil {
		return idem.DeadLetter{}, fmt.Errorf("idempg: resolve: dead letter %q: %w", id, idem.ErrNotFound)
	}
	at := d.db.storeNow(d.clock)
	if !ev.At.IsZero() {
		at = ev.At
	}
	var dl idem.DeadLetter
	err := d.db.withTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		var updated, exists bool
		err := tx.QueryRow(ctx, resolveSQL, id, string(to), at, freeText(ev.Actor), freeText(ev.Action), freeText(ev.Reason)).
			Scan(&updated, &exists)
		switch {
		case err != nil:
			return err
		case !exists:
			return fmt.Errorf("dead letter %q: %w", id, idem.ErrNotFound)
		case !updated:
			return fmt.Errorf("dead letter %q is no longer %s: %w", id, idem.LetterDead, idem.ErrInvalidTransition)
		}
		dl, err = getLetter(ctx, tx, id)
		return err
	})
	if err != nil {
		return idem.DeadLetter{}, fmt.Errorf("idempg: resolve: %w", err)
	}
	return dl, nil
}

// Stats implements idem.DeadLetters, ordered by consumer.
func (d *DeadLetters) Stats(ctx context.Context) ([]idem.DeadLetterStats, error) {
	rows, err := d.db.readQuerier(ctx).Query(ctx, `SELECT consumer, count(*), min(first_failed_at) FROM idem_dead_letters
		WHERE state = 'dead' GROUP BY consumer ORDER BY consumer`)
	if err != nil {
		return nil, fmt.Errorf("idempg: dead letter stats: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (idem.DeadLetterStats, error) {
		var (
			s      idem.DeadLetterStats
			count  int64
			oldest *time.Time
		)
		err := row.Scan(&s.Consumer, &count, &oldest)
		s.Count, s.Oldest = int(count), pgsql.TimeOf(oldest)
		return s, err
	})
	if err != nil {
		return nil, fmt.Errorf("idempg: dead letter stats: %w", err)
	}
	return out, nil
}
