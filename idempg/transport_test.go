package idempg_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/idemtest"
)

func newTransport(t testing.TB, db *idempg.DB, cfg idempg.TransportConfig) *idempg.Transport {
	t.Helper()
	if cfg.Poll == 0 {
		// Tests move their clocks by hand: look at them often.
		cfg.Poll = 10 * time.Millisecond
	}
	tr, err := idempg.NewTransport(t.Context(), db, &cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := tr.Close(); err != nil {
			t.Errorf("Transport.Close: %v", err)
		}
	})
	return tr
}

// transportDB returns a DB in a fresh schema with the transport's tables,
// for the subtests of a suite to share: they keep apart by their topics.
func transportDB(t testing.TB) *idempg.DB {
	t.Helper()
	db := openDB(t, pgURL(t), idempg.Config{MaxConns: 8})
	newTransport(t, db, idempg.TransportConfig{}).Close()
	return db
}

func nextDelivery(t testing.TB, s idem.Stream) idem.Delivery {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	d, err := s.Next(ctx)
	if err != nil {
		t.Fatalf("Next: %v", err)
	}
	return d
}

func subscribe(t testing.TB, tr *idempg.Transport, sub idem.Subscription) idem.Stream {
	t.Helper()
	s, err := tr.Subscribe(t.Context(), sub)
	if err != nil {
		t.Fatalf("Subscribe(%q, %q): %v", sub.Topic, sub.Consumer, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// Streams of one consumer name, in two Transports as two processes would
// have them, compete for one queue: no message is handed to two streams at
// once, and each is acknowledged exactly once.
func TestTransportCompetingStreams(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := transportDB(t)
	const n, perTransport = 300, 3
	sub := idem.Subscription{Topic: "payments", Consumer: "settlement", AckWait: time.Minute}
	var (
		streams []idem.Stream
		pubs    []*idempg.Transport
	)
	for range 2 {
		tr := newTransport(t, db, idempg.TransportConfig{Poll: 50 * time.Millisecond})
		pubs = append(pubs, tr)
		for range perTransport {
			streams = append(streams, subscribe(t, tr, sub))
		}
	}
	var (
		mu      sync.Mutex
		holding = make(map[string]int) // message → stream holding it
		acked   = make(map[string]int)
		wg      sync.WaitGroup
		done    = make(chan struct{})
		stop    = sync.OnceFunc(func() { close(done) })
	)
	for i, s := range streams {
		wg.Go(func() {
			for {
				nctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
				d, err := s.Next(nctx)
				cancel()
				if err != nil {
					select {
					case <-done:
						return
					default:
						continue
					}
				}
				id := d.Message().ID
				mu.Lock()
				if other, ok := holding[id]; ok {
					t.Errorf("message %q handed to stream %d while stream %d holds it", id, i, other)
				}
				holding[id] = i
				mu.Unlock()
				err = d.Ack(ctx)
				mu.Lock()
				delete(holding, id)
				if err != nil {
					mu.Unlock()
					t.Errorf("Ack(%q): %v", id, err)
					continue
				}
				acked[id]++
				if len(acked) == n {
					stop()
				}
				mu.Unlock()
			}
		})
	}
	// Published while the streams take, from both Transports, in batches.
	for i := 0; i < n; i += 10 {
		var msgs []idem.Message
		for j := i; j < i+10; j++ {
			msgs = append(msgs, idem.Message{ID: fmt.Sprint("m-", j), Topic: "payments", Payload: []byte("x")})
		}
		if err := pubs[i/10%2].Publish(ctx, msgs...); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Error("not every message was acknowledged within 30s")
		stop()
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	for id, c := range acked {
		if c != 1 {
			t.Errorf("message %q acknowledged %d times, want once", id, c)
		}
	}
	if len(acked) != n {
		t.Errorf("%d distinct messages acknowledged, want %d", len(acked), n)
	}
}

// Publish and Ack join the caller's transaction: a message published in a
// transaction that rolls back is never delivered, and an Ack that rolls
// back leaves the delivery holding its message.
func TestTransportJoinsCallersTx(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := transportDB(t)
	tr := newTransport(t, db, idempg.TransportConfig{Clock: idemmem.NewClock(idemtest.Start)})
	s := subscribe(t, tr, idem.Subscription{Topic: "payments", Consumer: "c"})
	rollback := errors.New("roll back")
	err := db.WithTx(ctx, func(ctx context.Context, _ pgx.Tx) error {
		if err := tr.Publish(ctx, idem.Message{ID: "rolled-back", Topic: "payments"}); err != nil {
			return err
		}
		return rollback
	})
	if !errors.Is(err, rollback) {
		t.Fatalf("WithTx = %v, want the rollback", err)
	}
	err = db.WithTx(ctx, func(ctx context.Context, _ pgx.Tx) error {
		return tr.Publish(ctx, idem.Message{ID: "committed", Topic: "payments"})
	})
	if err != nil {
		t.Fatal(err)
	}
	d := nextDelivery(t, s)
	if d.Message().ID != "committed" {
		t.Fatalf("Next = %q, want the committed message only", d.Message().ID)
	}
	err = db.WithTx(ctx, func(ctx context.Context, _ pgx.Tx) error {
		if err := d.Ack(ctx); err != nil {
			return err
		}
		return rollback
	})
	if !errors.Is(err, rollback) {
		t.Fatalf("WithTx = %v, want the rollback", err)
	}
	if err := d.Ack(ctx); err != nil {
		t.Errorf("Ack after the rolled-back Ack = %v, want nil", err)
	}
	if err := d.Ack(ctx); !errors.Is(err, idempg.ErrStaleDelivery) {
		t.Errorf("second Ack = %v, want ErrStaleDelivery", err)
	}
	nctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if d, err := s.Next(nctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Next = %v, %v; want nothing: the rolled-back message must never come", d, err)
	}
}

// A publisher whose REPEATABLE READ snapshot predates a consumer name's
// first Subscribe fails with a serialization failure instead of publishing
// a message that consumer name would never get.
func TestTransportRepeatableReadPublisher(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url := pgURL(t)
	db := openDB(t, url, idempg.Config{TxOptions: pgx.TxOptions{IsoLevel: pgx.RepeatableRead}})
	tr := newTransport(t, db, idempg.TransportConfig{})
	first := subscribe(t, tr, idem.Subscription{Topic: "payments", Consumer: "first"})
	if err := tr.Publish(ctx, idem.Message{ID: "before", Topic: "payments"}); err != nil {
		t.Fatal(err)
	}
	var late idem.Stream
	err := db.WithTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		// The snapshot is taken here...
		if _, err := tx.Exec(ctx, `SELECT 1`); err != nil {
			return err
		}
		// ...then a consumer name is created, and commits...
		late = subscribe(t, tr, idem.Subscription{Topic: "payments", Consumer: "late"})
		// ...before this transaction publishes.
		return tr.Publish(ctx, idem.Message{ID: "racing", Topic: "payments"})
	})
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "40001" {
		t.Fatalf("WithTx = %v, want a serialization failure (40001)", err)
	}
	for _, s := range []idem.Stream{first, late} {
		d := nextDelivery(t, s)
		if d.Message().ID != "before" {
			t.Fatalf("Next = %q, want %q", d.Message().ID, "before")
		}
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// Retried, it publishes to both.
	err = db.WithTx(ctx, func(ctx context.Context, _ pgx.Tx) error {
		return tr.Publish(ctx, idem.Message{ID: "racing", Topic: "payments"})
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []idem.Stream{first, late} {
		if d := nextDelivery(t, s); d.Message().ID != "racing" {
			t.Fatalf("Next = %q, want %q", d.Message().ID, "racing")
		}
	}
}

// The attempt count and an unsettled message survive a restart: a new
// Transport on the same schema carries on where the old one stopped.
func TestTransportRestart(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := transportDB(t)
	clock := idemmem.NewClock(idemtest.Start)
	sub := idem.Subscription{Topic: "payments", Consumer: "settlement", AckWait: time.Minute}
	m := idem.Message{ID: "evt-1", Topic: "payments", Payload: []byte("x")}

	first := newTransport(t, db, idempg.TransportConfig{Clock: clock})
	s, err := first.Subscribe(ctx, sub)
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Publish(ctx, m); err != nil {
		t.Fatal(err)
	}
	for want := 1; want <= 2; want++ {
		d := nextDelivery(t, s)
		if d.Attempt() != want {
			t.Fatalf("Attempt = %d, want %d", d.Attempt(), want)
		}
		if want == 1 {
			if err := d.Nack(ctx, 0); err != nil {
				t.Fatal(err)
			}
		}
	}
	// The second delivery is never settled: the process "dies".
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	second := newTransport(t, db, idempg.TransportConfig{Clock: clock})
	d := nextDelivery(t, subscribe(t, second, sub))
	if d.Message().ID != m.ID || d.Attempt() != 3 {
		t.Fatalf("after a restart: %q attempt %d, want %q attempt 3", d.Message().ID, d.Attempt(), m.ID)
	}
	if err := d.Ack(ctx); err != nil {
		t.Fatal(err)
	}
}

// A stream holds at most MaxInFlight deliveries; one whose AckWait ended no
// longer counts.
func TestTransportMaxInFlight(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	clock := idemmem.NewClock(idemtest.Start)
	tr := newTransport(t, transportDB(t), idempg.TransportConfig{Clock: clock})
	s := subscribe(t, tr, idem.Subscription{Topic: "payments", Consumer: "c", MaxInFlight: 2, AckWait: time.Minute})
	for i := range 3 {
		if err := tr.Publish(ctx, idem.Message{ID: fmt.Sprint("m-", i), Topic: "payments"}); err != nil {
			t.Fatal(err)
		}
	}
	d0, _ := nextDelivery(t, s), nextDelivery(t, s)
	nctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if d, err := s.Next(nctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Next at MaxInFlight = %v, %v; want nothing", d, err)
	}
	if err := d0.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	if d := nextDelivery(t, s); d.Message().ID != "m-2" {
		t.Fatalf("Next after an Ack = %q, want m-2", d.Message().ID)
	}
	clock.Advance(time.Minute + time.Millisecond)
	// Both AckWaits ended: both come again.
	for _, want := range []string{"m-1", "m-2"} {
		if d := nextDelivery(t, s); d.Message().ID != want || d.Attempt() != 2 {
			t.Fatalf("Next after the AckWait = %q attempt %d, want %q attempt 2", d.Message().ID, d.Attempt(), want)
		}
	}
}

func TestTransportPurge(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	clock := idemmem.NewClock(idemtest.Start)
	tr := newTransport(t, transportDB(t), idempg.TransportConfig{Clock: clock})
	a := subscribe(t, tr, idem.Subscription{Topic: "payments", Consumer: "a"})
	b := subscribe(t, tr, idem.Subscription{Topic: "payments", Consumer: "b"})
	for i := range 3 {
		if err := tr.Publish(ctx, idem.Message{ID: fmt.Sprint("m-", i), Topic: "payments"}); err != nil {
			t.Fatal(err)
		}
	}
	// Nobody wants these: they go with the first purge.
	if err := tr.Publish(ctx, idem.Message{ID: "unwanted", Topic: "refunds"}); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Hour)
	purge := func(want int, why string) {
		t.Helper()
		if n, err := tr.Purge(ctx, clock.Now(), 10); err != nil || n != want {
			t.Errorf("Purge = %d, %v; want %d: %s", n, err, want, why)
		}
	}
	if _, err := tr.Purge(ctx, clock.Now(), 0); !errors.Is(err, idem.ErrInvalidArgument) {
		t.Errorf("Purge(limit 0) = %v, want idem.ErrInvalidArgument", err)
	}
	purge(1, "only the message no consumer name wanted is settled")
	// a settles everything; b holds m-0 unsettled and has not had m-1, m-2.
	for range 3 {
		if err := nextDelivery(t, a).Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
	held := nextDelivery(t, b)
	purge(0, "b has not settled any")
	if err := held.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := tr.Purge(ctx, idemtest.Start, 10); err != nil || n != 0 {
		t.Errorf("Purge(before they were published) = %d, %v; want 0", n, err)
	}
	purge(1, "both have settled m-0")
	// b still gets the rest.
	for i := 1; i < 3; i++ {
		d := nextDelivery(t, b)
		if d.Message().ID != fmt.Sprint("m-", i) {
			t.Fatalf("b got %q, want m-%d", d.Message().ID, i)
		}
		if err := d.Term(ctx); err != nil {
			t.Fatal(err)
		}
	}
	purge(2, "both have settled every message")
	// A consumer name created after the purge starts from what is left.
	if err := tr.Publish(ctx, idem.Message{ID: "m-3", Topic: "payments"}); err != nil {
		t.Fatal(err)
	}
	c := subscribe(t, tr, idem.Subscription{Topic: "payments", Consumer: "c"})
	if d := nextDelivery(t, c); d.Message().ID != "m-3" {
		t.Fatalf("a new consumer name got %q first, want m-3", d.Message().ID)
	}
}

func TestTransportInvalid(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	tr := newTransport(t, transportDB(t), idempg.TransportConfig{})
	for _, m := range []idem.Message{
		{ID: "a\x00b", Topic: "payments"},
		{ID: "ok", Topic: "pay\xffments"},
		{ID: "ok", Topic: "payments", Key: "\x00"},
	} {
		if err := tr.Publish(ctx, m); !errors.Is(err, idem.ErrInvalidArgument) {
			t.Errorf("Publish(%+v) = %v, want idem.ErrInvalidArgument", m, err)
		}
	}
	for _, sub := range []idem.Subscription{
		{Topic: "pay\x00ments", Consumer: "c"},
		{Topic: "payments", Consumer: "c", AckWait: -1},
		{Topic: "payments", Consumer: "c", MaxInFlight: -1},
	} {
		if _, err := tr.Subscribe(ctx, sub); !errors.Is(err, idem.ErrInvalidArgument) {
			t.Errorf("Subscribe(%+v) = %v, want idem.ErrInvalidArgument", sub, err)
		}
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	if err := tr.Publish(ctx, idem.Message{ID: "late", Topic: "payments"}); !errors.Is(err, idem.ErrClosed) {
		t.Errorf("Publish after Close = %v, want idem.ErrClosed", err)
	}
	if _, err := tr.Subscribe(ctx, idem.Subscription{Topic: "payments", Consumer: "c"}); !errors.Is(err, idem.ErrClosed) {
		t.Errorf("Subscribe after Close = %v, want idem.ErrClosed", err)
	}
}

// The first Subscribe of a consumer name waits for a transaction that is
// publishing to its topic, and then gets the message: neither misses the
// other.
func TestTransportFirstSubscribeWaitsForPublisher(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	app := randomName("idempg_xprt_")
	db := openDB(t, withAppName(pgURL(t), app), idempg.Config{})
	tr := newTransport(t, db, idempg.TransportConfig{})
	type result struct {
		s   idem.Stream
		err error
	}
	subscribed := make(chan result, 1)
	// The topic exists already: the publisher below only locks its row.
	if err := tr.Publish(ctx, idem.Message{ID: "earlier", Topic: "payments"}); err != nil {
		t.Fatal(err)
	}
	err := db.WithTx(ctx, func(ctx context.Context, _ pgx.Tx) error {
		if err := tr.Publish(ctx, idem.Message{ID: "in-flight", Topic: "payments"}); err != nil {
			return err
		}
		go func() {
			s, err := tr.Subscribe(t.Context(), idem.Subscription{Topic: "payments", Consumer: "new"})
			subscribed <- result{s, err}
		}()
		var returned bool
		idemtest.Eventually(t, 10*time.Second, "Subscribe to wait for the publisher's lock, or return", func() bool {
			if len(subscribed) > 0 {
				returned = true
				return true
			}
			var waiting bool
			err := db.Pool().QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
				WHERE application_name = $1 AND wait_event_type = 'Lock')`, app).Scan(&waiting)
			if err != nil {
				t.Error(err)
				return true
			}
			return waiting
		})
		if returned {
			t.Error("Subscribe returned while a transaction publishing to its topic was open")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	r := <-subscribed
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer r.s.Close()
	for _, want := range []string{"earlier", "in-flight"} {
		d := nextDelivery(t, r.s)
		if d.Message().ID != want {
			t.Fatalf("Next = %q, want %q", d.Message().ID, want)
		}
		if err := d.Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// A delivery whose message went out again after its AckWait can no longer
// settle it or hold it; the new delivery can.
func TestTransportStaleDelivery(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	clock := idemmem.NewClock(idemtest.Start)
	tr := newTransport(t, transportDB(t), idempg.TransportConfig{Clock: clock})
	s := subscribe(t, tr, idem.Subscription{Topic: "payments", Consumer: "c", AckWait: time.Minute})
	if err := tr.Publish(ctx, idem.Message{ID: "m", Topic: "payments"}); err != nil {
		t.Fatal(err)
	}
	old := nextDelivery(t, s)
	clock.Advance(time.Minute)
	if err := old.InProgress(ctx); !errors.Is(err, idempg.ErrStaleDelivery) {
		t.Errorf("InProgress after the AckWait = %v, want ErrStaleDelivery", err)
	}
	again := nextDelivery(t, s)
	if again.Attempt() != 2 {
		t.Fatalf("Attempt = %d, want 2", again.Attempt())
	}
	for name, op := range map[string]func(context.Context) error{
		"Ack": old.Ack, "Term": old.Term, "InProgress": old.InProgress,
		"Nack": func(ctx context.Context) error { return old.Nack(ctx, 0) },
	} {
		if err := op(ctx); !errors.Is(err, idempg.ErrStaleDelivery) {
			t.Errorf("%s of the first delivery = %v, want ErrStaleDelivery", name, err)
		}
	}
	if err := again.InProgress(ctx); err != nil {
		t.Errorf("InProgress of the new delivery = %v", err)
	}
	if err := again.Ack(ctx); err != nil {
		t.Errorf("Ack of the new delivery = %v", err)
	}
}
