// Package jsonrpc is a third face of the engine (package keyed), beside
// idemhttp and idemgrpc, to show what one takes: a JSON-RPC 2.0 server in
// a few hundred lines, whose calls are run at most once per
// Idempotency-Key, with every decision about the key the engine's.
//
// What the face does itself is what JSON-RPC makes its own: it reads the
// key (an HTTP header) and fingerprints the call by its method and params
// (canonical JSON), never its id, which is the message's and not the
// operation's; it keeps a call's "result" or "error" member, not the
// whole response, and replays it under the id of the call that asks; it
// speaks the engine's refusals as error objects with codes of the range
// the specification leaves to servers (-32000 to -32099: CodeInFlight,
// CodeKeyMismatch…), and tells the client when to retry (Retry-After and
// data.retryAfterMs). A Method's *Error is kept and replayed when it is the
// call's deterministic outcome, and releases the key when it is transient
// (CodeRetry's range, CodeInternal).
//
// What it inherits from the engine, unchanged (keyed's table): a duplicate
// waits for the call in flight within its own deadline; a caller that
// leaves does not stop the method; leases renew while the method runs;
// recovery points (keyed.SaveRecovery) are never released, and a
// Completer (Server.NewCompleter) finishes what a dead holder left; keys
// and answers sealed at rest; the observer's phases. face_test.go runs the
// suite every face passes (idemtest.TestFace) on it.
package jsonrpc
