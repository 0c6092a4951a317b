package idemkafka

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/idem-go/idem"
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
	s := &stream{
		t:           t,
		sub:         sub,
		maxInFlight: t.cfg.MaxInFlight,
		parts:       make(map[partition]*partState),
		wake:        make(chan struct{}),
		done:        make(chan struct{}),
		committed:   make(chan struct{}),
	}
	if sub.MaxInFlight > 0 {
		s.maxInFlight = sub.MaxInFlight
	}
	opts := append([]kgo.Opt{
		kgo.SeedBrokers(t.seeds...),
		kgo.ConsumerGroup(sub.Consumer),
		kgo.ConsumeTopics(t.cfg.TopicPrefix + sub.Topic),
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
		kgo.RebalanceTimeout(t.cfg.RevokeWait + min(t.cfg.RevokeWait, 5*time.Second)),
		kgo.OnPartitionsAssigned(s.assigned),
		kgo.OnPartitionsRevoked(s.revoked),
		kgo.OnPartitionsLost(s.lost),
	}, t.cfg.ClientOptions...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("idemkafka: %w", err)
	}
	s.cl = cl
	go s.commitLoop()
	return s, nil
}

type partition struct {
	topic string
	part  int32
}

// partState is what a stream holds of one assigned partition: its records
// from the oldest unsettled one on, in offset order. The offset to commit
// is the oldest unsettled record's, since everything before it is settled.
type partState struct {
	partition
	entries []*entry
	// mark is the offset everything before which is settled; -1 until a
	// record was settled.
	mark      int64
	markEpoch int32
	// committed is the mark last committed.
	committed int64
	gone      bool
}

// entry is one record a stream holds.
type entry struct {
	ps      *partState
	rec     *kgo.Record
	msg     idem.Message
	settled bool
	// token names the current hand-out; 0 while not handed out.
	token   uint64
	attempt int
	due     time.Time
}

// advance moves ps.mark past the settled records at its front.
func (ps *partState) advance() {
	i := 0
	for i < len(ps.entries) && ps.entries[i].settled {
		r := ps.entries[i].rec
		ps.mark, ps.markEpoch = r.Offset+1, r.LeaderEpoch
		i++
	}
	if i > 0 {
		clear(ps.entries[:i])
		ps.entries = ps.entries[i:]
	}
}

type stream struct {
	t           *Transport
	sub         idem.Subscription
	cl          *kgo.Client
	maxInFlight int

	mu    sync.Mutex
	parts map[partition]*partState
	// ready holds records polled and not yet handed out, oldest first;
	// delayed holds Nacked records waiting for their delay, soonest first.
	ready, delayed []*entry
	inFlight       int
	nextToken      uint64
	polling        bool
	stopPoll       context.CancelFunc
	// wake is closed, and replaced, whenever a waiting Next may proceed.
	wake   chan struct{}
	closed bool
	// err is a fatal error of the client, returned by Next.
	err error

	closeOnce sync.Once
	done      chan struct{} // closed by Close
	committed chan struct{} // closed when commitLoop has ended
}

var _ idem.BatchStream = (*stream)(nil)

// broadcastLocked wakes every waiting Next, and a poll that blocks them.
func (s *stream) broadcastLocked() {
	close(s.wake)
	s.wake = make(chan struct{})
	if s.stopPoll != nil {
		s.stopPoll()
	}
}

func (s *stream) Next(ctx context.Context) (idem.Delivery, error) {
	ds, err := s.NextBatch(ctx, 1)
	if err != nil {
		return nil, err
	}
	return ds[0], nil
}

func (s *stream) NextBatch(ctx context.Context, max int) ([]idem.Delivery, error) {
	if max < 1 {
		return nil, &idem.ArgumentError{Field: "max", Reason: "must be at least 1"}
	}
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return nil, idem.ErrClosed
		}
		if s.err != nil {
			err := s.err
			s.mu.Unlock()
			return nil, err
		}
		now := s.t.cfg.Clock.Now()
		if ds := s.takeLocked(max, now); len(ds) > 0 {
			s.mu.Unlock()
			return ds, nil
		}
		var wait time.Duration = -1
		if len(s.delayed) > 0 {
			wait = s.delayed[0].due.Sub(now)
		}
		room := s.maxInFlight - s.inFlight - len(s.ready)
		if !s.polling && room > 0 {
			s.poll(ctx, room, wait) // unlocks
			continue
		}
		w := s.wake
		s.mu.Unlock()
		var timer <-chan time.Time
		var tm *time.Timer
		if wait >= 0 {
			tm = time.NewTimer(wait)
			timer = tm.C
		}
		select {
		case <-w:
		case <-timer:
		case <-ctx.Done():
		}
		if tm != nil {
			tm.Stop()
		}
	}
}

