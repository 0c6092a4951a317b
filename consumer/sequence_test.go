package consumer_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consumer"
)

// accountEvent is an event of account acct-1 carrying the account's
// version, its sequence number, in the payload.
func accountEvent(id string, version uint64) idem.Message {
	return idem.Message{ID: id, Key: "acct-1", Payload: fmt.Appendf(nil, `{"account":"acct-1","version":%d}`, version)}
}

// accountSequence is a Config.Sequence: the account and its version.
func accountSequence(m idem.Message) (string, uint64, error) {
	var e struct {
		Account string `json:"account"`
		Version uint64 `json:"version"`
	}
	err := json.Unmarshal(m.Payload, &e)
	return e.Account, e.Version, err
}

// sequenceBackend is an idem.SequenceInbox and a counter effect that joins
// its transaction, as a consumer's own table or keys would.
type sequenceBackend struct {
	inbox idem.SequenceInbox
	// add adds 1 to the counter name in the transaction ctx carries.
	add func(ctx context.Context, name string) error
	// get returns the committed value of name.
	get func(t *testing.T, name string) int
}

// sequenceBackends are the inboxes the consumer's sequence tests run on:
// the in-memory reference. (The SQL and Redis inboxes pass
// idemtest.TestSequenceInbox in their own modules.)
var sequenceBackends = []struct {
	name string
	open func(t *testing.T) sequenceBackend
}{
	{"memory", openMemoryBackend},
}

// forEachSequenceBackend runs test as a parallel subtest per backend.
func forEachSequenceBackend(t *testing.T, test func(t *testing.T, b sequenceBackend)) {
	for _, b := range sequenceBackends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			test(t, b.open(t))
		})
	}
}

func openMemoryBackend(t *testing.T) sequenceBackend {
	h := newHarness(t)
	return sequenceBackend{
		inbox: h.inbox,
		add:   func(ctx context.Context, name string) error { return h.applied.Add(ctx, name, 1) },
		get:   func(_ *testing.T, name string) int { return int(h.applied.Get(name)) },
	}
}

// seqLog records the sequence numbers a handler applied, in order.
type seqLog struct {
	mu  sync.Mutex
	got []uint64
}

// handler applies an account event: it adds to the counter of its version
// and notes the version.
func (l *seqLog) handler(t *testing.T, b sequenceBackend) consumer.Handler {
	return func(ctx context.Context, m idem.Message) error {
		info, ok := consumer.InfoFromContext(ctx)
		if !ok || info.Aggregate != "acct-1" || info.Seq == 0 {
			t.Errorf("Info %+v for %s: want the aggregate and sequence number", info, m.ID)
		}
		if err := b.add(ctx, fmt.Sprintf("acct-1/%d", info.Seq)); err != nil {
			return err
		}
		l.mu.Lock()
		defer l.mu.Unlock()
		l.got = append(l.got, info.Seq)
		return nil
	}
}

func (l *seqLog) applied() []uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.got)
}

// wantApplied checks that versions 1..n of acct-1 each committed once.
func wantApplied(t *testing.T, b sequenceBackend, n int) {
	t.Helper()
	for v := 1; v <= n; v++ {
		if got := b.get(t, fmt.Sprintf("acct-1/%d", v)); got != 1 {
			t.Errorf("version %d applied %d times, want 1", v, got)
		}
	}
}

func TestSequenceResentUnderNewIDsAppliedOnce(t *testing.T) {
	t.Parallel()
	forEachSequenceBackend(t, func(t *testing.T, b sequenceBackend) {
		h := newHarness(t)
		cfg := h.config()
		cfg.Inbox = b.inbox
		cfg.Sequence = accountSequence
		var log seqLog
		c, _ := h.start(cfg, log.handler(t, b))
		h.publish(accountEvent("e-1", 1), accountEvent("e-2", 2), accountEvent("e-3", 3),
			// A publisher re-sends the account's events, each under a new
			// message ID: an inbox of message IDs would apply them again.
			accountEvent("r-1", 1), accountEvent("r-2", 2), accountEvent("r-3", 3))
		waitFor(t, "six deliveries settled", func() bool {
			s := c.Stats()
			return s.Processed+s.Duplicates == 6
		})
		if s := c.Stats(); s.Processed != 3 || s.Duplicates != 3 {
			t.Errorf("stats %+v, want 3 processed and 3 duplicates", s)
		}
		wantApplied(t, b, 3)
		if got := log.applied(); !slices.Equal(got, []uint64{1, 2, 3}) {
			t.Errorf("applied %v, want [1 2 3]", got)
		}
		for _, id := range []string{"r-1", "r-2", "r-3"} {
			waitFor(t, id+" acked", func() bool { return countOp(h.rec.Ops(id), "ack") == 1 })
		}
	})
}

