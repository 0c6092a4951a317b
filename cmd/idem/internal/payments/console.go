package payments

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/acquirer"
	"github.com/idem-go/idem/console"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/idemsqlite"
)

// ConsoleInsights returns what the operators' console (package console)
// shows of a Service on the SQLite database db beyond its dead letters:
// the messages parked behind each letter, whether a re-driven letter was
// settled, the consumers' outcomes, the outbox backlog and the settlement
// lag. It reads the database only; the service need not run in this
// process. The database must have been migrated (by New or
// DeadLetterService).
func ConsoleInsights(db *idemsqlite.DB) (console.Insights, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: DB is required", ErrConfig)
	}
	return &insights{q: sqliteInsights{db: db.Reader()}}, nil
}

// ConsoleInsightsPostgres is ConsoleInsights for a Service on PostgreSQL.
func ConsoleInsightsPostgres(db *idempg.DB) (console.Insights, error) {
	if db == nil {
		return nil, fmt.Errorf("%w: Postgres is required", ErrConfig)
	}
	return &insights{q: pgInsights{db: db}}, nil
}

// insightQueries are the reads, in each database's dialect.
type insightQueries interface {
	parkedCounts(ctx context.Context) (map[string]int, error)
	processedAt(ctx context.Context, consumer, dedupKey string) (time.Time, bool, error)
	// outcomes counts, per consumer, what happened since since: messages
	// processed, messages failing, letters per state entered.
	outcomes(ctx context.Context, since time.Time) (map[string]*console.ConsumerOutcomes, error)
	outbox(ctx context.Context) (int, time.Time, error)
	unsettled(ctx context.Context) (int, time.Time, error)
}

type insights struct{ q insightQueries }

func (in *insights) ParkedCounts(ctx context.Context) (map[string]int, error) {
	m, err := in.q.parkedCounts(ctx)
	if err != nil {
		return nil, fmt.Errorf("payments: parked counts: %w", err)
	}
	return m, nil
}

// Processed implements console.Insights: the settlement consumer
// de-duplicates by the event's event_id, so a re-driven event was settled
// when the inbox holds its event_id. A body without one (a malformed
// event) is reported as not processed: its edited copy may carry one the
// letter does not show.
func (in *insights) Processed(ctx context.Context, consumer string, m idem.Message) (time.Time, bool, error) {
	if consumer != SettlementConsumer {
		return time.Time{}, false, nil
	}
	key, err := eventDedupKey(m)
	if err != nil {
		return time.Time{}, false, nil
	}
	at, ok, err := in.q.processedAt(ctx, consumer, key)
	if err != nil {
		return time.Time{}, false, fmt.Errorf("payments: reading the inbox: %w", err)
	}
	return at, ok, nil
}

func (in *insights) Overview(ctx context.Context, since time.Time) (console.Overview, error) {
	var ov console.Overview
	by, err := in.q.outcomes(ctx, since)
	if err != nil {
		return ov, fmt.Errorf("payments: consumer outcomes: %w", err)
	}
	for _, o := range by {
		ov.Consumers = append(ov.Consumers, *o)
	}
	slices.SortFunc(ov.Consumers, func(a, b console.ConsumerOutcomes) int { return cmp.Compare(a.Consumer, b.Consumer) })
	n, oldest, err := in.q.outbox(ctx)
	if err != nil {
		return ov, fmt.Errorf("payments: outbox backlog: %w", err)
	}
	ov.Backlogs = append(ov.Backlogs, console.Backlog{Name: "outbox", Count: n, Oldest: oldest,
		Help: "events written with their payment and not yet published by the relay"})
	n, oldest, err = in.q.unsettled(ctx)
	if err != nil {
		return ov, fmt.Errorf("payments: settlement lag: %w", err)
	}
	ov.Backlogs = append(ov.Backlogs, console.Backlog{Name: "settlement", Count: n, Oldest: oldest,
		Help: "payments and refunds not yet settled; the age of the oldest is the settlement lag (a dead-lettered event keeps its payment here)"})
	return ov, nil
}

// outcome returns by's entry for consumer, made when missing.
func outcome(by map[string]*console.ConsumerOutcomes, consumer string) *console.ConsumerOutcomes {
	o := by[consumer]
	if o == nil {
		o = &console.ConsumerOutcomes{Consumer: consumer}
		by[consumer] = o
	}
	return o
}

// addLetterState counts n letters of consumer that entered state.
func addLetterState(o *console.ConsumerOutcomes, state string, n int) {
	switch idem.LetterState(state) {
	case idem.LetterDead:
		o.DeadLettered += n
	case idem.LetterRedriven:
		o.Redriven += n
	case idem.LetterDiscarded:
		o.Discarded += n
	}
}

