package idemtest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
)

// outboxLease is the lease of the suite's claims.
const outboxLease = 10 * time.Second

// TestOutbox runs the conformance suite of idem.Outbox as subtests of t:
// added messages come back from Claim whole and in Seq order, with their
// CreatedAt; Claim honours its limit; an entry under a live lease is not
// claimed again, by any relay, until the lease ends, and then is; relays
// claiming concurrently never get the same entry; MarkSent takes entries out
// for good and is safe to repeat; invalid messages and claims are refused
// with idem.ErrInvalidArgument.
//
// newOutbox is called once per subtest, from that subtest's goroutine, and
// must return a fresh, empty outbox that reads the time from clock. It
// should register any cleanup with t.Cleanup. Subtests run in parallel.
// The suite adds outside any caller's transaction; that Add joins one is a
// property of each backend, for its own tests.
func TestOutbox(t *testing.T, newOutbox func(t *testing.T, clock idem.Clock) idem.Outbox) {
	t.Helper()
	for _, tc := range outboxTests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			clock := idemmem.NewClock(Start)
			o := newOutbox(t, clock)
			if o == nil {
				t.Fatal("newOutbox returned a nil Outbox")
			}
			tc.run(t, &outboxEnv{t: t, ctx: t.Context(), clock: clock, o: o})
		})
	}
}

var outboxTests = []struct {
	name string
	run  func(t *testing.T, e *outboxEnv)
}{
	{"AddClaim", testOutboxAddClaim},
	{"Limit", testOutboxLimit},
	{"LiveLease", testOutboxLiveLease},
	{"ExpiredLeaseKeepsOrder", testOutboxExpiredLeaseOrder},
	{"ConcurrentRelays", testOutboxConcurrentRelays},
	{"MarkSent", testOutboxMarkSent},
	{"Invalid", testOutboxInvalid},
}

type outboxEnv struct {
	t     *testing.T
	ctx   context.Context
	clock *idemmem.Clock
	o     idem.Outbox
}

// event returns message i of the suite's outbox tests.
func event(i int) idem.Message {
	return idem.Message{
		ID:      fmt.Sprintf("evt-%d", i),
		Topic:   "payments.succeeded",
		Key:     fmt.Sprintf("acct-%d", i%3),
		Headers: map[string]string{"Content-Type": "application/json", "X-Seq": fmt.Sprint(i)},
		Payload: fmt.Appendf(nil, `{"event_id":"evt-%d","amount":%d}`+"\x00\xff", i, 100*i),
		Time:    Start.Add(time.Duration(i) * time.Millisecond),
	}
}

func (e *outboxEnv) add(msgs ...idem.Message) {
	e.t.Helper()
	if err := e.o.Add(e.ctx, msgs...); err != nil {
		e.t.Fatalf("Add(%d messages): %v", len(msgs), err)
	}
}

func (e *outboxEnv) claim(relay string, limit int) []idem.OutboxEntry {
	e.t.Helper()
	got, err := e.o.Claim(e.ctx, relay, limit, outboxLease)
	if err != nil {
		e.t.Fatalf("Claim(%q, %d): %v", relay, limit, err)
	}
	if len(got) > limit {
		e.t.Fatalf("Claim(%q, %d) returned %d entries", relay, limit, len(got))
	}
	for i := 1; i < len(got); i++ {
		if got[i].Seq <= got[i-1].Seq {
			e.t.Fatalf("Claim(%q, %d) is not in Seq order: %v", relay, limit, ids(got))
		}
	}
	return got
}

// wantIDs checks that entries hold the messages with the given IDs, in
// that order.
func (e *outboxEnv) wantIDs(what string, got []idem.OutboxEntry, want ...string) {
	e.t.Helper()
	if g := ids(got); !slices.Equal(g, want) {
		e.t.Errorf("%s = %v, want %v", what, g, want)
	}
}

func ids(entries []idem.OutboxEntry) []string {
	out := make([]string, len(entries))
	for i, en := range entries {
		out[i] = en.Message.ID
	}
	return out
}

