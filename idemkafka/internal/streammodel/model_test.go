package streammodel

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"pgregory.net/rapid"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemkafka/internal/stream"
)

const (
	topic      = "t"
	nParts     = 2
	perPart    = 12
	revokeWait = time.Second
	commitTick = time.Second
)

// The kinds of step, each drawn with its weight.
const (
	opFill = iota
	opRelease
	opAck
	opNack
	opDrop
	opTick
	opAssign
	opRevoke
	opLose
	opOther
	opCrash
	opHoldCommit
	opReleaseCommit
	opRefuse
	nOps
)

var opNames = [nOps]string{"fill", "release", "ack", "nack", "drop", "tick", "assign", "revoke", "lose", "other", "crash", "hold-commit", "release-commit", "refuse"}

var weights = [nOps]int{opFill: 6, opRelease: 5, opAck: 8, opNack: 2, opDrop: 1, opTick: 4, opAssign: 4, opRevoke: 3, opLose: 1, opOther: 2, opCrash: 1, opHoldCommit: 1, opReleaseCommit: 2, opRefuse: 1}

type op struct {
	Kind, A, B int
}

func (o op) String() string { return fmt.Sprintf("%s(%d,%d)", opNames[o.Kind], o.A, o.B) }

func opGen() *rapid.Generator[op] {
	var kinds []int
	for k, w := range weights {
		for range w {
			kinds = append(kinds, k)
		}
	}
	return rapid.Custom(func(t *rapid.T) op {
		return op{Kind: rapid.SampledFrom(kinds).Draw(t, "kind"), A: rapid.IntRange(0, 99).Draw(t, "a"), B: rapid.IntRange(0, 99).Draw(t, "b")}
	})
}

// steps counts the steps run, over every interleaving.
var steps atomic.Int64

func TestStreamModel(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		maxInFlight := rapid.IntRange(2, 8).Draw(rt, "maxInFlight")
		var logs [nParts][]int64
		for p := range nParts {
			// Offsets with gaps, as compaction and transaction markers
			// leave them.
			gaps := rapid.SliceOfN(rapid.IntRange(1, 2), perPart, perPart).Draw(rt, fmt.Sprintf("gaps%d", p))
			o := int64(0)
			for _, g := range gaps {
				o += int64(g) - 1
				logs[p] = append(logs[p], o)
				o++
			}
		}
		ops := rapid.SliceOfN(opGen(), 60, 150).Draw(rt, "ops")
		var violation string
		synctest.Test(t, func(*testing.T) {
			w := newWorld(logs, maxInFlight)
			violation = w.run(ops)
		})
		if violation != "" {
			rt.Fatalf("%s", violation)
		}
	})
	t.Logf("%d steps", steps.Load())
}

// world is the reference model: the partitions' logs, the group's
// committed offsets, the effects that committed, and the consumer's
// incarnations.
type world struct {
	mu          sync.Mutex
	logs        [nParts][]int64
	committed   [nParts]int64
	acked       [nParts]map[int64]bool
	maxInFlight int
	members     []*member
	cur         *member
	step        int
	violation   string
}

func newWorld(logs [nParts][]int64, maxInFlight int) *world {
	w := &world{logs: logs, maxInFlight: maxInFlight}
	for p := range nParts {
		w.acked[p] = make(map[int64]bool)
	}
	w.cur = w.newMember()
	return w
}

func (w *world) violate(format string, args ...any) {
	if w.violation == "" {
		w.violation = fmt.Sprintf("step %d: ", w.step) + fmt.Sprintf(format, args...)
	}
}

// member is one incarnation of the consumer: its stream, the fake client
// under it, and what franz-go's client would know of its assignment.
type member struct {
	w   *world
	s   *stream.Stream
	cb  stream.Callbacks
	cl  *fakeClient
	got chan delivered
	// cancel stops the goroutine that takes deliveries; ended is closed
	// when it has returned.
	cancel context.CancelFunc
	ended  chan struct{}
	closed chan struct{}

	// Guarded by w.mu.
	assigned  [nParts]bool // the group's assignment, as franz-go knows it
	fetchable [nParts]bool // franz-go fetches it
	cursor    [nParts]int  // the next record franz-go fetches
	gen       [nParts]int  // counts the partition's assignments
	// revoking is the step a revocation of the partition began at, -1
	// when none is under way.
	revoking [nParts]int
	dead     bool

	// Only the model's goroutine touches these.
	out      []*delivered // handed to the handlers, not settled
	dropped  []*delivered // their handlers died
	callback chan struct{}
	onDone   func()
}

