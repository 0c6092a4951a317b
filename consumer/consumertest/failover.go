package consumertest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consumer"
	"github.com/idem-go/idem/idemmem"
)

// EventFailover configures RunEventFailover: a transport on a cluster,
// and what to do to the cluster while events flow through it.
type EventFailover struct {
	// Engine names the cluster in the figures' reports ("nats").
	Engine string
	// Report receives each figure of the run (idemtest.ClusterResult
	// prints them as RESULT lines). Defaults to the test's log.
	Report func(t testing.TB, engine, metric string, value any, unit string)
	// Publisher and Subscriber are the transport under test, on the
	// cluster.
	Publisher  idem.Publisher
	Subscriber idem.Subscriber
	// Topic is what the events are published to. Defaults to "events".
	Topic string
	// Keys is the number of keys, each with its own sequence of events.
	// Defaults to 8.
	Keys int
	// PerKey is the number of events of each key. Defaults to 40
	// (idemtest.ClusterScale multiplies it for a longer run).
	PerKey int
	// PublishTimeout bounds one attempt to publish an event; an attempt
	// that fails or times out is made again with the same message ID.
	// Defaults to 5s.
	PublishTimeout time.Duration
	// AckWait is the consumer's AckWait. Defaults to 5s.
	AckWait time.Duration
	// Sequence makes the consumer de-duplicate by key and sequence number
	// (consumer.Config.Sequence, with the gap held) rather than by message
	// ID: a key's event that arrives before the one ahead of it waits for
	// it. Out-of-order effects then fail the test; without it they are
	// counted and reported only, since a transport may hand a key's
	// message out again after its successors (one lost in a failover and
	// redelivered after its AckWait), and the consumer, seeing the ID only,
	// applies each as it comes. Defaults to false.
	Sequence bool
	// Pace is the pause between two events of a key, so that the events
	// flow before, during and after the failover. Defaults to 20ms.
	Pace time.Duration
	// Subscribed, when set, is called once the consumer has subscribed,
	// before anything is published: the queue or consumer it made exists,
	// and its leader can be looked up ahead of the kill.
	Subscribed func(t testing.TB)
	// Kill is called once a third of the events are acknowledged: it
	// kills the node that leads (and may wait for the cluster to elect
	// another). Required.
	Kill func(t testing.TB)
	// Restart is called once two thirds are acknowledged: it starts the
	// killed node again. Required.
	Restart func(t testing.TB)
	// Settle bounds the wait, after the last publish, for every event to
	// be applied. Defaults to 60s.
	Settle time.Duration
}

// EventFigures are what RunEventFailover counted.
type EventFigures struct {
	// Published is the number of events, each acknowledged by the
	// transport once.
	Published int
	// PublishRetries counts attempts that failed and were made again with
	// the same message ID.
	PublishRetries int
	// Applied counts the events whose effect committed, and AppliedTwice
	// those whose effect committed more than once (zero, or the inbox let
	// a duplicate through).
	Applied, AppliedTwice int
	// Missing counts acknowledged events never applied within Settle.
	Missing int
	// Duplicates counts deliveries the inbox absorbed.
	Duplicates int64
	// OutOfOrder counts effects applied out of their key's sequence.
	OutOfOrder int
	// LongestStall is the longest time between two acknowledged publishes:
	// how long the cluster took publishes in, at worst.
	LongestStall time.Duration
	// Elapsed is the run's length, from the first publish to the last
	// effect.
	Elapsed time.Duration
}

