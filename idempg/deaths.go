package idempg

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// generationKey keys a connection's generation in its pgconn CustomData.
const generationKey = "idempg.generation"

// deaths counts the pool's connections that died in use: a generation
// that every death ends. A connection dies when the server ends it or the
// network cuts it, and when the server restarts, crashes or fails over,
// every other connection of the pool has died with it, unseen until it is
// used: pgxpool pings only those idle for over a second, so a busy
// service would fail one request per pooled connection after its
// database came back. A connection of an earlier generation is pinged
// before it is handed out again, once: the pool then hands out only live
// ones, at the cost of a round trip per connection after each death.
type deaths struct {
	generation atomic.Uint64
}

// watchDeaths sets the hooks of pcfg that count deaths and ping the
// connections older than the last.
func watchDeaths(pcfg *pgxpool.Config) {
	d := &deaths{}
	// pgxpool calls a ReleaseTracer as a connection is given back, before
	// it destroys a dead one: the next Acquire already sees the death.
	pcfg.ConnConfig.Tracer = d
	pcfg.AfterConnect = func(_ context.Context, conn *pgx.Conn) error {
		conn.PgConn().CustomData()[generationKey] = d.generation.Load()
		return nil
	}
	pcfg.ShouldPing = func(_ context.Context, p pgxpool.ShouldPingParams) bool {
		data := p.Conn.PgConn().CustomData()
		current := d.generation.Load()
		seen, _ := data[generationKey].(uint64)
		// A ping that fails destroys the connection; one that succeeds
		// shows it alive in this generation.
		data[generationKey] = current
		return seen != current || p.IdleDuration > time.Second // pgxpool's own rule, kept
	}
}

// TraceRelease ends the generation when the connection given back has
// died.
func (d *deaths) TraceRelease(_ *pgxpool.Pool, data pgxpool.TraceReleaseData) {
	if data.Conn.IsClosed() {
		d.generation.Add(1)
	}
}

// TraceQueryStart and TraceQueryEnd do nothing: pgxpool looks for a
// ReleaseTracer only in the connections' pgx.QueryTracer.
func (d *deaths) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

func (d *deaths) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
