package idemsqlite

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

var sqlOutboxBacklog = messagesSQL(`SELECT count(*), min(created_at) FROM idem_outbox`)

// Backlog returns how many entries wait in the outbox to be relayed, and
// when the oldest of them was added (zero when none waits): what a gauge
// of the relay's backlog reads (idemprom.RegisterOutbox). Entries leased
// to a relay still wait: they leave the outbox when they are marked sent.
func (o *Outbox) Backlog(ctx context.Context) (entries int, oldest time.Time, err error) {
	err = o.db.read(ctx, func(ctx context.Context, r runner) error {
		var first sql.NullInt64
		if err := r.queryRow(ctx, sqlOutboxBacklog).Scan(&entries, &first); err != nil {
			return err
		}
		if first.Valid {
			oldest = time.Unix(0, first.Int64)
		}
		return nil
	})
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("idemsqlite: outbox backlog: %w", err)
	}
	return entries, oldest, nil
}
