package idem_test

import (
	"errors"
	"fmt"
	"time"

	"github.com/idem-go/idem"
)

func ExampleParseKey() {
	// The bare token most clients send and the structured-field string of
	// the IETF draft name the same key.
	for _, header := range []string{
		`8e03978e-40d5-43e8-bc93-6894a57f9324`,
		`"8e03978e-40d5-43e8-bc93-6894a57f9324"`,
		`"has space"`,
	} {
		key, err := idem.ParseKey(header)
		if errors.Is(err, idem.ErrInvalidKey) {
			// Answer 400 with the reason.
			fmt.Println(err)
			continue
		}
		fmt.Println(key)
	}
	// Output:
	// 8e03978e-40d5-43e8-bc93-6894a57f9324
	// 8e03978e-40d5-43e8-bc93-6894a57f9324
	// invalid idempotency key: character 0x20 at position 4 is not visible ASCII (0x21-0x7E)
}

func ExampleNewFingerprint() {
	// A client that retries re-serialises its body: members in another
	// order, other white space, another spelling of a number.
	first := idem.NewFingerprint("POST", "/v1/charges", "expand=customer", "application/json",
		[]byte(`{"amount": 1000, "currency": "eur"}`))
	retry := idem.NewFingerprint("POST", "/v1/charges", "expand=customer", "application/json",
		[]byte(`{"currency":"eur","amount":1e3}`))
	// Reusing the key for a different charge is a client bug.
	other := idem.NewFingerprint("POST", "/v1/charges", "expand=customer", "application/json",
		[]byte(`{"amount": 2000, "currency": "eur"}`))

	fmt.Println("retry matches:", retry == first)
	fmt.Println("other matches:", other == first)
	fmt.Println(first[:3])
	// Output:
	// retry matches: true
	// other matches: false
	// v1:
}

func ExampleCanonicalJSON() {
	out, err := idem.CanonicalJSON([]byte(`{
		"b": [1.50, 1e21, "\u20ac"],
		"a": {"y": null, "x": true}
	}`))
	fmt.Println(string(out), err)

	_, err = idem.CanonicalJSON([]byte(`{"a": 1, "a": 2}`))
	fmt.Println(errors.Is(err, idem.ErrNotCanonicalizable))
	// Output:
	// {"a":{"x":true,"y":null},"b":[1.5,1e+21,"€"]} <nil>
	// true
}

func ExampleRetryPolicy_Delay() {
	// Exponential from Base, capped; NoJitter shows the bare schedule (the
	// default, FullJitter, waits a random time up to each of these).
	p := idem.RetryPolicy{MaxAttempts: 6, Base: 100 * time.Millisecond, Cap: time.Second, Jitter: idem.NoJitter}
	var prev time.Duration
	for attempt := 1; attempt < p.Attempts(); attempt++ {
		prev = p.Delay(attempt, prev)
		fmt.Printf("after attempt %d: wait %v\n", attempt, prev)
	}
	// Output:
	// after attempt 1: wait 100ms
	// after attempt 2: wait 200ms
	// after attempt 3: wait 400ms
	// after attempt 4: wait 800ms
	// after attempt 5: wait 1s
}

func ExamplePermanent() {
	// A handler marks what no retry can fix; the consumer dead-letters it
	// at once instead of retrying.
	errMalformed := idem.Permanent(errors.New("malformed event: no event_id"))
	errTimeout := errors.New("provider timed out")
	fmt.Println(idem.Classify(errMalformed), idem.IsPermanent(fmt.Errorf("settle: %w", errMalformed)))
	fmt.Println(idem.Classify(errTimeout))
	// Output:
	// permanent true
	// transient
}

func ExampleRetryAfter() {
	// A rate-limited call says when to come back; the consumer waits that
	// long instead of its own backoff.
	err := idem.RetryAfter(errors.New("429 from the card provider"), 30*time.Second)
	d, ok := idem.RetryDelay(fmt.Errorf("charge: %w", err))
	fmt.Println(idem.Classify(err), d, ok)
	// Output:
	// transient 30s true
}
