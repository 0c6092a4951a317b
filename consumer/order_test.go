package consumer_test

import (
	"context"
	"flag"
	"fmt"
	"hash/fnv"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consumer"
	"github.com/idem-go/idem/idemmem"
)

var full = flag.Bool("consumer.full", false, "run the per-key order test at full size: 10,000 messages over 100 keys")

// flaky decides, the same way every run, whether an attempt fails: about a
// quarter of first, second and third attempts do; fourth attempts never.
func flaky(id string, attempt int) bool {
	if attempt > 3 {
		return false
	}
	h := fnv.New32a()
	fmt.Fprintf(h, "%s/%d", id, attempt)
	return h.Sum32()%100 < 25
}

func TestPerKeyOrderWithTransientFailures(t *testing.T) {
	t.Parallel()
	messages, keys := 2000, 50
	if *full {
		messages, keys = 10000, 100
	}
	h := newHarness(t)
	cfg := h.config()
	cfg.Retry.MaxAttempts = 10

	var mu sync.Mutex
	applied := make(map[string][]int) // committed sequence numbers, per key
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

		info, _ := consumer.InfoFromContext(ctx)
		if flaky(m.ID, info.Attempt) {
			mu.Lock()
			failures++
			mu.Unlock()
			return errFlaky
		}
		seq, err := strconv.Atoi(m.Headers["Seq"])
		if err != nil {
			return idem.Permanent(err)
		}
		tx, ok := idemmem.TxFromContext(ctx)
		if !ok {
			return idem.Permanent(fmt.Errorf("no transaction in the handler's context"))
		}
		// Written down only if the inbox's transaction commits.
		return tx.OnCommit(func() {
			mu.Lock()
			defer mu.Unlock()
			applied[m.Key] = append(applied[m.Key], seq)
		})
	}
	c, _ := h.start(cfg, handler)

	perKey := make(map[string]int)
	batch := make([]idem.Message, 0, 100)
	copies := 0
	for i := range messages {
		key := fmt.Sprintf("acct-%03d", i%keys)
		perKey[key]++
		m := idem.Message{
			ID:      fmt.Sprintf("evt-%05d", i),
			Key:     key,
			Headers: map[string]string{"Seq": strconv.Itoa(perKey[key])},
		}
		batch = append(batch, m)
		if i%17 == 0 {
			batch = append(batch, m) // a duplicate, right behind
			copies++
		}
		if len(batch) >= 100 {
			h.publish(batch...)
			batch = batch[:0]
		}
	}
	h.publish(batch...)

	// Duplicates are waited for only as far as the copies: besides them,
	// the transport may deliver again what a heartbeat did not keep alive,
	// since the clock runs fast here. A copy is handled after its message,
	// and a retry counted once it is scheduled, which may come after the
	// attempt it scheduled has begun: both are waited for too.
	h.advanceUntil("every message processed, every copy caught and every failure retried", time.Second, func() bool {
		s := c.Stats()
		mu.Lock()
		retried := s.Retried >= int64(failures)
		mu.Unlock()
		return s.Processed+s.DeadLettered >= int64(messages) && s.Duplicates >= int64(copies) && retried
	})

	s := c.Stats()
	if s.Processed != int64(messages) || s.DeadLettered != 0 || s.Duplicates < int64(copies) {
		t.Fatalf("stats %+v, want %d processed, at least %d duplicates and none dead-lettered", s, messages, copies)
	}
	mu.Lock()
	defer mu.Unlock()
	if failures == 0 || s.Retried != int64(failures) {
		t.Errorf("%d failures, %d retried: the test failed nothing, or lost a retry", failures, s.Retried)
	}
	for key, n := range perKey {
		seqs := applied[key]
		if len(seqs) != n {
			t.Errorf("key %s: %d applied, want %d", key, len(seqs), n)
		}
		for i, seq := range seqs {
			if seq != i+1 {
				t.Errorf("key %s applied out of order: %v", key, seqs)
				break
			}
		}
	}
}
