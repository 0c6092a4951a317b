package deadletter

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/idem-go/idem"
)

// Headers the service sets on the messages it re-publishes.
const (
	// HeaderRedriveOf names the dead letter a re-driven message comes
	// from, so that its consumer's logs lead back to it.
	HeaderRedriveOf = "Idem-Redrive-Of"
	// HeaderOriginalID carries a message's first ID when SuffixIDs gave it
	// a new one. DedupKey reads it.
	HeaderOriginalID = "Idem-Original-Id"
)

// IDPolicy says which IDs the messages the service re-publishes carry.
type IDPolicy int

const (
	// KeepIDs re-publishes every message under its own ID. A consumer that
	// de-duplicates by message ID applies it once: a dead-lettered or
	// parked message left no inbox row, since it was never applied.
	//
	// A broker that drops a repeated ID within a window (JetStream's
	// Nats-Msg-Id duplicate window, 2 minutes by default) drops a copy
	// re-published within that window of its first publication: parked
	// messages released soon after they arrived, or a letter re-driven at
	// once. Use SuffixIDs with such a broker.
	KeepIDs IDPolicy = iota
	// SuffixIDs re-publishes every message under a new ID, "<id>~redrive-<n>"
	// (n counts its re-publications), and keeps the first ID in the
	// HeaderOriginalID header. No broker window drops it; its consumer
	// must then de-duplicate by something that does not change: a field of
	// the body (the seed's event_id) or DedupKey.
	SuffixIDs
)

// DedupKey returns the ID a message was first published under: its
// HeaderOriginalID header when it has one, its ID otherwise. It fits
// consumer.Config.DedupKey, for consumers of messages that SuffixIDs may
// re-publish and whose body carries no key of its own. It never fails.
func DedupKey(m idem.Message) (string, error) {
	if id := m.Headers[HeaderOriginalID]; id != "" {
		return id, nil
	}
	return m.ID, nil
}

// Config configures a Service. DeadLetters, Ledger and Outbox are
// required.
type Config struct {
	// DeadLetters keeps the letters. Required.
	DeadLetters idem.DeadLetters
	// Ledger holds the keys held back behind letters and the messages
	// parked behind them. Required.
	Ledger idem.Ledger
	// Outbox receives the re-driven and released messages, in the same
	// transaction as the letter's change of state, so that a crash cannot
	// lose them; a relay (package outbox) publishes them. Required.
	Outbox idem.Outbox
	// InTx runs fn in one transaction of the database the three stores
	// live in, passing fn a context that carries it: idemmem.Transact for
	// the in-memory stores, the database's WithTx for SQLite and
	// PostgreSQL. Defaults to calling fn with ctx, without a shared
	// transaction: each store call then commits on its own, a crash in the
	// middle of a redrive can publish a message twice (never lose one), and
	// a dry run cannot list the messages parked behind a letter.
	InTx func(ctx context.Context, fn func(ctx context.Context) error) error
	// IDs chooses the IDs of re-published messages. Defaults to KeepIDs.
	IDs IDPolicy
	// Clock dates the events of the letters' history. Defaults to
	// idem.SystemClock.
	Clock idem.Clock
}

// Service is what people act on dead letters through: the CLI's
// `idem dlq` and the UI. The zero Service is not usable; call New.
type Service struct {
	cfg      Config
	sharedTx bool
}

// New returns a Service for cfg. Returns an error matching
// idem.ErrInvalidArgument when a required store is missing or IDs is not
// a policy.
func New(cfg *Config) (*Service, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	switch {
	case c.DeadLetters == nil:
		return nil, &idem.ArgumentError{Field: "deadletter.Config.DeadLetters", Reason: "must not be nil"}
	case c.Ledger == nil:
		return nil, &idem.ArgumentError{Field: "deadletter.Config.Ledger", Reason: "must not be nil"}
	case c.Outbox == nil:
		return nil, &idem.ArgumentError{Field: "deadletter.Config.Outbox", Reason: "must not be nil"}
	case c.IDs != KeepIDs && c.IDs != SuffixIDs:
		return nil, &idem.ArgumentError{Field: "deadletter.Config.IDs", Reason: "must be KeepIDs or SuffixIDs"}
	}
	s := &Service{cfg: c, sharedTx: c.InTx != nil}
	if c.InTx == nil {
		s.cfg.InTx = func(ctx context.Context, fn func(ctx context.Context) error) error { return fn(ctx) }
	}
	if c.Clock == nil {
		s.cfg.Clock = idem.SystemClock{}
	}
	return s, nil
}

