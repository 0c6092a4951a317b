package idemsqlite

import (
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/idem-go/idem"
)

// DeadLettersConfig configures NewDeadLetters. The zero value is ready to
// use.
type DeadLettersConfig struct {
	// Clock stamps the history's first event. Defaults to
	// idem.SystemClock.
	Clock idem.Clock
}

// DeadLetters is an idem.DeadLetters whose letters live in the tables
// idem_dead_letters (the message as it arrived, its consumer, class, state,
// first and last failure), idem_dead_letter_attempts (every attempt) and
// idem_dead_letter_events (the history). Nothing is ever deleted.
//
// IDs are "dl_" and 26 random base32 characters, so they can be made
// without asking the database and never collide across databases.
type DeadLetters struct {
	db    *DB
	clock idem.Clock
}

var _ idem.DeadLetters = (*DeadLetters)(nil)

const letterColumns = `id, consumer, message_id, topic, key, headers, payload, msg_time, class, state, first_failed_at, last_failed_at`

// The dead letters' statements, prepared once per DB. List's vary with its
// filter, and are not.
var (
	sqlAddLetter = messagesSQL(`INSERT INTO idem_dead_letters
		(id, consumer, message_id, topic, key, headers, payload, msg_time, class, state, first_failed_at, last_failed_at, added)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, (SELECT coalesce(max(added), 0) + 1 FROM idem_dead_letters))`)
	sqlAddLetterAttempt = messagesSQL(`INSERT INTO idem_dead_letter_attempts (letter_id, ord, number, at, class, error)
		VALUES (?, ?, ?, ?, ?, ?)`)
	sqlAddLetterEvent = messagesSQL(`INSERT INTO idem_dead_letter_events (letter_id, ord, at, actor, action, reason, state)
		VALUES (?1, (SELECT coalesce(max(ord), 0) + 1 FROM idem_dead_letter_events WHERE letter_id = ?1), ?2, ?3, ?4, ?5, ?6)`)
	sqlGetLetter      = messagesSQL(`SELECT ` + letterColumns + ` FROM idem_dead_letters WHERE id = ?`)
	sqlLetterAttempts = messagesSQL(`SELECT number, at, class, error FROM idem_dead_letter_attempts
		WHERE letter_id = ? ORDER BY ord`)
	sqlLetterHistory = messagesSQL(`SELECT at, actor, action, reason, state FROM idem_dead_letter_events
		WHERE letter_id = ? ORDER BY ord`)
	sqlLetterState    = messagesSQL(`SELECT state FROM idem_dead_letters WHERE id = ?`)
	sqlSetLetterState = messagesSQL(`UPDATE idem_dead_letters SET state = ? WHERE id = ?`)
	sqlLetterStats    = messagesSQL(`SELECT consumer, count(*), min(first_failed_at) FROM idem_dead_letters
		WHERE state = ? GROUP BY consumer ORDER BY consumer`)
)

// NewDeadLetters applies the message tables' migrations to db (component
// "idem_messages") and returns a DeadLetters on it. cfg may be nil.
func NewDeadLetters(ctx context.Context, db *DB, cfg *DeadLettersConfig) (*DeadLetters, error) {
	var c DeadLettersConfig
	if cfg != nil {
		c = *cfg
	}
	if c.Clock == nil {
		c.Clock = idem.SystemClock{}
	}
	if err := migrateMessages(ctx, db); err != nil {
		return nil, err
	}
	return &DeadLetters{db: db, clock: c.Clock}, nil
}

