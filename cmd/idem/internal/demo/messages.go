package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consumer"
)

// MessagesOptions configures RunMessages. A nil *MessagesOptions means all
// defaults.
type MessagesOptions struct {
	// Out receives the tables and the explanation. Defaults to io.Discard.
	Out io.Writer
	// Capacity is how many calls per 100 ms the retry storm's dependency
	// serves before it falls over again. Defaults to DefaultCapacity.
	Capacity int
	// Dir is the directory the lab's SQLite file is made in, and kept in,
	// so that its dead letters can be read afterwards (`idem dlq`, `idem
	// console`). Defaults to a temporary directory, removed at the end.
	Dir string
	// Logger receives the consumers' logs. Defaults to discarding them.
	Logger *slog.Logger
}

// MessagesReport is what RunMessages found.
type MessagesReport struct {
	// DB is the lab's SQLite file, when it was kept (MessagesOptions.Dir);
	// "" when it was removed.
	DB string
	// Rows of each scenario, the unsafe runs first.
	Redelivery []RedeliveryRow
	Poison     []PoisonRow
	Storm      []StormRow
	Order      []OrderRow
	// Letter is the poison message's dead letter, as the protected run
	// left it.
	Letter idem.DeadLetter
	// Elapsed is how long the demo took, in real time.
	Elapsed time.Duration
}

// OK reports whether every row showed what it exists to show: each unsafe
// consumer failing the way its scenario says, each protected one holding.
func (r *MessagesReport) OK() bool { return len(r.problems()) == 0 }

// problems says, in words, how the report falls short of OK.
func (r *MessagesReport) problems() []string {
	if r == nil {
		return []string{"no report"}
	}
	var out []string
	check := func(ok bool, format string, args ...any) bool {
		if !ok {
			out = append(out, fmt.Sprintf(format, args...))
		}
		return ok
	}
	if check(len(r.Redelivery) == 2, "the redelivery scenario has %d rows, want 2", len(r.Redelivery)) {
		u, p := r.Redelivery[0], r.Redelivery[1]
		check(u.Total > u.ShouldBe, "redelivery, unsafe: %s; want a redelivered event counted twice", u.Verdict())
		check(p.ExactlyOnce(), "redelivery, protected: %s; want exactly once", p.Verdict())
		check(p.Deliveries > p.Events, "redelivery, protected: %d deliveries of %d events; want some delivered twice", p.Deliveries, p.Events)
	}
	if check(len(r.Poison) == 2, "the poison scenario has %d rows, want 2", len(r.Poison)) {
		u, p := r.Poison[0], r.Poison[1]
		check(u.Applied == 0, "poison, unsafe: %d healthy events applied; want every one stuck behind the poison", u.Applied)
		check(!p.Blocked(), "poison, protected: %s; want every healthy event applied", p.Verdict())
		check(p.DeadLetter != "" && p.PoisonAttempts == poisonAttempts,
			"poison, protected: dead letter %q after %d attempts; want one after %d", p.DeadLetter, p.PoisonAttempts, poisonAttempts)
	}
	if check(len(r.Storm) == 2, "the storm scenario has %d rows, want 2", len(r.Storm)) {
		u, p := r.Storm[0], r.Storm[1]
		check(u.FellOver > 0 && u.Peak > u.Capacity,
			"storm, no jitter: peak %d per 100 ms for a capacity of %d, fell over %d times; want the herd to knock it over (a capacity below %d)",
			u.Peak, u.Capacity, u.FellOver, u.Events)
		check(p.Held() && p.Applied == p.Events,
			"storm, full jitter: peak %d per 100 ms for a capacity of %d, fell over %d times, %d of %d applied; want it to hold (a capacity of %d or more)",
			p.Peak, p.Capacity, p.FellOver, p.Applied, p.Events, p.Peak)
	}
	if check(len(r.Order) == len(orderDesigns), "the order scenario has %d rows, want %d", len(r.Order), len(orderDesigns)) {
		adds, sets, addsOrdered, ordered, versioned := r.Order[0], r.Order[1], r.Order[2], r.Order[3], r.Order[4]
		check(adds.FinalRight == adds.Accounts && adds.HistoryRight < adds.Accounts,
			"order, %s: %d of %d final states right, %d histories right; want every total right and a history wrong",
			adds.Consumer, adds.FinalRight, adds.Accounts, adds.HistoryRight)
		check(sets.FinalRight < sets.Accounts, "order, %s: %s; want a refund undone", sets.Consumer, sets.Verdict())
		check(addsOrdered.Right(), "order, %s: %s; want every account right", addsOrdered.Consumer, addsOrdered.Verdict())
		check(ordered.Right(), "order, %s: %s; want every account right", ordered.Consumer, ordered.Verdict())
		check(versioned.Right() && versioned.RefundFirst > 0,
			"order, %s: %s, %d refunds first; want every account right although refunds came first", versioned.Consumer, versioned.Verdict(), versioned.RefundFirst)
	}
	return out
}

