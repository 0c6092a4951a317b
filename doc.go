// Package idem is the vocabulary of effectively-once effects.
//
// "Exactly-once delivery" is a myth: a sender that gets no acknowledgement
// cannot tell a lost message from a lost acknowledgement, so it retries, and
// retries make duplicates. What is real is at-least-once delivery plus
// de-duplication at the receiver. idem is the receiver's half.
//
// This package holds the types every other idem package speaks, and nothing
// but the standard library:
//
//   - Key: an idempotency key as a client sends it (ParseKey accepts the
//     IETF draft's structured-field string and Stripe's bare token). A
//     key is a bearer of someone's request, so it is never logged as it
//     is (see Keys in logs).
//   - Scope: who owns a key; keys never cross scopes.
//   - Fingerprint: what a request said (method, path, query, body; JSON
//     canonicalised by CanonicalJSON, RFC 8785), so a key reused for a
//     different request is refused.
//   - Store: the heart. Claim a key atomically (exactly one caller wins),
//     Complete it with the answer every duplicate gets, or Release it after a
//     transient failure so a retry runs again. A lease with a fencing Token
//     covers the in-flight state: after a crash the lease ends and a retry
//     takes over; a completion from the old holder is refused.
//   - TxStore: a Store whose records live in the caller's database, so the
//     effect and the key's completion commit in one transaction.
//
// Backends live in their own packages (idemmem, idemsqlite), each passing
// the conformance suite in idemtest. The HTTP middleware is idemhttp; the
// reference payment service, the lab that shows all of this, is payments,
// run by cmd/idem.
//
// # A key's life
//
//	Claim ──► Acquired ──► effect ──► Complete ──► Completed (replayed until ExpiresAt)
//	   │                         └──► Release  ──► gone (a retry runs again)
//	   ├────► InFlight   (another holder; wait and claim again)
//	   ├────► Completed  (replay Record.Response)
//	   └────► Mismatch   (same key, different fingerprint: refuse)
//
// # Keys in logs
//
// A Key logs (Key.LogValue) as "hmac:" and 16 hex characters: 64 bits of an
// HMAC-SHA-256 of the key, enough to correlate the lines about one key and
// useless for finding it. Where the scope is known, KeyDigest digests scope
// and key together, so one key in two tenants logs as two. The HMAC's
// secret is drawn at random once per process, so an unkeyed hash of a
// guessed key matches nothing and one process's digests say nothing about
// another's. To correlate the logs of several replicas, give every one
// the same secret with SetKeyDigestSecret, and keep it secret.
package idem
