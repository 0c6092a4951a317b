package deadletter_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/deadletter"
	"github.com/idem-go/idem/idemmem"
)

var t0 = time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)

type env struct {
	t       *testing.T
	clock   *idemmem.Clock
	letters *idemmem.DeadLetters
	ledger  *idemmem.Ledger
	outbox  *idemmem.Outbox
	svc     *deadletter.Service
}

func newEnv(t *testing.T, cfg *deadletter.Config) *env {
	t.Helper()
	clock := idemmem.NewClock(t0)
	e := &env{
		t:       t,
		clock:   clock,
		letters: idemmem.NewDeadLetters(&idemmem.DeadLettersConfig{Clock: clock}),
		ledger:  idemmem.NewLedger(),
		outbox:  idemmem.NewOutbox(&idemmem.OutboxConfig{Clock: clock}),
	}
	var c deadletter.Config
	if cfg != nil {
		c = *cfg
	}
	c.DeadLetters, c.Ledger, c.Outbox, c.Clock = e.letters, e.ledger, e.outbox, clock
	svc, err := deadletter.New(&c)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	e.svc = svc
	return e
}

// transactInTx is the shared transaction of the in-memory stores.
var transactInTx = &deadletter.Config{InTx: idemmem.Transact}

func message(id, key string) idem.Message {
	return idem.Message{
		ID: id, Topic: "payments.succeeded", Key: key,
		Headers: map[string]string{"Trace": "t-" + id},
		Payload: fmt.Appendf(nil, `{"event_id":%q}`, id),
		Time:    t0.Add(-time.Hour),
	}
}

// deadLetter adds a letter for m as the consumer does: the letter and the
// hold on its key in one transaction; then parks parked behind it.
func (e *env) deadLetter(consumer string, class idem.DeadLetterClass, m idem.Message, parked ...idem.Message) string {
	e.t.Helper()
	ctx := context.Background()
	var id string
	now := e.clock.Now()
	err := idemmem.Transact(ctx, func(ctx context.Context) error {
		var err error
		id, err = e.letters.Add(ctx, idem.DeadLetter{
			Consumer: consumer, Message: m, Class: class,
			Attempts: []idem.Attempt{
				{Number: 1, At: now.Add(-2 * time.Minute), Class: idem.ClassTransient, Error: "timeout"},
				{Number: 2, At: now.Add(-time.Minute), Class: idem.ClassTransient, Error: "timeout again"},
			},
			FirstFailedAt: now.Add(-2 * time.Minute), LastFailedAt: now.Add(-time.Minute),
		})
		if err != nil {
			return err
		}
		if m.Key == "" {
			return nil
		}
		return e.ledger.HoldBack(ctx, consumer, m.Key, id)
	})
	if err != nil {
		e.t.Fatalf("dead-letter %s: %v", m.ID, err)
	}
	for _, p := range parked {
		if err := e.ledger.Park(ctx, consumer, p); err != nil {
			e.t.Fatalf("park %s: %v", p.ID, err)
		}
	}
	return id
}

// outboxed returns the messages in the outbox, oldest first.
func (e *env) outboxed() []idem.Message {
	e.t.Helper()
	entries, err := e.outbox.Claim(context.Background(), "test", 1000, time.Hour)
	if err != nil {
		e.t.Fatalf("Claim: %v", err)
	}
	var out []idem.Message
	for _, en := range entries {
		out = append(out, en.Message)
	}
	return out
}

func (e *env) letter(id string) idem.DeadLetter {
	e.t.Helper()
	dl, err := e.svc.Show(context.Background(), id)
	if err != nil {
		e.t.Fatalf("Show %s: %v", id, err)
	}
	return dl
}

func ids(msgs []idem.Message) []string {
	var out []string
	for _, m := range msgs {
		out = append(out, m.ID)
	}
	return out
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	dl, l, ob := idemmem.NewDeadLetters(nil), idemmem.NewLedger(), idemmem.NewOutbox(nil)
	for _, tc := range []struct {
		name string
		cfg  *deadletter.Config
	}{
		{"nil", nil},
		{"no dead letters", &deadletter.Config{Ledger: l, Outbox: ob}},
		{"no ledger", &deadletter.Config{DeadLetters: dl, Outbox: ob}},
		{"no outbox", &deadletter.Config{DeadLetters: dl, Ledger: l}},
		{"bad policy", &deadletter.Config{DeadLetters: dl, Ledger: l, Outbox: ob, IDs: 7}},
	} {
		if _, err := deadletter.New(tc.cfg); !errors.Is(err, idem.ErrInvalidArgument) {
			t.Errorf("%s: got %v, want ErrInvalidArgument", tc.name, err)
		}
	}
}

