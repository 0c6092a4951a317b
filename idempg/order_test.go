package idempg_test

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consumer"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/idemtest"
)

// orderWait bounds the wait for every message to be applied: generous for
// a loaded machine (under the race detector, beside another package's
// tests on two cores, the test has taken 50s where it takes 15s alone),
// yet a hang fails the test instead of the test binary.
const orderWait = 2 * time.Minute

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

// The consumer keeps each key's order across retries through the
// PostgreSQL transport: 10,000 messages over 100 keys, a quarter of early
// attempts failing. Everything lives in one schema: the transport's log,
// the inbox, the ledger, the dead letters, and the handler's effect, a row
// appended in the inbox's transaction. The order is read back from the
// committed rows, so a failed attempt whose write was not rolled back with
// its inbox row, a message applied twice or a key's messages applied out of
// order all show.
func TestPerKeyOrderWithTransientFailures(t *testing.T) {
	t.Parallel()
	const messages, keys, topic = 10000, 100, "payments.succeeded"
	const publishers = 4
	ctx := t.Context()
	// Room for the consumer's inbox transactions, its takes and
	// settlements, and the publishers at once.
	db := openDB(t, pgURL(t), idempg.Config{MaxConns: 8})
	err := db.Migrate(ctx, "test_order", fstest.MapFS{
		// No unique constraint: a message applied twice must show, not fail.
		"0001_applied.sql": {Data: []byte(`CREATE TABLE applied (
			n bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
			key text NOT NULL, seq integer NOT NULL, id text NOT NULL);`)},
	})
	if err != nil {
		t.Fatal(err)
	}
	// The default Poll: publishes and settlements wake the stream through
	// LISTEN/NOTIFY and in process, not polling.
	tr := newTransport(t, db, idempg.TransportConfig{Poll: 250 * time.Millisecond})
	inbox, err := idempg.NewInbox(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	letters, err := idempg.NewDeadLetters(ctx, db, nil)
	if err != nil {
		t.Fatal(err)
	}
	ledger, err := idempg.NewLedger(ctx, db)
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
			return db.WithTx(ctx, func(ctx context.Context, _ pgx.Tx) error { return fn(ctx) })
		},
	})
	if err != nil {
		t.Fatalf("consumer.New: %v", err)
	}

	var mu sync.Mutex
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
		err = db.WithTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO applied (key, seq, id) VALUES ($1, $2, $3)`, m.Key, seq, m.ID)
			return err
		})
		if err != nil {
			return err
		}
		// A failing attempt fails after its write, which must then roll
		// back with the inbox row: were the write not in the inbox's
		// transaction, it would stay, and its message show twice.
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
	idemtest.Eventually(t, orderWait, "every message applied", func() bool {
		select {
		case runErr = <-done:
			ended = true
			return true
		default:
		}
		s := c.Stats()
		// Parked too: a key held back behind a dead letter parks the rest.
		return s.Processed+s.DeadLettered+s.Parked >= messages && s.Duplicates >= int64(copies)
	})
	if ended {
		stopped = true
		t.Fatalf("Run returned before every message was applied: %v (stats %+v)", runErr, c.Stats())
	}
	t.Logf("%d messages (and %d copies) over %d keys: published in %s, all settled after %s; %+v",
		messages, copies, keys, published.Round(time.Millisecond), time.Since(start).Round(time.Millisecond), c.Stats())
	stop()

	s := c.Stats()
	if s.Processed != messages || s.Duplicates != int64(copies) || s.DeadLettered != 0 || s.Parked != 0 {
		t.Fatalf("stats %+v, want %d processed, %d duplicates and none dead-lettered or parked", s, messages, copies)
	}
	mu.Lock()
	if failures == 0 || s.Retried != int64(failures) {
		t.Errorf("%d failures, %d retried: the test failed nothing, or lost a retry", failures, s.Retried)
	}
	mu.Unlock()

	// What committed. A key's next message runs only after the previous
	// one committed, so within a key the identity n follows commit order.
	rows, err := db.Pool().Query(ctx, `SELECT key, seq, id FROM applied ORDER BY n`)
	if err != nil {
		t.Fatal(err)
	}
	applied := make(map[string][]int) // committed sequence numbers, per key
	commits := make(map[string]int)   // commits, per message ID
	var key, id string
	var seq int
	_, err = pgx.ForEachRow(rows, []any{&key, &seq, &id}, func() error {
		applied[key] = append(applied[key], seq)
		commits[id]++
		return nil
	})
	if err != nil {
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
	if err := db.Pool().QueryRow(ctx, `SELECT
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
