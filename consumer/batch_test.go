package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consumer"
	"github.com/idem-go/idem/idemmem"
)

// batchSizes is an idem.BatchInbox that writes down the size of every batch
// it is asked to record.
type batchSizes struct {
	*idemmem.Inbox

	mu    sync.Mutex
	sizes []int
}

func (b *batchSizes) ProcessBatch(ctx context.Context, consumer string, keys []string, fn func(context.Context, []bool) error) error {
	b.mu.Lock()
	b.sizes = append(b.sizes, len(keys))
	b.mu.Unlock()
	return b.Inbox.ProcessBatch(ctx, consumer, keys, fn)
}

func (b *batchSizes) largest() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.sizes) == 0 {
		return 0
	}
	return slices.Max(b.sizes)
}

// lanes publishes, for each key, n messages "<key>-<i>" (i from 1) carrying
// their sequence number in the header Seq, interleaved across keys.
func lanes(h *harness, keys []string, n int) []idem.Message {
	var msgs []idem.Message
	for i := 1; i <= n; i++ {
		for _, k := range keys {
			m := msg(fmt.Sprintf("%s-%d", k, i), k)
			m.Headers = map[string]string{"Seq": strconv.Itoa(i)}
			msgs = append(msgs, m)
		}
	}
	h.publish(msgs...)
	return msgs
}

// orderLog records, per key, the sequence numbers whose effect committed.
type orderLog struct {
	mu      sync.Mutex
	applied map[string][]int
}

// note writes m's sequence number down when the inbox's transaction
// commits.
func (o *orderLog) note(ctx context.Context, m idem.Message) error {
	seq, err := strconv.Atoi(m.Headers["Seq"])
	if err != nil {
		return idem.Permanent(err)
	}
	tx, ok := idemmem.TxFromContext(ctx)
	if !ok {
		return idem.Permanent(errors.New("no transaction in the handler's context"))
	}
	return tx.OnCommit(func() {
		o.mu.Lock()
		defer o.mu.Unlock()
		if o.applied == nil {
			o.applied = make(map[string][]int)
		}
		o.applied[m.Key] = append(o.applied[m.Key], seq)
	})
}

// want checks that key's committed sequence is exactly seqs.
func (o *orderLog) want(t *testing.T, key string, seqs ...int) {
	t.Helper()
	o.mu.Lock()
	defer o.mu.Unlock()
	if got := o.applied[key]; !slices.Equal(got, seqs) {
		t.Errorf("key %s applied %v, want %v", key, got, seqs)
	}
}

func seqs(from, to int) []int {
	var s []int
	for i := from; i <= to; i++ {
		s = append(s, i)
	}
	return s
}

func TestBatchAppliesEveryMessageOnceInOrder(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	inbox := &batchSizes{Inbox: h.inbox}
	cfg := h.config()
	cfg.Inbox = inbox
	cfg.Concurrency = 1
	keys := []string{"acct-1", "acct-2", "acct-3"}
	msgs := lanes(h, keys, 20)
	var order orderLog
	c, _ := h.start(cfg, func(ctx context.Context, m idem.Message) error {
		if err := order.note(ctx, m); err != nil {
			return err
		}
		return h.apply(ctx, m)
	})
	waitFor(t, "every message processed", func() bool { return c.Stats().Processed == int64(len(msgs)) })
	for _, m := range msgs {
		if got := h.applied.Get(m.ID); got != 1 {
			t.Errorf("%s applied %d times, want 1", m.ID, got)
		}
		waitFor(t, m.ID+" acknowledged", func() bool { return slices.Contains(h.rec.Ops(m.ID), "ack") })
		if ops := h.rec.Ops(m.ID); !slices.Equal(ops, []string{"deliver", "ack"}) {
			t.Errorf("%s: %v, want one delivery and one ack", m.ID, ops)
		}
	}
	for _, k := range keys {
		order.want(t, k, seqs(1, 20)...)
	}
	switch largest := inbox.largest(); {
	case batchSize == 1 && largest != 0:
		t.Errorf("BatchSize 1, yet a batch of %d was recorded", largest)
	case batchSize != 1 && largest < 2:
		t.Errorf("%d messages ready at once were recorded in batches of at most %d", len(msgs), largest)
	}
}

