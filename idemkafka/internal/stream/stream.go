package stream

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/idem-go/idem"
)

// HeaderID is the record header that carries Message.ID (idemkafka.HeaderID).
const HeaderID = "idem.id"

// ErrStaleDelivery is returned by a delivery's Ack, Nack, Term and
// InProgress once it no longer stands for its record: it was settled
// already, or its partition was taken away (a rebalance whose RevokeWait
// ended first, a lost session), and the record goes to the partition's
// next owner, from an offset that does not pass it (idemkafka.ErrStaleDelivery).
// It matches idem.ErrStaleDelivery.
var ErrStaleDelivery = fmt.Errorf("idemkafka: delivery already settled, or its partition taken away (%w)", idem.ErrStaleDelivery)

// Client is what a Stream needs of franz-go's group consumer: KgoClient
// makes one of a *kgo.Client; tests put a fake under the stream.
type Client interface {
	// PollRecords is kgo.Client.PollRecords.
	PollRecords(ctx context.Context, max int) kgo.Fetches
	// CommitOffsets commits offsets and waits for the broker's answer:
	// err when the request failed as a whole; otherwise the outcome of
	// each partition the broker answered for, nil for those it committed.
	CommitOffsets(ctx context.Context, offsets map[string]map[int32]kgo.EpochOffset) (map[string]map[int32]error, error)
	// Close leaves the group and closes the client.
	Close()
}

// KgoClient is cl as a Client.
func KgoClient(cl *kgo.Client) Client { return kgoClient{cl} }

type kgoClient struct{ *kgo.Client }

func (c kgoClient) CommitOffsets(ctx context.Context, offsets map[string]map[int32]kgo.EpochOffset) (map[string]map[int32]error, error) {
	var out map[string]map[int32]error
	var rerr error
	c.CommitOffsetsSync(ctx, offsets, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		if err != nil {
			rerr = err
			return
		}
		out = make(map[string]map[int32]error, len(resp.Topics))
		for _, rt := range resp.Topics {
			ps := make(map[int32]error, len(rt.Partitions))
			for _, rp := range rt.Partitions {
				ps[rp.Partition] = kerr.ErrorForCode(rp.ErrorCode)
			}
			out[rt.Topic] = ps
		}
	})
	return out, rerr
}

// Callbacks are the stream's answers to the group's rebalances, for
// kgo.OnPartitionsAssigned, OnPartitionsRevoked and OnPartitionsLost.
type Callbacks struct {
	Assigned, Revoked, Lost func(ctx context.Context, _ *kgo.Client, parts map[string][]int32)
}

// Config configures a Stream. Every field is required.
type Config struct {
	// Consumer is the consumer group, for errors and logs.
	Consumer string
	// TopicPrefix is taken off the topic of every delivered message.
	TopicPrefix    string
	Clock          idem.Clock
	Logger         *slog.Logger
	MaxInFlight    int
	CommitInterval time.Duration
	RevokeWait     time.Duration
	// Counters, when not nil, counts what the stream's commits meet,
	// across the streams that share it.
	Counters *Counters
}

// Counters are counts that outlive a stream: a transport keeps one per
// consumer group.
type Counters struct {
	// CommitFailures counts partitions whose offset a commit failed to
	// store.
	CommitFailures atomic.Int64
}

// New makes a stream and its client: dial gets the callbacks the client
// must call on rebalances.
func New(cfg Config, dial func(Callbacks) (Client, error)) (*Stream, error) {
	s := &Stream{
		cfg:         cfg,
		maxInFlight: cfg.MaxInFlight,
		parts:       make(map[partition]*partState),
		wake:        make(chan struct{}),
		done:        make(chan struct{}),
		committed:   make(chan struct{}),
		started:     make(chan struct{}),
		committing:  make(chan struct{}, 1),
	}
	cl, err := dial(Callbacks{
		Assigned: func(ctx context.Context, _ *kgo.Client, m map[string][]int32) { <-s.started; s.assigned(ctx, m) },
		Revoked:  func(ctx context.Context, _ *kgo.Client, m map[string][]int32) { <-s.started; s.revoked(ctx, m) },
		Lost:     func(ctx context.Context, _ *kgo.Client, m map[string][]int32) { <-s.started; s.lost(ctx, m) },
	})
	if err != nil {
		return nil, err
	}
	s.cl = cl
	close(s.started)
	go s.commitLoop()
	return s, nil
}

