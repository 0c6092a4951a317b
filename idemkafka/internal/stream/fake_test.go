package stream

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idem-go/idem"
)

// fakeClient is a Client a test drives, as franz-go's client would be
// driven by a broker: each PollRecords waits for the test to fill it with
// records, and a filled poll returns only when the test lets it (its
// goroutine may be slow to get back to the stream); a commit may be held
// on its way to the broker the same way. It keeps the committed offsets,
// as the group coordinator does.
type fakeClient struct {
	mu        sync.Mutex
	poll      *fakePoll
	committed map[partition]int64
	// history holds every offset the coordinator stored, per partition, in
	// the order it stored them.
	history map[partition][]int64
	// refuse makes the coordinator refuse a partition's next commits with
	// its error, once each.
	refuse map[partition][]error
	// holdNext holds the next commit until releaseCommit.
	holdNext bool
	held     *fakeCommit
	closed   bool
}

type fakePoll struct {
	max     int
	ctx     context.Context
	filled  []*kgo.Record
	isFull  bool
	release chan struct{}
	freed   bool
}

type fakeCommit struct {
	release chan struct{}
	freed   bool
}

func newFakeClient() *fakeClient {
	return &fakeClient{committed: make(map[partition]int64), history: make(map[partition][]int64), refuse: make(map[partition][]error)}
}

func (f *fakeClient) PollRecords(ctx context.Context, max int) kgo.Fetches {
	p := &fakePoll{max: max, ctx: ctx, release: make(chan struct{})}
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return kgo.NewErrFetch(kgo.ErrClientClosed)
	}
	f.poll = p
	f.mu.Unlock()
	select {
	case <-p.release:
	case <-ctx.Done():
		f.mu.Lock()
		full := p.isFull
		f.mu.Unlock()
		if full {
			// The records were taken: the poll returns them, whenever
			// its goroutine gets to it.
			<-p.release
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.poll == p {
		f.poll = nil
	}
	if !p.isFull {
		if ctx.Err() != nil {
			return kgo.NewErrFetch(ctx.Err())
		}
		return nil
	}
	return fetchesOf(p.filled)
}

// fetchesOf is what PollRecords returns for recs.
func fetchesOf(recs []*kgo.Record) kgo.Fetches {
	var ft []kgo.FetchTopic
	for _, r := range recs {
		i := slices.IndexFunc(ft, func(t kgo.FetchTopic) bool { return t.Topic == r.Topic })
		if i < 0 {
			ft = append(ft, kgo.FetchTopic{Topic: r.Topic})
			i = len(ft) - 1
		}
		j := slices.IndexFunc(ft[i].Partitions, func(p kgo.FetchPartition) bool { return p.Partition == r.Partition })
		if j < 0 {
			ft[i].Partitions = append(ft[i].Partitions, kgo.FetchPartition{Partition: r.Partition})
			j = len(ft[i].Partitions) - 1
		}
		ft[i].Partitions[j].Records = append(ft[i].Partitions[j].Records, r)
	}
	return kgo.Fetches{{Topics: ft}}
}

// pending returns the poll under way, if any, and whether it is filled,
// once the stream has done what it can.
func (f *fakeClient) pending() (max int, filled, ok bool) {
	synctest.Wait()
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.poll == nil || f.poll.freed {
		return 0, false, false
	}
	return f.poll.max, f.poll.isFull, true
}

// fill has the poll under way take recs (at most its max) from the
// client's buffers, without returning yet.
func (f *fakeClient) fill(t testing.TB, recs []*kgo.Record) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.poll == nil || f.poll.isFull {
		t.Fatalf("fill: no poll waiting for records")
	}
	if len(recs) > f.poll.max {
		t.Fatalf("fill: %d records for a poll of at most %d", len(recs), f.poll.max)
	}
	f.poll.filled, f.poll.isFull = recs, true
}

// releasePoll lets a filled poll return; false when there is none.
func (f *fakeClient) releasePoll() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.poll == nil || !f.poll.isFull || f.poll.freed {
		return false
	}
	f.poll.freed = true
	close(f.poll.release)
	return true
}

