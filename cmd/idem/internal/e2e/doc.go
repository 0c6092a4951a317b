// Package e2e holds the multi-process acceptance tests of idem's shared
// stores: real `idem serve` processes, the real PostgreSQL and Redis of the
// machine, and real process deaths. It has no API; everything is in its
// tests.
//
// TestMain builds the idem binary once (without the race detector: it runs
// as a subprocess) and every test starts its own replicas of it, each on a
// free port, on a fresh PostgreSQL schema (--pg-schema, dropped afterwards)
// and, when Redis holds the keys, a fresh key prefix (--keys-prefix,
// deleted afterwards), with an API key of its own. Tests read results back
// through the service's own API, the way a client would.
//
// What is proven:
//
//   - Two replicas sharing one PostgreSQL (and then one Redis for the keys)
//     answer 200 concurrent duplicates of one payment, split across both,
//     with exactly one payment: one debit, one execution, and the same
//     payment id for every client.
//   - A replica SIGKILLed while a payment is in flight, retried by the
//     client on the other replica, ends in exactly one payment and a 201.
//     With Redis keys the replica dies right after the payment commits and
//     before its key completes (Idem-Fault: crash-after-commit): the retry
//     takes the key over once its lease ends and answers with the payment
//     already made instead of charging again. This is the window between
//     two stores that the payment row's key closes.
//   - PostgreSQL, and then Redis, stopped under load and started again:
//     while they are down requests fail with 503 (or at the connection),
//     never with a 2xx that is not recorded and never with 500; afterwards
//     every client's retries end with 201 and every key has exactly one
//     payment. The shared services are never touched: these tests start
//     private instances in a temporary directory (which needs root, for
//     runuser, and PostgreSQL's and Redis's server binaries).
//
// Every test is gated like the rest of idem's service tests: without the
// service it is skipped with the reason, and with IDEM_REQUIRE_SERVICES=1
// it fails instead. IDEM_POSTGRES_URL and IDEM_REDIS_URL override the
// default local URLs.
//
//	go test -race -count=1 ./cmd/idem/internal/e2e/
package e2e