func TestBatchFailureTakesNoBatchMateWithIt(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cfg := h.config()
	cfg.Concurrency = 1
	keys := []string{"A", "B", "C"}
	msgs := lanes(h, keys, 10)
	var order orderLog
	var calls attemptsCounter
	c, _ := h.start(cfg, func(ctx context.Context, m idem.Message) error {
		attempt := calls.add(ctx, m)
		switch {
		case m.ID == "B-3" && attempt == 1:
			return errFlaky
		case m.ID == "C-5":
			return idem.Permanent(errors.New("unknown payment"))
		}
		if err := order.note(ctx, m); err != nil {
			return err
		}
		return h.apply(ctx, m)
	})
	// Counts follow what the transport is told, not the order of the
	// messages: the dead letter and the retry are waited for too.
	h.advanceUntil("B's messages applied and C's parked", time.Second, func() bool {
		s := c.Stats()
		return s.Processed == 10+10+4 && s.Parked == 5 && s.DeadLettered >= 1 && s.Retried >= 1
	})
	s := c.Stats()
	if s.DeadLettered != 1 || s.Retried != 1 {
		t.Errorf("stats %+v, want 1 dead letter and 1 retry", s)
	}
	for _, m := range msgs {
		want := int64(1)
		if seq, _ := strconv.Atoi(m.Headers["Seq"]); m.Key == "C" && seq >= 5 {
			want = 0 // C-5 dead-lettered, C-6 to C-10 parked behind it
		}
		if got := h.applied.Get(m.ID); got != want {
			t.Errorf("%s applied %d times, want %d", m.ID, got, want)
		}
	}
	order.want(t, "A", seqs(1, 10)...)
	order.want(t, "B", seqs(1, 10)...)
	order.want(t, "C", seqs(1, 4)...)
	if got := calls.Seen("B-3"); !slices.Equal(got, []int{1, 2}) {
		t.Errorf("B-3 attempted as %v, want attempts 1 then 2", got)
	}
	if got := calls.Calls("C-5"); got != 1 {
		t.Errorf("C-5 handled %d times, want once (permanent)", got)
	}
	if dls := h.letters(); len(dls) != 1 || dls[0].Message.ID != "C-5" {
		t.Errorf("dead letters %v, want C-5 alone", dls)
	}
}

func TestBatchMalformedMessageIsDeadLetteredAlone(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cfg := h.config()
	cfg.Concurrency = 1
	cfg.DedupKey = func(m idem.Message) (string, error) {
		if string(m.Payload) == "not json" {
			return "", errors.New("malformed")
		}
		return "dedup-" + m.ID, nil
	}
	var msgs []idem.Message
	for i := range 30 {
		m := msg(fmt.Sprintf("m-%d", i), "")
		if i == 12 {
			m.Payload = []byte("not json")
		}
		msgs = append(msgs, m)
	}
	h.publish(msgs...)
	c, _ := h.start(cfg, h.apply)
	waitFor(t, "the others processed, the malformed one dead-lettered", func() bool {
		s := c.Stats()
		return s.Processed == 29 && s.DeadLettered == 1
	})
	for i, m := range msgs {
		want := int64(1)
		if i == 12 {
			want = 0
		}
		if got := h.applied.Get(m.ID); got != want {
			t.Errorf("%s applied %d times, want %d", m.ID, got, want)
		}
	}
	if dls := h.letters(); len(dls) != 1 || dls[0].Message.ID != "m-12" || dls[0].Class != idem.DeadPermanent {
		t.Errorf("dead letters %+v, want m-12, permanent", dls)
	}
}

