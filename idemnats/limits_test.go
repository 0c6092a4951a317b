package idemnats_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemnats"
)

// jetStream connects to the server, closed with the test.
func jetStream(t *testing.T) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(natsURL(t))
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// uniqueStream returns a stream name and subject prefix of the test's own;
// the stream is deleted when the test ends.
func uniqueStream(t *testing.T, js jetstream.JetStream) (stream, prefix string) {
	t.Helper()
	run := fmt.Sprintf("%08x", rand.Uint32())
	stream = "IDEMTEST_" + run
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := js.DeleteStream(ctx, stream); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			t.Errorf("delete stream %s: %v", stream, err)
		}
	})
	return stream, "idemtest" + run
}

// The stream the transport creates refuses a publish once full rather
// than dropping its oldest message, should an operator give it limits; it
// has no setting that drops a message, so nothing is reported.
func TestCreatedStreamDiscardsNew(t *testing.T) {
	t.Parallel()
	js := jetStream(t)
	stream, prefix := uniqueStream(t, js)
	tr, err := idemnats.New(t.Context(), js, &idemnats.Config{Stream: stream, SubjectPrefix: prefix})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	defer tr.Close()
	st, err := js.Stream(t.Context(), stream)
	if err != nil {
		t.Fatal(err)
	}
	if got := st.CachedInfo().Config.Discard; got != jetstream.DiscardNew {
		t.Errorf("created stream's Discard = %v, want DiscardNew", got)
	}
	if ws := tr.Warnings(); len(ws) != 0 {
		t.Errorf("Warnings of the created stream = %v, want none", ws)
	}
	// An operator gives it a limit: the message past it is refused, with
	// an error the outbox retries on, and the one stored stays.
	sc := st.CachedInfo().Config
	sc.MaxMsgs = 1
	if _, err := js.UpdateStream(t.Context(), sc); err != nil {
		t.Fatalf("update stream: %v", err)
	}
	if err := tr.Publish(t.Context(), idem.Message{ID: "m1", Topic: "orders"}); err != nil {
		t.Fatalf("Publish within the limit: %v", err)
	}
	if err := tr.Publish(t.Context(), idem.Message{ID: "m2", Topic: "orders"}); err == nil {
		t.Error("Publish past the limit succeeded; want the stream's refusal")
	}
	info, err := st.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 1 || info.State.FirstSeq != 1 {
		t.Errorf("stream holds %d messages from sequence %d, want the first one alone", info.State.Msgs, info.State.FirstSeq)
	}
}

