package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"runtime/pprof"
	"time"

	"github.com/idem-go/idem/idemsqlite"
)

// envWriterWatchdog is the environment variable of serve's SQLite writer
// watchdog: a duration (5s), past which a turn of the single writer held
// by one transaction makes serve log it and write every goroutine's stack
// on stderr, while the holder is still at it. Every write of the process
// waits for that turn, lease renewals included, so the stacks name what
// holds the whole process up; a goroutine dump taken after the fact names
// nothing. Unset, or 0, for none. The torture runs set it on their
// replicas, whose logs they keep.
const envWriterWatchdog = "IDEM_SQLITE_WRITER_WATCHDOG"

// writerWatchdog reads $IDEM_SQLITE_WRITER_WATCHDOG: 0 when unset.
func (a *app) writerWatchdog() (time.Duration, error) {
	v, ok := a.lookupEnv(envWriterWatchdog)
	if !ok || v == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("$%s=%q: want a duration such as 5s, or 0 for no watchdog", envWriterWatchdog, v)
	}
	return d, nil
}

// startWriterWatch runs watchWriter on db, looking every quarter of limit,
// until the returned stop is called.
func startWriterWatch(db *idemsqlite.DB, limit time.Duration, logger *slog.Logger, w io.Writer) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	t := time.NewTicker(max(limit/4, time.Millisecond))
	done := make(chan struct{})
	go func() {
		defer close(done)
		watchWriter(ctx, t.C, limit, db.WriterState, logger, w)
	}()
	return func() {
		cancel()
		t.Stop()
		<-done
	}
}

// watchWriter reads state at each tick until ctx ends. The first tick
// that finds the writer's turn held longer than limit logs it and writes
// the stacks of every goroutine to w; the same hold is dumped once (a
// reading whose Held is not past the last one's is another hold, or none).
func watchWriter(ctx context.Context, tick <-chan time.Time, limit time.Duration, state func() idemsqlite.WriterState, logger *slog.Logger, w io.Writer) {
	var last time.Duration
	dumped := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick:
		}
		ws := state()
		if ws.Held <= last {
			dumped = false
		}
		last = ws.Held
		if dumped || ws.Held <= limit {
			continue
		}
		dumped = true
		logger.Error("sqlite writer watchdog: one transaction has held the writer past the limit; every goroutine's stack follows on stderr",
			"held", ws.Held.Round(time.Millisecond), "limit", limit, "waiting", ws.Waiting, "renewals_queued", ws.Renewals)
		fmt.Fprintf(w, "sqlite writer watchdog: goroutines, the writer held %s:\n", ws.Held.Round(time.Millisecond))
		_ = pprof.Lookup("goroutine").WriteTo(w, 2)
		fmt.Fprintln(w, "sqlite writer watchdog: end of the goroutines")
	}
}
