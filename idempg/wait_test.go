package idempg_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/idemtest"
)

// A waiter on one replica wakes when another replica completes the key:
// the notification crosses processes through the database.
func TestWaitChangeAcrossReplicas(t *testing.T) {
	t.Parallel()
	url := pgURL(t)
	schema := freshSchema(t, url)
	clock := idemmem.NewClock(idemtest.Start)
	a := newStore(t, openDB(t, url, idempg.Config{Schema: schema, Clock: clock}))
	b := newStore(t, openDB(t, url, idempg.Config{Schema: schema, Clock: clock}))
	req := idem.ClaimRequest{Scope: "s", Key: "k", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
	c := mustClaim(t, b, req)

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		for {
			if err := a.WaitChange(ctx, req.Scope, req.Key); err != nil {
				done <- err
				return
			}
			// Spurious returns are allowed; a caller claims again.
			dup, err := a.Claim(ctx, req)
			if err != nil || dup.Outcome != idem.InFlight {
				done <- err
				return
			}
		}
	}()
	if err := b.Complete(t.Context(), refOf(c), idem.Response{Status: 201}); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("waiter on the other replica: %v", err)
	}
	if dup, err := a.Claim(t.Context(), req); err != nil || dup.Outcome != idem.Completed {
		t.Errorf("Claim after the wake = %v, %v; want completed", dup.Outcome, err)
	}
}

// A takeover wakes the waiters too: the key changed hands.
func TestWaitChangeWakesOnTakeover(t *testing.T) {
	t.Parallel()
	url := pgURL(t)
	clock := idemmem.NewClock(idemtest.Start)
	db := openDB(t, url, idempg.Config{Clock: clock})
	s := newStore(t, db)
	req := idem.ClaimRequest{Scope: "s", Key: "k", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
	mustClaim(t, s, req)
	listening := idempg.Listening(s)

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	// Start the store's listener and wait until it has woken every waiter,
	// as it does once when it starts: that wake must not be mistaken for
	// the takeover's. (Its LISTEN shows in pg_stat_activity before that
	// wake, and a waiter that came between would return at once.)
	if err := s.WaitChange(ctx, req.Scope, "not-in-flight"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-listening:
	case <-ctx.Done():
		t.Fatal("the store's listener never listened")
	}
	done := make(chan error, 1)
	go func() { done <- s.WaitChange(ctx, req.Scope, req.Key) }()
	// Take the key over only once the waiter is registered (it registers
	// before it reads the key): a takeover before that would leave it
	// rightly waiting for the new holder's lease instead.
	waitFor(t, ctx, "the waiter registered", func() (bool, error) {
		select {
		case err := <-done:
			return false, fmt.Errorf("the waiter returned before the takeover: %v", err)
		default:
		}
		var n int
		err := db.Pool().QueryRow(ctx, `SELECT count(*) FROM idem_waiters`).Scan(&n)
		return n > 0, err
	})
	clock.Advance(req.Lease)
	if c := mustClaim(t, s, req); !c.TookOver {
		t.Fatal("expected a takeover")
	}
	if err := <-done; err != nil {
		t.Fatalf("waiter during a takeover: %v", err)
	}
}

func TestWaitChangeAfterClose(t *testing.T) {
	t.Parallel()
	url := pgURL(t)
	db := openDB(t, url, idempg.Config{Clock: idemmem.NewClock(idemtest.Start)})
	s := newStore(t, db)
	req := idem.ClaimRequest{Scope: "s", Key: "k", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
	mustClaim(t, s, req)

	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		for {
			if err := s.WaitChange(ctx, req.Scope, req.Key); err != nil {
				done <- err
				return
			}
		}
	}()
	s.Close()
	err := <-done
	if err == nil || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitChange during Close = %v, want the store's closed error at once", err)
	}
	if err := s.WaitChange(ctx, req.Scope, req.Key); err == nil {
		t.Error("WaitChange after Close = nil, want an error")
	}
	s.Close() // idempotent
}
