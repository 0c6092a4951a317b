package idem

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"hash"
	"mime"
	"net/url"
	"strings"
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
	h := sha256.New()
	field(h, []byte(FingerprintVersion))
	field(h, []byte(method)) // methods are case-sensitive (RFC 9110, 9.1)
	field(h, []byte(path))
	field(h, []byte(canonicalQuery(rawQuery)))
	if isJSONType(contentType) {
		if canon, err := CanonicalJSON(body); err == nil {
			field(h, []byte("json"))
			field(h, canon)
			return Fingerprint(FingerprintVersion + ":" + hex.EncodeToString(h.Sum(nil)))
		}
	}
	field(h, []byte("bytes"))
	field(h, body)
	return Fingerprint(FingerprintVersion + ":" + hex.EncodeToString(h.Sum(nil)))
}

func field(h hash.Hash, b []byte) {
	var n [binary.MaxVarintLen64]byte
	h.Write(n[:binary.PutUvarint(n[:], uint64(len(b)))])
	h.Write(b)
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
	if strings.TrimSpace(contentType) == "" {
		return true
	}
	mt, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return false
	}
	return mt == "application/json" || strings.HasSuffix(mt, "+json")
}