// takeLocked hands out up to max records: due redeliveries first, then
// records in the order they were polled.
func (s *stream) takeLocked(max int, now time.Time) []idem.Delivery {
	var ds []idem.Delivery
	for len(ds) < max && len(s.delayed) > 0 && !s.delayed[0].due.After(now) && s.inFlight < s.maxInFlight {
		e := s.delayed[0]
		s.delayed = s.delayed[1:]
		ds = append(ds, s.handOutLocked(e))
	}
	for len(ds) < max && len(s.ready) > 0 && s.inFlight < s.maxInFlight {
		e := s.ready[0]
		s.ready[0] = nil
		s.ready = s.ready[1:]
		ds = append(ds, s.handOutLocked(e))
	}
	return ds
}

func (s *stream) handOutLocked(e *entry) idem.Delivery {
	s.nextToken++
	e.token = s.nextToken
	e.attempt++
	s.inFlight++
	return &delivery{s: s, e: e, token: e.token, attempt: e.attempt}
}

// poll fetches up to room records, for at most wait when wait is not
// negative, and keeps those of the partitions the stream owns. It is
// called with s.mu held and returns with it released. A Nack or a settle
// meanwhile stops the poll early (broadcastLocked), so that what it made
// ready is handed out at once.
func (s *stream) poll(ctx context.Context, room int, wait time.Duration) {
	pctx, cancel := context.WithCancel(ctx)
	if wait >= 0 {
		pctx, cancel = context.WithTimeout(ctx, wait)
	}
	s.polling, s.stopPoll = true, cancel
	s.mu.Unlock()
	fetches := s.cl.PollRecords(pctx, room)
	cancel()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.polling, s.stopPoll = false, nil
	if fetches.IsClientClosed() {
		s.err = idem.ErrClosed
		return
	}
	added := false
	fetches.EachRecord(func(r *kgo.Record) {
		ps := s.parts[partition{r.Topic, r.Partition}]
		if ps == nil {
			// Polled before its partition went: its next owner gets it.
			return
		}
		if n := len(ps.entries); n > 0 && ps.entries[n-1].rec.Offset >= r.Offset {
			return
		}
		e := &entry{ps: ps, rec: r, msg: message(r, s.t.cfg.TopicPrefix)}
		ps.entries = append(ps.entries, e)
		s.ready = append(s.ready, e)
		added = true
	})
	for _, fe := range fetches.Errors() {
		if errors.Is(fe.Err, context.Canceled) || errors.Is(fe.Err, context.DeadlineExceeded) {
			continue
		}
		// franz-go reports the group's own failures without a topic. One
		// that retrying cannot mend (a session timeout the broker refuses,
		// a group the client may not join) ends the stream, so that the
		// consumer says so and subscribes again; the client retries the
		// others, which are only logged.
		if fe.Topic == "" && !kerr.IsRetriable(fe.Err) {
			s.err = fmt.Errorf("idemkafka: consumer group %q: %w", s.sub.Consumer, fe.Err)
			s.broadcastLocked()
			return
		}
		s.t.cfg.Logger.Warn("fetching from Kafka", "topic", fe.Topic, "partition", fe.Partition, "error", fe.Err)
	}
	if added {
		s.broadcastLocked()
	}
}

// settleLocked settles d's record if d still stands for it: Ack and Term
// do so for good; Nack with redeliver puts it back after delay.
func (s *stream) settleLocked(d *delivery, redeliver bool, delay time.Duration) bool {
	e := d.e
	if e.token != d.token || e.settled || e.ps.gone {
		return false
	}
	e.token = 0
	s.inFlight--
	if redeliver {
		e.due = s.t.cfg.Clock.Now().Add(delay)
		i, _ := slices.BinarySearchFunc(s.delayed, e.due, func(x *entry, t time.Time) int {
			if x.due.After(t) {
				return 1
			}
			return -1
		})
		s.delayed = slices.Insert(s.delayed, i, e)
	} else {
		e.settled = true
		e.ps.advance()
	}
	s.broadcastLocked()
	return true
}