// Add implements idem.DeadLetters: it writes through db.WithTx, so it joins
// the transaction ctx carries (the consumer's, which also settles the
// message). The first history event is "dead-lettered", by the consumer,
// with the last error as its reason. Returns an error matching
// idem.ErrInvalidArgument when dl has no Consumer, its Message does not
// validate, or its Class is unknown.
func (d *DeadLetters) Add(ctx context.Context, dl idem.DeadLetter) (string, error) {
	switch {
	case dl.Consumer == "":
		return "", &idem.ArgumentError{Field: "DeadLetter.Consumer", Reason: "must not be empty"}
	case dl.Class != idem.DeadPermanent && dl.Class != idem.DeadExhausted:
		return "", &idem.ArgumentError{Field: "DeadLetter.Class", Reason: fmt.Sprintf("%q is neither %q nor %q", dl.Class, idem.DeadPermanent, idem.DeadExhausted)}
	}
	if err := dl.Message.Validate(); err != nil {
		return "", err
	}
	h, err := encodeHeaders(dl.Message.Headers)
	if err != nil {
		return "", fmt.Errorf("idemsqlite: add dead letter: %w", err)
	}
	id := "dl_" + strings.ToLower(rand.Text())
	now := d.clock.Now()
	m := dl.Message
	err = d.db.withTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		r := d.db.in(tx)
		if _, err := r.exec(ctx, sqlAddLetter, id, dl.Consumer, m.ID, m.Topic, m.Key, h, payloadArg(m.Payload), msgNanos(m.Time),
			string(dl.Class), string(idem.LetterDead), msgNanos(dl.FirstFailedAt), msgNanos(dl.LastFailedAt)); err != nil {
			return err
		}
		addAttempt := r.bind(ctx, sqlAddLetterAttempt)
		for i, a := range dl.Attempts {
			if _, err := addAttempt.exec(ctx, id, i+1, a.Number, msgNanos(a.At), string(a.Class), a.Error); err != nil {
				return err
			}
		}
		return addEvent(ctx, r, id, idem.LetterEvent{
			At: now, Actor: dl.Consumer, Action: "dead-lettered", Reason: dl.LastError(), State: idem.LetterDead,
		})
	})
	if err != nil {
		return "", fmt.Errorf("idemsqlite: add dead letter: %w", err)
	}
	return id, nil
}

func addEvent(ctx context.Context, r runner, id string, ev idem.LetterEvent) error {
	_, err := r.exec(ctx, sqlAddLetterEvent, id, msgNanos(ev.At), ev.Actor, ev.Action, ev.Reason, string(ev.State))
	return err
}

// Get implements idem.DeadLetters.
func (d *DeadLetters) Get(ctx context.Context, id string) (idem.DeadLetter, error) {
	var dl idem.DeadLetter
	err := d.db.read(ctx, func(ctx context.Context, r runner) error {
		var err error
		dl, err = getLetter(ctx, r, id)
		return err
	})
	if err != nil {
		return idem.DeadLetter{}, fmt.Errorf("idemsqlite: get dead letter: %w", err)
	}
	return dl, nil
}

func getLetter(ctx context.Context, r runner, id string) (idem.DeadLetter, error) {
	rows, err := r.query(ctx, sqlGetLetter, id)
	if err != nil {
		return idem.DeadLetter{}, err
	}
	found, err := scanLetters(ctx, r, rows)
	if err != nil {
		return idem.DeadLetter{}, err
	}
	if len(found) == 0 {
		return idem.DeadLetter{}, fmt.Errorf("dead letter %q: %w", id, idem.ErrNotFound)
	}
	return found[0], nil
}

