// Package servemux shows the idemhttp middleware on net/http's ServeMux:
// POST /orders is protected, so the same Idempotency-Key sent twice runs
// the handler once, the second answer is the first one replayed with
// Idempotent-Replayed: true, and the same key with another body gets 422.
//
// The whole program is in Example; it keeps keys in memory (idemmem), which
// a single process that may forget them on restart can afford. A durable
// store is one line away: see package sqltx.
package servemux
