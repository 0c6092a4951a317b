package keyed_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/keyed"
)

// The Completer's Bound is what its documentation promises an operator:
// the lease, one round's interval and one round's Timeout, with Every
// defaulting to a second and Timeout to nine tenths of the lease. The
// payments' and the tortures' deadlines are computed from it, so a Bound
// that said less than the Completer takes would report late finishes the
// Completer never promised against, and one that said more would hide
// them.
func TestCompleterBoundAndItsDefaults(t *testing.T) {
	t.Parallel()
	const lease = 10 * time.Second
	eng, err := keyed.New(&keyed.Config{Store: idemmem.NewStore(nil), SeparateTx: true, Lease: lease, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	resume := func(context.Context, keyed.Execution) (idem.Response, error) { return idem.Response{Status: 200}, nil }
	for _, tc := range []struct {
		name    string
		cfg     keyed.CompleterConfig
		want    time.Duration
		explain string
	}{
		{"defaults", keyed.CompleterConfig{Resume: resume}, lease + time.Second + lease*9/10,
			"the lease, Every's default 1s and Timeout's default of nine tenths of the lease"},
		{"Every set", keyed.CompleterConfig{Resume: resume, Every: 250 * time.Millisecond}, lease + 250*time.Millisecond + lease*9/10,
			"the lease, the Every given and Timeout's default"},
		{"Timeout set", keyed.CompleterConfig{Resume: resume, Timeout: 3 * time.Second}, lease + time.Second + 3*time.Second,
			"the lease, Every's default and the Timeout given"},
		{"both set", keyed.CompleterConfig{Resume: resume, Every: 2 * time.Second, Timeout: 4 * time.Second}, lease + 6*time.Second,
			"the lease, the Every and the Timeout given"},
	} {
		comp, err := eng.NewCompleter(&tc.cfg)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got := comp.Bound(); got != tc.want {
			t.Errorf("%s: Bound() = %s; want %s: %s", tc.name, got, tc.want, tc.explain)
		}
	}
}

// failingListing is a store whose listing of the abandoned keys fails.
type failingListing struct{ *idemmem.Store }

var errListing = errors.New("the store is unavailable")

func (s *failingListing) Abandoned(context.Context, int) ([]idem.Record, error) {
	return nil, errListing
}

// notifyingLog is a log's output that says when it was first written.
type notifyingLog struct {
	syncBuffer
	once sync.Once
	seen chan struct{} // closed at the first write
}

func (l *notifyingLog) Write(p []byte) (int, error) {
	defer l.once.Do(func() { close(l.seen) })
	return l.syncBuffer.Write(p)
}

// A round whose listing fails is counted, says why at WARN (an operator
// must see that abandoned keys are not being looked for), and the
// Completer goes on; RunOnce returns the listing's error, and Stats
// counts each round.
func TestCompleterRoundWhoseListingFails(t *testing.T) {
	t.Parallel()
	store := &failingListing{Store: idemmem.NewStore(nil)}
	eng, err := keyed.New(&keyed.Config{Store: store, SeparateTx: true, Lease: 10 * time.Second, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	logs := &notifyingLog{seen: make(chan struct{})}
	comp, err := eng.NewCompleter(&keyed.CompleterConfig{Every: time.Hour, Logger: slog.New(slog.NewTextHandler(logs, nil)),
		Resume: func(context.Context, keyed.Execution) (idem.Response, error) {
			return idem.Response{}, errors.New("no key is listed, so none is resumed")
		}})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := comp.RunOnce(t.Context()); n != 0 || !errors.Is(err, errListing) {
		t.Errorf("RunOnce with a failing listing = %d, %v; want 0 and the listing's error", n, err)
	}
	if n, err := comp.RunOnce(t.Context()); n != 0 || !errors.Is(err, errListing) {
		t.Errorf("the second RunOnce = %d, %v; want 0 and the listing's error", n, err)
	}
	if got := comp.Stats().Rounds; got != 2 {
		t.Errorf("Stats().Rounds after two rounds = %d; want 2", got)
	}
	ctx, cancel := context.WithCancel(t.Context())
	ran := make(chan error, 1)
	go func() { ran <- comp.Run(ctx) }()
	// Run's first round fails at once (Every is an hour: there is no
	// second). The wait is bounded only so that a Completer that never
	// says so fails here rather than hanging the suite.
	select {
	case <-logs.seen:
	case <-time.After(10 * time.Second):
		t.Error("Run's round whose listing failed logged nothing")
	}
	cancel()
	if err := <-ran; !errors.Is(err, context.Canceled) {
		t.Errorf("Run = %v; want context.Canceled", err)
	}
	out := logs.String()
	if !strings.Contains(out, "level=WARN") || !strings.Contains(out, "could not list abandoned executions") || !strings.Contains(out, errListing.Error()) {
		t.Errorf("Run's log after a failed listing: %q; want a WARN saying it could not list the abandoned executions, with the store's error", out)
	}
	if _, _, ok := roundBegan(strings.TrimSpace(out)); !ok {
		t.Errorf("Run's log after a failed listing: %q; want the round's round_began, at or before the line", out)
	}
	if got := comp.Stats().Rounds; got != 3 {
		t.Errorf("Stats().Rounds after two RunOnce and one Run round = %d; want 3", got)
	}
}
