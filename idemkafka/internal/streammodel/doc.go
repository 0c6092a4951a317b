// Package streammodel holds the model-based test of idemkafka's stream
// (package idemkafka/internal/stream), in a module of its own so that
// idemkafka's users do not inherit its test-only requirement,
// pgregory.net/rapid.
//
// The test draws arbitrary interleavings of fetches, rebalances
// (assignments, revocations, lost sessions), deliveries, Acks, Nacks,
// handlers that die, commits (slow, refused), another group member taking
// partitions over, and crashes of the consumer, and runs them against the
// stream on a fake franz-go client inside a testing/synctest bubble, so
// that every interleaving is replayed exactly and time passes only when
// the model says so. The fake keeps franz-go's promises and no more: a
// poll begun after a revocation's callback began returns none of the
// revoked partitions' records, but one under way may (see the package
// documentation of idemkafka/internal/stream).
//
// After each step it checks the stream against a small reference model:
// the committed offset never passes a record whose effect did not commit;
// a committed offset never moves back; the stream holds no more than
// MaxInFlight records, and its in-flight count is the model's; no record
// of a partition is handed out once its revocation has begun. At the end,
// with the faults stopped, every record is delivered and committed, and
// nothing is left held or in flight.
//
//	go test ./idemkafka/internal/streammodel/ -rapid.checks=5000
//
// runs a longer search than CI's default of 100 interleavings.
package streammodel
