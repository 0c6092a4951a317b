// Package idemprobe checks from outside whether an HTTP endpoint honours
// idempotency keys: it sends requests, reads the answers, and judges them
// check by check. It knows nothing of the server's code, so it can check
// any endpoint — idem's own middleware, another library's, a hand-written
// one — and, being a module of its own that requires nothing but
// Porcupine (for check 12), it can do so from an API team's own go test,
// against their handler served in-process:
//
//	func TestPaymentsIdempotency(t *testing.T) {
//		idemprobe.Test(t, &idemprobe.Config{
//			Handler: api.NewRouter(deps), // served on loopback for the test
//			URL:     "/v1/payments",
//			Body:    `{"account_id":"acct_1","amount":{{n}},"currency":"KRW"}`,
//			Header:  http.Header{"Authorization": {"Bearer test-key"}},
//		})
//	}
//
// Each check is a subtest (TestPaymentsIdempotency/concurrent-duplicates,
// …/key-reuse-refused, …): it passes with the report's reason logged,
// fails with the report's words and the requests and answers that show it,
// and is skipped with the reason when it does not apply. go test -run
// 'TestPaymentsIdempotency/lost-response' runs one. Against a server that is
// already running, give URL instead of Handler; Run returns the report card
// without a test, which the command idem probe prints:
//
//	rep, err := idemprobe.Run(ctx, &idemprobe.Config{
//		URL:    "http://127.0.0.1:8080/v1/payments",
//		Body:   `{"account_id":"acct_1","amount":{{n}},"currency":"KRW"}`,
//		Header: http.Header{"Authorization": {"Bearer " + key}},
//	})
//	if err != nil { … }          // could not start: see ErrInvalidConfig, ErrRemote
//	rep.WriteText(os.Stdout)     // or WriteJSON, WriteJUnit
//	switch rep.Outcome() { … }   // OutcomePass, OutcomeFail, OutcomeNotRun
//
// # The checks
//
// Each is pass, fail, not applicable, not run or an error, with the requests
// sent and the answers as evidence, and names where its rule comes from: a
// section of the IETF draft draft-ietf-httpapi-idempotency-key-header-07
// (by the number and name -07 gives it), Stripe's or Adyen's documented
// behaviour, or idem's own contract where they say nothing or differ. idem
// differs from the draft on one point the checks meet: the draft answers
// 409 to a duplicate in flight, idem's middleware lets it wait for the
// first answer, within a bound, before 409; checks 1 and 8 accept either,
// and Config.Strict holds check 8 to the draft's 409. docs/probe.md has the
// table.
//
//  1. Concurrent duplicates (Config.Concurrency, 8, at once with one fresh key)
//     run once: every successful answer is the same, and any other is 409.
//  2. Sequential duplicates are replayed: the same status and body; a
//     replay marked as one (Config.ReplayHeader, Idempotent-Replayed by
//     default: true) is noted.
//  3. The key of a completed request sent with another body is refused with
//     422.
//  4. A missing key is refused with 400; not applicable when the request
//     without a key succeeds, since the endpoint then does not require keys.
//     A malformed key (300 characters; one with a tab inside) is refused with
//     400.
//  5. A lost response: the request goes on a connection of its own, which is
//     closed as soon as the answer starts to arrive, without reading it, as a
//     client whose network failed would; the retry with the same key must get
//     the first execution's answer, not a second execution.
//  6. No replay carries Set-Cookie: a replay goes to whoever presents the key.
//  7. A 5xx is not kept, and the retry runs again: judged on every 5xx the
//     other checks met on the way (up to three), by a retry with its key,
//     and with Config.FaultHeader, which must make the endpoint answer 5xx
//     with no effect, on one the probe causes.
//  8. With Config.SlowHeader, which must hold the request in flight: a
//     duplicate sent meanwhile waits for the first's answer or gets 409 with
//     Retry-After (only the 409 with Config.Strict), and never runs a
//     second time.
//  9. With Config.OtherHeader, a second credential: a key the first one used
//     never gives the other one its answer (keys are scoped by tenant).
//  10. With Config.RevocableHeader and Config.Revoke: a key used under a
//     credential that is then revoked is refused (401, 403), not replayed.
//  11. With Config.TTL: after it, a reused key runs anew or is refused, per
//     the server's policy, and the report says which.
//  12. With Config.History: a history of concurrent requests under a few
//     keys, with duplicates, lost connections and mismatched bodies, is
//     linearizable against "each key runs once and every answer under it
//     is its first execution's, or a refusal", as Porcupine checks it; a
//     history that is not is saved as Porcupine's HTML visualisation.
//
// Check 2 runs first: its first request, with a fresh key, is the baseline.
// If it does not succeed, the probe sends it again with the same key, then
// with a fresh one, as a client would. A 5xx replayed to the retry fails
// check 7; if none of the three succeeds (say 401, for missing credentials),
// nothing else would mean anything, and every other check is not run
// (Report.Outcome is OutcomeNotRun unless check 7 failed). Checks 6, 7 and
// 12 run last: 6 reads the replays every other check received, 7 the 5xx
// they met, and 12's many requests must not crowd the others.
//
// Each check is one row of the table in checks.go (its number, name, title,
// source, the checks it runs after, the option it needs) and one file,
// check_*.go, with its run function, or its Case (check 4's two halves are
// written as cases); Run walks the table, in the order the rows'
// dependencies allow, and reports in the table's order. A check whose
// option was not given is not applicable without sending anything; one
// that cannot finish is an error that keeps the evidence it has.
//
// # Cases of one's own, and the draft's
//
// A rule specific to an API is a Case: requests sent in order, each with
// what its answer must be, and how much the effect counter must grow.
//
//	idemprobe.Case{
//		Name:  "refund-once",
//		Title: "a refund retried is refunded once",
//		Steps: []idemprobe.Step{
//			{Name: "first", Body: `{"payment":"pay_1","amount":{{n}}}`, Want: idemprobe.Want{Status: []int{201}}},
//			{Name: "retry", Body: `{"payment":"pay_1","amount":{{n}}}`, Want: idemprobe.Want{Same: "first"}},
//			{Name: "in-flight", Key: "b", Slow: true, Background: true},
//			{Name: "dup", Key: "b", Want: idemprobe.Want{Conflict: true}},
//		},
//		Effect: 2,
//	}
//
// A step names its key (steps of a case share one fresh key unless they
// name others), may send it raw (RawKey: `"{{key}}"`, a structured-field
// string), leave it out (NoKey), vary the body (OtherBody), send copies at
// once (Copies), be sent in the background while the next step goes
// (Background, with Slow), or hang up as its answer arrives (HangUp); its
// Want names the statuses accepted, an earlier step whose answer it must
// repeat (Same) or must not (Other), a replay mark, headers, or the answer
// to a duplicate in flight (Conflict). Config.Cases run after the probe's
// checks (but 6, 7 and 12, which also judge what the cases met), numbered
// from 13 on, each a subtest of Test.
//
// DraftCases returns the draft's core behaviours in this form, each citing
// its section of -07: a retry gets the completed result (§2.6), a retry in
// flight a conflict (§2.6, §2.7), a missing key 400 (§2.7), a key reused
// with another payload 422 (§2.2, §2.4, §2.7), a corrected retry the first
// result (§2.7), a structured-field string key is honoured (§2.1), an
// invalid key is refused before anything runs (§2.1, §5), and another
// client's request under the same key is not given the first's answer
// (§5).
//
// # Telling executions apart
//
// From outside, "it ran once" is told by the answers: the top-level "id" of
// a JSON body, or else the Location header. With Config.CountURL the probe
// also reads the effect itself before and after each check (a GET answering a
// JSON list, an object whose "data" is a list, or a number) and requires it
// to grow by exactly one per operation, and not at all for a refused one.
// Without an id, a Location or a count, check 5 can only pass on an
// answer marked as a replay (Config.ReplayHeader: true), and says so
// otherwise.
//
// # Bodies
//
// Config.Body is a template: each {{n}} becomes a counter, one value per
// logical operation (its duplicates repeat it), for APIs that refuse two
// operations with the same content. Check 3 needs another body for the same
// key: the next {{n}} where the template has one, else a JSON object with one
// more field ("idem_probe_variant"), else the body with a newline added; with
// no body at all check 3 is not applicable.
//
// # Safety
//
// The probe never sends more than Config.MaxRequests (200, plus the
// history's) requests in all, count reads included; a check that would go beyond stops with an error line.
// The whole probe ends within Config.Timeout (60s). A target that is not
// loopback (127.0.0.0/8, ::1, localhost, after resolving the name) is refused
// with ErrRemote unless Config.AllowRemote, and every connection's address is
// checked again when it is dialled. The report never shows a credential:
// Authorization (as "Bearer xxxxx"), Proxy-Authorization, Cookie and every
// header in Config.SecretHeaders are hidden, and a Set-Cookie answered shows
// only the cookie's name.
package idemprobe
