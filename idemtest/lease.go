package idemtest

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// The contract of Store.Renew, run by TestStore on every store.

// renew renews r for lease and fails unless it succeeds with the lease
// ending lease from the clock's time.
func (e *env) renew(r idem.Ref, lease time.Duration) time.Time {
	e.t.Helper()
	end, err := e.store.Renew(e.ctx, r, lease)
	if err != nil {
		e.t.Fatalf("Renew(%q, token %d, %v) = %v", r.Key, r.Token, lease, err)
	}
	if want := e.clock.Now().Add(lease); !end.Equal(want) {
		e.t.Fatalf("Renew(%q, %v) = lease end %v; want %v (the store's time plus the lease)", r.Key, lease, end, want)
	}
	return end
}

// wantRenewRefused renews r and fails unless it gets ErrLeaseLost.
func (e *env) wantRenewRefused(what string, r idem.Ref) {
	e.t.Helper()
	end, err := e.store.Renew(e.ctx, r, lease)
	if !errors.Is(err, idem.ErrLeaseLost) {
		e.t.Fatalf("%s: Renew = %v, %v; want ErrLeaseLost", what, end, err)
	}
}

// testRenew: a renewal moves the lease end to the store's time plus the
// lease, Get shows it, and nobody takes the key over before that end, even
// after the end of the lease the claim gave; after it, the next claim does.
func testRenew(t *testing.T, e *env) {
	req := e.req("k", "fp")
	c := e.acquire(req)
	e.clock.Advance(lease / 2)
	end := e.renew(ref(c), lease)
	want := c.Record
	want.LeaseExpiresAt = end
	checkRecord(t, "Get after Renew", e.get(req.Scope, req.Key), want)

	// Past the claim's own lease end, the renewed lease still holds.
	e.clock.Advance(lease/2 + time.Millisecond)
	if dup := e.claim(req); dup.Outcome != idem.InFlight {
		t.Fatalf("Claim past the claim's lease end, before the renewed end = %v; want in_flight", dup.Outcome)
	}
	// A shorter lease counts from now, too: the renewal sets the end.
	end = e.renew(ref(c), 2*time.Second)
	e.clock.Advance(2*time.Second - time.Millisecond)
	if dup := e.claim(req); dup.Outcome != idem.InFlight {
		t.Fatalf("Claim a millisecond before the renewed end = %v; want in_flight", dup.Outcome)
	}
	if got := e.get(req.Scope, req.Key); !got.LeaseExpiresAt.Equal(end) || got.Token != c.Token {
		t.Fatalf("Get = lease end %v, token %d; want %v, %d", got.LeaseExpiresAt, got.Token, end, c.Token)
	}
	e.clock.Advance(time.Millisecond)
	next := e.claim(req)
	if next.Outcome != idem.Acquired || !next.TookOver || next.Token <= c.Token {
		t.Fatalf("Claim at the renewed end = %v (took over %v, token %d); want a takeover with a token above %d",
			next.Outcome, next.TookOver, next.Token, c.Token)
	}
}