// An existing stream is inspected and left as it is: every setting of it,
// or of its consumers, that can drop a message before its consumers have
// it is reported, and no other.
func TestExistingStreamReported(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		cfg      jetstream.StreamConfig
		consumer *jetstream.ConsumerConfig
		want     []string
	}{{
		name: "age and count limits, discard old",
		cfg:  jetstream.StreamConfig{MaxAge: time.Hour, MaxMsgs: 1000, Discard: jetstream.DiscardOld},
		want: []string{"MaxAge", "MaxMsgs"},
	}, {
		name: "every lossy setting",
		cfg: jetstream.StreamConfig{MaxAge: time.Hour, MaxMsgs: 1000, MaxBytes: 1 << 20, MaxMsgsPerSubject: 10,
			Discard: jetstream.DiscardOld, Retention: jetstream.InterestPolicy, Storage: jetstream.MemoryStorage},
		consumer: &jetstream.ConsumerConfig{Durable: "other", AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: 5},
		want:     []string{"MaxAge", "MaxMsgs", "MaxBytes", "MaxMsgsPerSubject", "Retention", "Storage", "MaxDeliver"},
	}, {
		name: "limits with discard new refuse instead",
		cfg:  jetstream.StreamConfig{MaxMsgs: 1000, MaxBytes: 1 << 20, Discard: jetstream.DiscardNew},
	}, {
		name: "a subject's limit discards old without DiscardNewPerSubject",
		cfg:  jetstream.StreamConfig{MaxMsgsPerSubject: 10, Discard: jetstream.DiscardNew},
		want: []string{"MaxMsgsPerSubject"},
	}, {
		name: "work queue",
		cfg:  jetstream.StreamConfig{Retention: jetstream.WorkQueuePolicy},
		want: []string{"Retention"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			js := jetStream(t)
			stream, prefix := uniqueStream(t, js)
			sc := tc.cfg
			sc.Name, sc.Subjects = stream, []string{prefix + ".>"}
			st, err := createStream(t, js, sc)
			if err != nil {
				t.Fatalf("create stream: %v", err)
			}
			if tc.consumer != nil {
				if _, err := st.CreateConsumer(t.Context(), *tc.consumer); err != nil {
					t.Fatalf("create consumer: %v", err)
				}
			}
			before := st.CachedInfo().Config
			var logged syncBuffer
			tr, err := idemnats.New(t.Context(), js, &idemnats.Config{Stream: stream, SubjectPrefix: prefix,
				Logger: slog.New(slog.NewTextHandler(&logged, nil))})
			if err != nil {
				t.Fatalf("New on the existing stream: %v", err)
			}
			defer tr.Close()
			var got []string
			for _, w := range tr.Warnings() {
				got = append(got, w.Setting)
				if !errors.Is(w, idemnats.ErrDropsMessages) || w.Stream != stream || w.Meaning == "" {
					t.Errorf("Warning %+v: want ErrDropsMessages on stream %s, with its meaning", w, stream)
				}
				if w.Setting == "MaxDeliver" && w.Consumer != "other" {
					t.Errorf("MaxDeliver reported on consumer %q, want other", w.Consumer)
				}
				if msg := w.Error(); !strings.Contains(msg, stream) || !strings.Contains(msg, w.Setting) || !strings.Contains(msg, w.Meaning) {
					t.Errorf("Warning says %q: want the stream, the setting and its meaning", msg)
				}
			}
			slices.Sort(got)
			want := slices.Clone(tc.want)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Errorf("reported %v, want %v", got, want)
			}
			if n := strings.Count(logged.String(), "level=WARN"); n != len(want) {
				t.Errorf("logged %d warnings, want %d:\n%s", n, len(want), logged.String())
			}
			after, err := js.Stream(t.Context(), stream)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(after.CachedInfo().Config, before) {
				t.Errorf("stream changed:\n%+v\nwas\n%+v", after.CachedInfo().Config, before)
			}
		})
	}
}

// A consumer that Subscribe makes with Config.MaxDeliver is reported, once:
// past it the server stops delivering a message without a word.
func TestMaxDeliverReported(t *testing.T) {
	t.Parallel()
	tr := newIsolated(t, idemnats.Config{MaxDeliver: 3})
	if ws := tr.Warnings(); len(ws) != 0 {
		t.Fatalf("Warnings before Subscribe = %v, want none", ws)
	}
	for range 2 {
		s, err := tr.Subscribe(t.Context(), idem.Subscription{Topic: "orders", Consumer: "c"})
		if err != nil {
			t.Fatal(err)
		}
		s.Close()
	}
	ws := tr.Warnings()
	if len(ws) != 1 || ws[0].Setting != "MaxDeliver" || ws[0].Consumer != "c" || ws[0].Value != "3" {
		t.Errorf("Warnings = %v, want MaxDeliver 3 on consumer c, once", ws)
	}
}

// syncBuffer is a bytes.Buffer safe for a logger and a test to share.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// createStream creates the stream, trying again when the server failed to
// make its storage: nats-server 2.x can lose the race between a stream
// created in one account directory and the last stream of that directory
// deleted at the same moment by a parallel test ("could not create storage
// directory … no such file or directory", err_code 10049), which a second
// try does not meet.
func createStream(t *testing.T, js jetstream.JetStream, sc jetstream.StreamConfig) (jetstream.Stream, error) {
	t.Helper()
	for try := 1; ; try++ {
		st, err := js.CreateStream(t.Context(), sc)
		var apiErr *jetstream.APIError
		if err == nil || try == 3 || !errors.As(err, &apiErr) || apiErr.ErrorCode != storeFailed {
			return st, err
		}
		t.Logf("create stream, try %d: %v; trying again", try, err)
	}
}

// storeFailed is JetStream's error code for a stream whose storage could
// not be made.
const storeFailed jetstream.ErrorCode = 10049
