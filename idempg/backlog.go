package idempg

import (
	"context"
	"fmt"
	"time"

	"github.com/idem-go/idem/internal/pgsql"
)

// Backlog returns how many entries wait in the outbox to be relayed, and
// when the oldest of them was added (zero when none waits): what a gauge
// of the relay's backlog reads (idemprom.RegisterOutbox). Entries leased
// to a relay still wait: they leave the outbox when they are marked sent.
func (o *Outbox) Backlog(ctx context.Context) (entries int, oldest time.Time, err error) {
	var (
		n     int64
		first *time.Time
	)
	err = o.db.readQuerier(ctx).QueryRow(ctx, `SELECT count(*), min(created_at) FROM idem_outbox`).Scan(&n, &first)
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("idempg: outbox backlog: %w", err)
	}
	return int(n), pgsql.TimeOf(first), nil
}
