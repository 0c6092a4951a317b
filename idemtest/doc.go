// Package idemtest holds what backend authors test with: the conformance
// suites every idem.Store, transport, inbox and outbox passes, and the gate
// for tests that need an external service. (The manual clock the suites move
// is idemmem.Clock.)
//
// idemtest is a module of its own, because its linearizability checks need
// Porcupine and the root module requires nothing; a backend's module
// requires it for its tests only.
//
// # The Store suite
//
// TestStore is shaped like testing/fstest.TestFS: a backend's own test calls
// it with a constructor, and it runs the contract of idem.Store as subtests
// (atomic claims under 64 racing goroutines, replay of the exact response,
// fingerprint mismatches, scopes, lease takeover with greater fencing tokens,
// refused stale holders, TTL expiry, Purge limits, argument validation,
// cancellation, lease renewal (a renewed key is not taken over before its
// new end, outlives its TTL while renewed, and a stale, taken-over or
// completed holder's renewal changes nothing), and linearizability, below).
// When the store also implements idem.TxStore, idem.TxClaimer,
// idem.Replayer, idem.Restarter (the holder recorded; ending an earlier
// incarnation's leases touches only those, which are then taken over at
// once, and listed as abandoned when they have a recovery point) or
// idem.Waiter, their contracts are checked too; otherwise those groups are
// skipped with the reason.
//
// The constructor gets each subtest's *testing.T and a Clock, and must return
// a fresh, empty store that reads time from that clock:
//
//	func TestStore(t *testing.T) {
//		idemtest.TestStore(t, func(t *testing.T, clock idem.Clock) idem.Store {
//			db := openEmptyDatabase(t) // one per subtest; closed by t.Cleanup
//			s, err := mystore.New(db, &mystore.Config{Clock: clock})
//			if err != nil {
//				t.Fatal(err)
//			}
//			return s
//		})
//	}
//
// The suite never sleeps to let time pass: leases and TTLs end when it moves
// the Clock, so it is fast and does not flake on a slow machine. A store must
// therefore take every "now" from the injected clock, including the one that
// decides whether a lease is live. Clocks start at Start, a whole second, and
// move by whole milliseconds, so a backend that keeps milliseconds still
// round-trips every time exactly.
//
// # Linearizability
//
// TestStore's subtest Linearizable records a concurrent history: six
// goroutines call Claim, Complete (with their own tokens and stale ones),
// Release, Get and, on an idem.TxClaimer, ClaimTx (keeping its answer or
// rolling back) on three keys, in rounds; between rounds, while nothing
// runs, the Clock moves by nothing, a millisecond, half a lease, past the
// lease or past the TTL. Porcupine (github.com/anishathalye/porcupine), a
// checker idem did not write, then decides whether some order of the calls,
// each taking effect at one instant between its call and its return,
// explains every answer by a sequential model of one key's life: absent,
// in flight under a token until its lease ends, completed with one answer
// until its TTL passes. A history it rejects is written as an HTML
// visualisation to a temporary file, named in the failure, for a person to
// read. The check runs in seconds; IDEMTEST_LINEARIZABILITY_SCALE=N
// (LinearizabilityScaleEnv) makes it N times longer.
//
// Subtests run in parallel, each on its own store. Waits for other
// goroutines are bounded (10 s), so a broken store fails instead of hanging.
//
// TestSerialWriter checks what a store whose writes queue for one writer
// and commit in groups (idemsqlite) must still promise, through a
// WriterControl that holds the writer: a claim that waits for a slow
// member behind it in its group gets its whole lease, and a completion
// reports a lease lost to a takeover in its group only once that group has
// committed.
//
// TestWithTx checks a database's own transaction helper (DB.WithTx,
// adapted to TxRunner), which the same-transaction forms stand on: commit,
// rollback on error and on panic, nested calls joining, a context kept past
// its transaction refused, and the database's store joining the caller's
// transaction.
//
// TestTxEffects checks what TestStore cannot see of idem.TxStore and
// idem.TxClaimer: the work's own writes (through InboxEffects, as
// TestInbox's) commit with the key's completion, exactly once, or not at
// all, whether the work keeps its answer, fails, panics or lost its lease.
//
// TestMiddleware checks idemhttp's middleware in front of a store: what a
// request and its duplicates get (replays, waits, mismatches, classified
// failures, expiry, takeover, keys and bodies sealed at rest), in the
// same-transaction form when the store offers it.
//
// (consumer/consumertest holds TestPerKeyOrder, which drives the consumer
// over a transport, and RunEventFailover, which does so while a cluster
// loses a node; idemtest's suites need only the root's interfaces.)
//
// TestTransport (gated by TransportFeatures), TestInbox, TestOutbox,
// TestDeadLetters and TestLedger are suites of the same kind for the message
// interfaces; each one's doc says what it checks and what it needs.
//
// # Tests that need a service
//
// RequireService decides whether a test that needs PostgreSQL, Redis, NATS or
// RabbitMQ runs:
//
//	url := idemtest.RequireService(t, "PostgreSQL", "IDEM_POSTGRES_URL", "postgres://127.0.0.1:5432/test")
//
// It reads the URL from the environment (with a default of the standard
// local port) and dials it. A service that does not answer skips the test with
// the reason on a developer's machine, and fails it when
// IDEM_REQUIRE_SERVICES=1, as in CI, so that a test cannot pass by skipping
// there.
package idemtest