// RunMessages plays the message scenarios, each against a consumer built
// the unsafe way and one built with idem, printing each scenario's table to
// opts.Out as it ends, then what they showed, and returns the report.
//
// An error means the demo itself could not run (the database could not be
// opened, the lab got stuck, ctx was cancelled); the report then holds the
// rows played so far. Counting twice, blocking, falling over and ending in
// the wrong state are not errors: they are what the report is for.
func RunMessages(ctx context.Context, opts *MessagesOptions) (rep *MessagesReport, err error) {
	var o MessagesOptions
	if opts != nil {
		o = *opts
	}
	if o.Out == nil {
		o.Out = io.Discard
	}
	if o.Capacity <= 0 {
		o.Capacity = DefaultCapacity
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	began := time.Now()
	rep = &MessagesReport{}
	defer func() { rep.Elapsed = time.Since(began) }()

	dir := o.Dir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "idem-demo-messages-*"); err != nil {
			return rep, fmt.Errorf("demo: making a temporary directory: %w", err)
		}
		defer func() { err = errors.Join(err, os.RemoveAll(dir)) }()
	}
	path := filepath.Join(dir, "messages.db")
	// The lab's clock starts at a whole second of real time, so that dead
	// letters read later sort among real ones.
	l, err := openMsgLab(ctx, path, time.Now().UTC().Truncate(time.Second), o.Logger)
	if err != nil {
		return rep, fmt.Errorf("demo: %w", err)
	}
	defer func() { err = errors.Join(err, l.db.Close()) }()
	if o.Dir != "" {
		rep.DB = path
	}

	p := &printer{w: o.Out}
	p.messagesIntro()

	p.redeliveryStarts()
	for _, run := range []struct {
		mode   Mode
		design string
		inbox  idem.Inbox
	}{
		{ModeUnsafe, "no inbox", consumer.NoInbox{}},
		{ModeProtected, "inbox in the effect's tx", l.inbox},
	} {
		row, err := playRedelivery(ctx, l, run.mode, run.design, run.inbox)
		if err != nil {
			return rep, fmt.Errorf("demo: redelivery, %s: %w", run.mode, err)
		}
		rep.Redelivery = append(rep.Redelivery, row)
	}
	p.redeliveryTable(rep.Redelivery)

	p.poisonStarts()
	for _, run := range []struct {
		mode   Mode
		design string
	}{
		{ModeUnsafe, fmt.Sprintf("retries its head every %v, forever", naiveRetryEvery)},
		{ModeProtected, fmt.Sprintf("idem: %d attempts, jittered backoff", poisonAttempts)},
	} {
		row, err := playPoison(ctx, l, run.mode, run.design)
		if err != nil {
			return rep, fmt.Errorf("demo: poison, %s: %w", run.mode, err)
		}
		rep.Poison = append(rep.Poison, row)
	}
	if id := rep.Poison[1].DeadLetter; id != "" {
		if rep.Letter, err = l.letters.Get(ctx, id); err != nil {
			return rep, fmt.Errorf("demo: reading the poison's dead letter: %w", err)
		}
	}
	p.poisonTable(rep.Poison, rep.Letter, rep.DB)

	p.stormStarts(o.Capacity)
	for _, run := range []struct {
		mode   Mode
		design string
		policy idem.RetryPolicy
	}{
		{ModeUnsafe, "no jitter", idem.RetryPolicy{Jitter: idem.NoJitter}},
		{ModeProtected, "full jitter", idem.RetryPolicy{Jitter: idem.FullJitter, Rand: newLabRand(labSeed)}},
	} {
		row, err := playStorm(ctx, l, run.mode, run.design, o.Capacity, run.policy)
		if err != nil {
			return rep, fmt.Errorf("demo: retry storm, %s: %w", run.mode, err)
		}
		rep.Storm = append(rep.Storm, row)
	}
	p.stormTable(rep.Storm)

	p.orderStarts()
	for i, d := range orderDesigns {
		row, err := playOrder(ctx, l, i+1, d)
		if err != nil {
			return rep, fmt.Errorf("demo: order, %s: %w", d.consumer, err)
		}
		rep.Order = append(rep.Order, row)
	}
	p.orderTable(rep.Order)

	rep.Elapsed = time.Since(began)
	p.messagesClosing(rep)
	return rep, nil
}
