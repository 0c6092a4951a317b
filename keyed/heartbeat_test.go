package keyed_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/keyed"
)

// slowRenewals is a store whose renewals reach it late: one sent before
// the execution yields its key arrives after the Yield (or, if the engine
// waits for it, ends with its context).
type slowRenewals struct {
	*idemmem.Store
	entered, done chan struct{}
	yieldOnce     sync.Once
	yielded       chan struct{}
}

func (s *slowRenewals) Renew(ctx context.Context, ref idem.Ref, lease time.Duration) (time.Time, error) {
	defer close(s.done)
	close(s.entered)
	select {
	case <-s.yielded:
	case <-ctx.Done():
		return time.Time{}, ctx.Err()
	}
	return s.Store.Renew(ctx, ref, lease)
}

func (s *slowRenewals) Yield(ctx context.Context, ref idem.Ref) error {
	err := s.Store.Yield(ctx, ref)
	s.yieldOnce.Do(func() { close(s.yielded) })
	return err
}

// failingFace runs a handler that saves a recovery point, says it is
// running, waits to be let go and fails: a failure after a point.
type failingFace struct {
	running, letGo chan struct{}
	refused        keyed.Reason
}

func (f *failingFace) Run(ctx context.Context, inTx bool) keyed.Ran {
	if err := keyed.SaveRecovery(ctx, "charging", []byte("card")); err != nil {
		panic(err)
	}
	close(f.running)
	<-f.letGo
	return keyed.Ran{Status: 500, Failure: "panicked"}
}
func (f *failingFace) Send()                            {}
func (f *failingFace) Replay(resp *idem.Response) error { return nil }
func (f *failingFace) Refuse(r keyed.Refusal)           { f.refused = r.Reason }

// An execution that fails after a recovery point yields its lease, so
// that the client's retry or a Completer takes the key over at once; a
// renewal of that lease still on its way must not give it back a live
// lease after the Yield, leaving the key held by nobody for a whole lease.
func TestYieldOutlastsARenewalInFlight(t *testing.T) {
	t.Parallel()
	clock := idemmem.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	store := &slowRenewals{Store: idemmem.NewStore(&idemmem.Config{Clock: clock}),
		entered: make(chan struct{}), done: make(chan struct{}), yielded: make(chan struct{})}
	const lease = 1200 * time.Millisecond // its sixth, the renewal's own time, is real time
	eng, err := keyed.New(&keyed.Config{Store: store, SeparateTx: true, Clock: clock, Timers: clock, Lease: lease, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	face := &failingFace{running: make(chan struct{}), letGo: make(chan struct{})}
	fp := idem.NewFingerprint("POST", "/pay", "", "", []byte("pay"))
	served := make(chan keyed.Outcome, 1)
	go func() { served <- eng.Serve(t.Context(), keyed.Request{Key: "k", Fingerprint: fp}, face) }()
	<-face.running
	clock.Advance(lease / 6)
	clock.Advance(lease / 6) // a third of the lease: the renewal is sent
	<-store.entered
	close(face.letGo)
	if o := <-served; o != keyed.OutcomeUnfinished || face.refused != keyed.RefusedUnfinished {
		t.Fatalf("outcome %s, refused %s; want unfinished", o, face.refused)
	}
	<-store.done
	rec, err := store.Get(t.Context(), "", "k")
	if err != nil {
		t.Fatal(err)
	}
	if now := clock.Now(); rec.State != idem.StateInFlight || rec.Recovery.IsZero() || rec.LeaseExpiresAt.After(now) {
		t.Fatalf("the key is %s, point %q, its lease ending %v after its yield: a renewal sent before the yield gave it a live lease again",
			rec.State, rec.Recovery.Name, rec.LeaseExpiresAt.Sub(now))
	}
	claim, err := store.Claim(t.Context(), idem.ClaimRequest{Key: "k", Fingerprint: fp, Lease: lease, TTL: time.Hour})
	if err != nil || claim.Outcome != idem.Acquired || claim.Record.Recovery.Name != "charging" {
		t.Fatalf("the retry's claim: %v, %v; want it acquired at once, with the point", claim.Outcome, err)
	}
}
