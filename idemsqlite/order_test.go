package idemsqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"strconv"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consumer"
	"github.com/idem-go/idem/idemsqlite"
	"github.com/idem-go/idem/idemtest"
)

// orderWait bounds the wait for every message to be applied: generous for
// a loaded machine (under the race detector, beside the other tests of the
// package and another package's on two cores, the test has taken 50s
// where it takes 10s alone), yet a hang fails the test instead of the test
// binary. fullOrderWait is that of the full size, under the race detector.
const (
	orderWait     = 2 * time.Minute
	fullOrderWait = 8 * time.Minute
)

// fullOrder runs TestPerKeyOrderWithTransientFailures at the size of the
// brokers' tests, 10,000 messages over 100 keys, instead of 500 over 10.
// Under the race detector every step through the transpiled SQLite engine
// is instrumented, and each message takes a dozen statements or more on the
// single writer (hand-out, inbox, effect, ledger, acknowledgement), so the
// full size takes minutes there; without -race it takes seconds.
var fullOrder = flag.Bool("idemsqlite.full", false, "run the per-key order test with 10,000 messages over 100 keys")

var errFlaky = errors.New("dependency unavailable")

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

// The consumer keeps each key's order across retries through the embedded
// transport: 500 messages over 10 keys (10,000 over 100 with
// -idemsqlite.full), a quarter of early attempts failing. Everything lives
// in one file: the transport's log, the inbox, the ledger, the dead
// letters, and the handler's effect, a row appended in the inbox's
// transaction. The order is read back from the committed rows, so a failed
// attempt whose write was not rolled back with its inbox row, a message
// applied twice or a key's messages applied out of order all show.
func TestPerKeyOrderWithTransientFailures(t *testing.T) {
	t.Parallel()
	const topic = "payments.succeeded"
	// Few keys by default: the order check catches a message that
	// overtakes an earlier one of its key only if it is delivered while
	// that one waits for its retry, and the single writer paces the
	// hand-outs, so over many keys a key's next message seldom comes soon
	// enough.
	messages, keys, wait := 500, 10, orderWait
	if *fullOrder {
		messages, keys, wait = 10000, 100, fullOrderWait
	}
	const publishers = 4
	ctx := t.Context()
	db := openMessagesDB(t)
	err := db.Migrate(ctx, "test_order", fstest.MapFS{
		// No unique constraint: a message applied twice must show, not fail.
		"0001_applied.sql": {Data: []byte(`CREATE TABLE applied (
			n INTEGER PRIMARY KEY AUTOINCREMENT,
			key TEXT NOT NULL, seq INTEGER NOT NULL, id TEXT NOT NULL);`)},
	})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := idemsqlite.NewTransport(ctx, db, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	inbox, err := idemsqlite.NewInbox(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	letters, err := idemsqlite.NewDeadLetters(ctx, db, nil)
	if err != nil {
		t.Fatal(err)
	}
	ledger, err := idemsqlite.NewLedger(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	c, err := consumer.New(&consumer.Config{
		Name:        "settlement",
		Topic:       topic,
		Subscriber:  tr,
		Inbox:       inbox,
		DeadLetters: letters,
		Ledger:      ledger,
		Retry:       idem.RetryPolicy{MaxAttempts: 10, Base: time.Millisecond, Cap: 5 * time.Millisecond},
		InTx: func(ctx context.Context, fn func(ctx context.Context) error) error {
			return db.WithTx(ctx, func(ctx context.Context, _ *sql.Tx) error { return fn(ctx) })
		},
	})
	if err != nil {
		t.Fatalf("consumer.New: %v", err)
	}

	var mu sync.Mutex
	running := make(map[string]bool)
	failures := 0
	handler := func(ctx context.Context, m idem.Message) error {
		// Each handler runs in an inbox transaction, which holds the only
		// writer connection: today handlers never overlap here, and this
		// guards against that changing.
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
		// Joins the inbox's transaction: a write of its own would wait for
		// the writer that transaction holds, and the test would time out.
		err = db.WithTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO applied (key, seq, id) VALUES (?, ?, ?)`, m.Key, seq, m.ID)
			return err
		})
		if err != nil {
			return err
		}
		// A failing attempt fails after its write, which must then roll
		// back with the inbox row.
		info, _ := consumer.InfoFromContext(ctx)
		if flaky(m.ID, info.Attempt) {
			mu.Lock()
			failures++
			mu.Unlock()
			return errFlaky
		}
		return nil
	}

	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx, handler) }()
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

	// Each key's messages in publish order, with a copy behind every 17th,
	// which the transport delivers and the inbox must drop.
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
	publish(t, tr, lanes)
	published := time.Since(start)

	ended := false
	var runErr error
	idemtest.Eventually(t, wait, "every message applied", func() bool {
		select {
		case runErr = <-done:
			ended = true
			return true
		default:
		}
		s := c.Stats()
		// Parked too: a key held back behind a dead letter parks the rest.
		return s.Processed+s.DeadLettered+s.Parked >= int64(messages) && s.Duplicates >= int64(copies)
	})
	if ended {
		stopped = true
		t.Fatalf("Run returned before every message was applied: %v (stats %+v)", runErr, c.Stats())
	}
	t.Logf("%d messages (and %d copies) over %d keys: published in %s, all settled after %s; %+v",
		messages, copies, keys, published.Round(time.Millisecond), time.Since(start).Round(time.Millisecond), c.Stats())
	stop()

	s := c.Stats()
	if s.Processed != int64(messages) || s.Duplicates != int64(copies) || s.DeadLettered != 0 || s.Parked != 0 {
		t.Fatalf("stats %+v, want %d processed, %d duplicates and none dead-lettered or parked", s, messages, copies)
	}
	mu.Lock()
	if failures == 0 || s.Retried != int64(failures) {
		t.Errorf("%d failures, %d retried: the test failed nothing, or lost a retry", failures, s.Retried)
	}
	mu.Unlock()

	// What committed, in the order it committed: the single writer gives
	// out the autoincrement n in commit order.
	rows, err := db.Reader().QueryContext(ctx, `SELECT key, seq, id FROM applied ORDER BY n`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	applied := make(map[string][]int) // committed sequence numbers, per key
	commits := make(map[string]int)   // commits, per message ID
	for rows.Next() {
		var key, id string
		var seq int
		if err := rows.Scan(&key, &seq, &id); err != nil {
			t.Fatal(err)
		}
		applied[key] = append(applied[key], seq)
		commits[id]++
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
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

	// Every delivery was acknowledged, and nothing was left in the ledger.
	var pending, inboxRows, attempts int
	if err := db.Reader().QueryRowContext(ctx, `SELECT
		(SELECT count(*) FROM idem_transport_pending),
		(SELECT count(*) FROM idem_inbox WHERE consumer = 'settlement'),
		(SELECT count(*) FROM idem_ledger_attempts)`).Scan(&pending, &inboxRows, &attempts); err != nil {
		t.Fatal(err)
	}
	if pending != 0 || inboxRows != messages || attempts != 0 {
		t.Errorf("%d deliveries unsettled, %d inbox rows, %d recorded attempts left; want 0, %d, 0",
			pending, inboxRows, attempts, messages)
	}
}

// publish publishes each lane in order, in batches (one transaction each),
// the lanes at once.
func publish(t *testing.T, p idem.Publisher, lanes [][]idem.Message) {
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
