package keyed_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/keyed"
)

// slowListing is a store whose first listing of the abandoned keys does
// not answer until its context ends (a store starved under load), and
// which reports the deadline each listing and each claim was given.
type slowListing struct {
	*idemmem.Store
	mu        sync.Mutex
	listings  int
	firstDone chan struct{} // closed once the first listing has ended
	listed    chan listing
	claimed   chan time.Time
	// hangClaims makes every Claim wait for its context's end.
	hangClaims bool
	claimEnded chan error
	completed  chan struct{} // closed once a Complete succeeded
}

// listing is a listing's deadline, and when it was called.
type listing struct{ deadline, at time.Time }

func (s *slowListing) Abandoned(ctx context.Context, limit int) ([]idem.Record, error) {
	s.mu.Lock()
	s.listings++
	first := s.listings == 1
	s.mu.Unlock()
	d, _ := ctx.Deadline()
	select {
	case s.listed <- listing{d, time.Now()}:
	default:
	}
	if first {
		defer close(s.firstDone)
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return s.Store.Abandoned(ctx, limit)
}

func (s *slowListing) Claim(ctx context.Context, req idem.ClaimRequest) (idem.Claim, error) {
	d, _ := ctx.Deadline()
	select {
	case s.claimed <- d:
	default:
	}
	if _, ok := ctx.Deadline(); s.hangClaims && !ok {
		s.claimEnded <- errNoDeadline
		return idem.Claim{}, errNoDeadline
	}
	if s.hangClaims {
		<-ctx.Done()
		s.claimEnded <- ctx.Err()
		return idem.Claim{}, ctx.Err()
	}
	return s.Store.Claim(ctx, req)
}

var errNoDeadline = errors.New("the claim has no deadline")

func (s *slowListing) Complete(ctx context.Context, ref idem.Ref, resp idem.Response) error {
	err := s.Store.Complete(ctx, ref, resp)
	if err == nil {
		close(s.completed)
	}
	return err
}

// The Completer's Bound (Lease + Every + Timeout) holds by construction:
// a round's listing of the abandoned keys and its claims are inside the
// Timeout that bounds the round, with the resume and the keeping of its
// answer, and a round whose listing does not answer holds back no later
// round. Here the first round's listing never answers: the next round
// finishes the key all the same, its claim and its resume given the
// deadline of the round that listed the key, never a Timeout of their own
// on top of the listing's.
func TestCompleterBoundCoversTheListingAndTheClaim(t *testing.T) {
	t.Parallel()
	clock := idemmem.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	mem := idemmem.NewStore(&idemmem.Config{Clock: clock})
	store := &slowListing{Store: mem, firstDone: make(chan struct{}), listed: make(chan listing, 64), claimed: make(chan time.Time, 64),
		completed: make(chan struct{})}
	eng, err := keyed.New(&keyed.Config{Store: store, SeparateTx: true, Clock: clock, Timers: clock, Lease: 12 * time.Second, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	const timeout = time.Hour
	resumed := make(chan time.Time, 1)
	comp, err := eng.NewCompleter(&keyed.CompleterConfig{Every: 5 * time.Millisecond, Timeout: timeout,
		Resume: func(ctx context.Context, ex keyed.Execution) (idem.Response, error) {
			d, _ := ctx.Deadline()
			resumed <- d
			return idem.Response{Status: 201, Body: []byte(ex.Key)}, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	abandon(t, mem, "k")
	ctx, cancel := context.WithCancel(t.Context())
	ran := make(chan error, 1)
	go func() { ran <- comp.Run(ctx) }()
	firstListing := <-store.listed
	if firstListing.deadline.IsZero() {
		cancel()
		<-ran
		t.Fatal("a round's listing of the abandoned keys has no deadline: nothing bounds it")
	}
	if firstListing.deadline.After(firstListing.at.Add(timeout)) {
		t.Errorf("the first round's listing may run until %s, more than the round's Timeout %s after it was sent at %s", firstListing.deadline, timeout, firstListing.at)
	}
	claimDeadline, resumeDeadline := <-store.claimed, <-resumed
	select {
	case <-store.firstDone:
		t.Fatal("the key was taken over only once the first round's listing ended; want the next round to take it meanwhile")
	default:
	}
	// The listing that found the key belongs to the round whose deadline
	// the claim and the resume were given.
	var listings []time.Time
	for len(store.listed) > 0 {
		listings = append(listings, (<-store.listed).deadline)
	}
	found := false
	for _, d := range listings {
		found = found || d.Equal(claimDeadline)
	}
	if claimDeadline.IsZero() || !found {
		t.Errorf("the claim's deadline %s is none of the rounds' listing deadlines %v: want the deadline of the round that listed the key", claimDeadline, listings)
	}
	if !resumeDeadline.Equal(claimDeadline) {
		t.Errorf("the resume's deadline %s, the claim's %s: want the round's, one Timeout from its start", resumeDeadline, claimDeadline)
	}
	<-store.completed
	if rec, err := mem.Get(t.Context(), "", "k"); err != nil || rec.State != idem.StateCompleted {
		t.Errorf("the key: %v, %v; want it completed", rec.State, err)
	}
	cancel()
	if err := <-ran; !errors.Is(err, context.Canceled) {
		t.Errorf("Run = %v; want context.Canceled", err)
	}
	<-store.firstDone
}

// A claim the store does not answer is cut off at the round's deadline
// (the round gave up: the bound counts again from then; had the round
// run out of time before the claim, it says that instead), and the
// Completer says so, naming the key, after it said, before the claim was
// sent, that it was taking the key over: a replica killed while its claim
// was under way has said that it may hold the key.
func TestCompleterClaimEndsAtTheRoundsDeadline(t *testing.T) {
	t.Parallel()
	clock := idemmem.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	mem := idemmem.NewStore(&idemmem.Config{Clock: clock})
	store := &slowListing{Store: mem, firstDone: make(chan struct{}), listed: make(chan listing, 64), claimed: make(chan time.Time, 64),
		hangClaims: true, claimEnded: make(chan error, 1)}
	close(store.firstDone)
	store.listings = 1 // no listing is slow here
	var logs bytes.Buffer
	var logMu sync.Mutex
	eng, err := keyed.New(&keyed.Config{Store: store, SeparateTx: true, Clock: clock, Timers: clock, Lease: 12 * time.Second, TTL: time.Hour,
		Logger: slog.New(slog.NewTextHandler(&lockedWriter{mu: &logMu, w: &logs}, nil))})
	if err != nil {
		t.Fatal(err)
	}
	comp, err := eng.NewCompleter(&keyed.CompleterConfig{Timeout: time.Second,
		Resume: func(ctx context.Context, ex keyed.Execution) (idem.Response, error) {
			t.Error("resumed a key whose claim was never answered")
			return idem.Response{}, errors.New("not taken")
		}})
	if err != nil {
		t.Fatal(err)
	}
	abandon(t, mem, "k")
	n, err := comp.RunOnce(t.Context())
	if errors.Is(err, context.DeadlineExceeded) && n == 0 && len(store.claimed) == 0 {
		// As starved again, the listing itself: the round gave up there,
		// with the error Run logs, and sent no claim.
		return
	}
	if err != nil || n != 0 {
		t.Fatalf("RunOnce = %d, %v; want 0 finished, no error", n, err)
	}
	// RunOnce has returned: the round's resumes, and so its claim, ended.
	logMu.Lock()
	got := logs.String()
	logMu.Unlock()
	select {
	case err := <-store.claimEnded:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("the claim ended with %v; want the round's deadline", err)
		}
	default:
		// A machine so starved that the in-memory listing took the
		// round's whole second: the round gave up before the claim, and
		// must say so, naming the key.
		if !strings.Contains(got, `msg="completer: the round ran out of time before it could take the abandoned execution over"`) || !strings.Contains(got, "key=hmac:") {
			t.Fatalf("no claim was sent, and the round did not say it ran out of time before it:\n%s", got)
		}
		return
	}
	before := strings.Index(got, `msg="completer: taking an abandoned execution over"`)
	after := strings.Index(got, `msg="completer: could not take the abandoned execution over"`)
	if before < 0 || after < before || !strings.Contains(got[after:], "deadline exceeded") || strings.Count(got, "key=hmac:") < 2 {
		t.Errorf("want the claim logged before it was sent and its end logged with the deadline, both naming the key:\n%s", got)
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// A round that runs out of time waiting for a slot logs the keys it could
// not take over, not those another resume of the same Completer has under
// way (listed again, their lease having ended by the store's clock while
// that resume runs): those are being taken over.
func TestCompleterOutOfTimeLogsOnlyKeysNotUnderWay(t *testing.T) {
	t.Parallel()
	clock := idemmem.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	// The renewals' timers never fire: the slow resume's lease ends by the
	// store's clock when the test advances it.
	timers := idemmem.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	mem := idemmem.NewStore(&idemmem.Config{Clock: clock})
	var logs bytes.Buffer
	var logMu sync.Mutex
	eng, err := keyed.New(&keyed.Config{Store: mem, SeparateTx: true, Clock: clock, Timers: timers, Lease: 12 * time.Second, TTL: time.Hour,
		Logger: slog.New(slog.NewTextHandler(&lockedWriter{mu: &logMu, w: &logs}, nil))})
	if err != nil {
		t.Fatal(err)
	}
	resuming, release := make(chan struct{}), make(chan struct{})
	comp, err := eng.NewCompleter(&keyed.CompleterConfig{Parallel: 1, Timeout: time.Second,
		Resume: func(ctx context.Context, ex keyed.Execution) (idem.Response, error) {
			if ex.Key != "slow" {
				t.Errorf("resumed %q, which the round could not have had a slot for", ex.Key)
				return idem.Response{}, errors.New("unexpected")
			}
			close(resuming)
			<-release
			return idem.Response{Status: 201}, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	abandon(t, mem, "slow")
	first := make(chan error, 1)
	go func() {
		_, err := comp.RunOnce(t.Context())
		first <- err
	}()
	select {
	case <-resuming:
	case err := <-first:
		t.Fatalf("the first round ended (%v) before resuming the slow key", err)
	}
	abandon(t, mem, "waiting")
	clock.Advance(13 * time.Second) // the slow resume's lease ends by the store's clock
	if n, err := comp.RunOnce(t.Context()); n != 0 || err != nil {
		t.Errorf("second round = %d, %v; want 0 finished, no error", n, err)
	}
	close(release)
	if err := <-first; err != nil {
		t.Errorf("first round: %v", err)
	}
	logMu.Lock()
	got := logs.String()
	logMu.Unlock()
	if n := strings.Count(got, `msg="completer: the round ran out of time before it could take the abandoned execution over"`); n != 1 {
		t.Errorf("the second round logged %d keys as out of time; want 1, the key it could not take over, not the one being resumed:\n%s", n, got)
	}
	// The line says when its round began: a round's give-up concerns the
	// keys of that round alone, and a reader of the log (a torture's
	// bound) must not take it for a later round's.
	for _, line := range strings.Split(got, "\n") {
		if !strings.Contains(line, "the round ran out of time") {
			continue
		}
		at, began, ok := roundBegan(line)
		if !ok || at.Sub(began) < time.Second-2*time.Millisecond {
			t.Errorf("the round out of time logged %q; want round_began, its Timeout (1s) before the line at least", line)
		}
	}
}

// roundBegan reads, from a completer's text log line, its time and its
// round_began attribute.
func roundBegan(line string) (at, began time.Time, ok bool) {
	field := func(name string) (time.Time, bool) {
		for _, f := range strings.Fields(line) {
			if v, found := strings.CutPrefix(f, name+"="); found {
				t, err := time.Parse(time.RFC3339Nano, v)
				return t, err == nil
			}
		}
		return time.Time{}, false
	}
	at, okAt := field("time")
	began, okBegan := field("round_began")
	return at, began, okAt && okBegan && !began.After(at)
}

// slowUnknownGets is a store whose Get of a key named unknown-… answers
// only once released (or its context ended): a store slow to read back
// the many keys a card network's outage left unknown.
type slowUnknownGets struct {
	*idemmem.Store
	slow    atomic.Bool
	release chan struct{}
	gets    atomic.Int64
	entered chan struct{} // when not nil, sent to by each slow Get
}

func (s *slowUnknownGets) Get(ctx context.Context, scope idem.Scope, key idem.Key) (idem.Record, error) {
	if s.slow.Load() && strings.HasPrefix(string(key), "unknown-") {
		s.gets.Add(1)
		if s.entered != nil {
			s.entered <- struct{}{}
		}
		select {
		case <-s.release:
		case <-ctx.Done():
			return idem.Record{}, ctx.Err()
		}
	}
	return s.Store.Get(ctx, scope, key)
}

// A round with many keys of unknown outcome to read back (not listed:
// the Completer holds them under the leases of their failed resumes)
// still takes an abandoned key over: the reading back comes after the
// round's claims, and cannot spend the Timeout they need.
func TestCompleterPruningDoesNotStarveClaims(t *testing.T) {
	t.Parallel()
	clock := idemmem.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	mem := idemmem.NewStore(&idemmem.Config{Clock: clock})
	store := &slowUnknownGets{Store: mem, release: make(chan struct{})}
	eng, err := keyed.New(&keyed.Config{Store: store, SeparateTx: true, Clock: clock, Timers: clock, Lease: 12 * time.Second, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	var resumedFresh sync.Once
	comp, err := eng.NewCompleter(&keyed.CompleterConfig{Timeout: 2 * time.Second,
		Resume: func(ctx context.Context, ex keyed.Execution) (idem.Response, error) {
			if strings.HasPrefix(string(ex.Key), "unknown-") {
				return idem.Response{}, errors.New("the card network did not answer")
			}
			resumedFresh.Do(func() { close(store.release) })
			return idem.Response{Status: 201}, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	const unknown = 50
	for i := range unknown {
		abandon(t, mem, idem.Key(fmt.Sprintf("unknown-%d", i)))
	}
	if n, err := comp.RunOnce(t.Context()); n != 0 || err != nil {
		t.Fatalf("first round = %d, %v; want 0 finished (every resume failing), no error", n, err)
	}
	if got := comp.Stats().Unknown; got != unknown {
		t.Fatalf("after the first round: %d unknown; want %d", got, unknown)
	}
	store.slow.Store(true)
	abandon(t, mem, "fresh")
	if n, err := comp.RunOnce(t.Context()); n != 1 || err != nil {
		t.Errorf("round with %d unknown keys to read back = %d, %v; want the abandoned key finished (%d slow reads)", unknown, n, err, store.gets.Load())
	}
	if rec, err := mem.Get(t.Context(), "", "fresh"); err != nil || rec.State != idem.StateCompleted {
		t.Errorf("the abandoned key after the round: %v, %v; want it completed", rec.State, err)
	}
}

// Rounds that overlap do not read the same unknown keys back again: while
// one round reads them, the next reads none.
func TestCompleterOneRoundAtATimeReadsUnknownKeysBack(t *testing.T) {
	t.Parallel()
	clock := idemmem.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	mem := idemmem.NewStore(&idemmem.Config{Clock: clock})
	store := &slowUnknownGets{Store: mem, release: make(chan struct{}), entered: make(chan struct{}, 64)}
	eng, err := keyed.New(&keyed.Config{Store: store, SeparateTx: true, Clock: clock, Timers: clock, Lease: 12 * time.Second, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	comp, err := eng.NewCompleter(&keyed.CompleterConfig{Timeout: time.Minute,
		Resume: func(ctx context.Context, ex keyed.Execution) (idem.Response, error) {
			return idem.Response{}, errors.New("the card network did not answer")
		}})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		abandon(t, mem, idem.Key(fmt.Sprintf("unknown-%d", i)))
	}
	if _, err := comp.RunOnce(t.Context()); err != nil {
		t.Fatal(err)
	}
	store.slow.Store(true)
	first := make(chan error, 1)
	go func() {
		_, err := comp.RunOnce(t.Context())
		first <- err
	}()
	<-store.entered // the first round reads an unknown key back
	if _, err := comp.RunOnce(t.Context()); err != nil {
		t.Errorf("the overlapping round: %v", err)
	}
	if got := store.gets.Load(); got != 1 {
		t.Errorf("%d reads of unknown keys once the overlapping round ended; want 1, the first round's", got)
	}
	close(store.release)
	if err := <-first; err != nil {
		t.Errorf("the first round: %v", err)
	}
	if got := store.gets.Load(); got != 3 {
		t.Errorf("%d reads of unknown keys; want 3, each once", got)
	}
}
