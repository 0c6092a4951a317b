package keyed

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"fmt"

	"github.com/idem-go/idem"
)

// A recovery point's data is what an execution's next phases need: often
// the request itself (an amount, a description, the client's own words).
// The engine keeps it as it keeps answers: in an envelope that also
// carries the request's downstream seed (see DownstreamKey), sealed with
// Config.BodyKeys when they are set, and bound to the record's scope, key
// and the point's name, so that data moved to another record, or to
// another point, does not open there.

// pointMagic starts the envelope of a point's data, before any sealing:
// then 32 bytes of downstream seed, then the application's data. It begins
// with a NUL byte, as sealedBodyMagic does, so that data saved before the
// envelope existed is told apart.
const pointMagic = "\x00idem-rp1\x00"

// pointOverhead is the most the envelope and its sealing add to a point's
// data: the envelope, and the sealing's magic, key ID, nonce and tag.
const pointOverhead = len(pointMagic) + sha256.Size + len(sealedBodyMagic) + 1 + 32 + 12 + 16

// MaxRecoveryDataLen is the longest recovery point data SaveRecovery
// accepts: idem.MaxRecoveryDataLen less what the engine adds to it.
const MaxRecoveryDataLen = idem.MaxRecoveryDataLen - pointOverhead

// downstreamSeed is what every downstream key of one logical request is
// derived from: a SHA-256 of its scope and of its key as the client sent
// it. Neither changes when the store's keys are sealed (`idem keys seal`),
// when Config.KeySecret is turned on or rotated, or when the body keys
// are: a retry after any of them, or a Completer going on from a point
// saved before, sends the same keys downstream. The engine keeps the seed
// in every recovery point it saves, since a Completer never sees the
// client's key.
func downstreamSeed(scope idem.Scope, clientKey idem.Key) [sha256.Size]byte {
	const domain = "idem downstream seed v1\x00"
	in := make([]byte, 0, len(domain)+binary.MaxVarintLen64+len(scope)+len(clientKey))
	in = append(in, domain...)
	in = binary.AppendUvarint(in, uint64(len(scope)))
	in = append(in, scope...)
	in = append(in, clientKey...)
	return sha256.Sum256(in)
}

// pointAD is what a sealed point's data is bound to: its record's scope
// and key, as a kept body is, and the point's name. The NUL that keys
// never contain keeps it apart from any body's.
func pointAD(scope idem.Scope, key idem.Key, name string) []byte {
	return append(append(bodyAD(scope, key), "\x00rp\x00"...), name...)
}

// wrapPoint is what the store keeps of rp, saved by the execution whose
// downstream seed is seed, for the record (scope, key): its data in the
// envelope, sealed with bodies when they are set.
func wrapPoint(bodies *bodySealer, scope idem.Scope, key idem.Key, seed [sha256.Size]byte, rp idem.RecoveryPoint) (idem.RecoveryPoint, error) {
	if len(rp.Data) > MaxRecoveryDataLen {
		return idem.RecoveryPoint{}, &idem.ArgumentError{Field: "RecoveryPoint.Data",
			Reason: fmt.Sprintf("must be at most %d bytes (keyed.MaxRecoveryDataLen)", MaxRecoveryDataLen)}
	}
	env := make([]byte, 0, len(pointMagic)+len(seed)+len(rp.Data))
	env = append(env, pointMagic...)
	env = append(env, seed[:]...)
	env = append(env, rp.Data...)
	rp.Data = env
	if bodies != nil {
		sealed, err := bodies.sealAD(pointAD(scope, key, rp.Name), env)
		if err != nil {
			return idem.RecoveryPoint{}, fmt.Errorf("sealing the recovery point: %w", err)
		}
		rp.Data = sealed
	}
	return rp, nil
}

