package idemtest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// InboxEffects lets TestInbox see whether a handler's writes commit with the
// inbox record. It stands for the consumer's own tables: Write makes a
// write in the transaction the inbox gives its handler, Count reads what has
// committed. For a SQL inbox, Write might insert a row tagged tag through the
// transaction found in ctx, and Count select count(*) of them outside any
// transaction.
type InboxEffects interface {
	// Write records one write tagged tag in the transaction ctx carries.
	// ctx is the one Inbox.Process gave its fn; Write should fail if it
	// carries no transaction, since a write outside it would commit
	// whatever the inbox decides.
	Write(ctx context.Context, tag string) error
	// Count returns how many writes tagged tag have committed.
	Count(ctx context.Context, tag string) (int, error)
}

// TestInbox runs the conformance suite of idem.Inbox as subtests of t: the
// first Process of a (consumer, key) runs fn and commits its writes; later
// ones return idem.ErrDuplicate without running it; a failing fn leaves
// neither record nor writes, so a redelivery runs it again, and its error
// comes back unchanged (a permanent or rate-limited error keeps its class);
// 32 concurrent deliveries of one message apply its effect exactly once,
// also when the first of them fails; consumers and keys are independent
// namespaces; a cancelled context commits nothing; and a history of many
// deliveries of a few messages at once, their handlers failing now and
// then, that Porcupine finds linearizable against processing each key
// once (see the package documentation, "Linearizability").
//
// newInbox is called once per subtest, from that subtest's goroutine, and
// returns a fresh, empty inbox and a view of its database's effects. It
// should register any cleanup with t.Cleanup. Subtests run in parallel.
//
// When the inbox is an idem.BatchInbox, the suite also checks ProcessBatch:
// fresh flags that tell processed keys from new ones, for each consumer
// apart; a failing batch that leaves no record; invalid batches refused
// with idem.ErrInvalidArgument; and batches sharing keys in different
// orders, run at once with Process calls of the same keys, that apply each
// effect once and never wait for each other for good. Otherwise those
// subtests are skipped with the reason.
//
// When the inbox is an idem.SequenceInbox, the suite also checks
// ProcessSequence: sequence numbers applied in order; duplicates at and
// below the mark, under either GapPolicy; GapHold refusing a number past
// the next with a *idem.SequenceGapError and running nothing; GapAllow
// running past a gap and raising the mark beyond it, so that a late lower
// number is a duplicate; a failing fn that leaves the mark and its writes
// as they were; two copies each of numbers 1..12 of one aggregate, run at
// once and retried while they meet a gap, applied exactly once each, in
// order, one handler at a time, with the mark ending at 12; marks per
// (consumer, aggregate), apart from Process's records; a cancelled context
// that commits nothing; invalid calls (seq 0 among them) refused with
// idem.ErrInvalidArgument; and numbers past 2^53 and 2^63, up to the
// largest uint64, kept exactly. Otherwise those subtests are skipped with
// the reason.
func TestInbox(t *testing.T, newInbox func(t *testing.T) (idem.Inbox, InboxEffects)) {
	t.Helper()
	env := func(t *testing.T) *inboxEnv {
		inbox, effects := newInbox(t)
		if inbox == nil || effects == nil {
			t.Fatal("newInbox returned a nil Inbox or InboxEffects")
		}
		return &inboxEnv{t: t, ctx: t.Context(), inbox: inbox, effects: effects}
	}
	for _, tc := range inboxTests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.run(t, env(t))
		})
	}
	for _, tc := range batchInboxTests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := env(t)
			in, ok := e.inbox.(idem.BatchInbox)
			if !ok {
				t.Skip("the inbox is not an idem.BatchInbox")
			}
			tc.run(t, e, in)
		})
	}
	for _, tc := range sequenceInboxTests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := env(t)
			in, ok := e.inbox.(idem.SequenceInbox)
			if !ok {
				t.Skip("the inbox is not an idem.SequenceInbox")
			}
			tc.run(t, e, in)
		})
	}
}

var inboxTests = []struct {
	name string
	run  func(t *testing.T, e *inboxEnv)
}{
	{"FirstRunsThenDuplicate", testInboxFirstThenDuplicate},
	{"FailureLeavesNothing", testInboxFailure},
	{"ConcurrentOneKey", testInboxConcurrentOneKey},
	{"ConcurrentFirstFails", testInboxConcurrentFirstFails},
	{"ConcurrentManyKeys", testInboxConcurrentManyKeys},
	{"Namespaces", testInboxNamespaces},
	{"CancelledContext", testInboxCancelled},
	{"Linearizable", testInboxLinearizable},
}