// testRenewRefused: a token that does not hold the key in flight renews
// nothing: a stale or unknown token, a completed key, a released one, an
// absent one, and the holder whose lease another took over.
func testRenewRefused(t *testing.T, e *env) {
	req := e.req("k", "fp")
	c := e.acquire(req)
	e.wantRenewRefused("a token the key never had", idem.Ref{Scope: "s", Key: "k", Token: c.Token - 1})
	e.wantRenewRefused("a token above the holder's", idem.Ref{Scope: "s", Key: "k", Token: c.Token + 1})
	e.wantRenewRefused("another scope", idem.Ref{Scope: "other", Key: "k", Token: c.Token})
	checkRecord(t, "Get after refused renewals", e.get(req.Scope, req.Key), c.Record)

	// Taken over: the stale holder's renewal neither succeeds nor moves
	// the new holder's lease.
	e.clock.Advance(lease + time.Millisecond)
	next := e.acquire(req)
	if !next.TookOver {
		t.Fatal("Claim after the lease ended did not take the key over")
	}
	e.clock.Advance(time.Second)
	e.wantRenewRefused("the holder whose key was taken over", ref(c))
	checkRecord(t, "Get after the stale holder's renewal", e.get(req.Scope, req.Key), next.Record)

	// Completed.
	resp := sampleResponse()
	e.complete(ref(next), resp)
	done := e.get(req.Scope, req.Key)
	e.wantRenewRefused("a completed key", ref(next))
	checkRecord(t, "Get after renewing a completed key", e.get(req.Scope, req.Key), done)

	// Released, and absent: no record appears.
	rel := e.acquire(e.req("released", "fp"))
	if err := e.store.Release(e.ctx, ref(rel)); err != nil {
		t.Fatal(err)
	}
	e.wantRenewRefused("a released key", ref(rel))
	e.wantNotFound("s", "released")
	e.wantRenewRefused("an absent key", idem.Ref{Scope: "s", Key: "absent", Token: c.Token})
	e.wantNotFound("s", "absent")

	// Expired and claimed anew: the first generation's token is stale.
	old := e.acquire(e.req("anew", "fp"))
	e.complete(ref(old), resp)
	e.clock.Advance(ttl + time.Millisecond)
	anew := e.acquire(e.req("anew", "another request"))
	e.wantRenewRefused("a token of the key's earlier generation", ref(old))
	checkRecord(t, "Get after the earlier generation's renewal", e.get("s", "anew"), anew.Record)
}

// testRenewLateHolder: a holder whose lease ended and whom nobody took
// over still holds the key, as Complete says, and its renewal gives it a
// live lease again.
func testRenewLateHolder(t *testing.T, e *env) {
	req := e.req("k", "fp")
	c := e.acquire(req)
	e.clock.Advance(2 * lease)
	e.renew(ref(c), lease)
	e.clock.Advance(lease - time.Millisecond)
	if dup := e.claim(req); dup.Outcome != idem.InFlight {
		t.Fatalf("Claim within the late holder's renewed lease = %v; want in_flight", dup.Outcome)
	}
	e.complete(ref(c), sampleResponse())
}

// testRenewOutlivesTTL: a key renewed past its TTL stays in flight under
// its holder: Get returns it with its expiry at least its lease end, a
// claim with another fingerprint is a mismatch (the key is not claimed
// anew), Purge keeps it, and the holder completes it.
func testRenewOutlivesTTL(t *testing.T, e *env) {
	req := e.req("long", "fp")
	req.TTL = 3 * lease
	c := e.acquire(req)
	plain := e.req("plain", "fp")
	plain.TTL = req.TTL
	p := e.acquire(plain)
	e.complete(ref(p), idem.Response{Status: 200})

	var end time.Time
	for elapsed := time.Duration(0); elapsed < 2*req.TTL; elapsed += lease / 2 {
		e.clock.Advance(lease / 2)
		end = e.renew(ref(c), lease)
	}
	e.clock.Advance(lease / 2)
	if n := e.purge(100); n != 1 {
		t.Fatalf("Purge = %d; want 1 (the completed key past its TTL, not the renewed one)", n)
	}
	got := e.get(req.Scope, req.Key)
	if got.State != idem.StateInFlight || got.Token != c.Token || !got.LeaseExpiresAt.Equal(end) {
		t.Fatalf("Get of the renewed key past its TTL = %v, token %d, lease end %v; want in_flight, %d, %v",
			got.State, got.Token, got.LeaseExpiresAt, c.Token, end)
	}
	if got.ExpiresAt.Before(end) {
		t.Fatalf("ExpiresAt = %v, before the lease end %v: the key would expire under its holder", got.ExpiresAt, end)
	}
	if m := e.claim(e.req("long", "another request")); m.Outcome != idem.Mismatch {
		t.Fatalf("Claim with another fingerprint = %v; want mismatch (the key must not be claimed anew)", m.Outcome)
	}
	if dup := e.claim(req); dup.Outcome != idem.InFlight {
		t.Fatalf("Claim of the renewed key = %v; want in_flight", dup.Outcome)
	}
	resp := sampleResponse()
	e.complete(ref(c), resp)
	if dup := e.claim(req); dup.Outcome != idem.Completed || responseDiff(dup.Record.Response, &resp) != "" {
		t.Fatalf("Claim after the late completion = %v, %+v; want completed with its response", dup.Outcome, dup.Record.Response)
	}
}