// unwrapPoint returns rp, as the store keeps it for the record (scope,
// key), with its data as the application saved it, and the downstream
// seed it carries. Data saved before the envelope existed is returned as
// it is, with the seed of the record's key as the store keeps it (which is
// the client's, unless the keys were sealed since). An error wraps
// ErrBodyUnreadable: the data is sealed and bodies do not open it.
func unwrapPoint(bodies *bodySealer, scope idem.Scope, key idem.Key, rp idem.RecoveryPoint) (idem.RecoveryPoint, [sha256.Size]byte, error) {
	if rp.IsZero() {
		return rp, [sha256.Size]byte{}, nil
	}
	data, _, err := bodies.openAD(pointAD(scope, key, rp.Name), rp.Data)
	if err != nil {
		return idem.RecoveryPoint{}, [sha256.Size]byte{}, fmt.Errorf("recovery point %q: %w", rp.Name, err)
	}
	if !bytes.HasPrefix(data, []byte(pointMagic)) || len(data) < len(pointMagic)+sha256.Size {
		rp.Data = data
		return rp, downstreamSeed(scope, key), nil
	}
	var seed [sha256.Size]byte
	copy(seed[:], data[len(pointMagic):])
	rp.Data = data[len(pointMagic)+sha256.Size:]
	return rp, seed, nil
}

// OpenPoint returns a kept recovery point's data as the application saved
// it (SaveRecovery): out of the engine's envelope, and opened with keys
// when it was sealed with one of them (Config.BodyKeys). scope and key are
// the record's, as the store keeps them; name is the point's. Tools that
// read points outside an execution, such as `idem reconcile`, use it; an
// error wraps ErrBodyUnreadable, or says what is wrong with keys.
func OpenPoint(keys []BodyKey, scope idem.Scope, key idem.Key, name string, data []byte) ([]byte, error) {
	s, err := newBodySealer(keys)
	if err != nil {
		return nil, err
	}
	rp, _, err := unwrapPoint(s, scope, key, idem.RecoveryPoint{Name: name, Data: data})
	if err != nil {
		return nil, err
	}
	return rp.Data, nil
}

// ResealPoint returns the recovery point data a store keeps under
// (scope, oldKey), made ready to be kept under (scope, newKey): opened
// with keys, put in the engine's envelope when it was saved before the
// envelope existed (with the downstream seed of oldKey, which must then be
// the client's key as the execution that saved it saw it), and sealed
// with the first of keys, when there are any, for newKey. It is what
// `idem keys seal` does to each point as it rewrites its key, and, with
// newKey equal to oldKey, what moves a point to the newest body key, or
// seals one saved in clear. An error wraps ErrBodyUnreadable, or says what
// is wrong with keys.
func ResealPoint(keys []BodyKey, scope idem.Scope, oldKey, newKey idem.Key, name string, data []byte) ([]byte, error) {
	s, err := newBodySealer(keys)
	if err != nil {
		return nil, err
	}
	rp, seed, err := unwrapPoint(s, scope, oldKey, idem.RecoveryPoint{Name: name, Data: data})
	if err != nil {
		return nil, err
	}
	out, err := wrapPoint(s, scope, newKey, seed, rp)
	if err != nil {
		return nil, err
	}
	return out.Data, nil
}

// ResealBody returns a kept response body a store keeps under (scope,
// oldKey), made ready to be kept under (scope, newKey): opened with keys
// when it is sealed, and sealed with the first of keys, when there are
// any. `idem keys seal` does it to every kept body as it rewrites its key,
// since a sealed body is bound to the key it was kept under. An error
// wraps ErrBodyUnreadable, or says what is wrong with keys.
func ResealBody(keys []BodyKey, scope idem.Scope, oldKey, newKey idem.Key, body []byte) ([]byte, error) {
	s, err := newBodySealer(keys)
	if err != nil {
		return nil, err
	}
	plain, _, err := s.open(scope, oldKey, body)
	if err != nil || s == nil || len(plain) == 0 {
		return plain, err
	}
	return s.seal(scope, newKey, plain)
}

// IsSealedData reports whether b, a kept body or a recovery point's data
// as a store keeps it, is sealed with a body key (Config.BodyKeys).
func IsSealedData(b []byte) bool { return bytes.HasPrefix(b, []byte(sealedBodyMagic)) }