// The reads shared by both dialects but for placeholders and time types.
const (
	// A letter's hold counts only while the key is held behind it.
	parkedCountsSQL = `SELECT h.letter_id, count(*) FROM idem_ledger_holds h
		JOIN idem_ledger_parked p ON p.consumer = h.consumer AND p.key = h.key
		GROUP BY h.letter_id`
	letterEventsSQL = `SELECT l.consumer, e.state, count(*) FROM idem_dead_letter_events e
		JOIN idem_dead_letters l ON l.id = e.letter_id WHERE e.at >= %s GROUP BY l.consumer, e.state`
	processedSQL = `SELECT consumer, count(*) FROM idem_inbox WHERE processed_at >= %s GROUP BY consumer`
	failingSQL   = `SELECT consumer, count(DISTINCT dedup_key) FROM idem_ledger_attempts WHERE at >= %s GROUP BY consumer`
)

// sqliteInsights reads a SQLite database, whose message times are unix
// nanoseconds and whose payments' times are fixed-width text.
type sqliteInsights struct{ db *sql.DB }

func (s sqliteInsights) parkedCounts(ctx context.Context) (map[string]int, error) {
	rows, err := s.db.QueryContext(ctx, parkedCountsSQL)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			return nil, err
		}
		out[id] = n
	}
	return out, rows.Err()
}

func (s sqliteInsights) processedAt(ctx context.Context, consumer, key string) (time.Time, bool, error) {
	var n int64
	err := s.db.QueryRowContext(ctx, `SELECT processed_at FROM idem_inbox WHERE consumer = ? AND dedup_key = ?`, consumer, key).Scan(&n)
	if errors.Is(err, sql.ErrNoRows) {
		return time.Time{}, false, nil
	}
	if err != nil {
		return time.Time{}, false, err
	}
	return time.Unix(0, n).UTC(), true, nil
}

func (s sqliteInsights) outcomes(ctx context.Context, since time.Time) (map[string]*console.ConsumerOutcomes, error) {
	by := map[string]*console.ConsumerOutcomes{}
	at := since.UnixNano()
	for _, q := range []struct {
		sql string
		add func(o *console.ConsumerOutcomes, n int)
	}{
		{fmt.Sprintf(processedSQL, "?"), func(o *console.ConsumerOutcomes, n int) { o.Processed += n }},
		{fmt.Sprintf(failingSQL, "?"), func(o *console.ConsumerOutcomes, n int) { o.Failing += n }},
	} {
		rows, err := s.db.QueryContext(ctx, q.sql, at)
		if err != nil {
			return nil, err
		}
		for rows.Next() {
			var c string
			var n int
			if err := rows.Scan(&c, &n); err != nil {
				rows.Close()
				return nil, err
			}
			q.add(outcome(by, c), n)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, err
		}
	}
	rows, err := s.db.QueryContext(ctx, fmt.Sprintf(letterEventsSQL, "?"), at)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var c, state string
		var n int
		if err := rows.Scan(&c, &state, &n); err != nil {
			return nil, err
		}
		addLetterState(outcome(by, c), state, n)
	}
	return by, rows.Err()
}

func (s sqliteInsights) outbox(ctx context.Context) (int, time.Time, error) {
	var n int
	var oldest sql.NullInt64
	if err := s.db.QueryRowContext(ctx, `SELECT count(*), min(created_at) FROM idem_outbox`).Scan(&n, &oldest); err != nil {
		return 0, time.Time{}, err
	}
	if !oldest.Valid {
		return n, time.Time{}, nil
	}
	return n, time.Unix(0, oldest.Int64).UTC(), nil
}

func (s sqliteInsights) unsettled(ctx context.Context) (int, time.Time, error) {
	var n int
	var oldest sql.NullString
	err := s.db.QueryRowContext(ctx, `SELECT count(*), min(created_at) FROM (
		SELECT created_at FROM payments WHERE settled = 0 UNION ALL SELECT created_at FROM refunds WHERE settled = 0)`).Scan(&n, &oldest)
	if err != nil {
		return 0, time.Time{}, err
	}
	if !oldest.Valid {
		return n, time.Time{}, nil
	}
	t, err := parseTime(oldest.String)
	return n, t, err
}

// pgInsights reads a PostgreSQL schema.
type pgInsights struct{ db *idempg.DB }

func (p pgInsights) parkedCounts(ctx context.Context) (map[string]int, error) {
	rows, err := p.db.Pool().Query(ctx, parkedCountsSQL)
	if err != nil {
		return nil, err
	}
	out := map[string]int{}
	var id string
	var n int
	_, err = pgx.ForEachRow(rows, []any{&id, &n}, func() error {
		out[id] = n
		return nil
	})
	return out, err
}

func (p pgInsights) processedAt(ctx context.Context, consumer, key string) (time.Time, bool, error) {
	var at time.Time
	err := p.db.Pool().QueryRow(ctx, `SELECT processed_at FROM idem_inbox WHERE consumer = $1 AND dedup_key = $2`, consumer, key).Scan(&at)
	if errors.Is(err, pgx.ErrNoRows) {
		return time.Time{}, false, nil
	}
	if err != nil {
		return time.Time{}, false, err
	}
	return at.UTC(), true, nil
}