// testRenewInvalid: a lease that is not positive is refused with an
// *idem.ArgumentError and changes nothing.
func testRenewInvalid(t *testing.T, e *env) {
	req := e.req("k", "fp")
	c := e.acquire(req)
	e.clock.Advance(time.Second)
	for _, l := range []time.Duration{0, -time.Second} {
		end, err := e.store.Renew(e.ctx, ref(c), l)
		var argErr *idem.ArgumentError
		if !errors.Is(err, idem.ErrInvalidArgument) || !errors.As(err, &argErr) {
			t.Errorf("Renew(lease %v) = %v, %v; want an *idem.ArgumentError", l, end, err)
		}
	}
	checkRecord(t, "Get after invalid renewals", e.get(req.Scope, req.Key), c.Record)
	ctx, cancel := context.WithCancel(e.ctx)
	cancel()
	if _, err := e.store.Renew(ctx, ref(c), lease); err == nil || errors.Is(err, idem.ErrLeaseLost) {
		t.Errorf("Renew with a cancelled context = %v; want the context's error", err)
	}
}

// The contract of idem.Restarter, run by TestStore on the stores that
// implement it.

var restarterTests = []struct {
	name string
	run  func(t *testing.T, e *env, r idem.Restarter)
}{
	{"HolderRecorded", testHolderRecorded},
	{"YieldEarlier", testYieldEarlier},
	{"YieldEarlierInvalid", testYieldEarlierInvalid},
	{"YieldEarlierRecovery", testYieldEarlierRecovery},
}

var (
	replicaA1 = idem.Holder{Replica: "a", Incarnation: "1"}
	replicaA2 = idem.Holder{Replica: "a", Incarnation: "2"}
	replicaA3 = idem.Holder{Replica: "a", Incarnation: "3"}
	replicaB1 = idem.Holder{Replica: "b", Incarnation: "1"}
)

func (e *env) holderReq(key string, h idem.Holder) idem.ClaimRequest {
	req := e.req(key, "fp")
	req.Holder = h
	return req
}

func wantHolder(t *testing.T, what string, got, want idem.Holder) {
	t.Helper()
	if got != want {
		t.Fatalf("%s: Holder = %+v; want %+v", what, got, want)
	}
}

