package idemredis_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemredis"
)

// exampleClient connects to the Redis the tests use (IDEM_REDIS_URL, or the
// local default) and returns a prefix no other run uses.
func exampleClient() (*redis.Client, string, error) {
	url := os.Getenv(redisEnv)
	if url == "" {
		url = defaultRedisURL
	}
	opt, err := redis.ParseURL(url)
	if err != nil {
		return nil, "", err
	}
	return redis.NewClient(opt), "idem-example-" + rand.Text(), nil
}

// deleteExampleKeys removes what an example wrote.
func deleteExampleKeys(client *redis.Client, prefix string) {
	ctx := context.Background()
	iter := client.Scan(ctx, 0, prefix+":*", 100).Iterator()
	for iter.Next(ctx) {
		client.Unlink(ctx, iter.Val())
	}
}

// A request is claimed, its effect runs once, and a duplicate (here through
// another replica's Store) gets the stored answer; the same key with another
// body is refused.
func Example() {
	ctx := context.Background()
	client, prefix, err := exampleClient()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.Close()
	defer deleteExampleKeys(client, prefix)

	// Two replicas of a service, sharing one Redis and one prefix.
	replicaA, err := idemredis.NewStore(ctx, client, &idemredis.Config{Prefix: prefix})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer replicaA.Close()
	replicaB, err := idemredis.NewStore(ctx, client, &idemredis.Config{Prefix: prefix})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer replicaB.Close()

	req := idem.ClaimRequest{
		Scope:       "merchant-7",
		Key:         "order-42",
		Fingerprint: idem.NewFingerprint("POST", "/payments", "", "application/json", []byte(`{"amount":1250}`)),
		Lease:       30 * time.Second,
		TTL:         time.Hour,
	}
	claim, err := replicaA.Claim(ctx, req)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("replica A:", claim.Outcome)

	// While A runs the effect, the duplicate on B finds the key in flight.
	dup, _ := replicaB.Claim(ctx, req)
	fmt.Println("replica B, meanwhile:", dup.Outcome)

	// ... A charges the card, passing "merchant-7/order-42" on as the
	// payment provider's idempotency key, then keeps its answer.
	ref := idem.Ref{Scope: req.Scope, Key: req.Key, Token: claim.Token}
	if err := replicaA.Complete(ctx, ref, idem.Response{Status: 201, Body: []byte(`{"id":"pay_1"}`)}); err != nil {
		fmt.Println(err)
		return
	}

	dup, _ = replicaB.Claim(ctx, req)
	fmt.Println("replica B, after:", dup.Outcome, dup.Record.Response.Status, string(dup.Record.Response.Body))

	other := req
	other.Fingerprint = idem.NewFingerprint("POST", "/payments", "", "application/json", []byte(`{"amount":9999}`))
	reused, _ := replicaB.Claim(ctx, other)
	fmt.Println("other body:", reused.Outcome)
	// Output:
	// replica A: acquired
	// replica B, meanwhile: in_flight
	// replica B, after: completed 201 {"id":"pay_1"}
	// other body: mismatch
}

// A duplicate that finds the key in flight waits for the first request,
// woken through Redis pub/sub when it completes, instead of polling.
func ExampleStore_WaitChange() {
	ctx := context.Background()
	client, prefix, err := exampleClient()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.Close()
	defer deleteExampleKeys(client, prefix)
	store, err := idemredis.NewStore(ctx, client, &idemredis.Config{Prefix: prefix})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer store.Close()

	req := idem.ClaimRequest{Key: "k", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
	first, err := store.Claim(ctx, req)
	if err != nil {
		fmt.Println(err)
		return
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		// The first request finishes while the duplicate waits.
		_ = store.Complete(ctx, idem.Ref{Key: req.Key, Token: first.Token}, idem.Response{Status: 200})
	}()
	defer func() { <-done }()

	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for {
		c, err := store.Claim(wctx, req)
		if err != nil {
			fmt.Println(err)
			return
		}
		if c.Outcome != idem.InFlight {
			fmt.Println("duplicate:", c.Outcome, c.Record.Response.Status)
			return
		}
		if err := store.WaitChange(wctx, req.Scope, req.Key); err != nil {
			fmt.Println(err)
			return
		}
	}
	// Output:
	// duplicate: completed 200
}

// A service that already has a rueidis client gives it to NewRueidisStore (Open
// makes one itself): the store's API is the same as on go-redis, and many
// concurrent requests share its auto-pipelined connections.
func ExampleNewRueidisStore() {
	ctx := context.Background()
	cleaner, prefix, err := exampleClient()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cleaner.Close()
	defer deleteExampleKeys(cleaner, prefix)
	client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{cleaner.Options().Addr}, SelectDB: cleaner.Options().DB, DisableCache: true})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.Close()
	store, err := idemredis.NewRueidisStore(ctx, client, &idemredis.Config{Prefix: prefix})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer store.Close()

	req := idem.ClaimRequest{Scope: "tenant-a", Key: "order-7", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour}
	c, err := store.Claim(ctx, req)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("first:", c.Outcome)
	if err := store.Complete(ctx, idem.Ref{Scope: req.Scope, Key: req.Key, Token: c.Token}, idem.Response{Status: 201}); err != nil {
		fmt.Println(err)
		return
	}
	dup, err := store.Claim(ctx, req)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("duplicate:", dup.Outcome, dup.Record.Response.Status)
	// Output:
	// first: acquired
	// duplicate: completed 201
}