// scanLetters reads rows of letterColumns, closes them, and then reads
// each letter's attempts and history.
func scanLetters(ctx context.Context, r runner, rows *sql.Rows) ([]idem.DeadLetter, error) {
	var out []idem.DeadLetter
	err := func() error {
		defer rows.Close()
		for rows.Next() {
			var (
				dl              idem.DeadLetter
				h               sql.NullString
				mt, first, last int64
				class, state    string
			)
			if err := rows.Scan(&dl.ID, &dl.Consumer, &dl.Message.ID, &dl.Message.Topic, &dl.Message.Key, &h,
				&dl.Message.Payload, &mt, &class, &state, &first, &last); err != nil {
				return err
			}
			var err error
			if dl.Message.Headers, err = decodeHeaders(h); err != nil {
				return err
			}
			dl.Message.Time, dl.FirstFailedAt, dl.LastFailedAt = msgTime(mt), msgTime(first), msgTime(last)
			dl.Class, dl.State = idem.DeadLetterClass(class), idem.LetterState(state)
			out = append(out, dl)
		}
		return rows.Err()
	}()
	if err != nil {
		return nil, err
	}
	// Read after the letters' rows are closed: a transaction's connection
	// serves one result set at a time.
	for i := range out {
		rows, err := r.query(ctx, sqlLetterAttempts, out[i].ID)
		if err != nil {
			return nil, err
		}
		if out[i].Attempts, err = scanAttempts(rows); err != nil {
			return nil, err
		}
		if out[i].History, err = letterHistory(ctx, r, out[i].ID); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func letterHistory(ctx context.Context, r runner, id string) ([]idem.LetterEvent, error) {
	rows, err := r.query(ctx, sqlLetterHistory, id)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []idem.LetterEvent
	for rows.Next() {
		var (
			ev    idem.LetterEvent
			at    int64
			state string
		)
		if err := rows.Scan(&at, &ev.Actor, &ev.Action, &ev.Reason, &state); err != nil {
			return nil, err
		}
		ev.At, ev.State = msgTime(at), idem.LetterState(state)
		out = append(out, ev)
	}
	return out, rows.Err()
}

// List implements idem.DeadLetters. Letters that failed last at the same
// time come most recently added first. Returns an error matching
// idem.ErrInvalidArgument when f.Limit is negative.
func (d *DeadLetters) List(ctx context.Context, f idem.DeadLetterFilter) ([]idem.DeadLetter, error) {
	if f.Limit < 0 {
		return nil, &idem.ArgumentError{Field: "DeadLetterFilter.Limit", Reason: "must not be negative"}
	}
	var (
		where []string
		args  []any
	)
	if f.Consumer != "" {
		where, args = append(where, "consumer = ?"), append(args, f.Consumer)
	}
	if f.Class != "" {
		where, args = append(where, "class = ?"), append(args, string(f.Class))
	}
	if f.State != "" {
		where, args = append(where, "state = ?"), append(args, string(f.State))
	}
	if !f.Since.IsZero() {
		where, args = append(where, "last_failed_at >= ?"), append(args, f.Since.UnixNano())
	}
	query := `SELECT ` + letterColumns + ` FROM idem_dead_letters`
	if len(where) > 0 {
		query += ` WHERE ` + strings.Join(where, " AND ")
	}
	query += ` ORDER BY last_failed_at DESC, added DESC`
	if f.Limit > 0 {
		query, args = query+` LIMIT ?`, append(args, f.Limit)
	}
	var out []idem.DeadLetter
	err := d.db.read(ctx, func(ctx context.Context, r runner) error {
		rows, err := r.queryer().QueryContext(ctx, query, args...)
		if err != nil {
			return err
		}
		out, err = scanLetters(ctx, r, rows)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("idemsqlite: list dead letters: %w", err)
	}
	return out, nil
}

// Resolve implements idem.DeadLetters. The state is checked and changed in
// one write transaction (the caller's, if ctx carries one), so of two
// concurrent resolutions one wins and the other gets
// idem.ErrInvalidTransition. ev.State is set to to; a zero ev.At is the
// clock's time. Returns an error matching idem.ErrInvalidArgument when to is
// not a state at all.
func (d *DeadLetters) Resolve(ctx context.Context, id string, to idem.LetterState, ev idem.LetterEvent) (idem.DeadLetter, error) {
	switch to {
	case idem.LetterRedriven, idem.LetterDiscarded:
	case idem.LetterDead:
		return idem.DeadLetter{}, fmt.Errorf("idemsqlite: resolve %q to %s: %w", id, to, idem.ErrInvalidTransition)
	default:
		return idem.DeadLetter{}, &idem.ArgumentError{Field: "to", Reason: fmt.Sprintf("%q is not a dead-letter state", to)}
	}
	ev.State = to
	if ev.At.IsZero() {
		ev.At = d.clock.Now()
	}
	var dl idem.DeadLetter
	err := d.db.withTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		r := d.db.in(tx)
		var state string
		err := r.queryRow(ctx, sqlLetterState, id).Scan(&state)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			return fmt.Errorf("dead letter %q: %w", id, idem.ErrNotFound)
		case err != nil:
			return err
		case idem.LetterState(state) != idem.LetterDead:
			return fmt.Errorf("dead letter %q is %s, not %s: %w", id, state, idem.LetterDead, idem.ErrInvalidTransition)
		}
		if _, err := r.exec(ctx, sqlSetLetterState, string(to), id); err != nil {
			return err
		}
		if err := addEvent(ctx, r, id, ev); err != nil {
			return err
		}
		dl, err = getLetter(ctx, r, id)
		return err
	})
	if err != nil {
		return idem.DeadLetter{}, fmt.Errorf("idemsqlite: resolve: %w", err)
	}
	return dl, nil
}

// Stats implements idem.DeadLetters, ordered by consumer.
func (d *DeadLetters) Stats(ctx context.Context) ([]idem.DeadLetterStats, error) {
	var out []idem.DeadLetterStats
	err := d.db.read(ctx, func(ctx context.Context, r runner) error {
		rows, err := r.query(ctx, sqlLetterStats, string(idem.LetterDead))
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var (
				s      idem.DeadLetterStats
				oldest int64
			)
			if err := rows.Scan(&s.Consumer, &s.Count, &oldest); err != nil {
				return err
			}
			s.Oldest = msgTime(oldest)
			out = append(out, s)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("idemsqlite: dead letter stats: %w", err)
	}
	return out, nil
}
