// Package probe shows what idemprobe.Test reports against a handler that
// gets idempotency wrong: an in-memory one, written by hand, that replays
// the first answer to a key whatever body comes with it, and replays every
// header it sent, Set-Cookie included. Each check it breaks is a failing
// subtest that says what went wrong, cites the rule, and shows the
// requests and answers; the rest pass or are skipped.
//
// TestWrongHandler is that test, and fails; so that go test ./... passes,
// TestWrongHandlerFailsItsChecks runs it in a child process, checks that
// exactly the subtests it should fail do, and logs its output:
//
//	go test -v -run TestWrongHandlerFailsItsChecks ./probe
package probe
