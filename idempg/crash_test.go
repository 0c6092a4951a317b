package idempg_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consumer"
	"github.com/idem-go/idem/idempg"
)

// crashChildEnv names the schema a crash child consumes in; the child is
// this test binary, run again for TestCrashChild alone.
const crashChildEnv = "IDEMPG_CRASH_CHILD_SCHEMA"

const crashTopic = "crash.payments"

// A consumer in batches of 100 on the PostgreSQL transport, SIGKILLed at
// random moments while it works through 6,000 messages each published
// twice (so, often, in the middle of a batch's transaction or its commit),
// then started again: when the last run has processed everything, every
// message was applied exactly once (the counters and the inbox add up to
// 6,000) and nothing is left unsettled.
func TestConsumerSIGKILLedMidBatch(t *testing.T) {
	t.Parallel()
	url := pgURL(t)
	schema := freshSchema(t, url)
	db := openDB(t, url, idempg.Config{Schema: schema})
	ctx := t.Context()
	if _, err := db.Pool().Exec(ctx, `CREATE TABLE crash_counters (key text PRIMARY KEY, n bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	tr := newTransport(t, db, idempg.TransportConfig{})
	// The consumer name exists before the messages are published.
	s, err := tr.Subscribe(ctx, idem.Subscription{Topic: crashTopic, Consumer: "settlement"})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	const n, keys = 6000, 50
	for i := 0; i < n; i += 500 {
		var msgs []idem.Message
		for j := i; j < i+500; j++ {
			m := idem.Message{ID: fmt.Sprintf("evt-%d", j), Topic: crashTopic, Key: fmt.Sprintf("acct-%d", j%keys)}
			// Each twice, as a relay that died after publishing does: the
			// inbox absorbs the copy, whichever batch it lands in.
			msgs = append(msgs, m, m)
		}
		if err := tr.Publish(ctx, msgs...); err != nil {
			t.Fatal(err)
		}
	}
	applied := func() int64 {
		var sum int64
		if err := db.Pool().QueryRow(ctx, `SELECT coalesce(sum(n), 0) FROM crash_counters`).Scan(&sum); err != nil {
			t.Fatal(err)
		}
		return sum
	}
	child := func() *exec.Cmd {
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestCrashChild$", "-test.count=1")
		cmd.Env = append(os.Environ(), crashChildEnv+"="+schema)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 3))
	kills := 0
	for kills < 6 {
		before := applied()
		if before >= n {
			break
		}
		cmd := child()
		// Killed once it has made some progress, a random moment later.
		deadline := time.Now().Add(time.Minute)
		for applied() < before+100 && applied() < n {
			if time.Now().After(deadline) {
				cmd.Process.Kill()
				cmd.Wait()
				t.Fatalf("the consumer applied %d messages in a minute", applied()-before)
			}
			time.Sleep(time.Millisecond)
		}
		time.Sleep(time.Duration(r.IntN(20_000)) * time.Microsecond)
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()
		kills++
	}
	// The last run: until everything is applied, past the AckWait of what
	// the killed ones held.
	cmd := child()
	defer func() {
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()
	}()
	// Bounded by progress, not by a total: on a loaded machine the last
	// run is slow, but one that stops applying for a minute is stuck.
	last, lastAt := applied(), time.Now()
	for last < n {
		if now := applied(); now > last {
			last, lastAt = now, time.Now()
		} else if time.Since(lastAt) > time.Minute {
			var dead, parked, held, pending int64
			db.Pool().QueryRow(ctx, `SELECT (SELECT count(*) FROM idem_dead_letters), (SELECT count(*) FROM idem_ledger_parked),
				(SELECT count(*) FROM idem_ledger_holds), (SELECT count(*) FROM idem_transport_pending)`).Scan(&dead, &parked, &held, &pending)
			var why string
			db.Pool().QueryRow(ctx, `SELECT coalesce(string_agg(DISTINCT l.class || ' after ' || a.number || ' attempts: ' || left(a.error, 200), '; '), '')
				FROM idem_dead_letters l JOIN idem_dead_letter_attempts a ON a.letter_id = l.id
				WHERE a.ord = (SELECT max(ord) FROM idem_dead_letter_attempts WHERE letter_id = l.id)`).Scan(&why)
			t.Fatalf("%d of %d messages applied after %d kills, and none for a minute: %d dead letters (%s), %d parked, %d keys held, %d deliveries pending",
				last, n, kills, dead, why, parked, held, pending)
		}
		time.Sleep(5 * time.Millisecond)
	}
	deadline := time.Now().Add(time.Minute)
	var inbox, unsettled int64
	if err := db.Pool().QueryRow(ctx, `SELECT (SELECT count(*) FROM idem_inbox WHERE consumer = 'settlement'),
		(SELECT count(*) FROM idem_transport_pending)`).Scan(&inbox, &unsettled); err != nil {
		t.Fatal(err)
	}
	// Settlements after the last effect commit with it: by now nothing is
	// left, or what is left is being settled.
	for unsettled > 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
		db.Pool().QueryRow(ctx, `SELECT count(*) FROM idem_transport_pending`).Scan(&unsettled)
	}
	if got := applied(); got != n || inbox != n || unsettled != 0 {
		t.Fatalf("after %d SIGKILLs: %d applied, %d inbox rows, %d unsettled; want %d, %d, 0", kills, got, inbox, unsettled, n, n)
	}
	t.Logf("%d SIGKILLs; every one of %d messages applied once", kills, n)
}

// TestCrashChild is the consumer TestConsumerSIGKILLedMidBatch kills: it
// runs until killed.
func TestCrashChild(t *testing.T) {
	schema := os.Getenv(crashChildEnv)
	if schema == "" {
		t.Skip("run by TestConsumerSIGKILLedMidBatch")
	}
	ctx := context.Background()
	db, err := idempg.Open(ctx, pgURL(t), &idempg.Config{Schema: schema, MaxConns: 4})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := idempg.NewTransport(ctx, db, &idempg.TransportConfig{Poll: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
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
		Name: "settlement", Topic: crashTopic, Subscriber: tr, Inbox: inbox, DeadLetters: letters, Ledger: ledger,
		InTx: func(ctx context.Context, fn func(context.Context) error) error {
			return db.WithTx(ctx, func(ctx context.Context, _ pgx.Tx) error { return fn(ctx) })
		},
		// What a killed run held comes back after a second.
		AckWait: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	err = c.Run(ctx, func(ctx context.Context, m idem.Message) error {
		return db.WithTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO crash_counters (key, n) VALUES ($1, 1)
				ON CONFLICT (key) DO UPDATE SET n = crash_counters.n + 1`, m.Key)
			return err
		})
	})
	if err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
}
