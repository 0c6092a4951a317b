package torture

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/idem-go/idem"
)

// maxListed bounds the events a violation names one by one.
const maxListed = 10

// check reads the effects back and says whether the promise held: every
// event applied, none twice, none out of its key's order (in sequence
// mode), nothing dead-lettered.
func (r *messagesRun) check(ctx context.Context, elapsed time.Duration) (*MessagesReport, error) {
	ctx, cancel := context.WithTimeout(ctx, phaseTimeout)
	defer cancel()
	kind, _ := brokerKind(r.cfg.Broker)
	name := "torture-messages-" + kind
	if kind == "nats" || kind == "amqp" || kind == "kafka" {
		name += "-" + r.spec.DB
	}
	mode := "key and sequence number"
	switch {
	case r.cfg.Unsafe:
		name += "-unsafe"
		mode = "nothing (unsafe: no inbox)"
	case r.cfg.ByID:
		name += "-byid"
		mode = "event ID"
	}
	rep := &MessagesReport{
		Name: name, Seed: r.cfg.Seed, Consumers: r.cfg.Consumers, Mode: mode,
		Events: r.cfg.Events, Keys: r.cfg.Keys,
		Published: r.published.Load(), Copies: r.copies.Load(),
		OrderKept: !r.cfg.ByID && !r.cfg.Unsafe,
		Kills:     r.kills.Load(), AckKills: r.ackKills.Load(), BrokerRestarts: r.restarts.Load(),
		AppliedLate: r.late, Drained: r.drained,
		Elapsed: elapsed,
		Churns:  r.churns.Load(), HeldPeak: r.heldPeak.Load(), HeldLimit: r.heldLimit.Load(), HeldReports: r.heldReports.Load(),
	}
	if r.cfg.ChurnEvery > 0 && !r.calmAt.IsZero() {
		rep.Churned = true
		rep.CalmRate = float64(r.calmApplied) / r.calmAt.Sub(r.began).Seconds()
		if end := r.began.Add(elapsed); end.After(r.calmAt) {
			rep.ChurnRate = float64(int64(r.cfg.Events)-r.calmApplied) / end.Sub(r.calmAt).Seconds()
		}
	}
	s := r.site
	var lo, hi int64
	if err := s.query(ctx, `SELECT count(*), count(DISTINCT event), coalesce(min(event), 0), coalesce(max(event), 0) FROM torture_effects`,
		&rep.Applied, &rep.Distinct, &lo, &hi); err != nil {
		return nil, fmt.Errorf("torture: counting the effects: %w", err)
	}
	if rep.Applied > 0 && (lo < 0 || hi >= int64(r.cfg.Events)) {
		r.violate("effects of events %d to %d, outside the %d published", lo, hi, r.cfg.Events)
	}

	// Events applied more than once.
	var twice []string
	if err := s.query(ctx, `SELECT count(*) FROM (SELECT event FROM torture_effects GROUP BY event HAVING count(*) > 1) AS t`, &rep.Twice); err != nil {
		return nil, fmt.Errorf("torture: counting the events applied twice: %w", err)
	}
	if rep.Twice > 0 {
		err := s.rows(ctx, fmt.Sprintf(`SELECT event, count(*) FROM torture_effects GROUP BY event HAVING count(*) > 1 ORDER BY event LIMIT %d`, maxListed),
			func(scan func(...any) error) error {
				var event, n int64
				if err := scan(&event, &n); err != nil {
					return err
				}
				twice = append(twice, fmt.Sprintf("%d (%d times)", event, n))
				return nil
			})
		if err != nil {
			return nil, fmt.Errorf("torture: listing the events applied twice: %w", err)
		}
		r.violate("%d events applied more than once: %s%s", rep.Twice, strings.Join(twice, ", "), more(rep.Twice, len(twice)))
	}

	// Events never applied.
	if rep.Distinct < int64(r.cfg.Events) {
		rep.Missing = int64(r.cfg.Events) - rep.Distinct
		var missing []string
		next := int64(0)
		err := s.rows(ctx, `SELECT DISTINCT event FROM torture_effects ORDER BY event`, func(scan func(...any) error) error {
			var event int64
			if err := scan(&event); err != nil {
				return err
			}
			for ; next < event && len(missing) < maxListed; next++ {
				missing = append(missing, fmt.Sprint(next))
			}
			next = event + 1
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("torture: listing the events missing: %w", err)
		}
		for ; next < int64(r.cfg.Events) && len(missing) < maxListed; next++ {
			missing = append(missing, fmt.Sprint(next))
		}
		r.violate("%d events never applied: %s%s", rep.Missing, strings.Join(missing, ", "), more(rep.Missing, len(missing)))
	}

	// A key's events in the order they were applied: each the one after
	// the previous.
	const order = `SELECT key, seq, coalesce(prev, 0) FROM (
		SELECT key, seq, lag(seq) OVER (PARTITION BY key ORDER BY n) AS prev FROM torture_effects) AS t
		WHERE seq <> coalesce(prev, 0) + 1`
	if err := s.query(ctx, `SELECT count(*) FROM (`+order+`) AS o`, &rep.OutOfOrder); err != nil {
		return nil, fmt.Errorf("torture: checking the order: %w", err)
	}
	if rep.OutOfOrder > 0 && rep.OrderKept {
		var first []string
		err := s.rows(ctx, order+fmt.Sprintf(` ORDER BY key LIMIT %d`, maxListed), func(scan func(...any) error) error {
			var key, seq, prev int64
			if err := scan(&key, &seq, &prev); err != nil {
				return err
			}
			first = append(first, fmt.Sprintf("k%d: %d after %d", key, seq, prev))
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("torture: listing the events out of order: %w", err)
		}
		r.violate("%d effects out of their key's order: %s%s", rep.OutOfOrder, strings.Join(first, ", "), more(rep.OutOfOrder, len(first)))
	}

	stats, err := s.letters.Stats(ctx)
	if err != nil {
		return nil, fmt.Errorf("torture: reading the dead letters: %w", err)
	}
	for _, st := range stats {
		rep.DeadLetters += int64(st.Count)
	}
	if rep.DeadLetters > 0 {
		letters, err := s.letters.List(ctx, idem.DeadLetterFilter{Consumer: messagesConsumer, Limit: 3})
		if err != nil {
			return nil, fmt.Errorf("torture: reading the dead letters: %w", err)
		}
		var why []string
		for _, dl := range letters {
			why = append(why, fmt.Sprintf("%s (%s: %s)", dl.Message.ID, dl.Class, dl.LastError()))
		}
		r.violate("%d messages dead-lettered: %s%s", rep.DeadLetters, strings.Join(why, "; "), more(rep.DeadLetters, len(why)))
	}
	rep.Violations = r.violations
	return rep, nil
}

// more is ", …" when n is more than the listed.
func more(n int64, listed int) string {
	if n > int64(listed) {
		return ", …"
	}
	return ""
}