// Message is the idem.Message a record carries. A record that another
// producer wrote, without HeaderID, is named by its place in the log,
// topic/partition/offset, which no redelivery changes.
func Message(r *kgo.Record, prefix string) idem.Message {
	m := idem.Message{Topic: strings.TrimPrefix(r.Topic, prefix), Key: string(r.Key), Payload: r.Value, Time: r.Timestamp}
	for _, h := range r.Headers {
		if h.Key == HeaderID {
			m.ID = string(h.Value)
			continue
		}
		if m.Headers == nil {
			m.Headers = make(map[string]string, len(r.Headers))
		}
		m.Headers[h.Key] = string(h.Value)
	}
	if m.ID == "" {
		m.ID = fmt.Sprintf("%s/%d/%d", r.Topic, r.Partition, r.Offset)
	}
	return m
}

type partition struct {
	topic string
	part  int32
}

// partState is what a stream holds of one assigned partition: its records
// polled and not settled, in offset order. The offset to commit is the
// oldest of them, since every record before it is settled; when none is
// held, the one past the newest polled. Settled records are not kept, so
// a record that stays unsettled at the head of its partition (a keyed
// message the consumer retries in memory) holds no memory but its own,
// however many are settled behind it.
type partState struct {
	partition
	held []*entry
	// next is one past the newest record polled, -1 before the first;
	// nextEpoch is that record's leader epoch.
	next      int64
	nextEpoch int32
	// committed is the offset last committed, or the first polled: the
	// group's position is at or before it, and nothing before it was
	// this stream's to settle.
	committed int64
	// revoking is set when a revocation of the partition begins: from
	// then on, nothing of it is handed out, put back in line, or taken in
	// from a poll.
	revoking bool
	// gone is set when the partition's deliveries stop counting: once a
	// revocation's wait has ended (its commit reads the marks next, and
	// a settlement after that read would be committed by nobody), or the
	// partition was lost. Its deliveries are stale from then on.
	gone bool
}

// entry is one record a stream holds.
type entry struct {
	ps   *partState
	rec  *kgo.Record
	msg  idem.Message
	size int64
	// prevEpoch is the leader epoch of the record polled before this one
	// in its partition: the epoch committed with this record's offset,
	// which names the last record settled.
	prevEpoch int32
	polled    time.Time
	// token names the current hand-out; 0 while not handed out.
	token   uint64
	attempt int
	due     time.Time
}

// mark returns the offset to commit and its epoch; ok is false before a
// record was polled.
func (ps *partState) mark() (offset int64, epoch int32, ok bool) {
	if len(ps.held) > 0 {
		return ps.held[0].rec.Offset, ps.held[0].prevEpoch, true
	}
	return ps.next, ps.nextEpoch, ps.next >= 0
}

// Stream is one member of a consumer group: an idem.BatchStream of the
// records of the partitions the group assigns it.
type Stream struct {
	cfg         Config
	cl          Client
	maxInFlight int
	started     chan struct{} // closed once cl is set

	mu    sync.Mutex
	parts map[partition]*partState
	// ready holds records polled and not yet handed out, oldest first;
	// delayed holds Nacked records waiting for their delay, soonest first.
	ready, delayed []*entry
	// held counts the records of every partState's held, heldBytes their
	// sizes, peak the most held at once; they stay within maxInFlight.
	held      int
	heldBytes int64
	peak      int
	inFlight  int
	nextToken uint64
	// polling is set while a poll is under way, pollDone closed when it
	// has taken in what it fetched; stopPoll stops it early.
	polling  bool
	pollDone chan struct{}
	stopPoll context.CancelFunc
	// fences counts the rebalance callbacks that keep new polls from
	// starting (see fenceLocked).
	fences int
	// wake is closed, and replaced, whenever a waiting Next may proceed.
	wake   chan struct{}
	closed bool
	// err is a fatal error of the client, returned by Next.
	err error

	// committing holds a token while a commit is under way: one commit
	// at a time, each with the marks of its time, so that an older offset
	// never lands after a newer one. (A channel, not a mutex, so that a
	// revocation waiting for it is seen waiting by testing/synctest.)
	committing chan struct{}

	closeOnce sync.Once
	done      chan struct{} // closed by Close
	committed chan struct{} // closed when commitLoop has ended
}

