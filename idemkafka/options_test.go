package idemkafka_test

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemkafka"
)

// Config.ClientOptions add to the transport's franz-go options and cannot
// undo those its guarantees rest on. Here an option that would start a
// group with no committed offset at the end of the topic: the group must
// still start at the oldest record, so that the message published before
// the first Subscribe is delivered, as Subscribe promises.
func TestClientOptionsCannotUndoTheTransports(t *testing.T) {
	t.Parallel()
	const topic = "orders"
	seeds := startKafka(t)
	tr := open(t, seeds, idemkafka.Config{Partitions: 1, ClientOptions: []kgo.Opt{
		kgo.ConsumeResetOffset(kgo.NewOffset().AtEnd()),
	}})
	m := idem.Message{ID: "m1", Topic: topic, Payload: []byte("published before the first Subscribe")}
	if err := tr.Publish(t.Context(), m); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	s, err := tr.Subscribe(t.Context(), idem.Subscription{Topic: topic, Consumer: "c"})
	if err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	d, err := s.Next(ctx)
	if err != nil {
		t.Fatalf("Next = %v: the message published before the group's first Subscribe was skipped", err)
	}
	if d.Message().ID != m.ID {
		t.Fatalf("Next = %q, want %q", d.Message().ID, m.ID)
	}
	if err := d.Ack(t.Context()); err != nil {
		t.Fatalf("Ack: %v", err)
	}
}
