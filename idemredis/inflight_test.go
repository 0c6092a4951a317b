package idemredis_test

import (
	"context"
	"errors"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemredis"
	"github.com/idem-go/idem/idemtest"
)

// InFlight lists every key in flight, whether its holder's lease has ended
// or not, oldest lease end first, as idemsqlite's and idempg's
// InFlightAtPoints list theirs (without points: the Store keeps none); a
// key completed, released or expired is not listed, nor a key under the
// prefix that is no record. It changes nothing in Redis.
func TestInFlight(t *testing.T) {
	t.Parallel()
	client := newClient(t)
	clock := idemmem.NewClock(idemtest.Start)
	prefix := randomPrefix(t)
	s := newStore(t, client, &idemredis.Config{Prefix: prefix, Clock: clock})
	ctx := t.Context()
	claim := func(scope idem.Scope, key idem.Key, lease, ttl time.Duration) idem.Ref {
		t.Helper()
		c, err := s.Claim(ctx, idem.ClaimRequest{Scope: scope, Key: key, Fingerprint: "fp-" + idem.Fingerprint(key), Lease: lease, TTL: ttl})
		if err != nil || c.Outcome != idem.Acquired {
			t.Fatalf("claim %s: %v %v", key, c.Outcome, err)
		}
		return idem.Ref{Scope: scope, Key: key, Token: c.Token}
	}
	claim("s", "gone", time.Minute, 24*time.Hour)   // its holder's lease will have ended
	claim("s", "expired", time.Minute, time.Minute) // its TTL will have passed too
	if err := s.Complete(ctx, claim("s", "done", time.Hour, 24*time.Hour), idem.Response{Status: 201, Body: []byte("ok")}); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx, claim("s", "released", time.Hour, 24*time.Hour)); err != nil {
		t.Fatal(err)
	}
	clock.Advance(2 * time.Minute)
	claim("{odd}%scope", "held", time.Hour, 24*time.Hour) // its holder lives
	claim("", "global", 2*time.Hour, 24*time.Hour)
	// Someone else's keys under the prefix: no records.
	if err := client.HSet(ctx, prefix+":{s}:a-hash", "f", "v").Err(); err != nil {
		t.Fatal(err)
	}
	if err := client.Set(ctx, prefix+":{s}:junk", "not a record", 0).Err(); err != nil {
		t.Fatal(err)
	}
	before := dumpKeys(t, client, prefix)

	recs, err := s.InFlight(ctx, 10)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range recs {
		if r.State != idem.StateInFlight || r.Fingerprint != "fp-"+idem.Fingerprint(r.Key) || r.CreatedAt.IsZero() || !r.Recovery.IsZero() {
			t.Errorf("listed %+v; want an in-flight record with its fingerprint and claim time, and no point", r)
		}
		got = append(got, string(r.Scope)+"/"+string(r.Key))
	}
	if want := []string{"s/gone", "{odd}%scope/held", "/global"}; !slices.Equal(got, want) {
		t.Fatalf("InFlight: %v; want %v, the oldest lease end first", got, want)
	}
	if recs, err := s.InFlight(ctx, 1); err != nil || len(recs) != 1 || recs[0].Key != "gone" {
		t.Fatalf("InFlight with limit 1: %v %v; want gone", recs, err)
	}
	if _, err := s.InFlight(ctx, 0); !errors.Is(err, idem.ErrInvalidArgument) {
		t.Fatalf("limit 0: %v; want an argument error", err)
	}
	if after := dumpKeys(t, client, prefix); !maps.Equal(before, after) {
		t.Fatalf("InFlight changed Redis: %v before, %v after", before, after)
	}
}

// dumpKeys returns every key under prefix with its DUMP: what a write to
// any of them would change.
func dumpKeys(t *testing.T, client *redis.Client, prefix string) map[string]string {
	t.Helper()
	ctx := t.Context()
	out := map[string]string{}
	iter := client.Scan(ctx, 0, prefix+":*", 1000).Iterator()
	for iter.Next(ctx) {
		v, err := client.Dump(ctx, iter.Val()).Result()
		if err != nil {
			t.Fatal(err)
		}
		out[iter.Val()] = v
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// HoldsKeys tells whether any key under the prefix is named as a record's:
// none under a fresh prefix, nor when the only keys are another prefix's
// that begins with it, or keys under it named otherwise; one once a key
// was claimed there, even released since (its tombstone). It changes
// nothing in Redis.
func TestHoldsKeys(t *testing.T) {
	t.Parallel()
	client := newClient(t)
	prefix := randomPrefix(t)
	s := newStore(t, client, &idemredis.Config{Prefix: prefix})
	ctx := t.Context()
	holds := func() bool {
		t.Helper()
		got, err := s.HoldsKeys(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	if holds() {
		t.Fatal("HoldsKeys of a fresh prefix = true")
	}
	for _, k := range []string{prefix + "x:{s}:k", prefix + ":other"} {
		if err := client.Set(ctx, k, "v", time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { client.Del(context.Background(), k) })
	}
	if holds() {
		t.Fatal("HoldsKeys with only another prefix's key and a key named otherwise = true")
	}
	c, err := s.Claim(ctx, idem.ClaimRequest{Scope: "s", Key: "k", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour})
	if err != nil || c.Outcome != idem.Acquired {
		t.Fatalf("claim: %v %v", c.Outcome, err)
	}
	if err := s.Release(ctx, idem.Ref{Scope: "s", Key: "k", Token: c.Token}); err != nil {
		t.Fatal(err)
	}
	before := dumpKeys(t, client, prefix)
	if !holds() {
		t.Fatal("HoldsKeys after a key was claimed and released = false")
	}
	if after := dumpKeys(t, client, prefix); !maps.Equal(before, after) {
		t.Fatalf("HoldsKeys changed Redis: %v before, %v after", before, after)
	}
}
