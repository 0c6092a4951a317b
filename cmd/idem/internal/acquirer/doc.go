// Package acquirer is the lab's card network: a second service, run by
// `idem acquirer`, that the payment service charges cards at over HTTP. It
// is what real payment services meet past their own database's edge: a
// call that may take long, fail, or succeed with its answer lost, so that
// the caller cannot tell a charge made from a charge not made.
//
// The acquirer is itself an idem user: POST /v1/charges and POST
// /v1/charges/{id}/refunds require an Idempotency-Key and run behind
// idemhttp's middleware on its own SQLite file, so a caller that retries a
// charge with the same key gets the first charge back and never makes a
// second. Every charge shows the key it was made with, so a check can count
// the charges of one logical payment:
//
//	POST /v1/charges                {amount, currency, reference, description?, metadata?}  201 Charge; 402 for a declined card
//	POST /v1/charges/{id}/refunds   {amount?}                                               201 Refund; 422 past the charge
//	GET  /v1/charges/{id}                                                                   200 Charge
//	GET  /v1/charges?reference=R&limit=N&starting_after=ID                                  200 {"data": [...], "has_more": bool}
//
// A reference starting with "declined_" is a card the network always
// declines (402, kept with its key). With Config.Faults, the Idem-Fault
// header injects a delay, a failure before the commit, or an answer
// dropped after it, and Config.FaultRate injects refusals and dropped
// answers at random (see HeaderFault).
//
// Client is the caller's side, through idemhttp.RoundTripper: a charge is
// sent with the key the caller derives from its own request's key, so
// every retry and every replica sends the same one.
package acquirer