var _ idem.BatchStream = (*Stream)(nil)

// broadcastLocked wakes every waiting Next, and stops a poll that blocks
// them.
func (s *Stream) broadcastLocked() {
	close(s.wake)
	s.wake = make(chan struct{})
	if s.stopPoll != nil {
		s.stopPoll()
	}
}

func (s *Stream) Next(ctx context.Context) (idem.Delivery, error) {
	ds, err := s.NextBatch(ctx, 1)
	if err != nil {
		return nil, err
	}
	return ds[0], nil
}

func (s *Stream) NextBatch(ctx context.Context, max int) ([]idem.Delivery, error) {
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
		now := s.cfg.Clock.Now()
		if ds := s.takeLocked(max, now); len(ds) > 0 {
			s.mu.Unlock()
			return ds, nil
		}
		var wait time.Duration = -1
		if len(s.delayed) > 0 {
			wait = s.delayed[0].due.Sub(now)
		}
		// Every record held counts against MaxInFlight: handed out,
		// ready, waiting for its delay or given back by a revocation.
		room := s.maxInFlight - s.held
		if !s.polling && s.fences == 0 && room > 0 {
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
// records in the order they were polled. A record of a partition being
// revoked is not handed out (the revocation takes them out of line; this
// is the second guard).
func (s *Stream) takeLocked(max int, now time.Time) []idem.Delivery {
	var ds []idem.Delivery
	for len(ds) < max && len(s.delayed) > 0 && !s.delayed[0].due.After(now) {
		e := s.delayed[0]
		s.delayed[0] = nil
		s.delayed = s.delayed[1:]
		if !e.ps.revoking {
			ds = append(ds, s.handOutLocked(e))
		}
	}
	for len(ds) < max && len(s.ready) > 0 {
		e := s.ready[0]
		s.ready[0] = nil
		s.ready = s.ready[1:]
		if !e.ps.revoking {
			ds = append(ds, s.handOutLocked(e))
		}
	}
	return ds
}

func (s *Stream) handOutLocked(e *entry) idem.Delivery {
	s.nextToken++
	e.token = s.nextToken
	e.attempt++
	s.inFlight++
	return &delivery{s: s, e: e, token: e.token, attempt: e.attempt}
}

// poll fetches up to room records, for at most wait when wait is not
// negative, and takes in those of the partitions the stream owns. It is
// called with s.mu held and returns with it released. A Nack or a settle
// meanwhile stops the poll early (broadcastLocked), so that what it made
// ready is handed out at once.
func (s *Stream) poll(ctx context.Context, room int, wait time.Duration) {
	var pctx context.Context
	var cancel context.CancelFunc
	if wait >= 0 {
		pctx, cancel = context.WithTimeout(ctx, wait)
	} else {
		pctx, cancel = context.WithCancel(ctx)
	}
	done := make(chan struct{})
	s.polling, s.stopPoll, s.pollDone = true, cancel, done
	s.mu.Unlock()
	fetches := s.cl.PollRecords(pctx, room)
	cancel()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.polling, s.stopPoll, s.pollDone = false, nil, nil
	defer close(done)
	if fetches.IsClientClosed() {
		s.err = idem.ErrClosed
		return
	}
	added := false
	now := s.cfg.Clock.Now()
	fetches.EachRecord(func(r *kgo.Record) {
		ps := s.parts[partition{r.Topic, r.Partition}]
		if ps == nil || ps.revoking {
			// Fetched before its partition went, or while it goes: its
			// next owner gets it, from an offset that does not pass it.
			return
		}
		if r.Offset < ps.next {
			return // held or settled already
		}
		e := &entry{ps: ps, rec: r, msg: Message(r, s.cfg.TopicPrefix), size: recordBytes(r), prevEpoch: r.LeaderEpoch, polled: now}
		if ps.next >= 0 {
			e.prevEpoch = ps.nextEpoch
		} else {
			ps.committed = max(ps.committed, r.Offset)
		}
		ps.next, ps.nextEpoch = r.Offset+1, r.LeaderEpoch
		ps.held = append(ps.held, e)
		s.held++
		s.heldBytes += e.size
		s.ready = append(s.ready, e)
		added = true
	})
	s.peak = max(s.peak, s.held)
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
			s.err = fmt.Errorf("idemkafka: consumer group %q: %w", s.cfg.Consumer, fe.Err)
			s.broadcastLocked()
			return
		}
		s.cfg.Logger.Warn("fetching from Kafka", "consumer", s.cfg.Consumer, "topic", fe.Topic, "partition", fe.Partition, "error", fe.Err)
	}
	if added {
		s.broadcastLocked()
	}
}