type inboxEnv struct {
	t       *testing.T
	ctx     context.Context
	inbox   idem.Inbox
	effects InboxEffects
}

// writer returns an fn that counts its calls, writes tag, and returns err.
func (e *inboxEnv) writer(calls *atomic.Int32, tag string, err error) func(context.Context) error {
	return func(ctx context.Context) error {
		calls.Add(1)
		if werr := e.effects.Write(ctx, tag); werr != nil {
			return fmt.Errorf("idemtest: InboxEffects.Write(%q) in fn: %w", tag, werr)
		}
		return err
	}
}

func (e *inboxEnv) count(tag string) int {
	e.t.Helper()
	n, err := e.effects.Count(e.ctx, tag)
	if err != nil {
		e.t.Fatalf("InboxEffects.Count(%q): %v", tag, err)
	}
	return n
}

func (e *inboxEnv) wantCount(tag string, want int, why string) {
	e.t.Helper()
	if got := e.count(tag); got != want {
		e.t.Errorf("%d committed writes tagged %q, want %d: %s", got, tag, want, why)
	}
}

type ctxMarker struct{}

func testInboxFirstThenDuplicate(t *testing.T, e *inboxEnv) {
	var calls atomic.Int32
	ctx := context.WithValue(e.ctx, ctxMarker{}, "caller's")
	fn := e.writer(&calls, "effect", nil)
	sawValue := false
	err := e.inbox.Process(ctx, "c", "m-1", func(ctx context.Context) error {
		sawValue = ctx.Value(ctxMarker{}) == "caller's"
		return fn(ctx)
	})
	if err != nil {
		t.Fatalf("first Process = %v, want nil", err)
	}
	if calls.Load() != 1 {
		t.Fatalf("fn ran %d times on the first Process, want 1", calls.Load())
	}
	if !sawValue {
		t.Error("fn's context does not carry the values of the context given to Process")
	}
	e.wantCount("effect", 1, "the first Process committed")

	for i := range 3 {
		if err := e.inbox.Process(e.ctx, "c", "m-1", fn); !errors.Is(err, idem.ErrDuplicate) {
			t.Errorf("Process #%d of a processed message = %v, want idem.ErrDuplicate", i+2, err)
		}
	}
	if calls.Load() != 1 {
		t.Errorf("fn ran %d times in all, want 1: a duplicate must not run it", calls.Load())
	}
	e.wantCount("effect", 1, "duplicates write nothing")
}

func testInboxFailure(t *testing.T, e *inboxEnv) {
	boom := errors.New("boom")
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
		key, tag := "m-"+tc.name, "effect-"+tc.name
		var calls atomic.Int32
		err := e.inbox.Process(e.ctx, "c", key, e.writer(&calls, tag, tc.err))
		if !errors.Is(err, boom) {
			t.Errorf("%s: Process with a failing fn = %v, want fn's error", tc.name, err)
		} else if why := tc.check(err); why != "" {
			t.Errorf("%s: Process returned fn's error changed: %s", tc.name, why)
		}
		e.wantCount(tag, 0, tc.name+": fn failed, so its writes roll back")

		// Nothing was recorded: the redelivery runs fn again.
		if err := e.inbox.Process(e.ctx, "c", key, e.writer(&calls, tag, nil)); err != nil {
			t.Errorf("%s: Process after a failure = %v, want nil", tc.name, err)
		}
		if calls.Load() != 2 {
			t.Errorf("%s: fn ran %d times, want 2: a failed attempt must leave no record", tc.name, calls.Load())
		}
		e.wantCount(tag, 1, tc.name+": the retry committed")
		if err := e.inbox.Process(e.ctx, "c", key, e.writer(&calls, tag, nil)); !errors.Is(err, idem.ErrDuplicate) {
			t.Errorf("%s: Process after the retry committed = %v, want idem.ErrDuplicate", tc.name, err)
		}
	}
}

// outcomes tallies the results of concurrent Process calls.
type outcomes struct {
	mu              sync.Mutex
	ok, dup, failed int
	unexpected      []string
	// expectedFailure, when set, is an error some calls may return.
	expectedFailure error
}

func (o *outcomes) add(i int, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	switch {
	case err == nil:
		o.ok++
	case errors.Is(err, idem.ErrDuplicate):
		o.dup++
	case o.expectedFailure != nil && errors.Is(err, o.expectedFailure):
		o.failed++
	default:
		o.unexpected = append(o.unexpected, fmt.Sprintf("call %d: %v", i, err))
	}
}