func TestRunBatchAppliesInBulk(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cfg := h.config()
	cfg.Concurrency = 1
	keys := []string{"A", "B"}
	msgs := lanes(h, keys, 15)

	var mu sync.Mutex
	var sizes []int
	c, err := consumer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- c.RunBatch(ctx, func(ctx context.Context, batch []idem.Message) error {
			infos, ok := consumer.BatchInfoFromContext(ctx)
			if !ok || len(infos) != len(batch) {
				return idem.Permanent(fmt.Errorf("%d infos for %d messages", len(infos), len(batch)))
			}
			for i, m := range batch {
				switch {
				case m.ID == "A-4" && infos[i].Attempt == 1:
					// Named: the others are applied without it.
					return &consumer.ItemError{Index: i, Err: errFlaky}
				case m.ID == "B-9" && infos[i].Attempt == 1:
					// Not named: the consumer finds which one it was.
					return errFlaky
				}
			}
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
	h.advanceUntil("every message processed, A-4 and B-9 retried", time.Second, func() bool {
		s := c.Stats()
		return s.Processed == int64(len(msgs)) && s.Retried >= 2
	})
	for _, m := range msgs {
		if got := h.applied.Get(m.ID); got != 1 {
			t.Errorf("%s applied %d times, want 1", m.ID, got)
		}
	}
	if s := c.Stats(); s.Retried != 2 || s.DeadLettered != 0 {
		t.Errorf("stats %+v, want exactly 2 retried (A-4, B-9)", s)
	}
	mu.Lock()
	defer mu.Unlock()
	if batchSize != 1 && slices.Max(sizes) < 2 {
		t.Errorf("batch handler called with sizes %v: never more than one message", sizes)
	}
}

// A batch takes the messages queued behind its first message's key, in
// order, so that a key with a backlog is applied BatchSize messages a
// transaction rather than one; and no batch holds more than BatchSize.
func TestBatchTakesTheKeysQueuedMessagesUpToBatchSize(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	inbox := &batchSizes{Inbox: h.inbox}
	cfg := h.config()
	cfg.Inbox = inbox
	cfg.Concurrency = 1
	cfg.BatchSize = 2
	msgs := lanes(h, []string{"acct"}, 6)
	release := make(chan struct{})
	var once sync.Once
	c, _ := h.start(cfg, func(ctx context.Context, m idem.Message) error {
		// The first batch waits until the key's whole backlog is queued
		// behind it.
		once.Do(func() { <-release })
		return h.apply(ctx, m)
	})
	// A delivery in memory gets a heartbeat every quarter of AckWait (30s
	// by default): once each has had one, all six are queued.
	h.advanceUntil("every delivery held in memory", 30*time.Second/4, func() bool {
		for _, m := range msgs {
			if !slices.Contains(h.rec.Ops(m.ID), "in-progress") {
				return false
			}
		}
		return true
	})
	close(release)
	waitFor(t, "every message processed", func() bool { return c.Stats().Processed == int64(len(msgs)) })
	inbox.mu.Lock()
	defer inbox.mu.Unlock()
	if len(inbox.sizes) < 2 || inbox.sizes[1] != 2 || slices.Max(inbox.sizes) > 2 {
		t.Errorf("batches of %v; want the first batch after the backlog formed to take 2 (BatchSize), none more", inbox.sizes)
	}
}

// A batch also gathers the messages of other keys, and those without a key,
// that are ready when it forms, up to BatchSize.
func TestBatchGathersReadyMessagesOfOtherKeys(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	inbox := &batchSizes{Inbox: h.inbox}
	cfg := h.config()
	cfg.Inbox = inbox
	cfg.Concurrency = 1
	cfg.BatchSize = 3
	msgs := []idem.Message{msg("first", ""), msg("a-1", "a"), msg("b-1", "b"), msg("none-1", ""), msg("c-1", "c"), msg("none-2", "")}
	h.publish(msgs...)
	release := make(chan struct{})
	var once sync.Once
	c, _ := h.start(cfg, func(ctx context.Context, m idem.Message) error {
		once.Do(func() { <-release })
		return h.apply(ctx, m)
	})
	// A delivery in memory gets a heartbeat every quarter of AckWait (30s
	// by default): once each has had one, all six are ready.
	h.advanceUntil("every delivery held in memory", 30*time.Second/4, func() bool {
		for _, m := range msgs {
			if !slices.Contains(h.rec.Ops(m.ID), "in-progress") {
				return false
			}
		}
		return true
	})
	close(release)
	waitFor(t, "every message processed", func() bool { return c.Stats().Processed == int64(len(msgs)) })
	inbox.mu.Lock()
	defer inbox.mu.Unlock()
	if len(inbox.sizes) < 2 || inbox.sizes[1] != 3 || slices.Max(inbox.sizes) > 3 {
		t.Errorf("batches of %v; want the first batch after the others were ready to take 3 (BatchSize) of them, none more", inbox.sizes)
	}
}

// With BatchWait, a batch short of BatchSize waits that long for more
// messages: those that arrive meanwhile join it, a full batch goes at
// once, and a short one goes when BatchWait has passed.
func TestBatchWaitGathersLaterMessages(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	inbox := &batchSizes{Inbox: h.inbox}
	cfg := h.config()
	cfg.Inbox = inbox
	cfg.Concurrency = 1
	cfg.BatchSize = 3
	cfg.BatchWait = time.Second
	c, _ := h.start(cfg, h.apply)
	<-c.Subscribed()
	h.publish(msg("m-1", ""))
	waitFor(t, "the first batch to wait for more", func() bool { return h.timers.Pending(time.Second) == 1 })
	h.publish(msg("m-2", ""), msg("m-3", ""))
	waitFor(t, "the full batch processed", func() bool { return c.Stats().Processed == 3 })

	h.publish(msg("m-4", ""))
	waitFor(t, "the next batch to wait for more", func() bool { return h.timers.Pending(time.Second) == 1 })
	if p := c.Stats().Processed; p != 3 {
		t.Fatalf("%d processed before BatchWait passed, want 3", p)
	}
	h.timers.Advance(time.Second)
	waitFor(t, "the short batch processed once BatchWait passed", func() bool { return c.Stats().Processed == 4 })
	inbox.mu.Lock()
	defer inbox.mu.Unlock()
	if !slices.Equal(inbox.sizes, []int{3, 1}) {
		t.Errorf("batches of %v, want [3 1]", inbox.sizes)
	}
}

// singleLedger is a Ledger that looks up one key's hold at a time: not an
// idem.BatchLedger.
type singleLedger struct{ idem.Ledger }

// In batch mode, with a Ledger that cannot look up many keys at once, a
// batch still finds the keys held back behind a dead letter, one by one,
// and parks their messages.
func TestBatchParksWithALedgerOfSingleLookups(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cfg := h.config()
	cfg.Ledger = singleLedger{h.ledger}
	cfg.BatchSize = 10
	c, _ := h.start(cfg, func(ctx context.Context, m idem.Message) error {
		if m.ID == "k1" {
			return idem.Permanent(errors.New("malformed"))
		}
		return h.apply(ctx, m)
	})
	h.publish(msg("k1", "K"))
	waitFor(t, "k1 dead-lettered", func() bool { return c.Stats().DeadLettered == 1 })
	h.publish(msg("k2", "K"), msg("o1", "O"), msg("k3", "K"))
	waitFor(t, "k2 and k3 parked, o1 processed", func() bool {
		s := c.Stats()
		return s.Parked == 2 && s.Processed == 1
	})
	if h.applied.Get("k2") != 0 || h.applied.Get("k3") != 0 || h.applied.Get("o1") != 1 {
		t.Errorf("applied k2 %d, k3 %d, o1 %d times; want 0, 0, 1", h.applied.Get("k2"), h.applied.Get("k3"), h.applied.Get("o1"))
	}
}

// From a transport that hands out batches, the consumer asks for as many
// deliveries as there is room for, up to BatchSize, never more.
func TestBatchStreamAskedForBatchSize(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cfg := h.config()
	cfg.Concurrency = 1
	cfg.BatchSize = 5
	msgs := lanes(h, []string{"a", "b"}, 5)
	c, _ := h.start(cfg, h.apply)
	waitFor(t, "every message processed", func() bool { return c.Stats().Processed == int64(len(msgs)) })
	h.rec.mu.Lock()
	defer h.rec.mu.Unlock()
	if len(h.rec.asked) == 0 || h.rec.asked[0] != 5 || slices.Max(h.rec.asked) > 5 {
		t.Errorf("NextBatch asked for %v; want 5 (BatchSize) at first, with room for more, and never more", h.rec.asked)
	}
}

// A message that failed behind its key's head in a batch waits for the
// batch to settle before its failure is dealt with. When the head is then
// dealt with on its own (dead-lettered here), the key's next message goes
// to whichever worker is free: its failure in the batch is forgotten, not
// also dealt with by the batch's worker, and the message is handled by
// one worker at a time, and applied once.
func TestBatchFailureBehindAHeadDealtWithAloneIsHandledOnce(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	cfg := h.config()
	cfg.Concurrency, cfg.BatchSize = 2, 10
	cfg.AfterDeadLetter = consumer.LetThrough
	h.publish(msg("evt-1", "K"), msg("evt-2", "K"))
	var mu sync.Mutex
	var calls [][]string
	var running, overlapped int
	c, err := consumer.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- c.RunBatch(ctx, func(ctx context.Context, batch []idem.Message) error {
			var ids []string
			for _, m := range batch {
				ids = append(ids, m.ID)
			}
			mu.Lock()
			calls = append(calls, ids)
			first := len(calls) == 1
			if running++; running > 1 {
				overlapped++
			}
			mu.Unlock()
			defer func() {
				mu.Lock()
				running--
				mu.Unlock()
			}()
			switch {
			case first && slices.Equal(ids, []string{"evt-1", "evt-2"}):
				return &consumer.ItemError{Index: 1, Err: errFlaky}
			case slices.Equal(ids, []string{"evt-1"}):
				return &consumer.ItemError{Index: 0, Err: idem.Permanent(errors.New("card declined"))}
			}
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
	waitFor(t, "evt-1 dead-lettered", func() bool { return c.Stats().DeadLettered == 1 })
	h.advanceUntil("evt-2 processed", time.Second, func() bool { return c.Stats().Processed == 1 })
	// Its retry, were one left behind, comes due.
	h.timers.Advance(10 * time.Second)
	h.publish(msg("evt-3", "K"))
	h.advanceUntil("evt-3 processed", time.Second, func() bool { return c.Stats().Processed == 2 })
	if n := h.applied.Get("evt-2"); n != 1 {
		t.Errorf("evt-2 applied %d times, want once", n)
	}
	if s := c.Stats(); s.Duplicates != 0 {
		t.Errorf("Stats = %+v: evt-2 handled again once applied", s)
	}
	mu.Lock()
	defer mu.Unlock()
	if calls := slices.Clone(calls); len(calls) < 3 || !slices.Equal(calls[0], []string{"evt-1", "evt-2"}) || !slices.Equal(calls[1], []string{"evt-1"}) {
		t.Errorf("batches %v, want [evt-1 evt-2] then [evt-1] first (evt-2 failing in the first, evt-1 in the second)", calls)
	}
	if overlapped != 0 {
		t.Errorf("the handler ran %d times while another call ran (batches %v)", overlapped, calls)
	}
}

// An *ItemError names the message that failed by its index in the batch
// the BatchHandler got: the first (0) and the last are named like any
// other, and the rest of the batch is applied again at once without it.
// An index outside the batch names none: the error is the whole batch's,
// and the consumer finds the failing message by handling them one at a
// time.
func TestBatchItemErrorIndex(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		index int
		calls [][]string // the batches after the one that failed
	}{
		{0, [][]string{{"m2", "m3"}, {"m1"}}},
		{2, [][]string{{"m1", "m2"}, {"m3"}}},
		{-1, [][]string{{"m1"}, {"m2"}, {"m3"}}},
		{3, [][]string{{"m1"}, {"m2"}, {"m3"}}},
	} {
		t.Run(fmt.Sprintf("index=%d", tc.index), func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			cfg := h.config()
			cfg.Concurrency, cfg.BatchSize = 1, 10
			c, err := consumer.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			var calls [][]string
			failed := false
			gate, release := make(chan struct{}), make(chan struct{})
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() {
				done <- c.RunBatch(ctx, func(ctx context.Context, batch []idem.Message) error {
					ids := messageIDs(batch)
					if slices.Contains(ids, "gate") {
						// Holds the one worker until m1, m2 and m3 are all
						// ready, so that one batch takes them.
						close(gate)
						<-release
					} else {
						mu.Lock()
						calls = append(calls, ids)
						first := !failed
						failed = true
						mu.Unlock()
						if first {
							return &consumer.ItemError{Index: tc.index, Err: errFlaky}
						}
					}
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
			h.publish(msg("gate", "G"))
			<-gate
			h.publish(msg("m1", "A"), msg("m2", "B"), msg("m3", "C"))
			// A delivery in memory gets a heartbeat every quarter of
			// AckWait (30s by default): once each has had one, all three
			// are ready.
			h.advanceUntil("m1, m2 and m3 held in memory", 30*time.Second/4, func() bool {
				for _, id := range []string{"m1", "m2", "m3"} {
					if !slices.Contains(h.rec.Ops(id), "in-progress") {
						return false
					}
				}
				return true
			})
			close(release)
			h.advanceUntil("every message processed", time.Second, func() bool { return c.Stats().Processed == 4 })
			for _, id := range []string{"m1", "m2", "m3"} {
				if n := h.applied.Get(id); n != 1 {
					t.Errorf("%s applied %d times, want once", id, n)
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if len(calls) == 0 || !slices.Equal(calls[0], []string{"m1", "m2", "m3"}) {
				t.Fatalf("batches %v; want [m1 m2 m3] first", calls)
			}
			if got := calls[1:]; !slices.EqualFunc(got, tc.calls, slices.Equal) {
				t.Errorf("batches after the one that failed %v, want %v", got, tc.calls)
			}
		})
	}
}
