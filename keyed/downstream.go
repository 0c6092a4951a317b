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
// The key is a digest (SHA-256, base64url) of the execution's scope and
// key and the call's name: it reveals neither, and is 45 characters of
// visible ASCII, a valid key for idemhttp, idemgrpc and most APIs that
// take one.
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
	field(string(ex.Scope))
	field(string(ex.Key))
	field(name)
	for _, p := range parts {
		field(p)
	}
	sum := sha256.Sum256(buf)
	return "idg1_" + base64.RawURLEncoding.EncodeToString(sum[:])
}