// testHolderRecorded: the claim's holder is in the record from the claim
// on; a takeover records its own; a completion and a renewal keep it; an
// anonymous claim records none.
func testHolderRecorded(t *testing.T, e *env, r idem.Restarter) {
	c := e.acquire(e.holderReq("k", replicaA1))
	wantHolder(t, "Claim", c.Record.Holder, replicaA1)
	wantHolder(t, "Get", e.get("s", "k").Holder, replicaA1)
	if dup := e.claim(e.holderReq("k", replicaB1)); dup.Outcome != idem.InFlight {
		t.Fatalf("duplicate Claim = %v; want in_flight", dup.Outcome)
	} else {
		wantHolder(t, "the duplicate's Claim", dup.Record.Holder, replicaA1)
	}
	e.renew(ref(c), lease)
	wantHolder(t, "Get after Renew", e.get("s", "k").Holder, replicaA1)

	e.clock.Advance(lease + time.Millisecond)
	next := e.acquire(e.holderReq("k", replicaB1))
	if !next.TookOver {
		t.Fatal("Claim after the lease did not take the key over")
	}
	wantHolder(t, "the takeover's Claim", next.Record.Holder, replicaB1)
	wantHolder(t, "Get after the takeover", e.get("s", "k").Holder, replicaB1)
	e.complete(ref(next), sampleResponse())
	wantHolder(t, "Get after Complete", e.get("s", "k").Holder, replicaB1)

	anon := e.acquire(e.req("anonymous", "fp"))
	wantHolder(t, "an anonymous Claim", anon.Record.Holder, idem.Holder{})
	wantHolder(t, "Get of an anonymous claim", e.get("s", "anonymous").Holder, idem.Holder{})

	// A key taken over anonymously has no holder any more.
	e.acquire(e.holderReq("handed", replicaA1))
	e.clock.Advance(lease + time.Millisecond)
	if c := e.acquire(e.req("handed", "fp")); !c.TookOver {
		t.Fatalf("anonymous takeover = %v, took over %v", c.Outcome, c.TookOver)
	}
	wantHolder(t, "Get after an anonymous takeover", e.get("s", "handed").Holder, idem.Holder{})

	// Any printable text, up to idem.MaxHolderLen bytes, round-trips.
	h := idem.Holder{Replica: "pay-7f9c/é " + strings.Repeat("r", idem.MaxHolderLen-12), Incarnation: "2030-01-02T03:04:05Z#9f"}
	e.acquire(e.holderReq("any text", h))
	wantHolder(t, "Get of a holder with any printable text", e.get("s", "any text").Holder, h)
	if tc, ok := r.(idem.TxClaimer); ok {
		// ClaimTx records its holder with the key it completes.
		req := e.holderReq("tx", replicaA2)
		claim, kept, err := tc.ClaimTx(e.ctx, req, time.Second, func(ctx context.Context, c idem.Claim) (idem.Response, bool, error) {
			return idem.Response{Status: 201}, true, nil
		})
		if err != nil || !kept || claim.Outcome != idem.Acquired {
			t.Fatalf("ClaimTx = %v, kept %v, %v", claim.Outcome, kept, err)
		}
		wantHolder(t, "ClaimTx's Claim", claim.Record.Holder, replicaA2)
		wantHolder(t, "Get after ClaimTx", e.get("s", "tx").Holder, replicaA2)
	}
}

// testYieldEarlier: ending an earlier incarnation's leases ends exactly
// those: not the current incarnation's, not another replica's, not the
// anonymous keys', not the completed ones'; and the keys it ended are
// taken over by the next claim at once.
func testYieldEarlier(t *testing.T, e *env, r idem.Restarter) {
	// An earlier incarnation's key whose lease has ended already is not
	// counted, and is left as it is.
	e.acquire(e.holderReq("a1-ended", replicaA1))
	e.clock.Advance(lease + time.Second)
	endedBefore := e.get("s", "a1-ended")

	earlier := []string{"a1-x", "a1-y", "a3-z"} // "3" is not the current incarnation either
	held := map[string]idem.Holder{
		"a1-x": replicaA1, "a1-y": replicaA1, "a3-z": replicaA3,
		"a2": replicaA2, "b1": replicaB1, "anonymous": {},
	}
	claims := map[string]idem.Claim{}
	for k, h := range held {
		claims[k] = e.acquire(e.holderReq(k, h))
	}
	done := e.acquire(e.holderReq("a1-done", replicaA1))
	e.complete(ref(done), sampleResponse())
	e.clock.Advance(time.Second)

	n, err := r.YieldEarlier(e.ctx, replicaA2)
	if err != nil {
		t.Fatalf("YieldEarlier(%v) = %v", replicaA2, err)
	}
	if n != len(earlier) {
		t.Errorf("YieldEarlier(%v) = %d; want %d (%v)", replicaA2, n, len(earlier), earlier)
	}
	now := e.clock.Now()
	for _, k := range earlier {
		got := e.get("s", idem.Key(k))
		if got.State != idem.StateInFlight || got.Token != claims[k].Token || got.LeaseExpiresAt.After(now) {
			t.Errorf("%s after YieldEarlier: %v, token %d, lease end %v; want in flight under token %d, its lease ended by %v",
				k, got.State, got.Token, got.LeaseExpiresAt, claims[k].Token, now)
		}
		wantHolder(t, k+" after YieldEarlier", got.Holder, held[k])
	}
	for _, k := range []string{"a2", "b1", "anonymous"} {
		checkRecord(t, k+" (holder "+held[k].String()+") after YieldEarlier", e.get("s", idem.Key(k)), claims[k].Record)
		if dup := e.claim(e.holderReq(k, replicaA2)); dup.Outcome != idem.InFlight {
			t.Errorf("Claim of %s right after YieldEarlier = %v; want in_flight", k, dup.Outcome)
		}
	}
	if got := e.get("s", "a1-done"); got.State != idem.StateCompleted {
		t.Errorf("a completed key after YieldEarlier: %v", got.State)
	}
	checkRecord(t, "an earlier incarnation's key whose lease had ended", e.get("s", "a1-ended"), endedBefore)

	// Taken over at once, without the clock moving.
	for _, k := range earlier {
		c := e.claim(e.holderReq(k, replicaA2))
		if c.Outcome != idem.Acquired || !c.TookOver || c.Token <= claims[k].Token {
			t.Errorf("Claim of %s right after YieldEarlier = %v (took over %v, token %d); want a takeover",
				k, c.Outcome, c.TookOver, c.Token)
			continue
		}
		wantHolder(t, k+" taken over", c.Record.Holder, replicaA2)
		// The dead incarnation's late completion is fenced.
		if err := r.Complete(e.ctx, ref(claims[k]), idem.Response{Status: 500}); !errors.Is(err, idem.ErrLeaseLost) {
			t.Errorf("the earlier incarnation's Complete of %s after the takeover = %v; want ErrLeaseLost", k, err)
		}
	}
	// Nothing is left to end.
	if n, err := r.YieldEarlier(e.ctx, replicaA2); err != nil || n != 0 {
		t.Errorf("YieldEarlier again = %d, %v; want 0", n, err)
	}
}