// answer fills the poll under way with recs and lets it return.
func (f *fakeClient) answer(t testing.TB, recs []*kgo.Record) {
	t.Helper()
	f.fill(t, recs)
	f.releasePoll()
}

func (f *fakeClient) CommitOffsets(ctx context.Context, offsets map[string]map[int32]kgo.EpochOffset) (map[string]map[int32]error, error) {
	f.mu.Lock()
	var c *fakeCommit
	if f.holdNext {
		f.holdNext = false
		c = &fakeCommit{release: make(chan struct{})}
		f.held = c
	}
	f.mu.Unlock()
	if c != nil {
		select {
		case <-c.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[string]map[int32]error)
	for topic, parts := range offsets {
		out[topic] = make(map[int32]error)
		for p, eo := range parts {
			key := partition{topic, p}
			if errs := f.refuse[key]; len(errs) > 0 {
				out[topic][p] = errs[0]
				f.refuse[key] = errs[1:]
				continue
			}
			f.committed[key] = eo.Offset
			f.history[key] = append(f.history[key], eo.Offset)
			out[topic][p] = nil
		}
	}
	return out, nil
}

// releaseCommit lets a held commit reach the coordinator; false when none
// is held.
func (f *fakeClient) releaseCommit() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.held == nil || f.held.freed {
		return false
	}
	f.held.freed = true
	close(f.held.release)
	return true
}

func (f *fakeClient) committedAt(p partition) (int64, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	o, ok := f.committed[p]
	return o, ok
}

func (f *fakeClient) Close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
}

// records returns the records of topic t, partition 0, at offsets from
// to to-1, each with a 100-byte value.
func records(from, to int64) []*kgo.Record {
	var out []*kgo.Record
	for o := from; o < to; o++ {
		out = append(out, &kgo.Record{
			Topic: "t", Partition: 0, Offset: o, LeaderEpoch: 1,
			Key:   []byte(fmt.Sprintf("k%d", o%3)),
			Value: bytes.Repeat([]byte{'v'}, 100),
			Headers: []kgo.RecordHeader{
				{Key: HeaderID, Value: []byte(fmt.Sprintf("m%d", o))},
			},
		})
	}
	return out
}

var p0 = map[string][]int32{"t": {0}}

// harness runs a Stream on a fakeClient inside a synctest bubble, with a
// consumer goroutine that takes deliveries as they come.
type harness struct {
	t      *testing.T
	cfg    Config
	cl     *fakeClient
	s      *Stream
	logs   *bytes.Buffer
	cancel context.CancelFunc
	got    chan idem.Delivery
	ended  chan struct{}
	// closeOnce guards close.
	closeOnce sync.Once
	// acked holds the offsets of partition t/0 a delivery was acknowledged
	// for: their effects committed.
	acked map[int64]bool
}

func newHarness(t *testing.T, cfg Config) *harness {
	t.Helper()
	h := &harness{t: t, cl: newFakeClient(), logs: new(bytes.Buffer), got: make(chan idem.Delivery, 100_000), ended: make(chan struct{}), acked: make(map[int64]bool)}
	if cfg.Consumer == "" {
		cfg.Consumer = "c"
	}
	if cfg.Clock == nil {
		cfg.Clock = idem.SystemClock{}
	}
	cfg.Logger = slog.New(slog.NewTextHandler(h.logs, nil))
	if cfg.MaxInFlight == 0 {
		cfg.MaxInFlight = 100
	}
	if cfg.CommitInterval == 0 {
		cfg.CommitInterval = time.Hour
	}
	if cfg.RevokeWait == 0 {
		cfg.RevokeWait = 10 * time.Second
	}
	if cfg.Counters == nil {
		cfg.Counters = new(Counters)
	}
	h.cfg = cfg
	s, err := New(cfg, func(Callbacks) (Client, error) { return h.cl, nil })
	if err != nil {
		t.Fatal(err)
	}
	h.s = s
	t.Cleanup(h.close)
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	go func() {
		defer close(h.ended)
		for {
			ds, err := s.NextBatch(ctx, 10)
			if err != nil {
				return
			}
			for _, d := range ds {
				h.got <- d
			}
		}
	}()
	return h
}

