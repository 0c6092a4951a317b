package idemtest

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// The subtests of TestInbox for an inbox that is an idem.SequenceInbox.
var sequenceInboxTests = []struct {
	name string
	run  func(t *testing.T, e *inboxEnv, in idem.SequenceInbox)
}{
	{"SequenceInOrder", testSequenceInOrder},
	{"SequenceDuplicates", testSequenceDuplicates},
	{"SequenceGapHold", testSequenceGapHold},
	{"SequenceGapAllow", testSequenceGapAllow},
	{"SequenceFailureLeavesMark", testSequenceFailure},
	{"SequenceConcurrent", testSequenceConcurrent},
	{"SequenceNamespaces", testSequenceNamespaces},
	{"SequenceCancelledContext", testSequenceCancelled},
	{"SequenceInvalid", testSequenceInvalid},
	{"SequenceLargeNumbers", testSequenceLarge},
}

// seqEnv is the state of one sequence subtest: the calls of fn and what
// each ProcessSequence returned, so that every step can say what it
// expected.
type seqEnv struct {
	*inboxEnv
	in    idem.SequenceInbox
	calls atomic.Int32
}

// tag names the effect of one sequence number of an aggregate.
func seqTag(consumer, aggregate string, seq uint64) string {
	return fmt.Sprintf("%s/%s/%d", consumer, aggregate, seq)
}

// process calls ProcessSequence with an fn that counts its call, writes
// the sequence number's tag and returns fnErr.
func (s *seqEnv) process(consumer, aggregate string, seq uint64, gap idem.GapPolicy, fnErr error) error {
	return s.in.ProcessSequence(s.ctx, consumer, aggregate, seq, gap, s.writer(&s.calls, seqTag(consumer, aggregate, seq), fnErr))
}

// want checks that processing seq returns nil (fn ran once and its write
// committed), idem.ErrDuplicate or idem.ErrSequenceGap (fn did not run,
// nothing committed).
func (s *seqEnv) want(consumer, aggregate string, seq uint64, gap idem.GapPolicy, want error, why string) {
	s.t.Helper()
	tag := seqTag(consumer, aggregate, seq)
	before, calls := s.count(tag), s.calls.Load()
	err := s.process(consumer, aggregate, seq, gap, nil)
	ran := s.calls.Load() - calls
	switch {
	case want == nil && err != nil:
		s.t.Errorf("ProcessSequence(%q, %q, %d, %s) = %v, want nil: %s", consumer, aggregate, seq, gap, err, why)
	case want != nil && !errors.Is(err, want):
		s.t.Errorf("ProcessSequence(%q, %q, %d, %s) = %v, want %v: %s", consumer, aggregate, seq, gap, err, want, why)
	case want == nil && ran != 1:
		s.t.Errorf("ProcessSequence(%q, %q, %d, %s) ran fn %d times, want once: %s", consumer, aggregate, seq, gap, ran, why)
	case want != nil && ran != 0:
		s.t.Errorf("ProcessSequence(%q, %q, %d, %s) returned %v but ran fn: %s", consumer, aggregate, seq, gap, err, why)
	}
	wantCommitted := before
	if want == nil {
		wantCommitted++
	}
	s.wantCount(tag, wantCommitted, why)
}

func testSequenceInOrder(t *testing.T, e *inboxEnv, in idem.SequenceInbox) {
	s := &seqEnv{inboxEnv: e, in: in}
	ctx := context.WithValue(e.ctx, ctxMarker{}, "caller's")
	sawValue := false
	err := in.ProcessSequence(ctx, "c", "acct-1", 1, idem.GapHold, func(ctx context.Context) error {
		sawValue = ctx.Value(ctxMarker{}) == "caller's"
		return e.effects.Write(ctx, seqTag("c", "acct-1", 1))
	})
	if err != nil {
		t.Fatalf("ProcessSequence(acct-1, 1) = %v, want nil", err)
	}
	if !sawValue {
		t.Error("fn's context does not carry the values of the context given to ProcessSequence")
	}
	e.wantCount(seqTag("c", "acct-1", 1), 1, "the first message of an aggregate committed")
	for seq := uint64(2); seq <= 5; seq++ {
		s.want("c", "acct-1", seq, idem.GapHold, nil, "each next sequence number runs")
	}
}