// List returns the letters f selects, most recent failure first.
func (s *Service) List(ctx context.Context, f idem.DeadLetterFilter) ([]idem.DeadLetter, error) {
	dls, err := s.cfg.DeadLetters.List(ctx, f)
	if err != nil {
		return nil, fmt.Errorf("deadletter: list: %w", err)
	}
	return dls, nil
}

// Show returns one letter. Returns an error matching idem.ErrNotFound, with
// the ID, when there is none.
func (s *Service) Show(ctx context.Context, id string) (idem.DeadLetter, error) {
	dl, err := s.cfg.DeadLetters.Get(ctx, id)
	if err != nil {
		return idem.DeadLetter{}, fmt.Errorf("deadletter: show %q: %w", id, err)
	}
	return dl, nil
}

// RedriveOptions are the options of Redrive and RedriveMatching.
type RedriveOptions struct {
	// Actor is who re-drives, for the letter's history. Required.
	Actor string
	// Reason says why, for the history. Optional.
	Reason string
	// DryRun checks everything and reports what would happen, changing
	// nothing.
	DryRun bool
	// Edit, when set, returns the message to re-drive in place of the
	// original (which it receives as a copy): edit-and-redrive. It should
	// keep the message's ID (see the package documentation). An error
	// stops the whole call, having changed nothing.
	Edit func(idem.Message) (idem.Message, error)
	// Payload, when set, replaces the payload of the message to re-drive:
	// the simple edit, for one letter at a time. Not with Edit.
	Payload []byte
}

// Result reports what was done to one letter, or, in a dry run, what would
// have been.
type Result struct {
	// Letter is the letter after its change (before it, in a dry run).
	Letter idem.DeadLetter
	// Action is the history event's action: "redriven", "edited and
	// redriven" or "discarded".
	Action string
	DryRun bool
	// Message is the message re-driven: written to the outbox first. Nil
	// for a discard.
	Message *idem.Message
	// Released are the messages that were parked behind the letter,
	// written to the outbox after Message, in their order. In a dry run
	// without a shared transaction (Config.InTx) they cannot be read
	// without being taken, and are left out.
	Released []idem.Message
	// HeldBehind, when not empty, is the letter the key is now held
	// behind instead of this one (a later message of the key failed): the
	// parked messages keep waiting for that letter, and none is released.
	HeldBehind string
}

// errDryRun rolls a dry run's transaction back.
var errDryRun = errors.New("deadletter: dry run")

// plan is one letter's change, checked before anything is written.
type plan struct {
	dl     idem.DeadLetter
	msg    *idem.Message
	action string
	to     idem.LetterState
}

// Redrive sends the letters ids back to their consumers: for each, in one
// transaction (Config.InTx), the message (edited, with RedriveOptions.Edit
// or Payload) is written to the outbox, then the key is let go and the
// messages parked behind the letter are written after it, in order, so
// that the key's order is kept; and the letter moves to
// idem.LetterRedriven with an event in its history.
//
// Every letter is checked, and edited, before any is changed: an unknown
// ID (idem.ErrNotFound), a letter no longer dead
// (idem.ErrInvalidTransition), bad options (idem.ErrInvalidArgument) or a
// failed edit return an error naming the letter and change nothing. A
// letter that changes between the check and its own transaction (a
// concurrent redrive) fails alone: the others are still re-driven, and
// the returned error joins the failures.
func (s *Service) Redrive(ctx context.Context, ids []string, opts *RedriveOptions) ([]Result, error) {
	if opts == nil {
		return nil, &idem.ArgumentError{Field: "RedriveOptions", Reason: "must not be nil: Actor is required"}
	}
	if err := checkIDs(ids); err != nil {
		return nil, err
	}
	return s.redrive(ctx, ids, opts)
}