func testYieldEarlierInvalid(t *testing.T, e *env, r idem.Restarter) {
	c := e.acquire(e.holderReq("k", replicaA1))
	for _, h := range []idem.Holder{{}, {Replica: "a"}, {Incarnation: "2"}, {Replica: "a", Incarnation: "\x01"}} {
		n, err := r.YieldEarlier(e.ctx, h)
		var argErr *idem.ArgumentError
		if !errors.As(err, &argErr) {
			t.Errorf("YieldEarlier(%+v) = %d, %v; want an *idem.ArgumentError", h, n, err)
		}
	}
	checkRecord(t, "Get after refused YieldEarlier calls", e.get("s", "k"), c.Record)
}

// testYieldEarlierRecovery: on a Recoverer, a key an earlier incarnation
// left with a recovery point is listed as abandoned as soon as its lease
// is ended, and the current incarnation's is not.
func testYieldEarlierRecovery(t *testing.T, e *env, r idem.Restarter) {
	rec, ok := r.(idem.Recoverer)
	if !ok {
		t.Skip("the store does not implement idem.Recoverer")
	}
	dead := e.acquire(e.holderReq("dead", replicaA1))
	live := e.acquire(e.holderReq("live", replicaA2))
	other := e.acquire(e.holderReq("other", replicaB1))
	for k, c := range map[string]idem.Claim{"dead": dead, "live": live, "other": other} {
		if err := rec.SaveRecovery(e.ctx, ref(c), idem.RecoveryPoint{Name: "charging", Data: []byte(k)}); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := rec.Abandoned(e.ctx, 10); err != nil || len(got) != 0 {
		t.Fatalf("Abandoned before YieldEarlier = %v, %v; want none", got, err)
	}
	if n, err := r.YieldEarlier(e.ctx, replicaA2); err != nil || n != 1 {
		t.Fatalf("YieldEarlier = %d, %v; want 1", n, err)
	}
	got, err := rec.Abandoned(e.ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	if err := abandonedKeys(got, "dead"); err != nil {
		t.Fatalf("right after YieldEarlier: %v", err)
	}
	wantHolder(t, "the abandoned record", got[0].Holder, replicaA1)
	c := e.claim(e.holderReq("dead", replicaA2))
	if c.Outcome != idem.Acquired || !c.TookOver || string(c.Record.Recovery.Data) != "dead" {
		t.Fatalf("takeover of dead = %v (took over %v, point %+v); want a takeover with its point", c.Outcome, c.TookOver, c.Record.Recovery)
	}
}