type delivered struct {
	d   idem.Delivery
	p   int
	off int64
	gen int
}

func (w *world) newMember() *member {
	m := &member{w: w, got: make(chan delivered, 1000), ended: make(chan struct{}), closed: make(chan struct{})}
	for p := range nParts {
		m.revoking[p] = -1
	}
	m.cl = &fakeClient{m: m}
	s, err := stream.New(stream.Config{
		Consumer: "c", Clock: idem.SystemClock{}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		MaxInFlight: w.maxInFlight, CommitInterval: commitTick, RevokeWait: revokeWait, Counters: new(stream.Counters),
	}, func(cb stream.Callbacks) (stream.Client, error) {
		m.cb = cb
		return m.cl, nil
	})
	if err != nil {
		panic(err)
	}
	m.s = s
	ctx, cancel := context.WithCancel(context.Background())
	m.cancel = cancel
	go func() {
		defer close(m.ended)
		for {
			ds, err := s.NextBatch(ctx, 3)
			if err != nil {
				return
			}
			for _, d := range ds {
				m.got <- delivered{d: d}
			}
		}
	}()
	w.members = append(w.members, m)
	return m
}

// run plays ops, then stops the faults and checks that everything is
// delivered and committed. It returns the first violation, if any.
func (w *world) run(ops []op) string {
	defer w.cleanup()
	for _, o := range ops {
		w.step++
		steps.Add(1)
		w.apply(o)
		w.settle()
		if w.violation != "" {
			return w.violation + fmt.Sprintf(" (after %v)", o)
		}
	}
	w.finish()
	return w.violation
}

func (w *world) apply(o op) {
	m := w.cur
	switch o.Kind {
	case opFill:
		m.cl.fill(o.A)
	case opRelease:
		m.cl.releasePoll()
	case opAck, opNack, opDrop:
		if len(m.out) == 0 {
			return
		}
		i := o.A % len(m.out)
		x := m.out[i]
		m.out = append(m.out[:i], m.out[i+1:]...)
		switch o.Kind {
		case opAck:
			w.ack(x)
		case opNack:
			w.settled("Nack", x, x.d.Nack(context.Background(), time.Duration(o.B%3)*time.Second))
		case opDrop:
			m.dropped = append(m.dropped, x)
		}
	case opTick:
		time.Sleep(time.Duration(o.A%8+1) * 500 * time.Millisecond)
	case opAssign:
		w.assign(m, o.A%nParts)
	case opRevoke:
		w.revoke(m, o.A%nParts)
	case opLose:
		w.lose(m, o.A%nParts)
	case opOther:
		w.other(o.A%nParts, o.B%4+1)
	case opCrash:
		w.crash()
	case opHoldCommit:
		m.cl.mu.Lock()
		m.cl.holdNext = true
		m.cl.mu.Unlock()
	case opReleaseCommit:
		m.cl.releaseCommit()
	case opRefuse:
		m.cl.mu.Lock()
		m.cl.refuse[o.A%nParts]++
		m.cl.mu.Unlock()
	}
}

func (w *world) ack(x *delivered) {
	w.settled("Ack", x, x.d.Ack(context.Background()))
	w.mu.Lock()
	w.acked[x.p][x.off] = true
	w.mu.Unlock()
}

// settled checks what settling x returned: nil while x stands for its
// record, ErrStaleDelivery once its partition's assignment is over (the
// record is the next owner's), and either while a revocation of it is
// under way: once its RevokeWait has ended, the stream's commit reads the
// marks and a settlement after that counts for nothing.
func (w *world) settled(what string, x *delivered, err error) {
	w.mu.Lock()
	live := x.gen == w.cur.gen[x.p]
	ending := live && w.cur.revoking[x.p] >= 0
	w.mu.Unlock()
	switch {
	case ending && err != nil && !errors.Is(err, stream.ErrStaleDelivery):
		w.violate("%s of %d/%d, while its partition's revocation is under way = %v, want nil or ErrStaleDelivery", what, x.p, x.off, err)
	case ending:
	case live && err != nil:
		w.violate("%s of %d/%d, handed out in the partition's current assignment: %v", what, x.p, x.off, err)
	case !live && !errors.Is(err, stream.ErrStaleDelivery):
		w.violate("%s of %d/%d, handed out in an assignment that is over = %v, want ErrStaleDelivery", what, x.p, x.off, err)
	}
}