func (s *stream) settle(ctx context.Context, d *delivery, redeliver bool, delay time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return idem.ErrClosed
	}
	s.settleLocked(d, redeliver, delay)
	return nil
}

// AckBatch settles every delivery of ds that still stands for its record.
// No round trip happens here: the offsets it allows are committed by the
// next commit (Config.CommitInterval).
func (s *stream) AckBatch(ctx context.Context, ds []idem.Delivery) (int, error) {
	if len(ds) == 0 {
		return 0, nil
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, idem.ErrClosed
	}
	n := 0
	for _, d := range ds {
		kd, ok := d.(*delivery)
		if !ok || kd.s != s {
			return n, &idem.ArgumentError{Field: "ds", Reason: "holds a delivery of another stream"}
		}
		if s.settleLocked(kd, false, 0) {
			n++
		}
	}
	return n, nil
}

// AcksInTx reports false: offsets live in Kafka, not in the inbox's
// database, so the consumer acknowledges after its transaction commits.
func (s *stream) AcksInTx(context.Context) bool { return false }

// marksLocked returns the offsets to commit: of the partitions ps names, or
// of every partition when ps is nil, those whose mark moved.
func (s *stream) marksLocked(only map[partition]bool) map[string]map[int32]kgo.EpochOffset {
	var out map[string]map[int32]kgo.EpochOffset
	for p, ps := range s.parts {
		if only != nil && !only[p] {
			continue
		}
		if ps.mark < 0 || ps.mark == ps.committed {
			continue
		}
		if out == nil {
			out = make(map[string]map[int32]kgo.EpochOffset)
		}
		if out[p.topic] == nil {
			out[p.topic] = make(map[int32]kgo.EpochOffset)
		}
		out[p.topic][p.part] = kgo.EpochOffset{Epoch: ps.markEpoch, Offset: ps.mark}
	}
	return out
}

// commit commits offsets and, once the broker has them, records them as
// committed. A failed commit is tried again by the next one: the marks
// only move forward.
func (s *stream) commit(ctx context.Context, offsets map[string]map[int32]kgo.EpochOffset) {
	if len(offsets) == 0 {
		return
	}
	s.cl.CommitOffsetsSync(ctx, offsets, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		if err != nil {
			s.t.cfg.Logger.Warn("committing Kafka offsets", "consumer", s.sub.Consumer, "error", err)
			return
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, rt := range resp.Topics {
			for _, rp := range rt.Partitions {
				ps := s.parts[partition{rt.Topic, rp.Partition}]
				if ps == nil || rp.ErrorCode != 0 {
					continue
				}
				if o := offsets[rt.Topic][rp.Partition].Offset; o > ps.committed {
					ps.committed = o
				}
			}
		}
	})
}

// commitLoop commits, every CommitInterval, what the settles since the
// last commit allow.
func (s *stream) commitLoop() {
	defer close(s.committed)
	tick := time.NewTicker(s.t.cfg.CommitInterval)
	defer tick.Stop()
	for {
		select {
		case <-s.done:
			return
		case <-tick.C:
		}
		s.mu.Lock()
		offsets := s.marksLocked(nil)
		s.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		s.commit(ctx, offsets)
		cancel()
	}
}

// assigned starts holding the partitions a rebalance gave the stream.
func (s *stream) assigned(_ context.Context, _ *kgo.Client, assigned map[string][]int32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for topic, parts := range assigned {
		for _, p := range parts {
			key := partition{topic, p}
			if s.parts[key] == nil {
				s.parts[key] = &partState{partition: key, mark: -1, committed: -1}
			}
		}
	}
}