// RunEventFailover publishes Keys × PerKey events (each key's in order, one
// at a time, re-sent with the same message ID until acknowledged) through
// the transport, consumes them with the consumer package into idemmem's
// de-duplicating inbox, whose committed effects it records, kills a node
// a third of the way and restarts it at two thirds, then waits for every
// event to be applied and counts. It reports each figure to Report and
// returns them; a figure that breaks a guarantee
// (missing, applied twice, out of order) fails the test.
func RunEventFailover(t *testing.T, f EventFailover) EventFigures {
	t.Helper()
	if f.Kill == nil || f.Restart == nil {
		t.Fatal("consumertest.EventFailover: Kill and Restart are required")
	}
	if f.Topic == "" {
		f.Topic = "events"
	}
	if f.Report == nil {
		f.Report = func(t testing.TB, engine, metric string, value any, unit string) {
			t.Logf("%s: %s = %v %s", engine, metric, value, unit)
		}
	}
	if f.Keys == 0 {
		f.Keys = 8
	}
	if f.PerKey == 0 {
		f.PerKey = 40
	}
	if f.PublishTimeout == 0 {
		f.PublishTimeout = 5 * time.Second
	}
	if f.AckWait == 0 {
		f.AckWait = 5 * time.Second
	}
	if f.Pace == 0 {
		f.Pace = 20 * time.Millisecond
	}
	if f.Settle == 0 {
		f.Settle = 60 * time.Second
	}
	total := f.Keys * f.PerKey

	type effect struct {
		key string
		seq int
		id  string
	}
	var mu sync.Mutex
	var effects []effect
	cc := &consumer.Config{
		Name:        "cluster",
		Topic:       f.Topic,
		Subscriber:  f.Subscriber,
		Inbox:       idemmem.NewInbox(),
		DeadLetters: idemmem.NewDeadLetters(nil),
		Ledger:      idemmem.NewLedger(),
		InTx:        idemmem.Transact,
		AckWait:     f.AckWait,
		// Enough attempts for a gap to close after an AckWait or two.
		Retry:       idem.RetryPolicy{MaxAttempts: 60, Base: 20 * time.Millisecond, Cap: 500 * time.Millisecond},
		Resubscribe: idem.RetryPolicy{Base: 50 * time.Millisecond, Cap: 500 * time.Millisecond},
	}
	if f.Sequence {
		cc.Sequence = func(m idem.Message) (string, uint64, error) {
			seq, err := strconv.ParseUint(m.Headers["Seq"], 10, 64)
			return m.Key, seq, err
		}
	}
	c, err := consumer.New(cc)
	if err != nil {
		t.Fatalf("consumer.New: %v", err)
	}
	handler := func(ctx context.Context, m idem.Message) error {
		seq, err := strconv.Atoi(m.Headers["Seq"])
		if err != nil {
			return idem.Permanent(err)
		}
		tx, ok := idemmem.TxFromContext(ctx)
		if !ok {
			return idem.Permanent(errors.New("no transaction in the handler's context"))
		}
		return tx.OnCommit(func() {
			mu.Lock()
			defer mu.Unlock()
			effects = append(effects, effect{m.Key, seq, m.ID})
		})
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, handler) }()
	stop := func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("consumer Run: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("consumer Run did not return within 30s of cancel")
		}
	}
	select {
	case <-c.Subscribed():
	case err := <-done:
		cancel()
		t.Fatalf("consumer Run ended before subscribing: %v", err)
	case <-time.After(30 * time.Second):
		stop()
		t.Fatal("consumer did not subscribe within 30s")
	}

	if f.Subscribed != nil {
		f.Subscribed(t)
	}

	var (
		acked, retries atomic.Int64
		stallMu        sync.Mutex
		lastAck        time.Time
		stall          time.Duration
	)
	third, twoThirds := make(chan struct{}), make(chan struct{})
	var thirdOnce, twoOnce sync.Once
	began := time.Now()
	lastAck = began
	pubCtx, pubCancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer pubCancel()
	var wg sync.WaitGroup
	pubErrs := make(chan error, f.Keys)
	for k := range f.Keys {
		key := fmt.Sprintf("key%02d", k)
		wg.Go(func() {
			for seq := 1; seq <= f.PerKey; seq++ {
				if seq > 1 {
					pace := time.NewTimer(f.Pace)
					select {
					case <-pace.C:
					case <-pubCtx.Done():
						pace.Stop()
					}
				}
				m := idem.Message{ID: fmt.Sprintf("%s-%04d", key, seq), Topic: f.Topic, Key: key,
					Headers: map[string]string{"Seq": strconv.Itoa(seq)}, Payload: []byte(key)}
				for {
					actx, acancel := context.WithTimeout(pubCtx, f.PublishTimeout)
					err := f.Publisher.Publish(actx, m)
					acancel()
					if err == nil {
						break
					}
					if pubCtx.Err() != nil {
						pubErrs <- fmt.Errorf("publish %s: gave up: %w", m.ID, err)
						return
					}
					retries.Add(1)
					wait := time.NewTimer(100 * time.Millisecond)
					select {
					case <-wait.C:
					case <-pubCtx.Done():
						wait.Stop()
					}
				}
				now := time.Now()
				stallMu.Lock()
				stall = max(stall, now.Sub(lastAck))
				lastAck = now
				stallMu.Unlock()
				n := acked.Add(1)
				if n >= int64(total/3) {
					thirdOnce.Do(func() { close(third) })
				}
				if n >= int64(2*total/3) {
					twoOnce.Do(func() { close(twoThirds) })
				}
			}
		})
	}
	published := make(chan struct{})
	go func() {
		wg.Wait()
		close(published)
	}()
	phase := func(ch <-chan struct{}, what string) bool {
		select {
		case <-ch:
			return true
		case <-published:
			select {
			case <-ch:
				return true
			default:
			}
			t.Errorf("the publishers ended before %s", what)
			return false
		}
	}
	if phase(third, "a third was acknowledged") {
		f.Kill(t)
	}
	if phase(twoThirds, "two thirds were acknowledged") {
		f.Restart(t)
	}
	<-published
	close(pubErrs)
	for err := range pubErrs {
		t.Error(err)
	}

	unique := func() (applied, twice int) {
		mu.Lock()
		defer mu.Unlock()
		seen := make(map[string]int, len(effects))
		for _, e := range effects {
			seen[e.id]++
		}
		for _, n := range seen {
			if n > 1 {
				twice++
			}
		}
		return len(seen), twice
	}
	deadline := time.Now().Add(f.Settle)
	for step := time.Millisecond; ; step = min(2*step, 50*time.Millisecond) {
		if n, _ := unique(); n >= int(acked.Load()) || time.Now().After(deadline) {
			break
		}
		time.Sleep(step)
	}
	elapsed := time.Since(began)
	stop()

	fig := EventFigures{Published: int(acked.Load()), PublishRetries: int(retries.Load()),
		Duplicates: c.Stats().Duplicates, LongestStall: stall, Elapsed: elapsed}
	fig.Applied, fig.AppliedTwice = unique()
	fig.Missing = fig.Published - fig.Applied
	mu.Lock()
	last := make(map[string]int)
	for _, e := range effects {
		if e.seq != last[e.key]+1 && e.seq > last[e.key] {
			fig.OutOfOrder++
		}
		if e.seq < last[e.key] {
			fig.OutOfOrder++
			continue
		}
		last[e.key] = e.seq
	}
	mu.Unlock()

	if f.Sequence {
		f.Engine += "-sequence"
	}
	f.Report(t, f.Engine, "events-published", fig.Published, "events")
	f.Report(t, f.Engine, "events-applied", fig.Applied, "events")
	f.Report(t, f.Engine, "events-missing", fig.Missing, "events")
	f.Report(t, f.Engine, "events-applied-twice", fig.AppliedTwice, "events")
	f.Report(t, f.Engine, "duplicates-absorbed", fig.Duplicates, "deliveries")
	f.Report(t, f.Engine, "out-of-order", fig.OutOfOrder, "effects")
	f.Report(t, f.Engine, "publish-retries", fig.PublishRetries, "attempts")
	f.Report(t, f.Engine, "longest-publish-stall", fig.LongestStall.Milliseconds(), "ms")
	f.Report(t, f.Engine, "elapsed", elapsed.Milliseconds(), "ms")
	if fig.Missing != 0 {
		t.Errorf("%d of %d acknowledged events were never applied", fig.Missing, fig.Published)
	}
	if fig.AppliedTwice != 0 {
		t.Errorf("%d events were applied twice: the inbox let a duplicate through", fig.AppliedTwice)
	}
	if dead := c.Stats().DeadLettered; dead != 0 {
		t.Errorf("%d events were dead-lettered", dead)
	}
	switch {
	case fig.OutOfOrder != 0 && f.Sequence:
		t.Errorf("%d effects were applied out of their key's order, with the consumer holding gaps", fig.OutOfOrder)
	case fig.OutOfOrder != 0:
		t.Logf("%d effects were applied out of their key's order: the consumer de-duplicates by message ID, "+
			"and applies a key's message that the transport hands out again after its successors; "+
			"consumer.Config.Sequence holds them instead", fig.OutOfOrder)
	}
	return fig
}