func (p pgInsights) outcomes(ctx context.Context, since time.Time) (map[string]*console.ConsumerOutcomes, error) {
	by := map[string]*console.ConsumerOutcomes{}
	for _, q := range []struct {
		sql string
		add func(o *console.ConsumerOutcomes, n int)
	}{
		{fmt.Sprintf(processedSQL, "$1"), func(o *console.ConsumerOutcomes, n int) { o.Processed += n }},
		{fmt.Sprintf(failingSQL, "$1"), func(o *console.ConsumerOutcomes, n int) { o.Failing += n }},
	} {
		rows, err := p.db.Pool().Query(ctx, q.sql, since)
		if err != nil {
			return nil, err
		}
		var c string
		var n int
		if _, err := pgx.ForEachRow(rows, []any{&c, &n}, func() error { q.add(outcome(by, c), n); return nil }); err != nil {
			return nil, err
		}
	}
	rows, err := p.db.Pool().Query(ctx, fmt.Sprintf(letterEventsSQL, "$1"), since)
	if err != nil {
		return nil, err
	}
	var c, state string
	var n int
	_, err = pgx.ForEachRow(rows, []any{&c, &state, &n}, func() error { addLetterState(outcome(by, c), state, n); return nil })
	return by, err
}

func (p pgInsights) outbox(ctx context.Context) (int, time.Time, error) {
	return p.backlog(ctx, `SELECT count(*), min(created_at) FROM idem_outbox`)
}

func (p pgInsights) unsettled(ctx context.Context) (int, time.Time, error) {
	return p.backlog(ctx, `SELECT count(*), min(created_at) FROM (
		SELECT created_at FROM payments WHERE NOT settled UNION ALL SELECT created_at FROM refunds WHERE NOT settled) AS waiting`)
}

func (p pgInsights) backlog(ctx context.Context, query string) (int, time.Time, error) {
	var n int
	var oldest *time.Time
	if err := p.db.Pool().QueryRow(ctx, query).Scan(&n, &oldest); err != nil {
		return 0, time.Time{}, err
	}
	if oldest == nil {
		return n, time.Time{}, nil
	}
	return n, oldest.UTC(), nil
}

// ShowPoint returns what the console's "Unknown outcomes" page shows of a
// payment's recovery point (console.Config.ShowPoint): the payment, its
// amount, account and tenant, and the digest of the client's key the card
// network names it by, never the key. keys open points the service sealed
// (Config.BodyKeys). A point that is not a payment's is shown by its name.
func ShowPoint(keys []idemhttp.BodyKey) func(ctx context.Context, rec idem.Record) ([]console.PointField, error) {
	return ShowPointAt(keys, nil)
}

// ShowPointAt is ShowPoint that also asks the card network net (nil: none)
// for the charges made under the payment's key, and shows its answer: the
// charge it made, that it made none, or that it cannot be read now (the
// other fields are shown all the same).
func ShowPointAt(keys []idemhttp.BodyKey, net *acquirer.Client) func(ctx context.Context, rec idem.Record) ([]console.PointField, error) {
	return func(ctx context.Context, rec idem.Record) ([]console.PointField, error) {
		if !isChargingPoint(rec.Recovery.Name) {
			return []console.PointField{{Name: "point", Value: rec.Recovery.Name}}, nil
		}
		data, err := idemhttp.OpenPoint(keys, rec.Scope, rec.Key, rec.Recovery.Name, rec.Recovery.Data)
		if err != nil {
			return nil, fmt.Errorf("the point cannot be read: %w (give the console the service's body keys)", err)
		}
		pt, err := decodeCharging(data)
		if err != nil {
			return nil, err
		}
		fields := []console.PointField{
			{Name: "payment", Value: pt.Payment.ID},
			{Name: "amount", Value: fmt.Sprintf("%d %s", pt.Payment.Amount, pt.Payment.Currency)},
			{Name: "account", Value: pt.Payment.AccountID},
			{Name: "tenant", Value: pt.Tenant},
		}
		if pt.ClientKey != "" {
			digest := ClientKeyDigest(pt.Tenant, pt.ClientKey)
			fields = append(fields, console.PointField{Name: "card network's key digest", Value: digest})
			if net != nil {
				fields = append(fields, console.PointField{Name: "card network's answer", Value: networkAnswer(ctx, net, pt.Payment.AccountID, digest)})
			}
		}
		return fields, nil
	}
}

// networkAnswer says what the card network holds under a payment's key
// digest, among the charges of its account.
func networkAnswer(ctx context.Context, net *acquirer.Client, account, digest string) string {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	charges, err := net.Charges(ctx, account)
	if err != nil {
		return "cannot be read now: " + err.Error()
	}
	var made []string
	for _, ch := range charges {
		if ch.Metadata[MetaKeyDigest] == digest {
			made = append(made, fmt.Sprintf("charge %s of %d %s at %s (%d refunded)", ch.ID, ch.Amount, ch.Currency,
				ch.CreatedAt.UTC().Format(time.RFC3339), ch.AmountRefunded))
		}
	}
	if len(made) == 0 {
		return "no charge under this payment's key"
	}
	return "charged: " + strings.Join(made, "; ")
}