// fenceLocked waits until no poll is under way, stopping the one that is,
// and keeps new ones from starting until unfenceLocked. It is called with
// s.mu held, which it releases while it waits.
//
// franz-go stops fetching a partition it revokes before it calls
// OnPartitionsRevoked, and drops what it had buffered of it: a poll that
// begins after that returns none of its records (see the documentation of
// kgo.OnPartitionsRevoked, and groupConsumer.revoke in consumer_group.go,
// which invalidates the partitions under the consumer's lock that
// PollRecords takes them under). A poll under way when the callback
// begins may have taken some just before; on a lost session, franz-go
// drops the buffers only after OnPartitionsLost returns. A fence at the
// start of each callback lets such a poll take its records in while the
// stream still knows them for what they are, records of an assignment
// that is over: never into the state of the partition assigned again.
func (s *Stream) fenceLocked() {
	s.fences++
	for s.polling {
		s.stopPoll()
		w := s.pollDone
		s.mu.Unlock()
		<-w
		s.mu.Lock()
	}
}

func (s *Stream) unfenceLocked() {
	s.fences--
	s.broadcastLocked()
}

// settleLocked settles d's record if d still stands for it: Ack and Term
// do so for good; Nack with redeliver puts it back in line after delay,
// unless its partition is being revoked: it is then given back, for the
// next owner.
func (s *Stream) settleLocked(d *delivery, redeliver bool, delay time.Duration) bool {
	e := d.e
	if e.token == 0 || e.token != d.token || e.ps.gone {
		return false
	}
	e.token = 0
	s.inFlight--
	switch {
	case redeliver && e.ps.revoking:
	case redeliver:
		e.due = s.cfg.Clock.Now().Add(delay)
		i, _ := slices.BinarySearchFunc(s.delayed, e.due, func(x *entry, t time.Time) int {
			if x.due.After(t) {
				return 1
			}
			return -1
		})
		s.delayed = slices.Insert(s.delayed, i, e)
	default:
		s.releaseLocked(e)
	}
	s.broadcastLocked()
	return true
}

// releaseLocked takes the settled e out of its partition's held records.
func (s *Stream) releaseLocked(e *entry) {
	ps := e.ps
	if len(ps.held) > 0 && ps.held[0] == e {
		ps.held[0] = nil
		ps.held = ps.held[1:]
	} else {
		i, found := slices.BinarySearchFunc(ps.held, e.rec.Offset, func(x *entry, o int64) int {
			switch {
			case x.rec.Offset < o:
				return -1
			case x.rec.Offset > o:
				return 1
			}
			return 0
		})
		if !found || ps.held[i] != e {
			return
		}
		ps.held = slices.Delete(ps.held, i, i+1)
	}
	s.held--
	s.heldBytes -= e.size
}