// revoked finishes, or gives back, what the stream holds of the partitions
// a rebalance takes away: it hands out nothing more of them, waits up to
// RevokeWait for the deliveries it handed out to be settled, and commits
// what was. What is still unsettled then goes to the next owner, whose
// inbox finds it a duplicate should this stream's handler commit it after
// all. The rebalance waits for this to return.
func (s *stream) revoked(ctx context.Context, _ *kgo.Client, revoked map[string][]int32) {
	only := s.dropReady(revoked)
	if len(only) == 0 {
		return
	}
	deadline := time.NewTimer(s.t.cfg.RevokeWait)
	defer deadline.Stop()
	s.mu.Lock()
	for expired := false; !expired && !s.closed && s.handedOutLocked(only); {
		w := s.wake
		s.mu.Unlock()
		select {
		case <-w:
		case <-deadline.C:
			expired = true
		case <-ctx.Done():
			expired = true
		}
		s.mu.Lock()
	}
	offsets := s.marksLocked(only)
	s.mu.Unlock()
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	s.commit(cctx, offsets)
	cancel()
	s.forget(only)
}

// lost forgets partitions taken away without a rebalance's courtesy (the
// session expired): their offsets can no longer be committed.
func (s *stream) lost(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
	s.forget(s.dropReady(lost))
}

// dropReady stops handing out the records of the partitions in ps, and
// returns them as a set.
func (s *stream) dropReady(ps map[string][]int32) map[partition]bool {
	only := make(map[partition]bool)
	for topic, parts := range ps {
		for _, p := range parts {
			only[partition{topic, p}] = true
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	keep := func(e *entry) bool { return only[e.ps.partition] }
	s.ready = slices.DeleteFunc(s.ready, keep)
	s.delayed = slices.DeleteFunc(s.delayed, keep)
	return only
}

// handedOutLocked reports whether a delivery of the partitions in only is
// unsettled.
func (s *stream) handedOutLocked(only map[partition]bool) bool {
	for p := range only {
		if ps := s.parts[p]; ps != nil {
			for _, e := range ps.entries {
				if e.token != 0 {
					return true
				}
			}
		}
	}
	return false
}

// forget drops the partitions in only; their deliveries still out become
// stale.
func (s *stream) forget(only map[partition]bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for p := range only {
		ps := s.parts[p]
		if ps == nil {
			continue
		}
		for _, e := range ps.entries {
			if e.token != 0 {
				s.inFlight--
				e.token = 0
			}
		}
		ps.gone = true
		delete(s.parts, p)
	}
	s.broadcastLocked()
}

// Close commits what was settled, leaves the group and stops. Unsettled
// records go to the group's next member that owns their partition, or to
// this consumer's next incarnation.
func (s *stream) Close() error {
	s.closeOnce.Do(func() {
		close(s.done)
		<-s.committed
		s.mu.Lock()
		offsets := s.marksLocked(nil)
		s.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		s.commit(ctx, offsets)
		cancel()
		s.mu.Lock()
		s.closed = true
		s.broadcastLocked()
		s.mu.Unlock()
		s.cl.Close()
	})
	return nil
}

type delivery struct {
	s       *stream
	e       *entry
	token   uint64
	attempt int
}

func (d *delivery) Message() idem.Message { return d.e.msg }

// Attempt counts this stream's deliveries of the message. Kafka keeps no
// count, so it starts again at 1 after a restart or a rebalance; the
// consumer's Ledger keeps the count that survives them.
func (d *delivery) Attempt() int { return d.attempt }

func (d *delivery) Ack(ctx context.Context) error { return d.s.settle(ctx, d, false, 0) }

func (d *delivery) Term(ctx context.Context) error { return d.s.settle(ctx, d, false, 0) }

// Nack hands the record out again after delay, from this stream's memory:
// its offset stays uncommitted meanwhile, so a crash brings it back from
// Kafka instead. The partition's other records go on being delivered.
func (d *delivery) Nack(ctx context.Context, delay time.Duration) error {
	if delay < 0 {
		return &idem.ArgumentError{Field: "delay", Reason: "must not be negative"}
	}
	return d.s.settle(ctx, d, true, delay)
}

// InProgress does nothing but report a closed stream: a delivery is held
// until it is settled, whatever the time (see Subscribe).
func (d *delivery) InProgress(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	d.s.mu.Lock()
	defer d.s.mu.Unlock()
	if d.s.closed {
		return idem.ErrClosed
	}
	return nil
}
