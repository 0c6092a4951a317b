package idemkafka_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemkafka"
)

// A group the broker will not let the stream join (here a session timeout
// below the broker's group.min.session.timeout.ms) ends the stream with
// the broker's error, instead of a Next that waits for good.
func TestGroupRefusalEndsTheStream(t *testing.T) {
	t.Parallel()
	seeds := startKafka(t, kfake.GroupMinSessionTimeout(6*time.Second))
	tr := open(t, seeds, idemkafka.Config{SessionTimeout: time.Second})
	s, err := tr.Subscribe(t.Context(), idem.Subscription{Topic: "orders", Consumer: "c"})
	if err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	_, err = s.Next(ctx)
	if !errors.Is(err, kerr.InvalidSessionTimeout) {
		t.Fatalf("Next = %v, want the broker's INVALID_SESSION_TIMEOUT", err)
	}
}

// EnsureTopics creates what is missing, so that Warnings can read it
// before anything was published; a name Kafka cannot hold is refused.
func TestEnsureTopics(t *testing.T) {
	t.Parallel()
	tr := open(t, startKafka(t), idemkafka.Config{TopicPrefix: "svc."})
	if _, err := tr.Warnings(t.Context(), "orders"); err == nil {
		t.Fatal("Warnings of a topic not created yet = nil error")
	}
	if err := tr.EnsureTopics(t.Context(), "orders", "refunds"); err != nil {
		t.Fatalf("EnsureTopics: %v", err)
	}
	for _, topic := range []string{"orders", "refunds"} {
		if _, err := tr.Warnings(t.Context(), topic); err != nil {
			t.Errorf("Warnings(%q) after EnsureTopics: %v", topic, err)
		}
	}
	if err := tr.EnsureTopics(t.Context(), "no spaces"); !errors.Is(err, idem.ErrInvalidArgument) {
		t.Errorf("EnsureTopics(\"no spaces\") = %v, want idem.ErrInvalidArgument", err)
	}
}
