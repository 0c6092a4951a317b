// Package payments is the reference payment service: the lab that shows
// why at-least-once delivery needs de-duplication on the receiving side, and
// the proof that idem's toolkit is usable by an ordinary service.
//
// # The problem it demonstrates
//
// A customer presses "Pay" and the screen freezes. Did the payment go
// through? The client cannot tell a lost request from a lost
// acknowledgement, so it does the only safe thing for not losing the
// payment: it sends the request again. If the server processes both, the
// customer is charged twice.
//
// The service can be run both ways:
//
//   - Unsafe mode (Config.Unsafe) is the "before". The Idempotency-Key header
//     is ignored, every response carries "Idem-Mode: unsafe", and every
//     duplicate is a new charge: a frozen screen and a second press, a
//     client library that retries on a timeout, or a lost acknowledgement
//     followed by a retry each charge the account again. The balance never
//     goes negative (the debit is a conditional UPDATE), so what goes wrong
//     is precisely the double charge, not corruption.
//   - Protected mode (the default) is the "after". POST /v1/payments and
//     POST /v1/accounts/{id}/deposits require an Idempotency-Key; the key is
//     claimed atomically (scoped to the tenant), the payment and the stored
//     answer commit in one SQLite transaction, and every duplicate, however
//     concurrent, gets the first answer replayed with
//     "Idempotent-Replayed: true". The same key with a different body is
//     refused with 422; a key is forgotten after Config.KeyTTL (24 hours by
//     default) and a background purger deletes it.
//
// # Failures are classified
//
// Deterministic answers are stored and replayed: 201, 402 insufficient
// funds (even if a later deposit would make the payment possible: retrying
// a key repeats its answer, a new attempt needs a new key), 404 unknown
// account. Transient failures are not stored: a 503 rolls the work back and
// releases the key, so the retry really runs. A 400 (malformed JSON, an
// amount of 0, the wrong currency) is not stored either: nothing ran, so
// the corrected request may reuse its key.
//
// # Faults on demand
//
// With Config.Faults on, a request may carry an Idem-Fault header (see
// HeaderFault) to make the failures of the story happen when a test or a
// demonstration wants them:
//
//	Idem-Fault: delay=300ms            the frozen screen: the request stays in flight
//	Idem-Fault: drop-after-commit      the lost acknowledgement: charged, no answer
//	Idem-Fault: fail-before-commit     a transient failure: 503, nothing charged
//
// Send the same payment twice with delay=1s: unsafe mode charges twice,
// protected mode charges once and answers both with the same payment. Send
// it with drop-after-commit and retry: unsafe mode charges again, protected
// mode replays the payment the client never saw.
//
// # API
//
// Every /v1 route needs "Authorization: Bearer <api key>"; the key names
// the tenant (Config.APIKeys, ParseAPIKeys). Amounts are integers of minor
// units; currencies are three upper-case letters.
//
//	POST /v1/accounts                 {"balance":10000,"currency":"KRW"}       201 account
//	GET  /v1/accounts/{id}                                                     200 account
//	POST /v1/accounts/{id}/deposits   {"amount":100}                           201 deposit (key required)
//	POST /v1/payments                 {"account_id","amount","currency","description"?}
//	                                                                           201 payment (key required)
//	GET  /v1/payments/{id}                                                     200 payment
//	GET  /v1/accounts/{id}/payments   ?limit=1..1000 (default 100)             200 {"data":[…],"has_more"} newest first
//	GET  /healthz, GET /metrics
//
// Every error is an RFC 9457 application/problem+json document whose type is
// urn:idem:problem:<slug>, for example urn:idem:problem:insufficient-funds.
// Another tenant's account or payment is indistinguishable from a missing
// one (404).
//
// /healthz and /metrics need no API key, so probes and Prometheus can reach
// them; expose them only where they belong.
//
// # Metrics
//
// /metrics serves Config.Registry: idem_http_requests_total{middleware,
// outcome} for the three idempotency middlewares (middleware="payments",
// "deposits", "accounts"; outcome executed, replayed, mismatch, …), and the
// committed totals read from the database, payments_created_total,
// payments_deposits_total and payments_accounts. In unsafe mode, sending N
// duplicates and watching payments_created_total grow by N is the lab's
// "before"; in protected mode it grows by one and outcome="replayed" by N-1.
//
// # Storage
//
// The service keeps its accounts, payments and deposits in the same
// idemsqlite database as the idempotency keys, with its own embedded
// migrations. Every write goes through idemsqlite.DB.WithTx with the
// request's context: under the idempotency middleware that joins the key's
// transaction, so "charged but no answer stored" and "answer stored but not
// charged" cannot happen; in unsafe mode the same call commits on its own.
package payments