func TestRedriveWritesMessageThenParkedInOrder(t *testing.T) {
	t.Parallel()
	e := newEnv(t, transactInTx)
	id := e.deadLetter("settlement", idem.DeadExhausted, message("evt-1", "acct-1"), message("evt-2", "acct-1"), message("evt-3", "acct-1"))
	other := e.deadLetter("settlement", idem.DeadExhausted, message("evt-9", "acct-9"), message("evt-10", "acct-9"))
	e.clock.Advance(time.Minute)

	res, err := e.svc.Redrive(context.Background(), []string{id}, &deadletter.RedriveOptions{Actor: "alice", Reason: "fault fixed"})
	if err != nil {
		t.Fatalf("Redrive: %v", err)
	}
	if len(res) != 1 || res[0].Action != "redriven" || res[0].Message == nil || res[0].Message.ID != "evt-1" {
		t.Fatalf("results: %+v", res)
	}
	if got, want := ids(res[0].Released), []string{"evt-2", "evt-3"}; !slices.Equal(got, want) {
		t.Fatalf("released %v, want %v", got, want)
	}
	out := e.outboxed()
	if got, want := ids(out), []string{"evt-1", "evt-2", "evt-3"}; !slices.Equal(got, want) {
		t.Fatalf("outbox holds %v, want %v", got, want)
	}
	orig := message("evt-1", "acct-1")
	if m := out[0]; string(m.Payload) != string(orig.Payload) || m.Topic != orig.Topic || m.Key != orig.Key ||
		m.Headers["Trace"] != "t-evt-1" || m.Headers[deadletter.HeaderRedriveOf] != id {
		t.Fatalf("re-driven message %+v differs from the original %+v", m, orig)
	}
	dl := e.letter(id)
	if dl.State != idem.LetterRedriven || len(dl.History) != 2 {
		t.Fatalf("letter after redrive: state %s, history %+v", dl.State, dl.History)
	}
	want := idem.LetterEvent{At: t0.Add(time.Minute), Actor: "alice", Action: "redriven", Reason: "fault fixed", State: idem.LetterRedriven}
	if ev := dl.History[1]; ev != want {
		t.Fatalf("event %+v, want %+v", ev, want)
	}
	if _, held, _ := e.ledger.HeldBack(context.Background(), "settlement", "acct-1"); held {
		t.Fatal("key still held back after redrive")
	}
	// The other letter and its key are untouched.
	if e.letter(other).State != idem.LetterDead {
		t.Fatal("another letter changed")
	}
	if _, held, _ := e.ledger.HeldBack(context.Background(), "settlement", "acct-9"); !held {
		t.Fatal("another key was let go")
	}
}

func TestRedriveDryRunChangesNothing(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name         string
		cfg          *deadletter.Config
		wantReleased []string
	}{
		{"shared transaction", transactInTx, []string{"evt-2", "evt-3"}},
		{"no shared transaction", nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, tc.cfg)
			id := e.deadLetter("settlement", idem.DeadPermanent, message("evt-1", "acct-1"), message("evt-2", "acct-1"), message("evt-3", "acct-1"))
			res, err := e.svc.Redrive(context.Background(), []string{id}, &deadletter.RedriveOptions{Actor: "alice", DryRun: true})
			if err != nil {
				t.Fatalf("dry run: %v", err)
			}
			if len(res) != 1 || !res[0].DryRun || res[0].Message == nil || res[0].Message.ID != "evt-1" {
				t.Fatalf("results: %+v", res)
			}
			if got := ids(res[0].Released); !slices.Equal(got, tc.wantReleased) {
				t.Fatalf("would release %v, want %v", got, tc.wantReleased)
			}
			if n := e.outbox.Unsent(); n != 0 {
				t.Fatalf("dry run wrote %d outbox entries", n)
			}
			if dl := e.letter(id); dl.State != idem.LetterDead || len(dl.History) != 1 {
				t.Fatalf("dry run changed the letter: %+v", dl)
			}
			if h, held, _ := e.ledger.HeldBack(context.Background(), "settlement", "acct-1"); !held || h != id {
				t.Fatal("dry run let the key go")
			}
			// The parked messages are all still there for the real redrive.
			if _, err := e.svc.Redrive(context.Background(), []string{id}, &deadletter.RedriveOptions{Actor: "alice"}); err != nil {
				t.Fatalf("Redrive: %v", err)
			}
			if got, want := ids(e.outboxed()), []string{"evt-1", "evt-2", "evt-3"}; !slices.Equal(got, want) {
				t.Fatalf("outbox holds %v, want %v", got, want)
			}
		})
	}
}

func TestRedriveTwiceIsRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t, transactInTx)
	id := e.deadLetter("settlement", idem.DeadPermanent, message("evt-1", "acct-1"), message("evt-2", "acct-1"))
	opts := &deadletter.RedriveOptions{Actor: "alice"}
	if _, err := e.svc.Redrive(context.Background(), []string{id}, opts); err != nil {
		t.Fatal(err)
	}
	before := e.letter(id)
	res, err := e.svc.Redrive(context.Background(), []string{id}, opts)
	if !errors.Is(err, idem.ErrInvalidTransition) || !strings.Contains(err.Error(), id) {
		t.Fatalf("second Redrive: got %v, want ErrInvalidTransition naming %s", err, id)
	}
	if len(res) != 0 {
		t.Fatalf("second Redrive returned results %+v", res)
	}
	if n := e.outbox.Unsent(); n != 2 {
		t.Fatalf("outbox holds %d, want the 2 of the first redrive", n)
	}
	if after := e.letter(id); len(after.History) != len(before.History) {
		t.Fatalf("history grew: %+v", after.History)
	}
}

func TestBadInputChangesNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, transactInTx)
	id := e.deadLetter("settlement", idem.DeadPermanent, message("evt-1", "acct-1"), message("evt-2", "acct-1"))
	id2 := e.deadLetter("settlement", idem.DeadPermanent, message("evt-5", "acct-5"))
	ctx := context.Background()
	edit := func(m idem.Message) (idem.Message, error) { return m, nil }
	for _, tc := range []struct {
		name string
		do   func() error
		want error
	}{
		{"unknown ID among good ones", func() error {
			_, err := e.svc.Redrive(ctx, []string{id, "dl-404"}, &deadletter.RedriveOptions{Actor: "a"})
			if err != nil && !strings.Contains(err.Error(), "dl-404") {
				return fmt.Errorf("error does not name the ID: %w", err)
			}
			return err
		}, idem.ErrNotFound},
		{"no options", func() error { _, err := e.svc.Redrive(ctx, []string{id}, nil); return err }, idem.ErrInvalidArgument},
		{"no actor", func() error {
			_, err := e.svc.Redrive(ctx, []string{id}, &deadletter.RedriveOptions{})
			return err
		}, idem.ErrInvalidArgument},
		{"no IDs", func() error {
			_, err := e.svc.Redrive(ctx, nil, &deadletter.RedriveOptions{Actor: "a"})
			return err
		}, idem.ErrInvalidArgument},
		{"an ID twice", func() error {
			_, err := e.svc.Redrive(ctx, []string{id, id}, &deadletter.RedriveOptions{Actor: "a"})
			return err
		}, idem.ErrInvalidArgument},
		{"edit and payload", func() error {
			_, err := e.svc.Redrive(ctx, []string{id}, &deadletter.RedriveOptions{Actor: "a", Edit: edit, Payload: []byte("{}")})
			return err
		}, idem.ErrInvalidArgument},
		{"payload for two letters", func() error {
			_, err := e.svc.Redrive(ctx, []string{id, id2}, &deadletter.RedriveOptions{Actor: "a", Payload: []byte("{}")})
			return err
		}, idem.ErrInvalidArgument},
		{"edit fails on one", func() error {
			boom := errors.New("cannot edit")
			_, err := e.svc.Redrive(ctx, []string{id, id2}, &deadletter.RedriveOptions{Actor: "a", Edit: func(m idem.Message) (idem.Message, error) {
				if m.ID == "evt-5" {
					return m, boom
				}
				return m, nil
			}})
			if !errors.Is(err, boom) {
				return fmt.Errorf("the edit's error is lost: %v", err)
			}
			return idem.ErrInvalidArgument
		}, idem.ErrInvalidArgument},
		{"edit empties the topic", func() error {
			_, err := e.svc.Redrive(ctx, []string{id}, &deadletter.RedriveOptions{Actor: "a", Edit: func(m idem.Message) (idem.Message, error) {
				m.Topic = ""
				return m, nil
			}})
			return err
		}, idem.ErrInvalidArgument},
		{"discard without reason", func() error { _, err := e.svc.Discard(ctx, []string{id}, "alice", ""); return err }, idem.ErrInvalidArgument},
		{"discard with a blank reason", func() error { _, err := e.svc.Discard(ctx, []string{id}, "alice", "  "); return err }, idem.ErrInvalidArgument},
		{"discard without actor", func() error { _, err := e.svc.Discard(ctx, []string{id}, "", "spam"); return err }, idem.ErrInvalidArgument},
		{"discard unknown", func() error { _, err := e.svc.Discard(ctx, []string{"dl-404"}, "a", "spam"); return err }, idem.ErrNotFound},
		{"redrive matching resolved letters", func() error {
			_, err := e.svc.RedriveMatching(ctx, idem.DeadLetterFilter{State: idem.LetterRedriven}, &deadletter.RedriveOptions{Actor: "a"})
			return err
		}, idem.ErrInvalidArgument},
	} {
		if err := tc.do(); !errors.Is(err, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, err, tc.want)
		}
	}
	for _, l := range []string{id, id2} {
		if dl := e.letter(l); dl.State != idem.LetterDead || len(dl.History) != 1 {
			t.Fatalf("letter %s changed: %+v", l, dl)
		}
	}
	if n := e.outbox.Unsent(); n != 0 {
		t.Fatalf("outbox holds %d", n)
	}
	if _, held, _ := e.ledger.HeldBack(ctx, "settlement", "acct-1"); !held {
		t.Fatal("key let go")
	}
}