// settle waits until every goroutine of the bubble waits, takes the
// deliveries handed out, ends the callback that returned, and checks the
// stream against the model. The deliveries come first: one handed out
// before a callback returned is taken as such.
func (w *world) settle() {
	synctest.Wait()
	m := w.cur
	for {
		select {
		case x := <-m.got:
			var p int
			var off int64
			fmt.Sscanf(x.d.Message().ID, "%d/%d", &p, &off)
			x.p, x.off = p, off
			w.mu.Lock()
			x.gen = m.gen[p]
			switch {
			case m.revoking[p] >= 0 && m.revoking[p] < w.step:
				w.violate("handed out %d/%d after its partition's revocation began (step %d)", p, off, m.revoking[p])
			case !m.assigned[p] && m.revoking[p] < 0:
				w.violate("handed out %d/%d, of a partition not assigned", p, off)
			}
			w.mu.Unlock()
			m.out = append(m.out, &x)
			continue
		default:
		}
		break
	}
	if m.callback != nil {
		select {
		case <-m.callback:
			m.callback = nil
			m.onDone()
		default:
		}
	}
	w.check()
}

// check compares what the stream holds with the model.
func (w *world) check() {
	m := w.cur
	st := m.s.Stats()
	if st.Held > st.Limit || st.Peak > st.Limit {
		w.violate("holds %d records (peak %d), above MaxInFlight %d", st.Held, st.Peak, st.Limit)
	}
	live, ending := 0, 0
	w.mu.Lock()
	for _, x := range append(append([]*delivered(nil), m.out...), m.dropped...) {
		// A lost session's deliveries stay in flight until its callback
		// returns; a revocation's until its RevokeWait ends, which the
		// model does not see: then they are stale.
		if x.gen == m.gen[x.p] {
			live++
			if m.revoking[x.p] >= 0 {
				ending++
			}
		}
	}
	w.mu.Unlock()
	if st.InFlight > live || st.InFlight < live-ending {
		w.violate("%d deliveries in flight, the model has %d (%d of them of a revocation under way)", st.InFlight, live, ending)
	}
	if st.InFlight > st.Held {
		w.violate("%d in flight, %d held", st.InFlight, st.Held)
	}
}

// callback runs a rebalance callback as franz-go's group goroutine does:
// one at a time, while the stream goes on. onDone runs once it returned.
func (w *world) callback(m *member, fn func(context.Context, *kgo.Client, map[string][]int32), p int, onDone func()) {
	done := make(chan struct{})
	m.callback, m.onDone = done, onDone
	go func() {
		defer close(done)
		fn(context.Background(), nil, map[string][]int32{topic: {int32(p)}})
	}()
}

// assign gives p to m: the callback first, then franz-go fetches from the
// committed offset.
func (w *world) assign(m *member, p int) {
	w.mu.Lock()
	busy := m.callback != nil || m.assigned[p] || m.dead
	if !busy {
		m.assigned[p] = true
		m.gen[p]++
	}
	w.mu.Unlock()
	if busy {
		return
	}
	w.callback(m, m.cb.Assigned, p, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		m.fetchable[p] = true
		m.cursor[p] = 0
		for m.cursor[p] < len(w.logs[p]) && w.logs[p][m.cursor[p]] < w.committed[p] {
			m.cursor[p]++
		}
	})
}

// revoke takes p from m: franz-go stops fetching it and drops what it
// buffered, then calls the callback; once it returns, the partition is
// another member's.
func (w *world) revoke(m *member, p int) {
	w.mu.Lock()
	busy := m.callback != nil || !m.assigned[p] || m.dead
	if !busy {
		m.fetchable[p] = false
		m.revoking[p] = w.step
	}
	w.mu.Unlock()
	if busy {
		return
	}
	w.callback(m, m.cb.Revoked, p, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		m.assigned[p] = false
		m.revoking[p] = -1
		m.gen[p]++
	})
}

// lose takes p from m without a rebalance's courtesy (its session
// expired): its commits are refused from the start, and franz-go drops
// what it buffered only after the callback returned.
func (w *world) lose(m *member, p int) {
	w.mu.Lock()
	busy := m.callback != nil || !m.assigned[p] || m.dead
	if !busy {
		m.assigned[p] = false
		m.revoking[p] = w.step
	}
	w.mu.Unlock()
	if busy {
		return
	}
	w.callback(m, m.cb.Lost, p, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		m.fetchable[p] = false
		m.revoking[p] = -1
		m.gen[p]++
	})
}

