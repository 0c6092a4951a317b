// Package demo is the lab a newcomer runs first (`idem demo`): it shows,
// with numbers taken from the payment service itself, why retries double
// charge customers and how idempotency keys stop it.
//
// Run starts the reference payment service (package payments) in-process
// twice, each time on a fresh SQLite database in a temporary directory and
// behind a real HTTP server on a loopback port, with a card network of its
// own (package acquirer) that every payment charges the customer's card
// at:
//
//   - the "unsafe" run switches idempotency off, as a naive service would be;
//   - the "protected" run is the service as shipped, with every POST claimed
//     by its Idempotency-Key.
//
// Against each run it plays the same scenarios, each with a number of
// customers who each mean to pay one fixed amount exactly once, using one
// idempotency key per intended payment:
//
//   - frozen screen: the first press of "Pay" hangs, and the impatient
//     customer presses twice more while it does;
//   - lost response: the payment commits but the connection drops before the
//     answer arrives, so the client retries, as it must;
//   - card network: the card network charges, and its answer is lost on the
//     way back to the service, whose client retries the charge; then the
//     service's own answer is lost, and the customer retries;
//   - retry storm: ten copies of the same request arrive at once (a proxy, a
//     queue and a mobile app all retrying together);
//   - transient failure: the first attempt fails before anything commits
//     (503 with Retry-After), and the retry must really run the payment.
//
// Every customer's client is idemhttp.RoundTripper, the toolkit's client half:
// it resends a request under the same key after a network error or a "try
// again" answer, with jittered backoff, as a careful client must.
//
// The faults are injected by the service itself through its Idem-Fault
// request header, so the scenarios are reproducible without a flaky network.
// What each customer was charged is then read back from the service's API
// (account balances and payment lists) and from the card network (its
// charges per card), never counted on the client side,
// and printed as a table with one verdict per run and scenario: "exactly
// once", "DOUBLE CHARGED" or "lost payment".
//
// The point it makes is the one the whole of idem is built on: a sender that
// hears nothing cannot tell a lost request from a lost answer, so it must
// retry (at-least-once delivery), and only the receiver can make those
// retries harmless by de-duplicating them (exactly-once effects).
package demo