// RedriveMatching re-drives every dead letter f selects, as Redrive does,
// the oldest first failure first. f.State must be empty or idem.LetterDead. No letter matching is not an
// error: it returns no results.
func (s *Service) RedriveMatching(ctx context.Context, f idem.DeadLetterFilter, opts *RedriveOptions) ([]Result, error) {
	if opts == nil {
		return nil, &idem.ArgumentError{Field: "RedriveOptions", Reason: "must not be nil: Actor is required"}
	}
	if f.State != "" && f.State != idem.LetterDead {
		return nil, &idem.ArgumentError{Field: "DeadLetterFilter.State", Reason: fmt.Sprintf("only %q letters can be re-driven", idem.LetterDead)}
	}
	f.State = idem.LetterDead
	dls, err := s.List(ctx, f)
	if err != nil {
		return nil, err
	}
	if len(dls) == 0 {
		return nil, nil
	}
	// Oldest first, so that letters of one key (possible under the
	// consumer's LetThrough policy) go back in the order they failed.
	slices.SortStableFunc(dls, func(a, b idem.DeadLetter) int { return a.FirstFailedAt.Compare(b.FirstFailedAt) })
	ids := make([]string, len(dls))
	for i, dl := range dls {
		ids[i] = dl.ID
	}
	return s.redrive(ctx, ids, opts)
}

func (s *Service) redrive(ctx context.Context, ids []string, opts *RedriveOptions) ([]Result, error) {
	switch {
	case strings.TrimSpace(opts.Actor) == "":
		return nil, &idem.ArgumentError{Field: "RedriveOptions.Actor", Reason: "must not be empty: the history says who re-drove"}
	case opts.Edit != nil && opts.Payload != nil:
		return nil, &idem.ArgumentError{Field: "RedriveOptions.Payload", Reason: "cannot be set with Edit"}
	case opts.Payload != nil && len(ids) > 1:
		return nil, &idem.ArgumentError{Field: "RedriveOptions.Payload", Reason: fmt.Sprintf("replaces one letter's payload, not %d letters'; use Edit", len(ids))}
	}
	plans, err := s.check(ctx, ids, "redrive", func(dl idem.DeadLetter) (plan, error) {
		m := copyMessage(dl.Message)
		action := "redriven"
		switch {
		case opts.Edit != nil:
			edited, err := opts.Edit(copyMessage(m))
			if err != nil {
				return plan{}, fmt.Errorf("edit: %w", err)
			}
			m, action = copyMessage(edited), "edited and redriven"
		case opts.Payload != nil:
			m.Payload, action = append([]byte{}, opts.Payload...), "edited and redriven"
		}
		if err := m.Validate(); err != nil {
			return plan{}, fmt.Errorf("edited message: %w", err)
		}
		if m.Headers == nil {
			m.Headers = make(map[string]string)
		}
		m.Headers[HeaderRedriveOf] = dl.ID
		return plan{dl: dl, msg: &m, action: action, to: idem.LetterRedriven}, nil
	})
	if err != nil {
		return nil, err
	}
	return s.apply(ctx, plans, opts.Actor, opts.Reason, opts.DryRun)
}

// Discard gives the letters ids up, on purpose: each moves to
// idem.LetterDiscarded with actor and reason in its history, and the
// messages parked behind it are released to the outbox, in order, since
// they were waiting only on it. reason and actor are required. Errors are
// as Redrive's.
func (s *Service) Discard(ctx context.Context, ids []string, actor, reason string) ([]Result, error) {
	switch {
	case strings.TrimSpace(reason) == "":
		return nil, &idem.ArgumentError{Field: "reason", Reason: "must not be empty: say why the message is given up"}
	case strings.TrimSpace(actor) == "":
		return nil, &idem.ArgumentError{Field: "actor", Reason: "must not be empty: the history says who discarded"}
	}
	if err := checkIDs(ids); err != nil {
		return nil, err
	}
	plans, err := s.check(ctx, ids, "discard", func(dl idem.DeadLetter) (plan, error) {
		return plan{dl: dl, action: "discarded", to: idem.LetterDiscarded}, nil
	})
	if err != nil {
		return nil, err
	}
	return s.apply(ctx, plans, actor, reason, false)
}

func checkIDs(ids []string) error {
	if len(ids) == 0 {
		return &idem.ArgumentError{Field: "ids", Reason: "must name at least one dead letter"}
	}
	seen := make(map[string]bool, len(ids))
	for _, id := range ids {
		switch {
		case id == "":
			return &idem.ArgumentError{Field: "ids", Reason: "must not contain an empty ID"}
		case seen[id]:
			return &idem.ArgumentError{Field: "ids", Reason: fmt.Sprintf("names %q twice", id)}
		}
		seen[id] = true
	}
	return nil
}