// other has another member of the group apply up to n records of p from
// the committed offset, and commit them, while p is not m's.
func (w *world) other(p, n int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, m := range w.members {
		if !m.dead && (m.assigned[p] || m.revoking[p] >= 0) {
			return
		}
	}
	for _, off := range w.logs[p] {
		if n == 0 {
			break
		}
		if off >= w.committed[p] {
			w.acked[p][off] = true
			w.committed[p] = off + 1
			n--
		}
	}
}

// crash kills the consumer's process: its handlers die with it, nothing
// more reaches the broker, and its partitions go once its session times
// out. A new incarnation starts with none.
func (w *world) crash() {
	m := w.cur
	w.mu.Lock()
	m.dead = true
	for p := range nParts {
		m.assigned[p], m.fetchable[p] = false, false
	}
	w.mu.Unlock()
	m.cl.releasePoll()
	m.cl.releaseCommit()
	m.cancel()
	go func() {
		defer close(m.closed)
		m.s.Close()
	}()
	w.cur = w.newMember()
}

// finish stops the faults: every partition is given to the consumer
// again, its deliveries are acknowledged as they come, and every record
// must then be committed, with nothing left held or in flight.
func (w *world) finish() {
	m := w.cur
	m.cl.mu.Lock()
	m.cl.refuse = [nParts]int{}
	m.cl.holdNext = false
	m.cl.mu.Unlock()
	for range 200 {
		m.cl.releasePoll()
		m.cl.releaseCommit()
		if m.callback == nil {
			break
		}
		time.Sleep(time.Second)
		w.settle()
	}
	// What dead handlers held comes back once their partitions are
	// revoked: revoke and assign each again.
	for p := range nParts {
		for _, fn := range []func(*member, int){w.revoke, w.assign} {
			fn(m, p)
			for range 100 {
				if m.callback == nil {
					break
				}
				m.cl.releasePoll()
				time.Sleep(time.Second)
				w.settle()
			}
		}
	}
	m.dropped = nil
	for range 1000 {
		w.settle()
		for _, x := range m.out {
			w.ack(x)
		}
		m.out = nil
		m.cl.fill(1000)
		m.cl.releasePoll()
		time.Sleep(commitTick)
		w.settle()
		if w.violation != "" || w.done() {
			break
		}
	}
	if w.violation != "" {
		return
	}
	w.mu.Lock()
	for p := range nParts {
		for _, off := range w.logs[p] {
			if !w.acked[p][off] {
				w.violate("record %d/%d never applied: committed %d", p, off, w.committed[p])
			}
		}
	}
	w.mu.Unlock()
	if !w.done() {
		w.violate("not everything committed: %v", w.committed)
	}
	if st := m.s.Stats(); st.Held != 0 || st.InFlight != 0 {
		w.violate("after everything was committed: %d held, %d in flight", st.Held, st.InFlight)
	}
}

// done reports whether every partition is committed to its end.
func (w *world) done() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for p := range nParts {
		if w.committed[p] != w.logs[p][len(w.logs[p])-1]+1 {
			return false
		}
	}
	return true
}

// cleanup ends every incarnation and waits for their goroutines.
func (w *world) cleanup() {
	for _, m := range w.members {
		w.mu.Lock()
		dead := m.dead
		m.dead = true
		w.mu.Unlock()
		m.cl.releasePoll()
		m.cl.releaseCommit()
		m.cancel()
		if !dead {
			go func() {
				defer close(m.closed)
				m.s.Close()
			}()
		}
	}
	for _, m := range w.members {
		for range 1000 {
			m.cl.releasePoll()
			m.cl.releaseCommit()
			synctest.Wait()
			select {
			case <-m.closed:
			default:
				time.Sleep(time.Second)
				continue
			}
			break
		}
		<-m.ended
		if m.callback != nil {
			<-m.callback
		}
	}
}

// fakeClient is franz-go's client as the model sees it. A poll waits for
// the model to fill it from the partitions fetched at that moment, and
// returns its records when the model lets it (its goroutine may be slow
// to get back to the stream), even once the stream stopped it. A commit
// may be held on its way, and refused.
type fakeClient struct {
	m        *member
	mu       sync.Mutex
	poll     *fakePoll
	holdNext bool
	held     chan struct{}
	refuse   [nParts]int
}

type fakePoll struct {
	max     int
	filled  []*kgo.Record
	isFull  bool
	release chan struct{}
	freed   bool
}

