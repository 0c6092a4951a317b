package idempg

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemtest"
)

// A waiting Next wakes through LISTEN/NOTIFY, not its poll, when another
// Transport (another process) publishes, on its own or in a transaction
// that commits, and when a stream of the same consumer name closes and
// gives its message back.
func TestTransportWakeUps(t *testing.T) {
	t.Parallel()
	url := idemtest.RequireService(t, "PostgreSQL", "IDEM_POSTGRES_URL",
		"postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	schema := "idempg_test_xprt_" + transportWakeID(t.Name()+time.Now().String())
	db, err := Open(ctx, url, &Config{Schema: schema, MaxConns: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		db.Close()
		conn, err := pgx.Connect(context.Background(), url)
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close(context.Background())
		if _, err := conn.Exec(context.Background(), `DROP SCHEMA `+quoteIdent(schema)+` CASCADE`); err != nil {
			t.Error(err)
		}
	})
	// A poll that never comes within the test: only a notification wakes
	// a waiting Next.
	cfg := &TransportConfig{Poll: time.Hour}
	a, err := NewTransport(ctx, db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := NewTransport(ctx, db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	waiting := make(chan struct{}, 1)
	b.onWait = func() {
		select {
		case waiting <- struct{}{}:
		default:
		}
	}
	listening := make(chan uint32, 10)
	b.waits.onListen = func(pid uint32) { listening <- pid }
	sub := idem.Subscription{Topic: "payments", Consumer: "c"}
	s, err := b.Subscribe(ctx, sub)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// The first Next starts b's LISTEN connection. A notification sent
	// before it listens is missed (and made up for by waking every waiter
	// once it listens), so this one only waits until it listens.
	warm, stop := context.WithCancel(ctx)
	warmed := make(chan struct{})
	go func() {
		defer close(warmed)
		s.Next(warm)
	}()
	<-listening
	stop()
	<-warmed

	// wakes starts a Next of s, lets it wait, runs act, and returns what
	// the Next got.
	wakes := func(what string, act func() error) idem.Delivery {
		t.Helper()
		select {
		case <-waiting: // left by an earlier Next
		default:
		}
		got := make(chan idem.Delivery, 1)
		go func() {
			d, err := s.Next(ctx)
			if err != nil {
				t.Errorf("Next, waiting for %s: %v", what, err)
			}
			got <- d
		}()
		select {
		case <-waiting:
		case <-ctx.Done():
			t.Fatalf("Next never waited for %s", what)
		}
		if err := act(); err != nil {
			t.Fatal(err)
		}
		d := <-got
		if d == nil {
			t.FailNow()
		}
		if d.Message().ID != what {
			t.Fatalf("Next = %q, want %q", d.Message().ID, what)
		}
		return d
	}

	d := wakes("own", func() error {
		return a.Publish(ctx, idem.Message{ID: "own", Topic: "payments"})
	})
	if err := d.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	d = wakes("in-tx", func() error {
		return db.WithTx(ctx, func(ctx context.Context, _ pgx.Tx) error {
			return a.Publish(ctx, idem.Message{ID: "in-tx", Topic: "payments"})
		})
	})
	if err := d.Ack(ctx); err != nil {
		t.Fatal(err)
	}

	holder, err := a.Subscribe(ctx, sub)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	if err := a.Publish(ctx, idem.Message{ID: "given-back", Topic: "payments"}); err != nil {
		t.Fatal(err)
	}
	if d, err := holder.Next(ctx); err != nil || d.Message().ID != "given-back" {
		t.Fatalf("holder's Next = %v, %v; want given-back", d, err)
	}
	d = wakes("given-back", holder.Close)
	if d.Attempt() != 2 {
		t.Errorf("Attempt = %d, want 2", d.Attempt())
	}
}
