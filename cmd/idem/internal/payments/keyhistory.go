package payments

import (
	"context"
	"fmt"

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

func (h sqliteKeyHistory) AddKeyEvent(ctx context.Context, ev console.KeyEvent) error {
	_, err := h.db.Writer().ExecContext(ctx, `INSERT INTO key_actions (scope, key, at, actor, action, reason, result) VALUES (?, ?, ?, ?, ?, ?, ?)`,
		string(ev.Scope), string(ev.Key), formatTime(ev.At), ev.Actor, ev.Action, ev.Reason, ev.Result)
	if err != nil {
		return fmt.Errorf("payments: recording the action: %w", err)
	}
	return nil
}

func (h sqliteKeyHistory) KeyEvents(ctx context.Context, scope idem.Scope, key idem.Key) ([]console.KeyEvent, error) {
	rows, err := h.db.Reader().QueryContext(ctx, `SELECT at, actor, action, reason, result FROM key_actions WHERE scope = ? AND key = ? ORDER BY id`,
		string(scope), string(key))
	if err != nil {
		return nil, fmt.Errorf("payments: reading the key's history: %w", err)
	}
	defer rows.Close()
	var out []console.KeyEvent
	for rows.Next() {
		ev := console.KeyEvent{Scope: scope, Key: key}
		var at string
		if err := rows.Scan(&at, &ev.Actor, &ev.Action, &ev.Reason, &ev.Result); err != nil {
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

func (h pgKeyHistory) AddKeyEvent(ctx context.Context, ev console.KeyEvent) error {
	_, err := h.db.Pool().Exec(ctx, `INSERT INTO key_actions (scope, key, at, actor, action, reason, result) VALUES ($1, $2, $3, $4, $5, $6, $7)`,
		string(ev.Scope), string(ev.Key), ev.At, ev.Actor, ev.Action, ev.Reason, ev.Result)
	if err != nil {
		return fmt.Errorf("payments: recording the action: %w", err)
	}
	return nil
}

func (h pgKeyHistory) KeyEvents(ctx context.Context, scope idem.Scope, key idem.Key) ([]console.KeyEvent, error) {
	rows, err := h.db.Pool().Query(ctx, `SELECT at, actor, action, reason, result FROM key_actions WHERE scope = $1 AND key = $2 ORDER BY id`,
		string(scope), string(key))
	if err != nil {
		return nil, fmt.Errorf("payments: reading the key's history: %w", err)
	}
	var out []console.KeyEvent
	ev := console.KeyEvent{Scope: scope, Key: key}
	_, err = pgx.ForEachRow(rows, []any{&ev.At, &ev.Actor, &ev.Action, &ev.Reason, &ev.Result}, func() error {
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