func (f *fakeClient) PollRecords(ctx context.Context, max int) kgo.Fetches {
	p := &fakePoll{max: max, release: make(chan struct{})}
	f.mu.Lock()
	f.poll = p
	f.mu.Unlock()
	select {
	case <-p.release:
	case <-ctx.Done():
		f.mu.Lock()
		full := p.isFull
		f.mu.Unlock()
		if full {
			<-p.release
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.poll == p {
		f.poll = nil
	}
	f.m.w.mu.Lock()
	dead := f.m.dead
	f.m.w.mu.Unlock()
	switch {
	case dead:
		return kgo.NewErrFetch(kgo.ErrClientClosed)
	case !p.isFull:
		return kgo.NewErrFetch(ctx.Err())
	}
	var fps []kgo.FetchPartition
	for _, r := range p.filled {
		if len(fps) == 0 || fps[len(fps)-1].Partition != r.Partition {
			fps = append(fps, kgo.FetchPartition{Partition: r.Partition})
		}
		fps[len(fps)-1].Records = append(fps[len(fps)-1].Records, r)
	}
	return kgo.Fetches{{Topics: []kgo.FetchTopic{{Topic: topic, Partitions: fps}}}}
}

// fill has the poll under way take up to n records (and no more than it
// asked for) from the partitions franz-go fetches now.
func (f *fakeClient) fill(n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p := f.poll
	if p == nil || p.isFull {
		return
	}
	m, w := f.m, f.m.w
	w.mu.Lock()
	defer w.mu.Unlock()
	n = min(n+1, p.max)
	for part := range nParts {
		for n > 0 && m.fetchable[part] && m.cursor[part] < len(w.logs[part]) {
			off := w.logs[part][m.cursor[part]]
			m.cursor[part]++
			p.filled = append(p.filled, &kgo.Record{
				Topic: topic, Partition: int32(part), Offset: off, LeaderEpoch: 1,
				Headers: []kgo.RecordHeader{{Key: stream.HeaderID, Value: fmt.Appendf(nil, "%d/%d", part, off)}},
			})
			n--
		}
	}
	if len(p.filled) > 0 {
		p.isFull = true
	}
}

func (f *fakeClient) releasePoll() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if p := f.poll; p != nil && p.isFull && !p.freed {
		p.freed = true
		close(p.release)
	}
}

func (f *fakeClient) CommitOffsets(ctx context.Context, offsets map[string]map[int32]kgo.EpochOffset) (map[string]map[int32]error, error) {
	// The request carries the generation it was sent in: the coordinator
	// refuses it if the group moved on meanwhile (ILLEGAL_GENERATION),
	// here if the partition's assignment changed.
	var gen [nParts]int
	f.m.w.mu.Lock()
	gen = f.m.gen
	f.m.w.mu.Unlock()
	f.mu.Lock()
	var held chan struct{}
	if f.holdNext {
		f.holdNext = false
		held = make(chan struct{})
		f.held = held
	}
	f.mu.Unlock()
	if held != nil {
		select {
		case <-held:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	// The coordinator refuses the partitions the model told it to.
	var refused [nParts]bool
	f.mu.Lock()
	for part := range offsets[topic] {
		if f.refuse[part] > 0 {
			f.refuse[part]--
			refused[part] = true
		}
	}
	f.mu.Unlock()
	m, w := f.m, f.m.w
	w.mu.Lock()
	defer w.mu.Unlock()
	if m.dead {
		return nil, kgo.ErrClientClosed
	}
	out := map[string]map[int32]error{topic: {}}
	for part, eo := range offsets[topic] {
		p := int(part)
		switch {
		case !m.assigned[p] || m.gen[p] != gen[p]:
			out[topic][part] = kerr.IllegalGeneration
		case refused[p]:
			out[topic][part] = kerr.RebalanceInProgress
		default:
			if eo.Offset < w.committed[p] {
				w.violate("partition %d: committed offset moved back from %d to %d", p, w.committed[p], eo.Offset)
			}
			for _, off := range w.logs[p] {
				if off < eo.Offset && !w.acked[p][off] {
					w.violate("partition %d: committed offset %d passes %d, whose effect never committed", p, eo.Offset, off)
					break
				}
			}
			w.committed[p] = eo.Offset
			out[topic][part] = nil
		}
	}
	return out, nil
}

func (f *fakeClient) releaseCommit() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.held != nil {
		close(f.held)
		f.held = nil
	}
}

func (f *fakeClient) Close() {}

// TestMain makes CI's search 1,000 interleavings, unless -rapid.checks
// says otherwise: with the rebalance fix of the stream taken out, 1,000
// find the lost record every time they were tried, 100 did not.
func TestMain(m *testing.M) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "rapid.checks" })
	if !set {
		if err := flag.Set("rapid.checks", "1000"); err != nil {
			panic(err)
		}
	}
	os.Exit(m.Run())
}
