package idemnats_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemnats"
	"github.com/idem-go/idem/idemtest"
)

func natsURL(t testing.TB) string {
	t.Helper()
	return idemtest.RequireService(t, "NATS", "IDEM_NATS_URL", "nats://127.0.0.1:4222")
}

// newIsolated returns a Transport on a stream and subject prefix of its
// own, deleted when the test ends.
func newIsolated(t testing.TB, cfg idemnats.Config) *idemnats.Transport {
	t.Helper()
	url := natsURL(t)
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		t.Fatal(err)
	}
	run := fmt.Sprintf("%08x", rand.Uint32())
	cfg.Stream = "IDEMTEST_" + run
	cfg.SubjectPrefix = "idemtest" + run
	tr, err := idemnats.New(t.Context(), js, &cfg)
	if err != nil {
		nc.Close()
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		_ = tr.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := js.DeleteStream(ctx, cfg.Stream); err != nil {
			t.Errorf("delete stream %s: %v", cfg.Stream, err)
		}
		nc.Close()
	})
	return tr
}

func TestOpen(t *testing.T) {
	t.Parallel()
	url := natsURL(t)
	run := fmt.Sprintf("%08x", rand.Uint32())
	cfg := &idemnats.Config{Stream: "IDEMTEST_" + run, SubjectPrefix: "idemtest" + run}
	tr, err := idemnats.Open(t.Context(), url, cfg)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	defer tr.Close()
	// A second transport on the existing stream leaves it as it is.
	tr2, err := idemnats.Open(t.Context(), url, cfg)
	if err != nil {
		t.Fatalf("Open on an existing stream: %v", err)
	}
	defer tr2.Close()
	defer func() {
		nc, err := nats.Connect(url)
		if err != nil {
			t.Error(err)
			return
		}
		defer nc.Close()
		js, _ := jetstream.New(nc)
		if err := js.DeleteStream(context.Background(), cfg.Stream); err != nil {
			t.Errorf("delete stream: %v", err)
		}
	}()

	s, err := tr2.Subscribe(t.Context(), idem.Subscription{Topic: "orders", Consumer: "c"})
	if err != nil {
		t.Fatal(err)
	}
	want := idem.Message{ID: "m1", Topic: "orders", Time: time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)}
	// Published twice: JetStream drops the second within its window.
	for range 2 {
		if err := tr.Publish(t.Context(), want); err != nil {
			t.Fatalf("Publish: %v", err)
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	d, err := s.Next(ctx)
	if err != nil {
		t.Fatalf("Next: %v", err)
	}
	if got := d.Message(); got.ID != want.ID || !got.Time.Equal(want.Time) {
		t.Errorf("got %q at %v, want %q at %v", got.ID, got.Time, want.ID, want.Time)
	}
	if err := d.Ack(ctx); err != nil {
		t.Fatalf("Ack: %v", err)
	}
	if err := d.Ack(ctx); !errors.Is(err, idemnats.ErrStaleDelivery) {
		t.Errorf("second Ack = %v, want ErrStaleDelivery", err)
	}
	quiet, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	if d, err := s.Next(quiet); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Next after the duplicate publish = %v, %v; want nothing (de-duplicated)", d, err)
	}

	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	if err := tr.Publish(t.Context(), want); !errors.Is(err, idem.ErrClosed) {
		t.Errorf("Publish after Close = %v, want ErrClosed", err)
	}
	if _, err := tr.Subscribe(t.Context(), idem.Subscription{Topic: "orders", Consumer: "c"}); !errors.Is(err, idem.ErrClosed) {
		t.Errorf("Subscribe after Close = %v, want ErrClosed", err)
	}
}

