package idemmem_test

import (
	"context"
	"fmt"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
)

// A request is claimed, its effect runs once, and a duplicate gets the
// stored answer; the same key with another body is refused.
func Example() {
	ctx := context.Background()
	store := idemmem.NewStore(nil)

	req := idem.ClaimRequest{
		Scope:       "tenant-1",
		Key:         "8e03978e-40d5-43e8-bc93-6894a57f9324",
		Fingerprint: idem.NewFingerprint("POST", "/payments", "", "application/json", []byte(`{"amount":1250}`)),
		Lease:       30 * time.Second,
		TTL:         24 * time.Hour,
	}
	claim, err := store.Claim(ctx, req)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("first:", claim.Outcome)

	// ... run the effect, then keep its answer for the duplicates.
	ref := idem.Ref{Scope: req.Scope, Key: req.Key, Token: claim.Token}
	if err := store.Complete(ctx, ref, idem.Response{Status: 201, Body: []byte(`{"id":"pay_1"}`)}); err != nil {
		fmt.Println(err)
		return
	}

	dup, _ := store.Claim(ctx, req)
	fmt.Println("duplicate:", dup.Outcome, dup.Record.Response.Status, string(dup.Record.Response.Body))

	other := req
	other.Fingerprint = idem.NewFingerprint("POST", "/payments", "", "application/json", []byte(`{"amount":9999}`))
	reused, _ := store.Claim(ctx, other)
	fmt.Println("other body:", reused.Outcome)
	// Output:
	// first: acquired
	// duplicate: completed 201 {"id":"pay_1"}
	// other body: mismatch
}

// A duplicate that finds the key in flight waits for the first request
// instead of polling, then claims again.
func ExampleStore_WaitChange() {
	ctx := context.Background()
	store := idemmem.NewStore(nil)
	req := idem.ClaimRequest{Key: "k", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}

	first, _ := store.Claim(ctx, req)
	go func() {
		// The first request finishes while the duplicate waits.
		_ = store.Complete(ctx, idem.Ref{Key: req.Key, Token: first.Token}, idem.Response{Status: 200})
	}()

	for {
		c, err := store.Claim(ctx, req)
		if err != nil {
			fmt.Println(err)
			return
		}
		if c.Outcome != idem.InFlight {
			fmt.Println("duplicate:", c.Outcome, c.Record.Response.Status)
			return
		}
		waitCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_ = store.WaitChange(waitCtx, req.Scope, req.Key)
		cancel()
	}
	// Output:
	// duplicate: completed 200
}

// A Clock is also idem.Timers: a timer fires when the clock is moved past
// it, never because real time passed, so a test of retries or heartbeats
// takes no time and cannot be late.
func ExampleClock_AfterFunc() {
	clock := idemmem.NewClock(time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC))
	fired := make(chan time.Time, 1)
	clock.AfterFunc(30*time.Second, func() { fired <- clock.Now() })

	clock.Advance(29 * time.Second)
	select {
	case <-fired:
		fmt.Println("fired early")
	default:
		fmt.Println("after 29s: waiting")
	}
	clock.Advance(time.Second)
	fmt.Println("fired at", (<-fired).Format(time.TimeOnly))
	// Output:
	// after 29s: waiting
	// fired at 12:00:30
}
