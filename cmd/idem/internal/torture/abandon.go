package torture

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem/idemsqlite"
)

// completerEvery is the replicas' completer interval (payments' default).
const completerEvery = time.Second

// completerBound is how long after the last kill the replicas' completers
// must have finished every abandoned payment: a lease for the holder's to
// end, a round, and a resume (bounded by nine tenths of a lease), twice
// over (a completer killed in the middle of a resume, its lease to end in
// turn), and time for a crashed replica to start again.
func (r *run) completerBound() time.Duration {
	one := r.cfg.KeyLease + completerEvery + r.cfg.KeyLease*9/10
	return 2*one + 10*time.Second
}

// reviveExited starts again every replica that ended by itself and is
// still down once the load is over: one that a crash-after-charge fault
// made SIGKILL itself in the load's last moments, which the revive loop,
// stopped with the load, left down. The checks ask every replica.
func (r *run) reviveExited(ctx context.Context) error {
	r.chaos.Lock()
	defer r.chaos.Unlock()
	for i, rp := range r.replicas {
		select {
		case <-rp.exited():
		default:
			continue
		}
		r.crashes.Add(1)
		r.proxies[i].setUpstream("")
		if err := rp.start(ctx); err != nil {
			return fmt.Errorf("torture: restarting after a crash: %w", err)
		}
		r.proxies[i].setUpstream(rp.baseURL())
	}
	return nil
}

// awaitCompleters waits, once the load is over, until no key is in flight
// with a recovery point: every execution that stopped after its point
// (the abandoned payments, whose clients never came back) has been finished
// by a replica's completer. It returns how long the wait took, and how
// many keys were still unfinished when completerBound passed.
func (r *run) awaitCompleters(ctx context.Context) (time.Duration, int, error) {
	started := time.Now()
	deadline := started.Add(r.completerBound())
	for {
		n, err := r.pendingRecovery(ctx)
		if err != nil {
			return 0, 0, err
		}
		if n == 0 || time.Now().After(deadline) {
			return time.Since(started), n, nil
		}
		t := time.NewTimer(100 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return 0, 0, ctx.Err()
		case <-t.C:
		}
	}
}

// pendingRecovery counts the keys in flight with a recovery point.
func (r *run) pendingRecovery(ctx context.Context) (int, error) {
	const q = `SELECT count(*) FROM %sidem_keys WHERE state = 'in_flight' AND recovery_point IS NOT NULL`
	var n int
	if r.schema != "" {
		conn, err := pgx.Connect(ctx, r.pgURL)
		if err != nil {
			return 0, fmt.Errorf("torture: reading the keys: %w", err)
		}
		defer conn.Close(context.WithoutCancel(ctx))
		if err := conn.QueryRow(ctx, fmt.Sprintf(q, pgx.Identifier{r.schema}.Sanitize()+".")).Scan(&n); err != nil {
			return 0, fmt.Errorf("torture: reading the keys: %w", err)
		}
		return n, nil
	}
	db, err := idemsqlite.Open(r.sqlite, nil)
	if err != nil {
		return 0, fmt.Errorf("torture: reading the keys: %w", err)
	}
	defer db.Close()
	if err := db.Reader().QueryRowContext(ctx, fmt.Sprintf(q, "")).Scan(&n); err != nil {
		return 0, fmt.Errorf("torture: reading the keys: %w", err)
	}
	return n, nil
}

// slowestCompletion is the longest time from an abandoned payment's client
// giving up to its key's completion (by a completer, since nobody else
// asked), among those completed.
func (r *run) slowestCompletion(ctx context.Context) (time.Duration, error) {
	gaveUp := map[string]time.Time{}
	for _, lp := range r.payments {
		lp.mu.Lock()
		if lp.abandoned && !lp.gaveUpAt.IsZero() {
			gaveUp[lp.key] = lp.gaveUpAt
		}
		lp.mu.Unlock()
	}
	completed := map[string]time.Time{}
	const q = `SELECT key, completed_at FROM %sidem_keys WHERE scope = $1 AND state = 'completed'`
	if r.schema != "" {
		conn, err := pgx.Connect(ctx, r.pgURL)
		if err != nil {
			return 0, fmt.Errorf("torture: reading the keys: %w", err)
		}
		defer conn.Close(context.WithoutCancel(ctx))
		rows, err := conn.Query(ctx, fmt.Sprintf(q, pgx.Identifier{r.schema}.Sanitize()+"."), tenant)
		if err != nil {
			return 0, fmt.Errorf("torture: reading the keys: %w", err)
		}
		for rows.Next() {
			var key string
			var at time.Time
			if err := rows.Scan(&key, &at); err != nil {
				return 0, fmt.Errorf("torture: reading the keys: %w", err)
			}
			completed[key] = at
		}
		if err := rows.Err(); err != nil {
			return 0, fmt.Errorf("torture: reading the keys: %w", err)
		}
	} else {
		db, err := idemsqlite.Open(r.sqlite, nil)
		if err != nil {
			return 0, fmt.Errorf("torture: reading the keys: %w", err)
		}
		defer db.Close()
		rows, err := db.Reader().QueryContext(ctx, fmt.Sprintf(q, ""), tenant)
		if err != nil {
			return 0, fmt.Errorf("torture: reading the keys: %w", err)
		}
		defer rows.Close()
		for rows.Next() {
			var key string
			var at int64
			if err := rows.Scan(&key, &at); err != nil {
				return 0, fmt.Errorf("torture: reading the keys: %w", err)
			}
			completed[key] = time.Unix(0, at)
		}
		if err := rows.Err(); err != nil {
			return 0, fmt.Errorf("torture: reading the keys: %w", err)
		}
	}
	var slowest time.Duration
	for key, t := range gaveUp {
		if at, ok := completed[key]; ok {
			slowest = max(slowest, at.Sub(t))
		}
	}
	return slowest, nil
}