// settle settles d (op names the call, for the error), or returns
// ErrStaleDelivery when d no longer stands for its record.
func (s *Stream) settle(ctx context.Context, op string, d *delivery, redeliver bool, delay time.Duration) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return idem.ErrClosed
	}
	if !s.settleLocked(d, redeliver, delay) {
		return d.staleLocked(op)
	}
	return nil
}

// AckBatch settles every delivery of ds that still stands for its record.
// No round trip happens here: the offsets it allows are committed by the
// next commit (Config.CommitInterval).
func (s *Stream) AckBatch(ctx context.Context, ds []idem.Delivery) (int, error) {
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
func (s *Stream) AcksInTx(context.Context) bool { return false }

// commitMarks commits the marks that moved, of the partitions in only or
// of all when only is nil, and records those the coordinator stored. A
// failure is logged and counted, and tried again by the next commit: the
// marks only move forward.
func (s *Stream) commitMarks(ctx context.Context, only map[partition]bool) {
	s.committing <- struct{}{}
	defer func() { <-s.committing }()
	s.mu.Lock()
	var offsets map[string]map[int32]kgo.EpochOffset
	states := make(map[partition]*partState)
	for p, ps := range s.parts {
		if only != nil && !only[p] {
			continue
		}
		o, epoch, ok := ps.mark()
		if !ok || o <= ps.committed {
			continue
		}
		if offsets == nil {
			offsets = make(map[string]map[int32]kgo.EpochOffset)
		}
		if offsets[p.topic] == nil {
			offsets[p.topic] = make(map[int32]kgo.EpochOffset)
		}
		offsets[p.topic][p.part] = kgo.EpochOffset{Epoch: epoch, Offset: o}
		states[p] = ps
	}
	s.mu.Unlock()
	if len(offsets) == 0 {
		return
	}
	res, err := s.cl.CommitOffsets(ctx, offsets)
	if err != nil {
		if s.cfg.Counters != nil {
			s.cfg.Counters.CommitFailures.Add(int64(len(states)))
		}
		s.cfg.Logger.Warn("committing Kafka offsets failed; the next commit tries again", "consumer", s.cfg.Consumer, "partitions", len(states), "error", err)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for p, ps := range states {
		perr, answered := res[p.topic][p.part]
		if !answered {
			continue
		}
		if perr != nil {
			if s.cfg.Counters != nil {
				s.cfg.Counters.CommitFailures.Add(1)
			}
			s.cfg.Logger.Warn("committing a Kafka offset failed; the next commit tries again", "consumer", s.cfg.Consumer,
				"topic", p.topic, "partition", p.part, "offset", offsets[p.topic][p.part].Offset, "error", perr)
			continue
		}
		// The partition may have gone and come back meanwhile: the state
		// the marks were read from learns of its commit, not a new one.
		ps.committed = max(ps.committed, offsets[p.topic][p.part].Offset)
	}
}

// commitTimeout bounds a commit.
const commitTimeout = 30 * time.Second

// commitLoop commits, every CommitInterval, what the settles since the
// last commit allow.
func (s *Stream) commitLoop() {
	defer close(s.committed)
	tick := time.NewTicker(s.cfg.CommitInterval)
	defer tick.Stop()
	for {
		select {
		case <-s.done:
			return
		case <-tick.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), commitTimeout)
		s.commitMarks(ctx, nil)
		cancel()
	}
}

// assigned starts holding the partitions a rebalance gave the stream.
func (s *Stream) assigned(_ context.Context, assigned map[string][]int32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var fresh []partition
	for topic, parts := range assigned {
		for _, p := range parts {
			if key := (partition{topic, p}); s.parts[key] == nil {
				fresh = append(fresh, key)
			}
		}
	}
	if len(fresh) == 0 {
		return
	}
	// A poll under way takes its records in first: those of an earlier
	// assignment of these partitions then find none and are dropped.
	s.fenceLocked()
	defer s.unfenceLocked()
	for _, key := range fresh {
		s.parts[key] = &partState{partition: key, next: -1, committed: -1}
	}
}

// revoked finishes, or gives back, what the stream holds of the partitions
// a rebalance takes away: it hands out nothing more of them, waits up to
// RevokeWait for the deliveries of them it handed out to be settled, and
// commits what was. What is still unsettled then goes to the next owner,
// whose inbox finds it a duplicate should this stream's handler commit it
// after all. The rebalance waits for this to return.
func (s *Stream) revoked(ctx context.Context, revoked map[string][]int32) {
	s.mu.Lock()
	only := s.ownedLocked(revoked)
	if len(only) == 0 {
		s.mu.Unlock()
		return
	}
	for p := range only {
		s.parts[p].revoking = true
	}
	s.dropQueuedLocked(only)
	s.fenceLocked()
	s.unfenceLocked()
	deadline := time.NewTimer(s.cfg.RevokeWait)
	defer deadline.Stop()
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
	// What is settled from here on would miss the commit below, which
	// reads the marks once, and the partition is dropped right after it:
	// such a settlement counts for nothing, and says so (ErrStaleDelivery)
	// instead of answering nil for a record the next owner gets again.
	for p := range only {
		ps := s.parts[p]
		ps.gone = true
		for _, e := range ps.held {
			if e.token != 0 {
				s.inFlight--
				e.token = 0
			}
		}
	}
	s.broadcastLocked()
	s.mu.Unlock()
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), commitTimeout)
	s.commitMarks(cctx, only)
	cancel()
	s.mu.Lock()
	s.forgetLocked(only)
	s.mu.Unlock()
}

