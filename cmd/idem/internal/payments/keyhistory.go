package payments

import (
	"context"
	"database/sql"
	"fmt"
	"math"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/console"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/idemsqlite"
)

// KeyHistory returns the history of the operators' actions on keys
// stopped at a recovery point (console.Config.KeyHistory, idem keys
// settle), kept in the SQLite database db, which must have been migrated
// (by New or Migrate).
func KeyHistory(db *idemsqlite.DB) (console.KeyHistory, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: DB is required", ErrConfig)
	}
	return sqliteKeyHistory{db: db}, nil
}

// KeyHistoryPostgres is KeyHistory on PostgreSQL.
func KeyHistoryPostgres(db *idempg.DB) (console.KeyHistory, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: Postgres is required", ErrConfig)
	}
	return pgKeyHistory{db: db}, nil
}

type sqliteKeyHistory struct{ db *idemsqlite.DB }

// AddKeyEvent writes in the transaction ctx carries (a settle's, which
// completes the key in the same database), or in one of its own.
func (h sqliteKeyHistory) AddKeyEvent(ctx context.Context, ev console.KeyEvent) error {
	err := h.db.WithTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO key_actions (scope, key, at, actor, action, reason, result) VALUES (?, ?, ?, ?, ?, ?, ?)`,
			string(ev.Scope), string(ev.Key), formatTime(ev.At), ev.Actor, ev.Action, ev.Reason, ev.Result)
		return err
	})
	if err != nil {
		return fmt.Errorf("payments: recording the action: %w", err)
	}
	return nil
}

func (h sqliteKeyHistory) KeyEvents(ctx context.Context, scope idem.Scope, key idem.Key, q console.KeyEventsQuery) ([]console.KeyEvent, error) {
	q, err := q.Normalize()
	if err != nil {
		return nil, err
	}
	before := q.Before
	if before == 0 {
		before = math.MaxInt64
	}
	rows, err := h.db.Reader().QueryContext(ctx, `SELECT id, at, actor, action, reason, result FROM key_actions
		WHERE scope = ? AND key = ? AND id < ? ORDER BY id DESC LIMIT ?`,
		string(scope), string(key), before, q.Limit)
	if err != nil {
		return nil, fmt.Errorf("payments: reading the key's history: %w", err)
	}
	defer rows.Close()
	var out []console.KeyEvent
	for rows.Next() {
		ev := console.KeyEvent{Scope: scope, Key: key}
		var at string
		if err := rows.Scan(&ev.ID, &at, &ev.Actor, &ev.Action, &ev.Reason, &ev.Result); err != nil {
			return nil, fmt.Errorf("payments: reading the key's history: %w", err)
		}
		if ev.At, err = parseTime(at); err != nil {
			return nil, fmt.Errorf("payments: reading the key's history: %w", err)
		}
		out = append(out, ev)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("payments: reading the key's history: %w", err)
	}
	return out, nil
}

type pgKeyHistory struct{ db *idempg.DB }

// AddKeyEvent writes in the transaction ctx carries (a settle's, which
// completes the key in the same database), or in one of its own.
func (h pgKeyHistory) AddKeyEvent(ctx context.Context, ev console.KeyEvent) error {
	err := h.db.WithTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO key_actions (scope, key, at, actor, action, reason, result) VALUES ($1, $2, $3, $4, $5, $6, $7)`,
			string(ev.Scope), string(ev.Key), ev.At, ev.Actor, ev.Action, ev.Reason, ev.Result)
		return err
	})
	if err != nil {
		return fmt.Errorf("payments: recording the action: %w", err)
	}
	return nil
}

func (h pgKeyHistory) KeyEvents(ctx context.Context, scope idem.Scope, key idem.Key, q console.KeyEventsQuery) ([]console.KeyEvent, error) {
	q, err := q.Normalize()
	if err != nil {
		return nil, err
	}
	before := q.Before
	if before == 0 {
		before = math.MaxInt64
	}
	rows, err := h.db.Pool().Query(ctx, `SELECT id, at, actor, action, reason, result FROM key_actions
		WHERE scope = $1 AND key = $2 AND id < $3 ORDER BY id DESC LIMIT $4`,
		string(scope), string(key), before, q.Limit)
	if err != nil {
		return nil, fmt.Errorf("payments: reading the key's history: %w", err)
	}
	var out []console.KeyEvent
	ev := console.KeyEvent{Scope: scope, Key: key}
	_, err = pgx.ForEachRow(rows, []any{&ev.ID, &ev.At, &ev.Actor, &ev.Action, &ev.Reason, &ev.Result}, func() error {
		e := ev
		e.At = e.At.UTC()
		out = append(out, e)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("payments: reading the key's history: %w", err)
	}
	return out, nil
}