func testInboxConcurrentOneKey(t *testing.T, e *inboxEnv) {
	const n = 32
	var calls atomic.Int32
	var o outcomes
	race(n, func(i int) { o.add(i, e.inbox.Process(e.ctx, "c", "m-1", e.writer(&calls, "effect", nil))) })
	for _, u := range o.unexpected {
		t.Error(u)
	}
	if o.ok != 1 || o.dup != n-1 {
		t.Errorf("%d concurrent Process calls: %d nil and %d ErrDuplicate, want 1 and %d", n, o.ok, o.dup, n-1)
	}
	if calls.Load() != 1 {
		t.Errorf("fn ran %d times, want 1", calls.Load())
	}
	e.wantCount("effect", 1, "the effect of one message applies once")
}

func testInboxConcurrentFirstFails(t *testing.T, e *inboxEnv) {
	const n = 32
	boom := errors.New("first attempt fails")
	var calls atomic.Int32
	o := outcomes{expectedFailure: boom}
	race(n, func(i int) {
		o.add(i, e.inbox.Process(e.ctx, "c", "m-1", func(ctx context.Context) error {
			first := calls.Add(1) == 1
			if err := e.effects.Write(ctx, "effect"); err != nil {
				return err
			}
			if first {
				return boom
			}
			return nil
		}))
	})
	for _, u := range o.unexpected {
		t.Error(u)
	}
	if o.failed != 1 || o.ok != 1 || o.dup != n-2 {
		t.Errorf("%d concurrent Process calls, the first to run failing: %d failed, %d nil and %d ErrDuplicate; want 1, 1 and %d",
			n, o.failed, o.ok, o.dup, n-2)
	}
	if calls.Load() != 2 {
		t.Errorf("fn ran %d times, want 2 (the failure, then one success)", calls.Load())
	}
	e.wantCount("effect", 1, "only the successful run commits")
}

func testInboxConcurrentManyKeys(t *testing.T, e *inboxEnv) {
	const goroutines, keys = 16, 16
	calls := make([]atomic.Int32, keys)
	var o outcomes
	race(goroutines, func(g int) {
		for j := range keys {
			k := (g + j) % keys
			o.add(g, e.inbox.Process(e.ctx, "c", fmt.Sprintf("m-%d", k), e.writer(&calls[k], fmt.Sprintf("effect-%d", k), nil)))
		}
	})
	for _, u := range o.unexpected {
		t.Error(u)
	}
	if o.ok != keys || o.dup != keys*(goroutines-1) {
		t.Errorf("%d nil and %d ErrDuplicate, want %d and %d", o.ok, o.dup, keys, keys*(goroutines-1))
	}
	for k := range keys {
		if calls[k].Load() != 1 {
			t.Errorf("key m-%d: fn ran %d times, want 1", k, calls[k].Load())
		}
		e.wantCount(fmt.Sprintf("effect-%d", k), 1, "each message's effect applies once")
	}
}

func testInboxNamespaces(t *testing.T, e *inboxEnv) {
	var calls atomic.Int32
	for _, p := range []struct{ consumer, key string }{
		{"c1", "m-1"},
		{"c2", "m-1"}, // same key, another consumer
		{"c1", "m-2"}, // same consumer, another key
		// Pairs a store that joins consumer and key into one string
		// without care would confuse with one another.
		{"c1m", "-1"},
		{"c1:m", "1"},
		{"c1", "m:1"},
	} {
		tag := p.consumer + "/" + p.key
		if err := e.inbox.Process(e.ctx, p.consumer, p.key, e.writer(&calls, tag, nil)); err != nil {
			t.Errorf("Process(%q, %q) = %v, want nil: each (consumer, key) pair is its own", p.consumer, p.key, err)
		}
		e.wantCount(tag, 1, "committed")
	}
	if err := e.inbox.Process(e.ctx, "c2", "m-1", e.writer(&calls, "again", nil)); !errors.Is(err, idem.ErrDuplicate) {
		t.Errorf("Process(c2, m-1) again = %v, want idem.ErrDuplicate", err)
	}
}

func testInboxCancelled(t *testing.T, e *inboxEnv) {
	ctx, cancel := context.WithCancel(e.ctx)
	cancel()
	var calls atomic.Int32
	if err := e.inbox.Process(ctx, "c", "m-1", e.writer(&calls, "effect", nil)); err == nil {
		t.Error("Process with a cancelled context = nil, want an error")
	}
	e.wantCount("effect", 0, "a cancelled Process commits nothing")
	before := calls.Load()
	if err := e.inbox.Process(e.ctx, "c", "m-1", e.writer(&calls, "effect", nil)); err != nil {
		t.Fatalf("Process after a cancelled one = %v, want nil", err)
	}
	if calls.Load() != before+1 {
		t.Error("fn did not run after a cancelled Process: it must leave no record")
	}
	e.wantCount("effect", 1, "committed")
}