func testOutboxAddClaim(t *testing.T, e *outboxEnv) {
	e.add(event(1))
	e.clock.Advance(time.Millisecond)
	e.add(event(2), event(3))
	got := e.claim("r1", 10)
	e.wantIDs("Claim", got, "evt-1", "evt-2", "evt-3")
	for i, en := range got {
		if i >= 3 {
			break
		}
		want := event(i + 1)
		if d := messageDiff(en.Message, want, true); d != "" {
			t.Errorf("entry %q differs:\n\t%s", want.ID, d)
		}
		wantAt := Start
		if i > 0 {
			wantAt = Start.Add(time.Millisecond)
		}
		if !en.CreatedAt.Equal(wantAt) {
			t.Errorf("entry %q: CreatedAt = %v, want %v", want.ID, en.CreatedAt, wantAt)
		}
	}
	// The caller's copy is the caller's: changing it changes nothing kept.
	if len(got) > 0 {
		got[0].Message.Payload[0] = '['
		got[0].Message.Headers["X-Seq"] = "changed"
	}
	e.clock.Advance(outboxLease)
	again := e.claim("r2", 1)
	if len(again) == 1 {
		if d := messageDiff(again[0].Message, event(1), true); d != "" {
			t.Errorf("entry evt-1 changed with the copy Claim returned:\n\t%s", d)
		}
	}
}

func testOutboxLimit(t *testing.T, e *outboxEnv) {
	for i := 1; i <= 5; i++ {
		e.add(event(i))
	}
	e.wantIDs("Claim(r1, 2)", e.claim("r1", 2), "evt-1", "evt-2")
	e.wantIDs("Claim(r2, 2)", e.claim("r2", 2), "evt-3", "evt-4")
	e.wantIDs("Claim(r3, 10)", e.claim("r3", 10), "evt-5")
	e.wantIDs("Claim(r4, 10) with every entry leased", e.claim("r4", 10))
}

func testOutboxLiveLease(t *testing.T, e *outboxEnv) {
	e.add(event(1), event(2), event(3))
	first := e.claim("r1", 10)
	e.wantIDs("Claim(r1)", first, "evt-1", "evt-2", "evt-3")
	e.wantIDs("Claim(r2) at once", e.claim("r2", 10))
	e.clock.Advance(outboxLease - time.Millisecond)
	e.wantIDs("Claim(r2) just before the lease ends", e.claim("r2", 10))
	e.clock.Advance(time.Millisecond)
	again := e.claim("r2", 10)
	e.wantIDs("Claim(r2) once the lease has ended", again, "evt-1", "evt-2", "evt-3")
	for i := range min(len(first), len(again)) {
		if again[i].Seq != first[i].Seq {
			t.Errorf("entry %q: Seq %d when claimed again, was %d", again[i].Message.ID, again[i].Seq, first[i].Seq)
		}
	}
	e.wantIDs("Claim(r1) under r2's lease", e.claim("r1", 10))
}

func testOutboxExpiredLeaseOrder(t *testing.T, e *outboxEnv) {
	e.add(event(1), event(2), event(3), event(4))
	e.wantIDs("Claim(r1, 2)", e.claim("r1", 2), "evt-1", "evt-2")
	e.clock.Advance(outboxLease / 2)
	e.wantIDs("Claim(r2, 2)", e.claim("r2", 2), "evt-3", "evt-4")
	e.clock.Advance(outboxLease / 2)
	// r1's lease has ended, r2's has not.
	e.wantIDs("Claim(r3) after r1's lease ended", e.claim("r3", 10), "evt-1", "evt-2")
	e.clock.Advance(outboxLease)
	e.wantIDs("Claim(r4) after every lease ended", e.claim("r4", 10), "evt-1", "evt-2", "evt-3", "evt-4")
}