func TestDiscardReleasesParked(t *testing.T) {
	t.Parallel()
	e := newEnv(t, transactInTx)
	id := e.deadLetter("settlement", idem.DeadPermanent, message("evt-1", "acct-1"), message("evt-2", "acct-1"), message("evt-3", "acct-1"))
	res, err := e.svc.Discard(context.Background(), []string{id}, "bob", "duplicate of evt-0")
	if err != nil {
		t.Fatalf("Discard: %v", err)
	}
	if len(res) != 1 || res[0].Message != nil || res[0].Action != "discarded" {
		t.Fatalf("results: %+v", res)
	}
	if got, want := ids(e.outboxed()), []string{"evt-2", "evt-3"}; !slices.Equal(got, want) {
		t.Fatalf("outbox holds %v, want only the parked %v", got, want)
	}
	dl := e.letter(id)
	last := dl.History[len(dl.History)-1]
	if dl.State != idem.LetterDiscarded || last.Actor != "bob" || last.Reason != "duplicate of evt-0" || last.Action != "discarded" {
		t.Fatalf("letter after discard: %+v", dl)
	}
	if _, err := e.svc.Discard(context.Background(), []string{id}, "bob", "again"); !errors.Is(err, idem.ErrInvalidTransition) {
		t.Fatalf("second Discard: got %v, want ErrInvalidTransition", err)
	}
}

