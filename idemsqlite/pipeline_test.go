package idemsqlite_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consumer"
	"github.com/idem-go/idem/idemsqlite"
)

// The whole pipeline on one SQLite file: events written to the outbox with
// their effect, relayed to the embedded transport (some twice, as after a
// relay crash, and one re-published under another ID), and applied by a
// consumer whose effect, an increment, only the inbox protects. A malformed
// message is dead-lettered at once; a message failing transiently twice
// settles on its third attempt.
func TestPipeline(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := openMessagesDB(t)
	err := db.Migrate(ctx, "test_settlement", fstest.MapFS{
		"0001_totals.sql": {Data: []byte(`CREATE TABLE totals (tenant TEXT PRIMARY KEY, total INTEGER NOT NULL, events INTEGER NOT NULL);`)},
	})
	if err != nil {
		t.Fatal(err)
	}
	outbox, err := idemsqlite.NewOutbox(ctx, db, nil)
	if err != nil {
		t.Fatal(err)
	}
	transport, err := idemsqlite.NewTransport(ctx, db, &idemsqlite.TransportConfig{Poll: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer transport.Close()
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

	const n = 100
	event := func(i int) idem.Message {
		return idem.Message{
			ID: fmt.Sprintf("evt-%d", i), Topic: "payments.succeeded", Key: fmt.Sprintf("acct-%d", i%5),
			Payload: fmt.Appendf(nil, `{"event_id":"evt-%d","amount":%d}`, i, i),
		}
	}
	want := 0
	for i := range n {
		want += i
		// The event commits with the "payment" it announces.
		err := db.WithTx(ctx, func(ctx context.Context, tx *sql.Tx) error { return outbox.Add(ctx, event(i)) })
		if err != nil {
			t.Fatal(err)
		}
	}
	flaky := event(n)
	flaky.Headers = map[string]string{"Idem-Fault": "fail-times=2"}
	want += n
	malformed := idem.Message{ID: "bad-1", Topic: "payments.succeeded", Key: "acct-bad", Payload: []byte("{")}
	if err := outbox.Add(ctx, flaky, malformed); err != nil {
		t.Fatal(err)
	}

	// The relay: every entry published, the first ten twice (published,
	// not marked, lease over), and one re-published under a new ID.
	for relayed := 0; ; {
		entries, err := outbox.Claim(ctx, "relay-1", 16, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if len(entries) == 0 {
			break
		}
		var seqs []int64
		for _, en := range entries {
			if err := transport.Publish(ctx, en.Message); err != nil {
				t.Fatal(err)
			}
			if relayed < 10 {
				if err := transport.Publish(ctx, en.Message); err != nil {
					t.Fatal(err)
				}
			}
			relayed++
			seqs = append(seqs, en.Seq)
		}
		if err := outbox.MarkSent(ctx, seqs...); err != nil {
			t.Fatal(err)
		}
	}
	copyOf := event(7)
	copyOf.ID = "evt-7-copy"
	if err := transport.Publish(ctx, copyOf); err != nil {
		t.Fatal(err)
	}

	c, err := consumer.New(&consumer.Config{
		Name:        "settlement",
		Topic:       "payments.succeeded",
		Subscriber:  transport,
		Inbox:       inbox,
		DeadLetters: letters,
		Ledger:      ledger,
		InTx: func(ctx context.Context, fn func(ctx context.Context) error) error {
			return db.WithTx(ctx, func(ctx context.Context, _ *sql.Tx) error { return fn(ctx) })
		},
		DedupKey: func(m idem.Message) (string, error) {
			var e struct {
				EventID string `json:"event_id"`
			}
			err := json.Unmarshal(m.Payload, &e)
			return e.EventID, err
		},
		Retry: idem.RetryPolicy{MaxAttempts: 5, Base: time.Millisecond, Cap: 5 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu       sync.Mutex
		attempts = make(map[string]int)
	)
	handler := func(ctx context.Context, m idem.Message) error {
		mu.Lock()
		attempts[m.ID]++
		a := attempts[m.ID]
		mu.Unlock()
		if m.Headers["Idem-Fault"] == "fail-times=2" && a <= 2 {
			return errors.New("injected transient failure")
		}
		var e struct{ Amount int64 }
		if err := json.Unmarshal(m.Payload, &e); err != nil {
			return idem.Permanent(err)
		}
		return db.WithTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO totals (tenant, total, events) VALUES ('t', ?, 1)
				ON CONFLICT (tenant) DO UPDATE SET total = total + excluded.total, events = events + 1`, e.Amount)
			return err
		})
	}

	runCtx, cancel := context.WithCancel(ctx)
	stopped := make(chan error, 1)
	go func() { stopped <- c.Run(runCtx, handler) }()
	// Every delivery: n+1 events, ten copies, one copy under another ID,
	// and the malformed message.
	const deliveries = n + 1 + 10 + 1 + 1
	deadline := time.Now().Add(time.Minute)
	for {
		s := c.Stats()
		if s.Processed+s.Duplicates+s.DeadLettered >= deliveries {
			break
		}
		if time.Now().After(deadline) {
			cancel()
			<-stopped
			t.Fatalf("stats after a minute: %+v", s)
		}
		time.Sleep(5 * time.Millisecond) // polling, with a deadline
	}
	cancel()
	if err := <-stopped; err != nil {
		t.Fatalf("Run: %v", err)
	}

	var total, events int
	if err := db.Reader().QueryRowContext(ctx, `SELECT total, events FROM totals WHERE tenant = 't'`).Scan(&total, &events); err != nil {
		t.Fatal(err)
	}
	if total != want || events != n+1 {
		t.Errorf("total %d over %d events, want %d over %d", total, events, want, n+1)
	}
	s := c.Stats()
	if s.Processed != n+1 || s.Duplicates != 11 || s.DeadLettered != 1 {
		t.Errorf("Stats = %+v, want %d processed, 11 duplicates, 1 dead-lettered", s, n+1)
	}
	if a := attempts[flaky.ID]; a != 3 {
		t.Errorf("the flaky message ran %d times, want 3", a)
	}
	dls, err := letters.List(ctx, idem.DeadLetterFilter{Consumer: "settlement"})
	if err != nil {
		t.Fatal(err)
	}
	if len(dls) != 1 || dls[0].Message.ID != malformed.ID || dls[0].Class != idem.DeadPermanent || len(dls[0].Attempts) != 1 {
		t.Errorf("dead letters = %+v, want the malformed message, permanent, after one attempt", dls)
	}
	if left, err := ledger.Attempts(ctx, "settlement", "evt-"+fmt.Sprint(n)); err != nil || len(left) != 0 {
		t.Errorf("attempts left in the ledger for the flaky message: %+v, %v", left, err)
	}
}
