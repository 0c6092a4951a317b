package consumertest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consumer"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/internal/eventually"
)

// OrderOptions configures TestPerKeyOrder. The zero value means the
// defaults.
type OrderOptions struct {
	// Messages and Keys: how many messages, spread evenly over how many
	// ordering keys. Default to 10,000 and 100.
	Messages, Keys int
	// Topic is the topic published and consumed. Defaults to
	// "payments.succeeded".
	Topic string
	// CopiesDelivered says that the transport delivers a message published
	// twice under one ID, so that the consumer's inbox must catch every
	// copy; JetStream, which drops it within its duplicate window, leaves
	// it false.
	CopiesDelivered bool
	// BeforePublish, when set, runs once the consumer runs and before
	// anything is published: to declare a queue that must exist for
	// messages to be routed to it, say.
	BeforePublish func(t *testing.T)
	// Wait bounds how long the wait for every message to be applied may
	// go with none applied (and how long Run may take to return once
	// cancelled). Defaults to 50s: the whole wait takes as long as the
	// machine needs while messages keep being applied, and a hang fails
	// the test rather than the test binary.
	Wait time.Duration

	// Inbox, DeadLetters, Ledger and InTx are the consumer's stores, and
	// the transactions of their database. Default to idemmem's, with
	// idemmem.Transact.
	Inbox       idem.Inbox
	DeadLetters idem.DeadLetters
	Ledger      idem.Ledger
	InTx        func(ctx context.Context, fn func(ctx context.Context) error) error
	// Apply writes a message's effect in the transaction ctx carries (the
	// inbox's): its key, its sequence number within the key (from 1) and
	// its ID. Applied reads back the effects that committed, in commit
	// order. Set both or neither: they default to bookkeeping in memory,
	// on the commit of idemmem's transaction, which needs the default
	// stores.
	Apply   func(ctx context.Context, e AppliedEffect) error
	Applied func(t *testing.T) []AppliedEffect
	// Check, when set, runs after the suite's own checks, with the
	// consumer's final counts: for what only the backend can tell (its
	// deliveries all settled, its inbox rows, its ledger emptied).
	Check func(t *testing.T, s consumer.Stats, messages, copies int)
}

// AppliedEffect is one message's effect, as OrderOptions.Apply writes it.
type AppliedEffect struct {
	Key string
	Seq int
	ID  string
}

var errOrderFlaky = errors.New("dependency unavailable")

// orderFlaky decides, the same way every run, whether an attempt fails:
// about a quarter of first, second and third attempts do; fourth attempts
// never.
func orderFlaky(id string, attempt int) bool {
	if attempt > 3 {
		return false
	}
	h := fnv.New32a()
	fmt.Fprintf(h, "%s/%d", id, attempt)
	return h.Sum32()%100 < 25
}