func testSequenceDuplicates(t *testing.T, e *inboxEnv, in idem.SequenceInbox) {
	s := &seqEnv{inboxEnv: e, in: in}
	for seq := uint64(1); seq <= 3; seq++ {
		s.want("c", "acct-1", seq, idem.GapHold, nil, "in order")
	}
	for _, gap := range []idem.GapPolicy{idem.GapHold, idem.GapAllow} {
		s.want("c", "acct-1", 3, gap, idem.ErrDuplicate, "at the mark")
		s.want("c", "acct-1", 2, gap, idem.ErrDuplicate, "below the mark")
		s.want("c", "acct-1", 1, gap, idem.ErrDuplicate, "the first, below the mark")
	}
	// The duplicates changed nothing: the mark is still 3.
	s.want("c", "acct-1", 4, idem.GapHold, nil, "the mark is 3 after the duplicates")
}

func testSequenceGapHold(t *testing.T, e *inboxEnv, in idem.SequenceInbox) {
	s := &seqEnv{inboxEnv: e, in: in}
	checkGap := func(aggregate string, mark, seq uint64) {
		t.Helper()
		calls := s.calls.Load()
		err := s.process("c", aggregate, seq, idem.GapHold, nil)
		var gap *idem.SequenceGapError
		switch {
		case !errors.As(err, &gap):
			t.Errorf("ProcessSequence(%s, %d, GapHold) with mark %d = %v, want a *idem.SequenceGapError", aggregate, seq, mark, err)
		case !errors.Is(err, idem.ErrSequenceGap):
			t.Errorf("the gap error %v does not match idem.ErrSequenceGap", err)
		case gap.Aggregate != aggregate || gap.Mark != mark || gap.Seq != seq:
			t.Errorf("gap error %+v, want aggregate %q, mark %d, seq %d", gap, aggregate, mark, seq)
		}
		if errors.Is(err, idem.ErrDuplicate) {
			t.Errorf("the gap error %v matches idem.ErrDuplicate: a consumer would drop the message", err)
		}
		if s.calls.Load() != calls {
			t.Errorf("ProcessSequence(%s, %d, GapHold) ran fn across a gap", aggregate, seq)
		}
		e.wantCount(seqTag("c", aggregate, seq), 0, "a held gap runs nothing")
	}
	checkGap("fresh", 0, 2)
	s.want("c", "acct-1", 1, idem.GapHold, nil, "the first")
	checkGap("acct-1", 1, 3)
	checkGap("acct-1", 1, 10)
	// The gap error changed nothing: the mark is still 1.
	s.want("c", "acct-1", 2, idem.GapHold, nil, "the missing one, after the gap errors")
	s.want("c", "acct-1", 3, idem.GapHold, nil, "the held one, once the gap closed")
	s.want("c", "fresh", 1, idem.GapHold, nil, "the first of an aggregate whose gap was held")
}

func testSequenceGapAllow(t *testing.T, e *inboxEnv, in idem.SequenceInbox) {
	s := &seqEnv{inboxEnv: e, in: in}
	s.want("c", "acct-1", 1, idem.GapHold, nil, "the first")
	s.want("c", "acct-1", 5, idem.GapAllow, nil, "GapAllow runs past a gap")
	s.want("c", "acct-1", 3, idem.GapHold, idem.ErrDuplicate, "a late lower number is a duplicate once the mark passed it")
	s.want("c", "acct-1", 2, idem.GapAllow, idem.ErrDuplicate, "a late lower number is a duplicate under GapAllow too")
	s.want("c", "acct-1", 5, idem.GapAllow, idem.ErrDuplicate, "the mark is 5")
	s.want("c", "acct-1", 6, idem.GapHold, nil, "the mark is 5: 6 is next")
	s.want("c", "fresh", 100, idem.GapAllow, nil, "GapAllow runs the first message of an aggregate whatever its number")
	s.want("c", "fresh", 99, idem.GapAllow, idem.ErrDuplicate, "below a mark set by GapAllow")
}

