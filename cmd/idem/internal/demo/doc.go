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
//
// # Messages
//
// RunMessages is the lab's second half (`idem demo messages`): what a
// consumer must do about messages that come twice, fail for good, fail
// together, or come out of order. Each scenario runs a consumer built the
// unsafe way, then one built with idem, against the same events and faults,
// on one SQLite file, with idem's consumer (package consumer), idemsqlite's
// inbox, transport, ledger and dead letters; every figure is read back from
// what the consumers wrote there, the transport's deliveries and the dead
// letters:
//
//   - redelivery: 20 payment events added to a total; 5 acknowledgements
//     are lost on their way to the transport, and the consumer is killed
//     once between its commit and its acknowledgement, then restarted. A
//     consumer without an inbox (consumer.NoInbox) adds the 6 redelivered
//     events twice; with the inbox in the addition's transaction, each
//     counts once.
//   - a poison message: one event that always fails, at the head of the
//     queue, then 20 healthy ones, one worker each. A consumer that retries
//     its head every second, forever (headOfLine: the transport and the
//     inbox are idem's, the loop is the naive one) applies none of them in
//     the two minutes the lab watches; idem's consumer, with its default
//     policy, applies them at once and dead-letters the poison after 10
//     attempts, with each attempt and its error.
//   - a retry storm: 100 events, 4 consumers of 4 workers whose handler
//     calls a service that is down for the first second, serves a capacity
//     of calls per 100 ms (--capacity), and falls over for a second when it
//     gets more. Without jitter every retry lands in one window and knocks
//     it over again and again; with full jitter the peak stays under the
//     capacity. The calls per window are printed as a small histogram.
//   - order: 5 accounts, each paid and then refunded in part, the payment's
//     event failing its first attempt. Without per-key order
//     (consumer.Config.Unordered) a consumer that adds ends right through a
//     negative balance, and one that sets the status ends "paid", the
//     refund undone; with per-key order both end right, every step in
//     its order; and a consumer whose
//     events carry the state with a version (Config.Sequence under
//     idem.GapAllow) ends right with no order at all.
//
// Faults are injected the way the consumer's tests inject them: a wire
// between the consumer and the transport counts deliveries and loses
// acknowledgements, an inbox wrapper stops the consumer right after a
// commit, handlers fail the attempts a scenario says.
//
// Time is the lab's own clock (an idemmem.Clock, as the consumers' Clock
// and Timers and the transport's Clock): it moves only when every consumer
// of a scenario waits for a timer, and then to the next timer, so a
// retry's delay, a wait or calls per 100 ms are the same on every run
// however loaded the machine, and the two minutes of the poison scenario
// take milliseconds. The jitter is drawn from a seeded source, one stream
// per attempt, so its figures are the same on every run too. In the storm
// the timers due within one window of 100 ms fire together, at the last
// one's time (late, as timers are on a busy machine, never early), so that
// the lab takes one step per window instead of one per retry.
package demo