func TestRedriveKeepsParkedBehindANewerLetter(t *testing.T) {
	t.Parallel()
	e := newEnv(t, transactInTx)
	old := e.deadLetter("settlement", idem.DeadPermanent, message("evt-1", "acct-1"))
	// A later message of the key failed too: the hold moved to its letter.
	newer := e.deadLetter("settlement", idem.DeadPermanent, message("evt-2", "acct-1"), message("evt-3", "acct-1"))
	res, err := e.svc.Redrive(context.Background(), []string{old}, &deadletter.RedriveOptions{Actor: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	if res[0].HeldBehind != newer || len(res[0].Released) != 0 {
		t.Fatalf("result %+v: want held behind %s, nothing released", res[0], newer)
	}
	if got := ids(e.outboxed()); !slices.Equal(got, []string{"evt-1"}) {
		t.Fatalf("outbox holds %v, want [evt-1]", got)
	}
	if h, held, _ := e.ledger.HeldBack(context.Background(), "settlement", "acct-1"); !held || h != newer {
		t.Fatalf("hold: %q %v, want %s", h, held, newer)
	}
}

func TestRedriveMatching(t *testing.T) {
	t.Parallel()
	e := newEnv(t, transactInTx)
	a := e.deadLetter("settlement", idem.DeadPermanent, message("evt-1", "k1"))
	e.clock.Advance(time.Second)
	b := e.deadLetter("settlement", idem.DeadExhausted, message("evt-2", "k2"))
	e.clock.Advance(time.Second)
	c := e.deadLetter("audit", idem.DeadPermanent, message("evt-3", "k3"))
	e.clock.Advance(time.Second)
	d := e.deadLetter("settlement", idem.DeadPermanent, message("evt-4", ""))
	res, err := e.svc.RedriveMatching(context.Background(),
		idem.DeadLetterFilter{Consumer: "settlement", Class: idem.DeadPermanent}, &deadletter.RedriveOptions{Actor: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range res {
		got = append(got, r.Letter.ID)
	}
	slices.Sort(got)
	if want := []string{a, d}; !slices.Equal(got, want) {
		t.Fatalf("re-drove %v, want %v", got, want)
	}
	if len(res) != 2 || res[0].Letter.ID != a {
		t.Fatalf("re-drove %v, want the oldest failure, %s, first", got, a)
	}
	for l, want := range map[string]idem.LetterState{a: idem.LetterRedriven, b: idem.LetterDead, c: idem.LetterDead, d: idem.LetterRedriven} {
		if s := e.letter(l).State; s != want {
			t.Errorf("letter %s is %s, want %s", l, s, want)
		}
	}
	out := ids(e.outboxed())
	if !slices.Equal(out, []string{"evt-1", "evt-4"}) { // in failure order
		t.Fatalf("outbox holds %v", out)
	}
	// Nothing left to match.
	res, err = e.svc.RedriveMatching(context.Background(), idem.DeadLetterFilter{Consumer: "settlement", Class: idem.DeadPermanent}, &deadletter.RedriveOptions{Actor: "alice"})
	if err != nil || len(res) != 0 {
		t.Fatalf("second RedriveMatching: %+v, %v", res, err)
	}
}

func TestEditAndRedrive(t *testing.T) {
	t.Parallel()
	e := newEnv(t, transactInTx)
	id := e.deadLetter("settlement", idem.DeadPermanent, message("evt-1", "acct-1"), message("evt-2", "acct-1"))
	fixed := []byte(`{"event_id":"evt-1","amount":100}`)
	res, err := e.svc.Redrive(context.Background(), []string{id}, &deadletter.RedriveOptions{Actor: "alice", Reason: "amount was missing", Payload: fixed})
	if err != nil {
		t.Fatal(err)
	}
	out := e.outboxed()
	if got := ids(out); !slices.Equal(got, []string{"evt-1", "evt-2"}) {
		t.Fatalf("outbox holds %v", got)
	}
	if string(out[0].Payload) != string(fixed) || res[0].Action != "edited and redriven" {
		t.Fatalf("re-driven %s (%s), want the edited payload", out[0].Payload, res[0].Action)
	}
	dl := e.letter(id)
	if string(dl.Message.Payload) != string(message("evt-1", "").Payload) {
		t.Fatalf("the letter's original message was changed: %s", dl.Message.Payload)
	}
	if last := dl.History[len(dl.History)-1]; last.Action != "edited and redriven" {
		t.Fatalf("event %+v", last)
	}

	id2 := e.deadLetter("settlement", idem.DeadPermanent, message("evt-7", "acct-7"))
	_, err = e.svc.Redrive(context.Background(), []string{id2}, &deadletter.RedriveOptions{Actor: "alice", Edit: func(m idem.Message) (idem.Message, error) {
		m.Headers["Fixed-By"] = "alice"
		return m, nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	if out := e.outboxed(); len(out) != 1 || out[0].Headers["Fixed-By"] != "alice" || out[0].ID != "evt-7" {
		t.Fatalf("outbox holds %+v", out)
	}
	if h := e.letter(id2).Message.Headers; h["Fixed-By"] != "" {
		t.Fatal("Edit changed the stored letter")
	}
}

func TestSuffixIDs(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &deadletter.Config{InTx: idemmem.Transact, IDs: deadletter.SuffixIDs})
	id := e.deadLetter("settlement", idem.DeadPermanent, message("evt-1", "acct-1"), message("evt-2", "acct-1"))
	if _, err := e.svc.Redrive(context.Background(), []string{id}, &deadletter.RedriveOptions{Actor: "alice"}); err != nil {
		t.Fatal(err)
	}
	out := e.outboxed()
	if got, want := ids(out), []string{"evt-1~redrive-1", "evt-2~redrive-1"}; !slices.Equal(got, want) {
		t.Fatalf("outbox holds %v, want %v", got, want)
	}
	for i, m := range out {
		want := []string{"evt-1", "evt-2"}[i]
		if k, _ := deadletter.DedupKey(m); k != want || m.Headers[deadletter.HeaderOriginalID] != want {
			t.Fatalf("message %s: dedup key %q, want %q", m.ID, k, want)
		}
	}
	// The re-driven message fails again and is re-driven again.
	id2 := e.deadLetter("settlement", idem.DeadPermanent, out[0])
	if _, err := e.svc.Redrive(context.Background(), []string{id2}, &deadletter.RedriveOptions{Actor: "alice"}); err != nil {
		t.Fatal(err)
	}
	if got := ids(e.outboxed()); !slices.Equal(got, []string{"evt-1~redrive-2"}) {
		t.Fatalf("outbox holds %v, want [evt-1~redrive-2]", got)
	}
}

func TestDedupKey(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		m    idem.Message
		want string
	}{
		{idem.Message{ID: "evt-1"}, "evt-1"},
		{idem.Message{ID: "evt-1~redrive-2", Headers: map[string]string{deadletter.HeaderOriginalID: "evt-1"}}, "evt-1"},
		{idem.Message{ID: "evt-1", Headers: map[string]string{"Other": "x"}}, "evt-1"},
	} {
		if got, err := deadletter.DedupKey(tc.m); got != tc.want || err != nil {
			t.Errorf("DedupKey(%+v) = %q, %v; want %q", tc.m, got, err, tc.want)
		}
	}
}

func TestShowUnknown(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	_, err := e.svc.Show(context.Background(), "dl-404")
	if !errors.Is(err, idem.ErrNotFound) || !strings.Contains(err.Error(), "dl-404") {
		t.Fatalf("Show: got %v, want ErrNotFound naming the ID", err)
	}
}

func TestList(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.deadLetter("settlement", idem.DeadPermanent, message("evt-1", ""))
	e.deadLetter("audit", idem.DeadPermanent, message("evt-2", ""))
	dls, err := e.svc.List(context.Background(), idem.DeadLetterFilter{Consumer: "audit"})
	if err != nil || len(dls) != 1 || dls[0].Message.ID != "evt-2" {
		t.Fatalf("List: %+v, %v", dls, err)
	}
}

// With SuffixIDs, a parked message that carries no headers at all is
// released under a suffixed ID too, with the header that keeps its
// original ID for de-duplication.
func TestSuffixIDsOfAMessageWithoutHeaders(t *testing.T) {
	t.Parallel()
	e := newEnv(t, &deadletter.Config{InTx: idemmem.Transact, IDs: deadletter.SuffixIDs})
	bare := message("evt-2", "acct-1")
	bare.Headers = nil
	id := e.deadLetter("settlement", idem.DeadPermanent, message("evt-1", "acct-1"), bare)
	if _, err := e.svc.Redrive(context.Background(), []string{id}, &deadletter.RedriveOptions{Actor: "alice"}); err != nil {
		t.Fatal(err)
	}
	out := e.outboxed()
	if got, want := ids(out), []string{"evt-1~redrive-1", "evt-2~redrive-1"}; !slices.Equal(got, want) {
		t.Fatalf("outbox holds %v, want %v", got, want)
	}
	if k, _ := deadletter.DedupKey(out[1]); k != "evt-2" {
		t.Fatalf("released message %s: dedup key %q, want evt-2", out[1].ID, k)
	}
}

// Edit gets a copy of the letter's message: editing its payload in place
// changes the message to re-drive, never the letter the result shows.
func TestEditInPlaceLeavesTheLetterAlone(t *testing.T) {
	t.Parallel()
	e := newEnv(t, transactInTx)
	id := e.deadLetter("settlement", idem.DeadPermanent, message("evt-1", ""))
	want := string(e.letter(id).Message.Payload)
	res, err := e.svc.Redrive(context.Background(), []string{id}, &deadletter.RedriveOptions{Actor: "alice", DryRun: true,
		Edit: func(m idem.Message) (idem.Message, error) {
			copy(m.Payload, "XX")
			return m, nil
		}})
	if err != nil || len(res) != 1 {
		t.Fatalf("Redrive: %v, %v", res, err)
	}
	if got := string(res[0].Letter.Message.Payload); got != want {
		t.Errorf("the result's letter shows payload %s, want %s as stored", got, want)
	}
	if got := string(res[0].Message.Payload); !strings.HasPrefix(got, "XX") {
		t.Errorf("the message to re-drive has payload %s, want the edited one", got)
	}
}