func testOutboxConcurrentRelays(t *testing.T, e *outboxEnv) {
	const n, relays = 60, 8
	var msgs []idem.Message
	for i := range n {
		msgs = append(msgs, event(i))
	}
	e.add(msgs...)
	var (
		mu     sync.Mutex
		owners = make(map[string][]string)
		errs   []error
	)
	race(relays, func(r int) {
		relay := fmt.Sprintf("r%d", r)
		for {
			got, err := e.o.Claim(e.ctx, relay, 3, outboxLease)
			mu.Lock()
			if err != nil {
				errs = append(errs, fmt.Errorf("Claim(%s): %w", relay, err))
			}
			for _, en := range got {
				owners[en.Message.ID] = append(owners[en.Message.ID], relay)
			}
			mu.Unlock()
			if err != nil || len(got) == 0 {
				return
			}
		}
	})
	for _, err := range errs {
		t.Error(err)
	}
	for _, m := range msgs {
		if o := owners[m.ID]; len(o) != 1 {
			t.Errorf("entry %q was claimed by %v, want exactly one relay", m.ID, o)
		}
	}
}

func testOutboxMarkSent(t *testing.T, e *outboxEnv) {
	e.add(event(1), event(2), event(3), event(4))
	got := e.claim("r1", 10)
	if len(got) != 4 {
		t.Fatalf("Claim = %v, want 4 entries", ids(got))
	}
	if err := e.o.MarkSent(e.ctx, got[0].Seq, got[2].Seq); err != nil {
		t.Fatalf("MarkSent: %v", err)
	}
	if err := e.o.MarkSent(e.ctx, got[0].Seq); err != nil {
		t.Errorf("MarkSent of an entry already sent = %v, want nil", err)
	}
	if err := e.o.MarkSent(e.ctx); err != nil {
		t.Errorf("MarkSent() = %v, want nil", err)
	}
	e.clock.Advance(outboxLease)
	e.wantIDs("Claim after MarkSent and the lease's end", e.claim("r2", 10), "evt-2", "evt-4")
	if err := e.o.MarkSent(e.ctx, got[1].Seq, got[3].Seq); err != nil {
		t.Fatalf("MarkSent: %v", err)
	}
	e.clock.Advance(outboxLease)
	e.wantIDs("Claim once all are sent", e.claim("r3", 10))

	// Entries added later are claimed as usual.
	e.add(event(5))
	e.wantIDs("Claim after another Add", e.claim("r3", 10), "evt-5")
}

func testOutboxInvalid(t *testing.T, e *outboxEnv) {
	noID, noTopic := event(1), event(2)
	noID.ID, noTopic.Topic = "", ""
	for _, tc := range []struct {
		name string
		msgs []idem.Message
	}{
		{"no ID", []idem.Message{noID}},
		{"no topic", []idem.Message{noTopic}},
		{"a valid message, then one with no ID", []idem.Message{event(3), noID}},
	} {
		if err := e.o.Add(e.ctx, tc.msgs...); !errors.Is(err, idem.ErrInvalidArgument) {
			t.Errorf("Add(%s) = %v, want idem.ErrInvalidArgument", tc.name, err)
		}
	}
	e.wantIDs("Claim after refused Adds", e.claim("r1", 10))

	for _, tc := range []struct {
		name  string
		relay string
		limit int
		lease time.Duration
	}{
		{"no relay", "", 10, outboxLease},
		{"limit 0", "r1", 0, outboxLease},
		{"negative limit", "r1", -1, outboxLease},
		{"lease 0", "r1", 10, 0},
	} {
		if _, err := e.o.Claim(e.ctx, tc.relay, tc.limit, tc.lease); !errors.Is(err, idem.ErrInvalidArgument) {
			t.Errorf("Claim with %s = %v, want idem.ErrInvalidArgument", tc.name, err)
		}
	}

	ctx, cancel := context.WithCancel(e.ctx)
	cancel()
	if err := e.o.Add(ctx, event(4)); err == nil {
		t.Error("Add with a cancelled context = nil, want an error")
	}
	e.wantIDs("Claim after an Add with a cancelled context", e.claim("r1", 10))
}