func testSequenceFailure(t *testing.T, e *inboxEnv, in idem.SequenceInbox) {
	s := &seqEnv{inboxEnv: e, in: in}
	boom := errors.New("boom")
	s.want("c", "acct-1", 1, idem.GapHold, nil, "the first")
	for _, tc := range []struct {
		name  string
		err   error
		check func(err error) string
	}{
		{"plain", boom, func(error) string { return "" }},
		{"permanent", idem.Permanent(boom), func(err error) string {
			if !idem.IsPermanent(err) {
				return "it is no longer marked permanent"
			}
			return ""
		}},
		{"retry after", idem.RetryAfter(boom, 7*time.Second), func(err error) string {
			if d, ok := idem.RetryDelay(err); !ok || d != 7*time.Second {
				return fmt.Sprintf("RetryDelay = %v, %v; want 7s, true", d, ok)
			}
			return ""
		}},
	} {
		err := s.process("c", "acct-1", 2, idem.GapHold, tc.err)
		if !errors.Is(err, boom) {
			t.Errorf("%s: ProcessSequence with a failing fn = %v, want fn's error", tc.name, err)
		} else if why := tc.check(err); why != "" {
			t.Errorf("%s: ProcessSequence returned fn's error changed: %s", tc.name, why)
		}
		e.wantCount(seqTag("c", "acct-1", 2), 0, tc.name+": fn failed, so its writes roll back")
	}
	// A failure past a gap under GapAllow must not raise the mark either.
	if err := s.process("c", "acct-1", 10, idem.GapAllow, boom); !errors.Is(err, boom) {
		t.Errorf("ProcessSequence(10, GapAllow) with a failing fn = %v, want fn's error", err)
	}
	s.want("c", "acct-1", 2, idem.GapHold, nil, "the failures left the mark at 1: the redelivery runs")
	s.want("c", "acct-1", 3, idem.GapHold, nil, "the failure at 10 left no mark: 3 is next")
	s.want("c", "acct-1", 10, idem.GapAllow, nil, "10 runs once the mark is below it")

	// A failure of the first message of an aggregate leaves no mark.
	if err := s.process("c", "fresh", 1, idem.GapHold, boom); !errors.Is(err, boom) {
		t.Errorf("ProcessSequence(fresh, 1) with a failing fn = %v, want fn's error", err)
	}
	s.want("c", "fresh", 1, idem.GapHold, nil, "the first message's failure left no mark")
}