func TestSequenceGapHeldUntilTheMissingOneArrives(t *testing.T) {
	t.Parallel()
	forEachSequenceBackend(t, func(t *testing.T, b sequenceBackend) {
		h := newHarness(t)
		cfg := h.config()
		cfg.Inbox = b.inbox
		cfg.Sequence = accountSequence
		var log seqLog
		c, _ := h.start(cfg, log.handler(t, b))
		h.publish(accountEvent("e-1", 1), accountEvent("e-3", 3))
		// Version 3 meets a gap: it is handed back with the retry delay,
		// not applied.
		waitFor(t, "e-3 handed back", func() bool { return slices.Contains(h.rec.Ops("e-3"), "nack 1s") })
		if got := b.get(t, "acct-1/3"); got != 0 {
			t.Fatalf("version 3 applied %d times across a gap, want 0", got)
		}
		h.publish(accountEvent("e-2", 2))
		// e-3's retry is counted once its Nack is sent, which may come
		// after its next delivery began: waited for too.
		h.advanceUntil("all three applied, e-3 retried", time.Second, func() bool {
			s := c.Stats()
			return s.Processed == 3 && s.Retried >= 1
		})
		wantApplied(t, b, 3)
		if got := log.applied(); !slices.Equal(got, []uint64{1, 2, 3}) {
			t.Errorf("applied %v, want [1 2 3]: the gap keeps the account's order", got)
		}
		if s := c.Stats(); s.DeadLettered != 0 || s.Retried == 0 {
			t.Errorf("stats %+v, want version 3 retried and nothing dead-lettered", s)
		}
	})
}

// Versions 3 and 2 delivered in that order, one key: 3 leaves the head of
// the key's queue for 2, which would otherwise wait behind it for good.
func TestSequenceGapLetsTheMissingOnePass(t *testing.T) {
	t.Parallel()
	forEachSequenceBackend(t, func(t *testing.T, b sequenceBackend) {
		h := newHarness(t)
		cfg := h.config()
		cfg.Inbox = b.inbox
		cfg.Sequence = accountSequence
		var log seqLog
		c, _ := h.start(cfg, log.handler(t, b))
		h.publish(accountEvent("e-1", 1), accountEvent("e-3", 3), accountEvent("e-2", 2))
		waitFor(t, "version 2 applied past the held version 3", func() bool { return c.Stats().Processed == 2 })
		h.advanceUntil("version 3 applied", time.Second, func() bool { return c.Stats().Processed == 3 })
		wantApplied(t, b, 3)
		if got := log.applied(); !slices.Equal(got, []uint64{1, 2, 3}) {
			t.Errorf("applied %v, want [1 2 3]", got)
		}
	})
}

func TestSequenceGapAllow(t *testing.T) {
	t.Parallel()
	forEachSequenceBackend(t, func(t *testing.T, b sequenceBackend) {
		h := newHarness(t)
		cfg := h.config()
		cfg.Inbox = b.inbox
		cfg.Sequence = accountSequence
		cfg.Gap = idem.GapAllow
		var log seqLog
		c, _ := h.start(cfg, log.handler(t, b))
		h.publish(accountEvent("e-1", 1), accountEvent("e-3", 3))
		waitFor(t, "both applied", func() bool { return c.Stats().Processed == 2 })
		// The missing one comes late: the mark has passed it.
		h.publish(accountEvent("e-2", 2))
		waitFor(t, "the late one settled", func() bool { return c.Stats().Duplicates == 1 })
		if got := log.applied(); !slices.Equal(got, []uint64{1, 3}) {
			t.Errorf("applied %v, want [1 3]", got)
		}
		if got := b.get(t, "acct-1/2"); got != 0 {
			t.Errorf("the late version 2 applied %d times, want 0", got)
		}
		if s := c.Stats(); s.Retried != 0 {
			t.Errorf("stats %+v: GapAllow retries nothing", s)
		}
	})
}

func TestSequenceGapThatNeverClosesIsDeadLettered(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cfg := h.config()
	cfg.Sequence = accountSequence
	cfg.AfterDeadLetter = consumer.LetThrough
	c, _ := h.start(cfg, h.apply)
	h.publish(accountEvent("e-1", 1), accountEvent("e-3", 3))
	h.advanceUntil("e-3 dead-lettered", time.Second, func() bool { return c.Stats().DeadLettered == 1 })
	dls := h.letters()
	if len(dls) != 1 {
		t.Fatalf("%d dead letters, want 1", len(dls))
	}
	dl := dls[0]
	if dl.Message.ID != "e-3" || dl.Class != idem.DeadExhausted || len(dl.Attempts) != cfg.Retry.MaxAttempts {
		t.Errorf("dead letter %s: class %s, %d attempts; want e-3, exhausted, %d", dl.Message.ID, dl.Class, len(dl.Attempts), cfg.Retry.MaxAttempts)
	}
	if !strings.Contains(dl.LastError(), "sequence gap") || !strings.Contains(dl.LastError(), "expected 2") {
		t.Errorf("last error %q, want it to say the gap", dl.LastError())
	}
	if got := h.applied.Get("e-3"); got != 0 {
		t.Errorf("e-3 applied %d times, want 0", got)
	}
}

