package idem

import "github.com/idem-go/idem/internal/jcs"

// ErrNotCanonicalizable is matched (with errors.Is) by every error
// CanonicalJSON returns: the input is not JSON, or is JSON that RFC 8785
// cannot canonicalise. Callers that only want a stable form of "the same
// body" fall back to the raw bytes, as NewFingerprint does.
var ErrNotCanonicalizable = jcs.ErrNotCanonicalizable

// MaxJSONDepth is the deepest nesting of arrays and objects CanonicalJSON
// accepts, so that a hostile body such as a million '[' cannot exhaust the
// stack.
const MaxJSONDepth = jcs.MaxDepth

// CanonicalJSON returns the RFC 8785 (JSON Canonicalization Scheme, JCS)
// form of the JSON text b: no insignificant white space, object members
// sorted by name compared as UTF-16 code units, strings with the minimal
// escaping of RFC 8785, and numbers written as ECMAScript writes them. It
// refuses what RFC 8785 cannot canonicalise (invalid UTF-8, lone
// surrogates, duplicate member names, numbers beyond a double, nesting past
// MaxJSONDepth) with an error matching ErrNotCanonicalizable that says
// where. The canonicaliser itself is internal/jcs, apart from the
// vocabulary; its golden and fuzz tests live there.
func CanonicalJSON(b []byte) ([]byte, error) { return jcs.Canonical(b) }
