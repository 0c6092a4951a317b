// Package bench measures what idem's protection costs, side by side with
// the least anyone could write by hand for the same guarantee on the same
// store, in one process and one run, so the ratio means something on any
// machine.
//
// For each store it runs, with the same concurrency and request count:
//
//   - Redis, "first": the idemhttp middleware on an idemredis store in front
//     of a trivial handler, every request with a new key; against the
//     hand-written minimum, one SET NX PX to claim plus one SET of the
//     response per request.
//   - PostgreSQL, "first": the middleware on an idempg store (the
//     same-transaction form) in front of a handler that debits a balance and
//     inserts a payment in the key's transaction; against the hand-written
//     minimum, one transaction with INSERT … ON CONFLICT DO NOTHING for the
//     key, the balance update, the payment insert and the key's response
//     update.
//   - "replay", for both: the middleware answering a key it already
//     completed, which must be at least as fast as a first execution;
//     against the hand-written minimum, one SELECT (GET on Redis) of the
//     kept status and body. The key was completed by the same process a
//     moment before, so by default the middleware answers from the answer
//     it kept in memory (idemhttp's Config.MemoryReplayFor), as it does a
//     client's retry that comes soon after; Options.StoreReplays turns that
//     off, and every replay reads the store.
//   - PostgreSQL and SQLite, "slow": rounds of Concurrency first
//     executions at once whose handler waits Options.SlowHandler (100ms)
//     before its writes, as a handler that calls another service first;
//     against the hand-written minimum waiting as long before its
//     transaction. Its figure is a round's wall time (round_ms): where
//     one request's wait held up the others' writes, as a transaction
//     holding SQLite's single writer from the claim on would, a round
//     takes up to Concurrency times the wait.
//
// With Options.GRPC, idemgrpc's interceptor is measured the same way on
// SQLite and PostgreSQL (idem-grpc-<store>-<case>), in front of the same
// payment, against a hand-written interceptor that does what the HTTP
// minimum does and decodes its replays into the response message (see
// grpc.go).
//
// Requests are served in-process (no HTTP sockets), both sides through the
// same request scaffolding, so what is measured is the store work and the
// middleware, not the network stack. Rounds of the two sides alternate,
// in turned order (A B, B A, ...), so that drift on a shared machine hits
// both alike, and the ratio is the median of the rounds' ratios, each
// taken between two measurements made back to back.
//
// Each side's CPU per request is measured too: this process's (user and
// system time, the runtime's included) over the round's requests. With the
// store on the same machine, a ratio below one with the same CPU per
// request on both sides says the gap is the server's work, and a higher
// CPU per request says it is the client's. Options.Side measures one side
// alone, for a CPU profile of it.
// `idem bench` prints the table.
package bench