// testSequenceConcurrent runs two copies of each of an aggregate's
// sequence numbers 1..n at once, each retried while it meets a gap: every
// number is applied exactly once, in order, never two handlers of the
// aggregate at a time, and the mark ends at n.
func testSequenceConcurrent(t *testing.T, e *inboxEnv, in idem.SequenceInbox) {
	const n, copies = 12, 2
	// overlapWindow is how long each handler stays inside, waiting to see
	// whether another of the same aggregate comes in: an inbox that reads
	// the mark without holding it lets the other copy in meanwhile.
	const overlapWindow = 5 * time.Millisecond
	var (
		mu       sync.Mutex
		inside   int
		overlaps int
		order    []uint64
		calls    = make([]atomic.Int32, n+1)
		o        outcomes
	)
	deadline := time.Now().Add(30 * time.Second)
	race(n*copies, func(i int) {
		seq := uint64(i%n) + 1
		fn := func(ctx context.Context) error {
			calls[seq].Add(1)
			mu.Lock()
			inside++
			if inside > 1 {
				overlaps++
			}
			mu.Unlock()
			// Stay inside for the window, so that a handler let in beside
			// this one is seen inside with it.
			timer := time.NewTimer(overlapWindow)
			select {
			case <-timer.C:
			case <-ctx.Done():
			}
			timer.Stop()
			mu.Lock()
			inside--
			mu.Unlock()
			if err := e.effects.Write(ctx, seqTag("c", "acct-1", seq)); err != nil {
				return err
			}
			mu.Lock()
			order = append(order, seq)
			mu.Unlock()
			return nil
		}
		for {
			err := in.ProcessSequence(e.ctx, "c", "acct-1", seq, idem.GapHold, fn)
			if !errors.Is(err, idem.ErrSequenceGap) {
				o.add(i, err)
				return
			}
			if time.Now().After(deadline) {
				o.add(i, fmt.Errorf("seq %d still meets a gap after 30s: %w", seq, err))
				return
			}
			// The missing numbers are being applied by other goroutines.
			runtime.Gosched()
		}
	})
	for _, u := range o.unexpected {
		t.Error(u)
	}
	if o.ok != n || o.dup != n*(copies-1) {
		t.Errorf("%d copies each of sequence numbers 1..%d: %d nil and %d ErrDuplicate, want %d and %d",
			copies, n, o.ok, o.dup, n, n*(copies-1))
	}
	if overlaps > 0 {
		t.Errorf("two handlers of one aggregate ran at once %d times: the mark was read without being held", overlaps)
	}
	for seq := uint64(1); seq <= n; seq++ {
		if c := calls[seq].Load(); c != 1 {
			t.Errorf("seq %d: fn ran %d times, want 1", seq, c)
		}
		e.wantCount(seqTag("c", "acct-1", seq), 1, "each sequence number applies once")
	}
	mu.Lock()
	applied := slices.Clone(order)
	mu.Unlock()
	want := make([]uint64, n)
	for i := range want {
		want[i] = uint64(i) + 1
	}
	if !slices.Equal(applied, want) {
		t.Errorf("applied in the order %v, want %v: GapHold keeps an aggregate's order", applied, want)
	}
	s := &seqEnv{inboxEnv: e, in: in}
	s.want("c", "acct-1", n, idem.GapHold, idem.ErrDuplicate, "the mark ends at n")
	s.want("c", "acct-1", n+1, idem.GapHold, nil, "the mark ends at n: n+1 is next")
}

func testSequenceNamespaces(t *testing.T, e *inboxEnv, in idem.SequenceInbox) {
	s := &seqEnv{inboxEnv: e, in: in}
	for _, p := range []struct{ consumer, aggregate string }{
		{"c1", "acct-1"},
		{"c2", "acct-1"}, // same aggregate, another consumer
		{"c1", "acct-2"}, // same consumer, another aggregate
		// Pairs a store that joins consumer and aggregate into one string
		// without care would confuse with one another.
		{"c1a", "cct-1"},
		{"c1:acct", "-1"},
		{"c1", "acct:-1"},
	} {
		s.want(p.consumer, p.aggregate, 1, idem.GapHold, nil, "each (consumer, aggregate) has a mark of its own")
	}
	s.want("c2", "acct-1", 2, idem.GapHold, nil, "c2's mark of acct-1 is 1")
	s.want("c1", "acct-1", 2, idem.GapHold, nil, "c1's mark of acct-1 is 1 whatever c2 did")
	s.want("c1", "acct-2", 1, idem.GapHold, idem.ErrDuplicate, "acct-2's mark is its own")

	// The marks are apart from Process's records.
	var calls atomic.Int32
	if err := e.inbox.Process(e.ctx, "c1", "acct-1", e.writer(&calls, "message acct-1", nil)); err != nil {
		t.Errorf("Process(c1, acct-1) after ProcessSequence of aggregate acct-1 = %v, want nil: dedup keys and aggregates never meet", err)
	}
	if err := e.inbox.Process(e.ctx, "c1", "m-1", e.writer(&calls, "message m-1", nil)); err != nil {
		t.Fatalf("Process(c1, m-1) = %v", err)
	}
	s.want("c1", "m-1", 1, idem.GapHold, nil, "an aggregate named like a processed dedup key has no mark")
}

