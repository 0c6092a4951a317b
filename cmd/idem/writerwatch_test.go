package main

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem/idemsqlite"
)

// The writer watchdog dumps every goroutine's stack the first time it
// finds a turn of the writer held past its limit, once per hold: a longer
// reading of the same hold adds nothing, and a new hold past the limit is
// dumped again.
func TestWatchWriterDumpsOncePerHold(t *testing.T) {
	readings := []idemsqlite.WriterState{
		{},
		{Held: time.Second, Waiting: 3},
		{Held: 6 * time.Second, Waiting: 4, Renewals: 2}, // past the limit: dumped
		{Held: 9 * time.Second, Waiting: 5},              // the same hold
		{Held: 2 * time.Second},                          // another, within the limit
		{Held: 7 * time.Second, Waiting: 1},              // past it: dumped
	}
	var mu sync.Mutex
	next := 0
	state := func() idemsqlite.WriterState {
		mu.Lock()
		defer mu.Unlock()
		ws := readings[next]
		next++
		return ws
	}
	var logs, out bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	tick := make(chan time.Time)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		watchWriter(ctx, tick, 5*time.Second, state, logger, &out)
	}()
	for range readings {
		tick <- time.Time{}
	}
	cancel()
	<-done
	if n := strings.Count(logs.String(), "sqlite writer watchdog"); n != 2 {
		t.Errorf("%d log records, want 2 (one per hold past the limit):\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), "held=6s") || !strings.Contains(logs.String(), "renewals_queued=2") || !strings.Contains(logs.String(), "held=7s") {
		t.Errorf("the records do not say how long, and what was queued:\n%s", logs.String())
	}
	dump := out.String()
	if n := strings.Count(dump, "sqlite writer watchdog: goroutines"); n != 2 {
		t.Errorf("%d dumps, want 2", n)
	}
	if !strings.Contains(dump, "goroutine ") || !strings.Contains(dump, "TestWatchWriterDumpsOncePerHold") {
		t.Errorf("the dump holds no goroutine stacks (the test's own among them):\n%.2000s", dump)
	}
}

// $IDEM_SQLITE_WRITER_WATCHDOG is a duration; anything else is refused,
// naming the variable.
func TestWriterWatchdogEnv(t *testing.T) {
	for v, want := range map[string]time.Duration{"": 0, "0": 0, "5s": 5 * time.Second, "250ms": 250 * time.Millisecond} {
		a := &app{lookupEnv: func(k string) (string, bool) { return v, k == envWriterWatchdog }}
		if got, err := a.writerWatchdog(); err != nil || got != want {
			t.Errorf("%q: %v, %v; want %v", v, got, err, want)
		}
	}
	for _, v := range []string{"5", "soon", "-1s"} {
		a := &app{lookupEnv: func(k string) (string, bool) { return v, k == envWriterWatchdog }}
		if _, err := a.writerWatchdog(); err == nil || !strings.Contains(err.Error(), envWriterWatchdog) {
			t.Errorf("%q: %v; want an error naming %s", v, err, envWriterWatchdog)
		}
	}
}

// A failed torture test prints, from the replicas' log, the writer
// watchdog's records and the stacks that follow each, and nothing else of
// the log; within its bound.
func TestWriterWatchdogDumpsFromTheReplicasLog(t *testing.T) {
	log := `replica 0: time=… level=WARN msg="took over an expired lease"
replica 1: time=… level=ERROR msg="sqlite writer watchdog: one transaction has held the writer past the limit" held=6s
replica 1: sqlite writer watchdog: goroutines, the writer held 6s:
replica 0: time=… level=ERROR msg="lease not renewed"
replica 1: goroutine 7 [select]:
replica 1: idemsqlite.(*writerQueue).acquire(…)
replica 1: sqlite writer watchdog: end of the goroutines
replica 1: time=… level=WARN msg="could not renew the lease"
`
	want := `replica 1: time=… level=ERROR msg="sqlite writer watchdog: one transaction has held the writer past the limit" held=6s
replica 1: sqlite writer watchdog: goroutines, the writer held 6s:
replica 1: goroutine 7 [select]:
replica 1: idemsqlite.(*writerQueue).acquire(…)
replica 1: sqlite writer watchdog: end of the goroutines
`
	if got := writerWatchdogDumps(log, 100); got != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
	if got := writerWatchdogDumps(log, 2); !strings.HasSuffix(got, "… (the rest is in replicas.log)\n") || strings.Count(got, "\n") != 3 {
		t.Errorf("bounded to 2 lines:\n%s", got)
	}
	if got := writerWatchdogDumps("replica 0: level=WARN msg=x\n", 100); got != "" {
		t.Errorf("a log without a dump: %q; want nothing", got)
	}
}
