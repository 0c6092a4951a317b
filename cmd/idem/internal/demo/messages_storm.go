package demo

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consumer"
)

// The retry storm's plan.
const (
	stormEvents = 100
	// stormReplicas consumers share the consumer name, each with
	// stormWorkers workers: many consumers, failing together.
	stormReplicas = 4
	stormWorkers  = 4
	// outage is how long the dependency is down, from the start.
	outage = time.Second
	// bucket is the width of the windows the dependency counts its calls
	// in, and its capacity is per window.
	bucket = 100 * time.Millisecond
	// cooldown is how long the dependency stays down once more calls than
	// its capacity arrive in one window.
	cooldown = time.Second
	// DefaultCapacity is the dependency's capacity, in calls per bucket,
	// when Options leave it zero.
	DefaultCapacity = 30
)

// StormRow is one run of the retry storm: many consumers whose handler
// calls a dependency that goes down at the start and comes back after
// outage, each retrying with one policy.
type StormRow struct {
	Mode Mode
	// Consumer names the retry policy.
	Consumer string
	// Events is how many events were published; Calls how many calls the
	// handlers made to the dependency, one per attempt.
	Events, Calls int
	// Peak is the most calls the dependency received in one window of
	// 100 ms once it was back; Capacity how many it serves in one.
	Peak, Capacity int
	// FellOver counts the times the dependency, once back, received more
	// calls than its capacity in a window and went down again.
	FellOver int
	// Applied and DeadLettered count the events by how they ended.
	Applied, DeadLettered int
	// Drained is when, on the lab's clock from the start of the outage,
	// the last event ended.
	Drained time.Duration
	// Buckets are the calls in each window of 100 ms from the start.
	Buckets []int
}

// Held reports whether the dependency, once back, never fell over again.
func (r StormRow) Held() bool { return r.FellOver == 0 && r.Peak <= r.Capacity }

// Verdict is "FELL OVER AGAIN (N times)" or "held".
func (r StormRow) Verdict() string {
	switch {
	case r.FellOver == 1:
		return "FELL OVER AGAIN (once)"
	case r.FellOver > 1:
		return fmt.Sprintf("FELL OVER AGAIN (%d times)", r.FellOver)
	case r.Peak > r.Capacity:
		return "over capacity"
	case r.Applied < r.Events:
		return fmt.Sprintf("held, but %d events dead-lettered", r.Events-r.Applied)
	}
	return "held"
}

// dependency is the service the storm's handlers call, counting calls in
// windows of bucket on the lab's clock: down for outage from start, then
// up, until a window receives more than capacity calls; then it serves
// those within capacity, refuses the rest, and stays down for cooldown
// after the window.
type dependency struct {
	start    time.Time
	capacity int

	mu        sync.Mutex
	downUntil time.Time
	calls     map[int]int
	fellOver  int
}

var (
	errDown       = errors.New("ledger service unavailable (503)")
	errOverloaded = errors.New("ledger service overloaded (503): it fell over")
)

func newDependency(start time.Time, capacity int) *dependency {
	return &dependency{start: start, capacity: capacity, downUntil: start.Add(outage), calls: make(map[int]int)}
}

func (d *dependency) call(now time.Time) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	b := int(now.Sub(d.start) / bucket)
	d.calls[b]++
	switch {
	case now.Before(d.downUntil):
		return errDown
	case d.calls[b] > d.capacity:
		d.fellOver++
		d.downUntil = d.start.Add(time.Duration(b+1)*bucket + cooldown)
		return errOverloaded
	}
	return nil
}

// figures returns the calls per window from the start, their sum, the
// most in one window once the dependency was first back, and how often it
// fell over again.
func (d *dependency) figures() (buckets []int, calls, peak, fellOver int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	last := 0
	for b := range d.calls {
		last = max(last, b)
	}
	buckets = make([]int, last+1)
	back := int(outage / bucket)
	for b, n := range d.calls {
		buckets[b] = n
		calls += n
		if b >= back {
			peak = max(peak, n)
		}
	}
	return buckets, calls, peak, d.fellOver
}

