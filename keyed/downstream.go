package keyed

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
)

// DownstreamKey returns the idempotency key that ex sends with its call
// named name (and parts, when one name covers several calls: "reserve"
// and a line item's SKU, say) to another service. Every execution of one
// logical request (a retry after a transient failure, a takeover after a
// crash, a Completer's resume, on any replica, on any face) gets the same
// key for the same name, so the service called replays what an earlier
// execution asked of it rather than run it again, while two calls with
// different names get different keys.
//
// Name the call by what it does ("charge", "notify-ledger"), never by the
// order calls are made in: a handler that makes several calls at once
// (goroutines) starts them in an order that differs from one execution to
// the next, and a key numbered by arrival would then name another call
// the second time. Names are compared as they are, part by part: ("a",
// "bc") and ("ab", "c") are different calls.
//
// The key is a digest (SHA-256, base64url) of the request's scope, the
// key its client sent and the call's name (see downstreamSeed): it is the
// same before and after the store's keys are sealed (`idem keys seal`)
// or Config.KeySecret changes, and it is 45 characters of visible ASCII, a
// valid key for idemhttp, idemgrpc and most APIs that take one. It
// reveals neither the scope nor the key, but whoever can guess a client's
// key (a short or predictable one) can test the guess against it.
func (ex Execution) DownstreamKey(name string, parts ...string) string {
	return downstreamKey(ex, name, parts)
}

// DownstreamKey returns ExecutionFromContext(ctx).DownstreamKey(name,
// parts...), and false when ctx is no execution's context (a request the
// engine does not protect): the caller then has no key to derive from and
// should send a fresh one, or none.
func DownstreamKey(ctx context.Context, name string, parts ...string) (string, bool) {
	ex, ok := ExecutionFromContext(ctx)
	if !ok {
		return "", false
	}
	return downstreamKey(ex, name, parts), true
}

// downstreamKey is the one derivation of the keys an execution passes on:
// every form of them (Execution.DownstreamKey, idemgrpc's numbered keys)
// comes here, so that what a key is derived from is decided once. Each
// field is length-prefixed, so that no two lists of fields encode alike.
func downstreamKey(ex Execution, name string, parts []string) string {
	buf := make([]byte, 0, 128)
	field := func(f string) {
		buf = binary.AppendUvarint(buf, uint64(len(f)))
		buf = append(buf, f...)
	}
	// The request's seed, not the key as the store keeps it: sealing the
	// keys, or a new KeySecret, changes that form, and an execution that
	// goes on after either must send the keys its first one sent.
	seed := ex.seed
	if !ex.hasSeed {
		// An Execution the engine did not make (a test's): its key is
		// the only one known.
		seed = downstreamSeed(ex.Scope, ex.Key)
	}
	field(string(seed[:]))
	field(name)
	for _, p := range parts {
		field(p)
	}
	sum := sha256.Sum256(buf)
	return "idg1_" + base64.RawURLEncoding.EncodeToString(sum[:])
}