// lost forgets partitions taken away without a rebalance's courtesy (the
// session expired): their offsets can no longer be committed.
func (s *Stream) lost(_ context.Context, lost map[string][]int32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	only := s.ownedLocked(lost)
	if len(only) == 0 {
		return
	}
	for p := range only {
		s.parts[p].revoking = true
	}
	s.dropQueuedLocked(only)
	s.fenceLocked()
	defer s.unfenceLocked()
	s.forgetLocked(only)
}

// ownedLocked returns, as a set, the partitions of ps the stream holds.
func (s *Stream) ownedLocked(ps map[string][]int32) map[partition]bool {
	only := make(map[partition]bool)
	for topic, parts := range ps {
		for _, p := range parts {
			if key := (partition{topic, p}); s.parts[key] != nil {
				only[key] = true
			}
		}
	}
	return only
}

// dropQueuedLocked takes the records of the partitions in only out of
// line: they stay held, unsettled, until the partitions are forgotten.
func (s *Stream) dropQueuedLocked(only map[partition]bool) {
	of := func(e *entry) bool { return only[e.ps.partition] }
	s.ready = slices.DeleteFunc(s.ready, of)
	s.delayed = slices.DeleteFunc(s.delayed, of)
}

// handedOutLocked reports whether a delivery of the partitions in only is
// unsettled.
func (s *Stream) handedOutLocked(only map[partition]bool) bool {
	for p := range only {
		if ps := s.parts[p]; ps != nil {
			for _, e := range ps.held {
				if e.token != 0 {
					return true
				}
			}
		}
	}
	return false
}

// forgetLocked drops the partitions in only and everything the stream
// holds of them; their deliveries still out become stale.
func (s *Stream) forgetLocked(only map[partition]bool) {
	s.dropQueuedLocked(only)
	for p := range only {
		ps := s.parts[p]
		if ps == nil {
			continue
		}
		for _, e := range ps.held {
			if e.token != 0 {
				s.inFlight--
				e.token = 0
			}
			s.held--
			s.heldBytes -= e.size
		}
		ps.held = nil
		ps.gone = true
		delete(s.parts, p)
	}
	s.broadcastLocked()
}