// playStorm runs the storm with retry policy policy.
func playStorm(ctx context.Context, l *msgLab, mode Mode, design string, capacity int, policy idem.RetryPolicy) (StormRow, error) {
	run := "storm/" + string(mode)
	clock := newLabClock(l.start)
	tr, err := l.transport(ctx, clock, idlePoll)
	if err != nil {
		return StormRow{}, err
	}
	defer tr.Close()
	topic := "demo.storm." + string(mode)
	msgs := make([]idem.Message, stormEvents)
	for i := range msgs {
		id := fmt.Sprintf("evt_storm_%s_%03d", mode, i)
		msgs[i] = idem.Message{
			ID: id, Topic: topic, Key: fmt.Sprintf("acct-%d", i+1), Time: clock.Now(),
			Headers: map[string]string{"Content-Type": "application/json"},
			Payload: fmt.Appendf(nil, `{"event_id":%q,"amount":%d,"currency":%q}`, id, eventAmount, currency),
		}
	}
	if err := tr.Publish(ctx, msgs...); err != nil {
		return StormRow{}, err
	}

	dep := newDependency(l.start, capacity)
	h := func(ctx context.Context, m idem.Message) error {
		if err := dep.call(clock.Now()); err != nil {
			return err
		}
		return l.exec(ctx, `INSERT INTO demo_applied (run, event, published, applied_at) VALUES (?, ?, ?, ?)`,
			run, m.ID, labTime(m.Time), labTime(clock.Now()))
	}
	w := &wire{Subscriber: tr}
	letters, err := l.lettersOn(ctx, clock)
	if err != nil {
		return StormRow{}, err
	}
	cs := make([]*consumer.Consumer, stormReplicas)
	for i := range cs {
		cs[i], err = consumer.New(&consumer.Config{
			Name: "storm-" + string(mode), Topic: topic,
			Subscriber: w, Inbox: l.inbox, DeadLetters: letters, Ledger: l.ledger, InTx: l.inTx,
			Concurrency: stormWorkers,
			// One message per transaction: one call per attempt, so that
			// the dependency counts attempts, and a batch-mate's failure
			// never makes a call again.
			BatchSize: 1,
			Retry:     policy,
			AckWait:   labAckWait, Clock: clock, Timers: clock, Logger: l.logger,
		})
		if err != nil {
			return StormRow{}, err
		}
	}
	var stops []func() error
	defer func() {
		for _, stop := range stops {
			_ = stop()
		}
	}()
	for _, c := range cs {
		stops = append(stops, runConsumer(ctx, func(ctx context.Context) error { return c.Run(ctx, h) }))
	}
	ended := func() int {
		n := 0
		for _, c := range cs {
			s := c.Stats()
			n += int(s.Processed + s.DeadLettered)
		}
		return n
	}
	// Quiet: every event has ended or waits for its retry's timer.
	quiet := func() bool { return ended()+clock.waiting() == stormEvents }
	done := func() bool { return ended() == stormEvents }
	// The retries due within one window of the dependency's fire together:
	// what the dependency counts is calls per window, and the lab takes
	// one step per window instead of one per retry.
	if err := clock.run(ctx, "the storm's retries", quiet, done, l.start, bucket, l.start.Add(24*time.Hour)); err != nil {
		return StormRow{}, err
	}
	var errs []error
	for _, stop := range stops {
		errs = append(errs, stop())
	}
	if err := errors.Join(errs...); err != nil {
		return StormRow{}, err
	}

	row := StormRow{Mode: mode, Consumer: design, Events: stormEvents, Capacity: capacity}
	row.Buckets, row.Calls, row.Peak, row.FellOver = dep.figures()
	for _, c := range cs {
		row.DeadLettered += int(c.Stats().DeadLettered)
	}
	if err := l.db.Reader().QueryRowContext(ctx, `SELECT count(*) FROM demo_applied WHERE run = ?`, run).
		Scan(&row.Applied); err != nil {
		return StormRow{}, fmt.Errorf("reading the applied events back: %w", err)
	}
	// The clock stopped where the last event ended.
	row.Drained = clock.Now().Sub(l.start)
	return row, nil
}