// TestPerKeyOrder checks that a consumer.Consumer keeps each key's order
// through a real transport, across retries: Messages messages over Keys
// keys are published in order per key (through four publishers at once,
// each key's messages through one of them, with a copy behind every 17th)
// and consumed (with in-memory inbox, dead letters and ledger, or the
// stores OrderOptions names) while about a quarter of early attempts fail,
// each after writing its effect. Every message must be applied exactly
// once, each key's messages in publish order, never two of one key at
// once, and nothing dead-lettered or parked. pub and sub are the
// transport, on a topic no one else uses.
func TestPerKeyOrder(t *testing.T, pub idem.Publisher, sub idem.Subscriber, opts OrderOptions) {
	t.Helper()
	messages, keys, topic := cmp.Or(opts.Messages, 10000), cmp.Or(opts.Keys, 100), cmp.Or(opts.Topic, "payments.succeeded")
	orderWait := cmp.Or(opts.Wait, 50*time.Second)
	const publishers = 4
	if (opts.Apply == nil) != (opts.Applied == nil) {
		t.Fatal("consumertest.OrderOptions: set both Apply and Applied, or neither")
	}
	var mu sync.Mutex
	var effects []AppliedEffect // committed, with the default Apply
	if opts.Apply == nil {
		opts.Apply = func(ctx context.Context, e AppliedEffect) error {
			tx, ok := idemmem.TxFromContext(ctx)
			if !ok {
				return idem.Permanent(errors.New("no transaction in the handler's context"))
			}
			return tx.OnCommit(func() {
				mu.Lock()
				defer mu.Unlock()
				effects = append(effects, e)
			})
		}
		opts.Applied = func(*testing.T) []AppliedEffect {
			mu.Lock()
			defer mu.Unlock()
			return slices.Clone(effects)
		}
	}
	if opts.Inbox == nil {
		opts.Inbox, opts.DeadLetters, opts.Ledger, opts.InTx = idemmem.NewInbox(), idemmem.NewDeadLetters(nil), idemmem.NewLedger(), idemmem.Transact
	}
	c, err := consumer.New(&consumer.Config{
		Name:        "settlement",
		Topic:       topic,
		Subscriber:  sub,
		Inbox:       opts.Inbox,
		DeadLetters: opts.DeadLetters,
		Ledger:      opts.Ledger,
		Retry:       idem.RetryPolicy{MaxAttempts: 10, Base: time.Millisecond, Cap: 5 * time.Millisecond},
		InTx:        opts.InTx,
	})
	if err != nil {
		t.Fatalf("consumer.New: %v", err)
	}

	running := make(map[string]bool)
	failures := 0
	handler := func(ctx context.Context, m idem.Message) error {
		mu.Lock()
		if running[m.Key] {
			t.Errorf("two messages of key %s handled at once", m.Key)
		}
		running[m.Key] = true
		mu.Unlock()
		defer func() {
			mu.Lock()
			running[m.Key] = false
			mu.Unlock()
		}()

		seq, err := strconv.Atoi(m.Headers["Seq"])
		if err != nil {
			return idem.Permanent(err)
		}
		if err := opts.Apply(ctx, AppliedEffect{Key: m.Key, Seq: seq, ID: m.ID}); err != nil {
			return err
		}
		// A failing attempt fails after its write, which must then roll
		// back with the inbox row: were it not in the inbox's
		// transaction, it would stay, and its message show twice.
		info, _ := consumer.InfoFromContext(ctx)
		if orderFlaky(m.ID, info.Attempt) {
			mu.Lock()
			failures++
			mu.Unlock()
			return errOrderFlaky
		}
		return nil
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, handler) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(orderWait):
			t.Errorf("Run did not return within %s of cancel", orderWait)
		}
	}
	// Before the transport's cleanup, which registered earlier.
	t.Cleanup(stop)

	if opts.BeforePublish != nil {
		opts.BeforePublish(t)
	}
	// Each key's messages in publish order, with a copy behind every 17th:
	// a transport drops it (JetStream within its duplicate window) or
	// delivers it, and then the inbox must.
	perKey := make(map[string]int)
	lanes := make([][]idem.Message, publishers)
	copies := 0
	for i := range messages {
		key := fmt.Sprintf("acct-%03d", i%keys)
		perKey[key]++
		m := idem.Message{
			ID:      fmt.Sprintf("evt-%05d", i),
			Topic:   topic,
			Key:     key,
			Headers: map[string]string{"Seq": strconv.Itoa(perKey[key])},
		}
		p := i % keys % publishers // a key's messages all go through one publisher
		lanes[p] = append(lanes[p], m)
		if i%17 == 0 {
			lanes[p] = append(lanes[p], m)
			copies++
		}
	}
	start := time.Now()
	publishLanes(t, pub, lanes)
	published := time.Since(start)

	ended := false
	var runErr error
	// Progress, not a fixed time: how long ten thousand messages take
	// depends on the machine and on what runs beside the test.
	want := int64(messages)
	if opts.CopiesDelivered {
		want += int64(copies)
	}
	eventually.Progressing(t, orderWait, "every message applied", want, func() int64 {
		select {
		case runErr = <-done:
			ended = true
			return want
		default:
		}
		s := c.Stats()
		// Parked too: a key held back behind a dead letter parks the rest.
		n := min(s.Processed+s.DeadLettered+s.Parked, int64(messages))
		if opts.CopiesDelivered {
			n += min(s.Duplicates, int64(copies))
		}
		return n
	})
	if ended {
		stopped = true
		t.Fatalf("Run returned before every message was applied: %v (stats %+v)", runErr, c.Stats())
	}
	t.Logf("%d messages (and %d copies) over %d keys: published in %s, all settled after %s; %+v",
		messages, copies, keys, published.Round(time.Millisecond), time.Since(start).Round(time.Millisecond), c.Stats())
	stop()

	s := c.Stats()
	if s.Processed != int64(messages) || s.DeadLettered != 0 || s.Parked != 0 {
		t.Fatalf("stats %+v, want %d processed and none dead-lettered or parked", s, messages)
	}
	if opts.CopiesDelivered && s.Duplicates < int64(copies) {
		t.Fatalf("stats %+v, want at least %d duplicates caught by the inbox", s, copies)
	}
	mu.Lock()
	if failures == 0 || s.Retried != int64(failures) {
		t.Errorf("%d failures, %d retried: the test failed nothing, or lost a retry", failures, s.Retried)
	}
	mu.Unlock()

	applied := make(map[string][]int) // committed sequence numbers, per key
	commits := make(map[string]int)   // commits, per message ID
	for _, e := range opts.Applied(t) {
		applied[e.Key] = append(applied[e.Key], e.Seq)
		commits[e.ID]++
	}
	// The first few of each kind of failure say enough.
	const shown = 10
	wrong := 0
	for i := range messages {
		if id := fmt.Sprintf("evt-%05d", i); commits[id] != 1 {
			if wrong++; wrong <= shown {
				t.Errorf("%s applied %d times, want once", id, commits[id])
			}
		}
	}
	if wrong > shown {
		t.Errorf("and %d more messages not applied exactly once", wrong-shown)
	}
	wrong = 0
	for key, n := range perKey {
		seqs := applied[key]
		if len(seqs) != n {
			t.Errorf("key %s: %d applied, want %d", key, len(seqs), n)
		}
		for i, seq := range seqs {
			if seq != i+1 {
				if wrong++; wrong <= shown {
					t.Errorf("key %s applied out of order: %v", key, seqs)
				}
				break
			}
		}
	}
	if wrong > shown {
		t.Errorf("and %d more keys applied out of order", wrong-shown)
	}
	if opts.Check != nil {
		opts.Check(t, s, messages, copies)
	}
}

// publishLanes publishes each lane in order, in batches, the lanes at
// once: a transport that awaits each message's acknowledgement before the
// next (JetStream's PubAck) would otherwise take a round trip per message.
func publishLanes(t *testing.T, p idem.Publisher, lanes [][]idem.Message) {
	t.Helper()
	const batch = 100
	var wg sync.WaitGroup
	for _, lane := range lanes {
		wg.Go(func() {
			for len(lane) > 0 {
				n := min(len(lane), batch)
				if err := p.Publish(t.Context(), lane[:n]...); err != nil {
					t.Errorf("Publish: %v", err)
					return
				}
				lane = lane[n:]
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
}
