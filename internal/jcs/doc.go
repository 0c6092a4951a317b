// Package jcs canonicalises JSON text as RFC 8785 (the JSON
// Canonicalization Scheme) says: members sorted by name compared as UTF-16
// code units, no insignificant white space, minimal string escaping, and
// numbers written as ECMAScript writes them. Two texts that mean the same
// JSON value canonicalise to the same bytes, which is what an idempotency
// fingerprint needs: a retry whose body differs only in key order or white
// space is the same request.
//
// It is a parser of its own, not encoding/json's, because RFC 8785 is
// stricter than encoding/json (invalid UTF-8, lone surrogates, duplicate
// member names and numbers beyond a double are refused, with the offset)
// and because it must not build a map of the body: it sorts the members it
// parsed, in place. idem.CanonicalJSON is its face in the vocabulary.
//
// Its tests compare it with the RFC's examples and with ECMAScript's
// number formatting, and FuzzCanonicalJSON (seed corpus in
// testdata/fuzz) checks it against encoding/json on any input.
package jcs