// check reads every letter and plans its change, returning every problem
// found, joined, before anything is written.
func (s *Service) check(ctx context.Context, ids []string, verb string, mk func(idem.DeadLetter) (plan, error)) ([]plan, error) {
	var plans []plan
	var errs []error
	for _, id := range ids {
		dl, err := s.cfg.DeadLetters.Get(ctx, id)
		if err != nil {
			errs = append(errs, fmt.Errorf("deadletter: %s %q: %w", verb, id, err))
			continue
		}
		if dl.State != idem.LetterDead {
			errs = append(errs, fmt.Errorf("deadletter: %s %q: it is %s, not %s: %w", verb, id, dl.State, idem.LetterDead, idem.ErrInvalidTransition))
			continue
		}
		p, err := mk(dl)
		if err != nil {
			errs = append(errs, fmt.Errorf("deadletter: %s %q: %w", verb, id, err))
			continue
		}
		plans = append(plans, p)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return plans, nil
}

func (s *Service) apply(ctx context.Context, plans []plan, actor, reason string, dryRun bool) ([]Result, error) {
	var results []Result
	var errs []error
	for _, p := range plans {
		r, err := s.applyOne(ctx, p, idem.LetterEvent{At: s.cfg.Clock.Now(), Actor: actor, Action: p.action, Reason: reason}, dryRun)
		if err != nil {
			errs = append(errs, fmt.Errorf("deadletter: %s %q: %w", p.action, p.dl.ID, err))
			continue
		}
		results = append(results, r)
	}
	return results, errors.Join(errs...)
}

// applyOne changes one letter in one transaction. The letter's state is
// changed last: idem.DeadLetters.Resolve is what refuses a letter another
// caller has just resolved, and when it refuses, the transaction rolls
// the outbox writes back; without a shared transaction, a refusal then
// leaves a duplicate on the outbox rather than a state change with its
// message missing.
func (s *Service) applyOne(ctx context.Context, p plan, ev idem.LetterEvent, dryRun bool) (Result, error) {
	res := Result{Letter: p.dl, Action: p.action, DryRun: dryRun}
	if p.msg != nil {
		m := s.rename(*p.msg)
		res.Message = &m
	}
	consumer, key := p.dl.Consumer, p.dl.Message.Key
	err := s.cfg.InTx(ctx, func(ctx context.Context) error {
		res.Released, res.HeldBehind = nil, ""
		if key != "" {
			holder, held, err := s.cfg.Ledger.HeldBack(ctx, consumer, key)
			if err != nil {
				return fmt.Errorf("read the hold on key %q: %w", key, err)
			}
			switch {
			case held && holder != p.dl.ID:
				res.HeldBehind = holder
			case dryRun && !s.sharedTx:
				// LetGo would take the parked messages for good.
			default:
				released, err := s.cfg.Ledger.LetGo(ctx, consumer, key)
				if err != nil {
					return fmt.Errorf("let key %q go: %w", key, err)
				}
				for _, m := range released {
					res.Released = append(res.Released, s.rename(m))
				}
			}
		}
		if dryRun {
			return errDryRun
		}
		var out []idem.Message
		if res.Message != nil {
			out = append(out, *res.Message)
		}
		out = append(out, res.Released...)
		if len(out) > 0 {
			if err := s.cfg.Outbox.Add(ctx, out...); err != nil {
				return fmt.Errorf("write %d messages to the outbox: %w", len(out), err)
			}
		}
		dl, err := s.cfg.DeadLetters.Resolve(ctx, p.dl.ID, p.to, ev)
		if err != nil {
			return err
		}
		res.Letter = dl
		return nil
	})
	if err != nil && !(dryRun && errors.Is(err, errDryRun)) {
		return Result{}, err
	}
	return res, nil
}

// rename gives m the ID Config.IDs asks for.
func (s *Service) rename(m idem.Message) idem.Message {
	m = copyMessage(m)
	if s.cfg.IDs != SuffixIDs {
		return m
	}
	base := m.Headers[HeaderOriginalID]
	if base == "" {
		base = m.ID
	}
	n := 1
	if rest, ok := strings.CutPrefix(m.ID, base+"~redrive-"); ok {
		if k, err := strconv.Atoi(rest); err == nil && k > 0 {
			n = k + 1
		}
	}
	if m.Headers == nil {
		m.Headers = make(map[string]string)
	}
	m.Headers[HeaderOriginalID] = base
	m.ID = base + "~redrive-" + strconv.Itoa(n)
	return m
}

// copyMessage returns a copy of m that shares no memory with it.
func copyMessage(m idem.Message) idem.Message {
	m.Headers = maps.Clone(m.Headers)
	if m.Payload != nil {
		m.Payload = append([]byte{}, m.Payload...)
	}
	return m
}