// MaxDeliver is the broker's own bound: past it the server stops
// delivering the message.
func TestMaxDeliver(t *testing.T) {
	t.Parallel()
	tr := newIsolated(t, idemnats.Config{MaxDeliver: 2})
	s, err := tr.Subscribe(t.Context(), idem.Subscription{Topic: "orders", Consumer: "c"})
	if err != nil {
		t.Fatal(err)
	}
	if err := tr.Publish(t.Context(), idem.Message{ID: "m1", Topic: "orders"}, idem.Message{ID: "m2", Topic: "orders"}); err != nil {
		t.Fatal(err)
	}
	var got []string
	for range 3 {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		d, err := s.Next(ctx)
		cancel()
		if err != nil {
			t.Fatalf("Next: %v", err)
		}
		got = append(got, fmt.Sprintf("%s#%d", d.Message().ID, d.Attempt()))
		if d.Message().ID == "m1" {
			err = d.Nack(t.Context(), 0)
		} else {
			err = d.Ack(t.Context())
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	quiet, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	if d, err := s.Next(quiet); err == nil {
		got = append(got, fmt.Sprintf("%s#%d", d.Message().ID, d.Attempt()))
	}
	// m1 twice, m2 once, in any interleaving; never m1#3.
	count := map[string]int{}
	for _, g := range got {
		count[g]++
	}
	if len(got) != 3 || count["m1#1"] != 1 || count["m1#2"] != 1 || count["m2#1"] != 1 {
		t.Errorf("deliveries = %v, want m1#1, m1#2 and m2#1", got)
	}
}

func TestInvalid(t *testing.T) {
	t.Parallel()
	tr := newIsolated(t, idemnats.Config{})
	for name, m := range map[string]idem.Message{
		"wildcard topic":        {ID: "a", Topic: "orders.*"},
		"empty token":           {ID: "a", Topic: "orders..x"},
		"space in topic":        {ID: "a", Topic: "or ders"},
		"reserved header":       {ID: "a", Topic: "t", Headers: map[string]string{"Idem-Key": "x"}},
		"server header":         {ID: "a", Topic: "t", Headers: map[string]string{"Nats-Expected-Stream": "x"}},
		"colon in header name":  {ID: "a", Topic: "t", Headers: map[string]string{"a:b": "x"}},
		"line break in value":   {ID: "a", Topic: "t", Headers: map[string]string{"X": "a\r\nb"}},
		"value begins blank":    {ID: "a", Topic: "t", Headers: map[string]string{"X": " a"}},
		"line break in the key": {ID: "a", Topic: "t", Key: "k\n"},
	} {
		if err := tr.Publish(t.Context(), m); !errors.Is(err, idem.ErrInvalidArgument) {
			t.Errorf("Publish(%s) = %v, want ErrInvalidArgument", name, err)
		}
	}
	for name, sub := range map[string]idem.Subscription{
		"dot in consumer":      {Topic: "t", Consumer: "a.b"},
		"space in consumer":    {Topic: "t", Consumer: "a b"},
		"bad topic":            {Topic: "t..u", Consumer: "c"},
		"negative AckWait":     {Topic: "t", Consumer: "c", AckWait: -time.Second},
		"negative MaxInFlight": {Topic: "t", Consumer: "c", MaxInFlight: -1},
	} {
		if _, err := tr.Subscribe(t.Context(), sub); !errors.Is(err, idem.ErrInvalidArgument) {
			t.Errorf("Subscribe(%s) = %v, want ErrInvalidArgument", name, err)
		}
	}
}

func TestConfigInvalid(t *testing.T) {
	t.Parallel()
	for name, cfg := range map[string]idemnats.Config{
		"dot in stream":     {Stream: "A.B"},
		"wildcard prefix":   {SubjectPrefix: "idem.*"},
		"negative AckWait":  {AckWait: -1},
		"short PollWait":    {PollWait: time.Millisecond},
		"long PollWait":     {PollWait: time.Minute},
		"negative MaxDeliv": {MaxDeliver: -1},
		"negative window":   {PublishWindow: -1},
	} {
		// The configuration is checked before any connection is made.
		if _, err := idemnats.Open(t.Context(), "nats://127.0.0.1:1", &cfg); !errors.Is(err, idem.ErrInvalidArgument) {
			t.Errorf("Open(%s) = %v, want ErrInvalidArgument", name, err)
		}
	}
}

// TestExample runs Example, which needs the server, and checks its output.
func TestExample(t *testing.T) {
	// Not parallel: it swaps os.Stdout.
	natsURL(t)
	if got, want := captureStdout(t, Example), "evt-1 acct-1 attempt 1\nevt-1 attempt 2\n"; got != want {
		t.Errorf("Example printed:\n%s\nwant:\n%s", got, want)
	}
}

func captureStdout(t *testing.T, fn func()) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout := os.Stdout
	os.Stdout = w
	done := make(chan []byte)
	go func() {
		b, _ := io.ReadAll(r)
		done <- b
	}()
	func() {
		defer func() { os.Stdout = stdout }()
		fn()
	}()
	w.Close()
	out := <-done
	r.Close()
	return string(out)
}