// close stops the consumer goroutine and closes the stream, which commits
// what was settled. A test calls it to see that commit; its cleanup calls
// it again, which does nothing.
func (h *harness) close() {
	h.closeOnce.Do(func() {
		h.cancel()
		h.runOrStop(h.ended)
		done := make(chan struct{})
		go func() {
			defer close(done)
			h.s.Close()
		}()
		h.runOrStop(done)
	})
}

// runOrStop is run that gives up, instead of failing, when the stream is
// stuck: a test that failed already may have left it so.
func (h *harness) runOrStop(done <-chan struct{}) {
	for range 100 {
		synctest.Wait()
		select {
		case <-done:
			return
		default:
		}
		time.Sleep(h.cfg.RevokeWait + time.Second)
		synctest.Wait()
		if !h.cl.releaseCommit() && !h.cl.releasePoll() {
			select {
			case <-done:
			default:
				h.t.Errorf("the stream is stuck")
			}
			return
		}
	}
}

// run lets the stream run until done is closed. Time passes whenever
// everything waits, and a poll that took records, or a commit on its way,
// gets back only when nothing else can move: the slowest schedule.
func (h *harness) run(done <-chan struct{}) {
	h.t.Helper()
	for range 100 {
		synctest.Wait()
		select {
		case <-done:
			return
		default:
		}
		time.Sleep(h.cfg.RevokeWait + time.Second)
		synctest.Wait()
		select {
		case <-done:
			return
		default:
		}
		if !h.cl.releaseCommit() && !h.cl.releasePoll() {
			h.t.Fatalf("the stream is stuck")
		}
	}
	h.t.Fatalf("the stream did not get there")
}

// call runs a rebalance callback, as franz-go's group goroutine does, and
// lets the stream run until it returns.
func (h *harness) call(fn func(context.Context, map[string][]int32), parts map[string][]int32) {
	h.t.Helper()
	done := h.callAsync(fn, parts)
	h.run(done)
}

func (h *harness) callAsync(fn func(context.Context, map[string][]int32), parts map[string][]int32) chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn(context.Background(), parts)
	}()
	return done
}

// taken returns the deliveries the consumer goroutine took so far.
func (h *harness) taken() []idem.Delivery {
	synctest.Wait()
	var ds []idem.Delivery
	for {
		select {
		case d := <-h.got:
			ds = append(ds, d)
		default:
			return ds
		}
	}
}

func offsetOf(d idem.Delivery) int64 { return d.(*delivery).e.rec.Offset }

func (h *harness) ack(ds ...idem.Delivery) {
	h.t.Helper()
	for _, d := range ds {
		if err := d.Ack(context.Background()); err != nil {
			h.t.Fatalf("Ack: %v", err)
		}
		h.acked[offsetOf(d)] = true
	}
}

// checkCommitted fails the test if the committed offset of t/0 passed a
// record of the first n whose effect never committed: a lost message.
func (h *harness) checkCommitted(n int64) {
	h.t.Helper()
	c, ok := h.cl.committedAt(partition{"t", 0})
	if !ok {
		return
	}
	var lost []int64
	for o := int64(0); o < min(c, n); o++ {
		if !h.acked[o] {
			lost = append(lost, o)
		}
	}
	if len(lost) > 0 {
		h.t.Fatalf("committed offset %d passes offsets %v, which no delivery acknowledged: they are lost", c, lost)
	}
}

// checkHeld fails the test if the stream holds more than its limit.
func (h *harness) checkHeld() {
	h.t.Helper()
	if st := h.s.Stats(); st.Held > st.Limit {
		h.t.Fatalf("the stream holds %d records (%d bytes), above its limit of %d", st.Held, st.HeldBytes, st.Limit)
	}
}