// Close commits what was settled, leaves the group and stops. Unsettled
// records go to the group's next member that owns their partition, or to
// this consumer's next incarnation.
func (s *Stream) Close() error {
	s.closeOnce.Do(func() {
		close(s.done)
		<-s.committed
		ctx, cancel := context.WithTimeout(context.Background(), commitTimeout)
		s.commitMarks(ctx, nil)
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
	s       *Stream
	e       *entry
	token   uint64
	attempt int
}

func (d *delivery) Message() idem.Message { return d.e.msg }

// Attempt counts this stream's deliveries of the message. Kafka keeps no
// count, so it starts again at 1 after a restart or a rebalance; the
// consumer's Ledger keeps the count that survives them.
func (d *delivery) Attempt() int { return d.attempt }

// Ack settles the delivery: its record counts as done for the offset the
// stream commits. It returns ErrStaleDelivery when the delivery was settled
// already, or its partition was taken away: the record then goes to the
// partition's next owner.
func (d *delivery) Ack(ctx context.Context) error { return d.s.settle(ctx, "ack", d, false, 0) }

// Term settles the delivery as Ack does: Kafka cannot leave one record out
// of a partition's offset, and the consumer has dead-lettered it.
func (d *delivery) Term(ctx context.Context) error { return d.s.settle(ctx, "term", d, false, 0) }

// Nack hands the record out again after delay, from this stream's memory:
// its offset stays uncommitted meanwhile, so a crash brings it back from
// Kafka instead. The partition's other records go on being delivered.
func (d *delivery) Nack(ctx context.Context, delay time.Duration) error {
	if err := idem.ValidateNackDelay(delay); err != nil {
		return err
	}
	return d.s.settle(ctx, "nack", d, true, delay)
}

// InProgress does nothing but report a closed stream, or a delivery that
// no longer stands for its record (ErrStaleDelivery): a delivery is held
// until it is settled, whatever the time (see Subscribe), or until its
// partition is taken away.
func (d *delivery) InProgress(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	d.s.mu.Lock()
	defer d.s.mu.Unlock()
	if d.s.closed {
		return idem.ErrClosed
	}
	if d.e.token != d.token || d.e.ps.gone {
		return d.staleLocked("in progress")
	}
	return nil
}

// staleLocked is the error of op on d, which no longer stands for its
// record.
func (d *delivery) staleLocked(op string) error {
	return fmt.Errorf("idemkafka: %s: message %q: %w", op, d.e.msg.ID, ErrStaleDelivery)
}

// Stats is what a stream holds in memory.
type Stats struct {
	// Held counts the records held: polled and not handed out, handed out
	// and not settled, waiting for a redelivery, or given back by a
	// revocation under way. It never passes Limit.
	Held int
	// HeldBytes counts their keys, values and headers.
	HeldBytes int64
	// Peak is the most Held has been.
	Peak int
	// Delayed counts the records Nacked and waiting for their delay.
	Delayed int
	// InFlight counts the deliveries handed out and not settled.
	InFlight int
	// Limit is MaxInFlight.
	Limit int
	// Uncommitted counts, over the partitions, the offsets from the last
	// committed one to the newest polled: what a crash would deliver
	// again. A partition whose head stays unsettled makes it grow.
	Uncommitted int64
	// OldestHeld is when the record held longest was polled; zero when
	// none is held.
	OldestHeld time.Time
}

// Stats returns what the stream holds now.
func (s *Stream) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := Stats{Held: s.held, HeldBytes: s.heldBytes, Peak: s.peak, Delayed: len(s.delayed), InFlight: s.inFlight, Limit: s.maxInFlight}
	for _, ps := range s.parts {
		if ps.next >= 0 && ps.committed >= 0 {
			st.Uncommitted += ps.next - ps.committed
		}
		if len(ps.held) > 0 {
			if t := ps.held[0].polled; st.OldestHeld.IsZero() || t.Before(st.OldestHeld) {
				st.OldestHeld = t
			}
		}
	}
	return st
}

// recordBytes is the size of r's key, value and headers.
func recordBytes(r *kgo.Record) int64 {
	n := len(r.Key) + len(r.Value)
	for _, h := range r.Headers {
		n += len(h.Key) + len(h.Value)
	}
	return int64(n)
}
