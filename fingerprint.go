package idem

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"mime"
	"net/url"
	"strings"

	"github.com/idem-go/idem/internal/jcs"
)

// Fingerprint identifies the content of a request, so that a key reused
// with a different request can be refused. It is versioned ("v1:" followed
// by a hex SHA-256), so the recipe can change without old records matching
// new requests by accident.
type Fingerprint string

// FingerprintVersion is the prefix of fingerprints made by NewFingerprint.
const FingerprintVersion = "v1"

// NewFingerprint returns the fingerprint of a request: SHA-256 over its
// method, path, query and body, each length-prefixed so that no two
// different requests feed the hash the same bytes.
//
// The query is canonicalised (parameters sorted by name, the order of
// repeated values kept). A body whose Content-Type is JSON
// (application/json, anything +json) or absent, and that is valid I-JSON, is
// canonicalised with CanonicalJSON (RFC 8785) first, so key order and white
// space do not matter and a client that re-serialises its body is not
// refused. Any other body is hashed as bytes.
func NewFingerprint(method, path, rawQuery, contentType string, body []byte) Fingerprint {
	// One buffer fed to sha256.Sum256, rather than a hash.Hash written
	// field by field: the fields are small, and this costs one allocation
	// (none for the hash state) where the other cost one per field.
	var stack [512]byte
	buf := appendField(stack[:0], FingerprintVersion)
	buf = appendField(buf, method) // methods are case-sensitive (RFC 9110, 9.1)
	buf = appendField(buf, path)
	buf = appendField(buf, canonicalQuery(rawQuery))
	kind, content := "bytes", body
	if isJSONType(contentType) {
		// The canonical form goes to a buffer on the stack, which a
		// small body fits: no allocation for it.
		var canonStack [512]byte
		if canon, err := jcs.AppendCanonical(canonStack[:0], body); err == nil {
			kind, content = "json", canon
		}
	}
	buf = appendField(buf, kind)
	buf = binary.AppendUvarint(buf, uint64(len(content)))
	buf = append(buf, content...)
	sum := sha256.Sum256(buf)

	var out [len(FingerprintVersion) + 1 + 2*sha256.Size]byte
	n := copy(out[:], FingerprintVersion+":")
	hex.Encode(out[n:], sum[:])
	return Fingerprint(out[:])
}

// appendField appends s to buf after its length, so that no two sequences
// of fields give the same bytes.
func appendField(buf []byte, s string) []byte {
	buf = binary.AppendUvarint(buf, uint64(len(s)))
	return append(buf, s...)
}

func canonicalQuery(raw string) string {
	if raw == "" {
		return ""
	}
	v, err := url.ParseQuery(raw)
	if err != nil {
		return raw
	}
	return v.Encode()
}

func isJSONType(contentType string) bool {
	switch contentType {
	case "application/json", "application/json; charset=utf-8", "application/json;charset=utf-8":
		// The usual values, spared mime.ParseMediaType's allocations.
		return true
	}
	if strings.TrimSpace(contentType) == "" {
		return true
	}
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return false
	}
	return mt == "application/json" || strings.HasSuffix(mt, "+json")
}