func testSequenceCancelled(t *testing.T, e *inboxEnv, in idem.SequenceInbox) {
	s := &seqEnv{inboxEnv: e, in: in}
	s.want("c", "acct-1", 1, idem.GapHold, nil, "the first")
	ctx, cancel := context.WithCancel(e.ctx)
	cancel()
	if err := in.ProcessSequence(ctx, "c", "acct-1", 2, idem.GapHold, s.writer(&s.calls, seqTag("c", "acct-1", 2), nil)); err == nil {
		t.Error("ProcessSequence with a cancelled context = nil, want an error")
	}
	e.wantCount(seqTag("c", "acct-1", 2), 0, "a cancelled ProcessSequence commits nothing")
	s.want("c", "acct-1", 2, idem.GapHold, nil, "a cancelled call left the mark at 1")
}

func testSequenceInvalid(t *testing.T, e *inboxEnv, in idem.SequenceInbox) {
	ran := false
	fn := func(context.Context) error { ran = true; return nil }
	for _, tc := range []struct {
		name                string
		consumer, aggregate string
		seq                 uint64
		gap                 idem.GapPolicy
		fn                  func(context.Context) error
	}{
		{"seq 0", "c", "acct-1", 0, idem.GapHold, fn},
		{"seq 0 under GapAllow", "c", "acct-1", 0, idem.GapAllow, fn},
		{"an empty consumer", "", "acct-1", 1, idem.GapHold, fn},
		{"an empty aggregate", "c", "", 1, idem.GapHold, fn},
		{"an unknown gap policy", "c", "acct-1", 1, idem.GapPolicy(7), fn},
		{"a nil fn", "c", "acct-1", 1, idem.GapHold, nil},
	} {
		if err := in.ProcessSequence(e.ctx, tc.consumer, tc.aggregate, tc.seq, tc.gap, tc.fn); !errors.Is(err, idem.ErrInvalidArgument) {
			t.Errorf("ProcessSequence with %s = %v, want idem.ErrInvalidArgument", tc.name, err)
		}
	}
	if ran {
		t.Error("fn ran for an invalid call")
	}
	s := &seqEnv{inboxEnv: e, in: in}
	s.want("c", "acct-1", 1, idem.GapHold, nil, "the invalid calls changed nothing")
}

// testSequenceLarge checks numbers a store would get wrong if it kept them
// as int64 (past 2^63) or float64 (past 2^53, where neighbours round to
// one value).
func testSequenceLarge(t *testing.T, e *inboxEnv, in idem.SequenceInbox) {
	s := &seqEnv{inboxEnv: e, in: in}
	const (
		past53 = 1<<53 + 1
		past63 = 1<<63 + 7
		last   = math.MaxUint64
	)
	s.want("c", "acct-1", past53, idem.GapAllow, nil, "past 2^53")
	s.want("c", "acct-1", past53+1, idem.GapHold, nil, "the next past 2^53")
	s.want("c", "acct-1", past53+1, idem.GapHold, idem.ErrDuplicate, "at a mark past 2^53")
	s.want("c", "acct-1", past63, idem.GapAllow, nil, "past 2^63")
	s.want("c", "acct-1", past63-1, idem.GapHold, idem.ErrDuplicate, "just below a mark past 2^63")
	s.want("c", "acct-1", past63+1, idem.GapHold, nil, "the next past 2^63")
	calls := s.calls.Load()
	err := s.process("c", "acct-1", past63+3, idem.GapHold, nil)
	var gap *idem.SequenceGapError
	if !errors.As(err, &gap) || gap.Mark != past63+1 || gap.Seq != past63+3 || s.calls.Load() != calls {
		t.Errorf("ProcessSequence(%d, GapHold) with mark %d = %v, want a gap error with that mark and no run", uint64(past63+3), uint64(past63+1), err)
	}
	s.want("c", "acct-1", last-1, idem.GapAllow, nil, "the last number but one")
	s.want("c", "acct-1", last, idem.GapHold, nil, "the last number there is")
	s.want("c", "acct-1", last, idem.GapAllow, idem.ErrDuplicate, "at the last number")
}