// A message whose key is held back behind a dead letter, and which meets
// the gap that dead letter left, is parked behind it, as any later message
// of the key is: retrying it could only exhaust its attempts.
func TestSequenceGapBehindADeadLetterIsParked(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cfg := h.config()
	cfg.Sequence = accountSequence
	c, _ := h.start(cfg, func(ctx context.Context, m idem.Message) error {
		if m.ID == "e-2" {
			return idem.Permanent(errors.New("account closed"))
		}
		return h.apply(ctx, m)
	})
	h.publish(accountEvent("e-1", 1), accountEvent("e-2", 2), accountEvent("e-3", 3))
	// Each message is counted once the transport is told, after the next
	// of its key may have begun: e-1's Processed may come after e-3's
	// Parked, so all three are waited for.
	waitFor(t, "e-1 processed, e-2 dead-lettered and e-3 parked", func() bool {
		s := c.Stats()
		return s.Processed >= 1 && s.DeadLettered == 1 && s.Parked == 1
	})
	if s := c.Stats(); s.Processed != 1 || s.Retried != 0 {
		t.Errorf("stats %+v, want e-1 processed and nothing retried", s)
	}
	if got := h.applied.Get("e-3"); got != 0 {
		t.Errorf("e-3 applied %d times, want 0", got)
	}
}

func TestSequenceErrorIsPermanent(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cfg := h.config()
	cfg.Sequence = func(m idem.Message) (string, uint64, error) {
		if m.ID == "panics" {
			panic("no version")
		}
		return accountSequence(m)
	}
	var calls attemptsCounter
	c, _ := h.start(cfg, func(ctx context.Context, m idem.Message) error {
		calls.add(ctx, m)
		return h.apply(ctx, m)
	})
	h.publish(
		idem.Message{ID: "not-json", Key: "acct-1", Payload: []byte(`{not json`)},
		idem.Message{ID: "version-0", Key: "acct-1", Payload: []byte(`{"account":"acct-1","version":0}`)},
		idem.Message{ID: "no-account", Key: "acct-1", Payload: []byte(`{"version":4}`)},
		idem.Message{ID: "panics", Key: "acct-2", Payload: []byte(`{}`)},
	)
	waitFor(t, "four dead-lettered", func() bool { return c.Stats().DeadLettered == 4 })
	for _, dl := range h.letters() {
		if dl.Class != idem.DeadPermanent || len(dl.Attempts) != 1 || !strings.HasPrefix(dl.LastError(), "sequence:") {
			t.Errorf("letter %s: class %q, %d attempts, error %q; want permanent at once, with the reason", dl.Message.ID, dl.Class, len(dl.Attempts), dl.LastError())
		}
		if calls.Calls(dl.Message.ID) != 0 {
			t.Errorf("the handler ran for %s", dl.Message.ID)
		}
	}
}

// With Sequence set, a BatchInbox is asked for no batch, and a
// BatchHandler gets one message at a time: each message needs its own
// look at its aggregate's mark.
func TestSequenceHandlesOneMessageAtATime(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	inbox := &batchSizes{Inbox: h.inbox}
	cfg := h.config()
	cfg.Inbox = inbox
	cfg.Sequence = accountSequence
	c, err := consumer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var sizes []int
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- c.RunBatch(ctx, func(ctx context.Context, batch []idem.Message) error {
			mu.Lock()
			sizes = append(sizes, len(batch))
			mu.Unlock()
			for _, m := range batch {
				if err := h.apply(ctx, m); err != nil {
					return err
				}
			}
			return nil
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("RunBatch: %v", err)
		}
	})
	var msgs []idem.Message
	for v := uint64(1); v <= 20; v++ {
		msgs = append(msgs, accountEvent(fmt.Sprintf("e-%d", v), v))
	}
	h.publish(msgs...)
	waitFor(t, "twenty processed", func() bool { return c.Stats().Processed == 20 })
	if n := inbox.largest(); n != 0 {
		t.Errorf("the inbox was asked to record a batch of %d", n)
	}
	mu.Lock()
	defer mu.Unlock()
	if slices.Max(sizes) != 1 {
		t.Errorf("the batch handler got batches of sizes %v, want one message each", sizes)
	}
}
