package idemkafka

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemkafka/internal/stream"
)

// Subscribe joins the consumer group sub.Consumer on sub.Topic and returns
// its stream, an idem.BatchStream. A group that has committed nothing yet
// starts at the topic's oldest record, so what was published before the
// first Subscribe is delivered too. The topic is created when missing
// (unless Config.ManualTopics), and its settings that can lose messages
// are logged (see Warnings).
//
// sub.AckWait is not used: Kafka hands a partition to one group member at
// a time and redelivers only after a rebalance, so a delivery is held
// until it is settled, the stream closes, or its partition moves.
func (t *Transport) Subscribe(ctx context.Context, sub idem.Subscription) (idem.Stream, error) {
	if err := sub.Validate(); err != nil {
		return nil, err
	}
	if err := checkTopic("Subscription.Topic", t.cfg.TopicPrefix+sub.Topic); err != nil {
		return nil, err
	}
	if t.isClosed() {
		return nil, idem.ErrClosed
	}
	if err := t.ensureTopic(ctx, sub.Topic); err != nil {
		return nil, err
	}
	cfg := stream.Config{
		Consumer:       sub.Consumer,
		TopicPrefix:    t.cfg.TopicPrefix,
		Clock:          t.cfg.Clock,
		Logger:         t.cfg.Logger,
		MaxInFlight:    t.cfg.MaxInFlight,
		CommitInterval: t.cfg.CommitInterval,
		RevokeWait:     t.cfg.RevokeWait,
		Counters:       t.counters(sub.Consumer),
	}
	if sub.MaxInFlight > 0 {
		cfg.MaxInFlight = sub.MaxInFlight
	}
	s, err := stream.New(cfg, func(cb stream.Callbacks) (stream.Client, error) {
		// The stream's own options come after t.cfg.ClientOptions, which
		// cannot undo them (franz-go applies options in order).
		opts := append(slices.Clone(t.cfg.ClientOptions),
			kgo.SeedBrokers(t.seeds...),
			kgo.ConsumerGroup(sub.Consumer),
			kgo.ConsumeTopics(t.cfg.TopicPrefix+sub.Topic),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
			// Offsets are committed by the stream, only past what was
			// settled: franz-go's autocommit would commit what was polled.
			kgo.DisableAutoCommit(),
			kgo.FetchIsolationLevel(kgo.ReadCommitted()),
			kgo.SessionTimeout(t.cfg.SessionTimeout),
			// Kafka's own ratio: three heartbeats a session.
			kgo.HeartbeatInterval(min(3*time.Second, t.cfg.SessionTimeout/3)),
			// RevokeWait, and as long again (5s at most) to commit after it:
			// the coordinator waits that long for a member to rejoin, so a
			// killed member delays a rebalance by no more.
			kgo.RebalanceTimeout(t.cfg.RevokeWait+min(t.cfg.RevokeWait, 5*time.Second)),
			kgo.OnPartitionsAssigned(cb.Assigned),
			kgo.OnPartitionsRevoked(cb.Revoked),
			kgo.OnPartitionsLost(cb.Lost),
		)
		cl, err := kgo.NewClient(opts...)
		if err != nil {
			return nil, fmt.Errorf("idemkafka: %w", err)
		}
		return stream.KgoClient(cl), nil
	})
	if err != nil {
		return nil, err
	}
	t.track(sub.Consumer, s)
	return &subscribed{Stream: s, t: t, consumer: sub.Consumer}, nil
}

// subscribed is a stream the transport counts in its StreamStats until it
// is closed.
type subscribed struct {
	*stream.Stream
	t        *Transport
	consumer string
}

func (s *subscribed) Close() error {
	err := s.Stream.Close()
	s.t.untrack(s.consumer, s.Stream)
	return err
}

// counters returns the counts kept for consumer's streams.
func (t *Transport) counters(consumer string) *stream.Counters {
	t.mu.Lock()
	defer t.mu.Unlock()
	c := t.groupCounters[consumer]
	if c == nil {
		c = new(stream.Counters)
		t.groupCounters[consumer] = c
	}
	return c
}

func (t *Transport) track(consumer string, s *stream.Stream) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.streams[consumer] == nil {
		t.streams[consumer] = make(map[*stream.Stream]bool)
	}
	t.streams[consumer][s] = true
}

func (t *Transport) untrack(consumer string, s *stream.Stream) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.streams[consumer], s)
}

// StreamStats returns what the open streams of consumer (a consumer
// group) hold in this process's memory, and how their commits fared since
// the transport was opened. It implements idemprom.StreamStatser.
func (t *Transport) StreamStats(consumer string) idem.StreamStats {
	t.mu.Lock()
	ss := make([]*stream.Stream, 0, len(t.streams[consumer]))
	for s := range t.streams[consumer] {
		ss = append(ss, s)
	}
	c := t.groupCounters[consumer]
	t.mu.Unlock()
	var out idem.StreamStats
	for _, s := range ss {
		st := s.Stats()
		out.Held += st.Held
		out.HeldBytes += st.HeldBytes
		out.HeldPeak += st.Peak
		out.Delayed += st.Delayed
		out.Limit += st.Limit
		out.Uncommitted += st.Uncommitted
		if !st.OldestHeld.IsZero() && (out.OldestHeld.IsZero() || st.OldestHeld.Before(out.OldestHeld)) {
			out.OldestHeld = st.OldestHeld
		}
	}
	if c != nil {
		out.CommitFailures = c.CommitFailures.Load()
	}
	return out
}
