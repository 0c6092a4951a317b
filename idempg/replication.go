package idempg

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// ErrAsyncStandby is the Problem of a Warning about a primary that streams
// to a standby without waiting for it at commit: a promotion of that
// standby loses the transactions it had not received, payments and their
// keys together, although the primary acknowledged them.
var ErrAsyncStandby = errors.New("idempg: commits do not wait for the standby: a promotion can lose transactions the primary acknowledged")

// ErrNoSyncStandby is the Problem of a Warning about a primary that waits
// for synchronous standbys of which none is streaming: every commit that
// waits hangs until one is back.
var ErrNoSyncStandby = errors.New("idempg: commits wait for a synchronous standby and none is streaming: they hang until one is back")

// ErrStandby is the Problem of a Warning about a DB connected to a server
// in recovery (a standby): every write fails.
var ErrStandby = errors.New("idempg: the server is a standby (in recovery): every write fails")

// A Warning is a setting found on PostgreSQL under which a commit the
// server acknowledged can be lost in a failover, or cannot happen at all.
// The DB goes on working; the setting wants an operator.
type Warning struct {
	// Setting is the server setting at fault.
	Setting string
	// Problem says what can happen; errors.Is matches it against the
	// package's sentinels (ErrAsyncStandby, ErrNoSyncStandby, ErrStandby).
	Problem error
	// Fix says what mends it.
	Fix string
}

func (w *Warning) Error() string {
	return fmt.Sprintf("idempg: %s: %s; to fix it: %s", w.Setting, strings.TrimPrefix(w.Problem.Error(), "idempg: "), w.Fix)
}

func (w *Warning) Unwrap() error { return w.Problem }

// Warnings asks the server the DB writes to how it replicates, and returns
// what can lose a commit it acknowledged in a failover, or stop commits:
//
//   - a standby streams from it, and commits do not wait for any
//     (synchronous_standby_names empty), or synchronous_commit is off or
//     local (ErrAsyncStandby): set synchronous_standby_names and leave
//     synchronous_commit on (or remote_apply);
//   - synchronous_standby_names names standbys and none is streaming in
//     sync (ErrNoSyncStandby);
//   - the server is itself a standby (ErrStandby): connect with
//     target_session_attrs=read-write, listing every host.
//
// A primary with no standby has no failover to lose commits in, and gets no
// warning. The settings read are the server's defaults for a new session;
// idem's own claims and purges turn synchronous_commit off for themselves,
// which loses nothing (see "Claims: one round trip, asynchronous commit").
func (db *DB) Warnings(ctx context.Context) ([]*Warning, error) {
	var (
		recovery                 bool
		standbys, syncStandbys   int
		standbyNames, syncCommit string
	)
	err := db.pool.QueryRow(ctx, `SELECT pg_is_in_recovery(),
		(SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'),
		(SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming' AND sync_state IN ('sync', 'quorum')),
		current_setting('synchronous_standby_names'),
		(SELECT reset_val FROM pg_settings WHERE name = 'synchronous_commit')`).
		Scan(&recovery, &standbys, &syncStandbys, &standbyNames, &syncCommit)
	if err != nil {
		return nil, fmt.Errorf("idempg: reading the replication settings: %w", err)
	}
	var out []*Warning
	if recovery {
		out = append(out, &Warning{Setting: "pg_is_in_recovery", Problem: ErrStandby,
			Fix: "list every host in the URL with target_session_attrs=read-write, so that the pool connects to the primary"})
		return out, nil
	}
	switch {
	case standbyNames == "" && standbys > 0:
		out = append(out, &Warning{Setting: "synchronous_standby_names", Problem: ErrAsyncStandby,
			Fix: fmt.Sprintf("%d standby streams asynchronously: set synchronous_standby_names (for example 'ANY 1 (*)') so that a commit waits for one", standbys)})
	case standbyNames != "" && (syncCommit == "off" || syncCommit == "local"):
		out = append(out, &Warning{Setting: "synchronous_commit", Problem: ErrAsyncStandby,
			Fix: fmt.Sprintf("synchronous_commit is %s, so no commit waits for the standbys synchronous_standby_names names: set it to on (or remote_apply)", syncCommit)})
	case standbyNames != "" && syncStandbys == 0:
		out = append(out, &Warning{Setting: "synchronous_standby_names", Problem: ErrNoSyncStandby,
			Fix: fmt.Sprintf("no standby that %q names is streaming: bring one back, or empty it (accepting that a promotion can lose commits)", standbyNames)})
	}
	return out, nil
}
