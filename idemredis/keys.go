package idemredis

import (
	"strings"

	"github.com/idem-go/idem"
)

// emptyScopeTag is the hash tag of the empty scope. Redis Cluster ignores an
// empty tag ("{}") and hashes the whole key instead, which would scatter the
// global scope's keys over every slot. A lone '%' can never come out of
// escapeScope for a non-empty scope (there every '%' starts a "%XX"
// escape), so it names the empty scope without colliding with any other.
const emptyScopeTag = "%"

// scopeEscaper percent-encodes the characters that would change where the
// hash tag ends ('}'), make the tag hard to read ('{'), or make the encoding
// ambiguous ('%').
var scopeEscaper = strings.NewReplacer("%", "%25", "{", "%7B", "}", "%7D")

// hashTag returns the Redis Cluster hash tag for scope, without braces. It
// is never empty and never contains '}', so the tag always ends at the
// brace the store put after it.
func hashTag(scope idem.Scope) string {
	if scope == "" {
		return emptyScopeTag
	}
	return scopeEscaper.Replace(string(scope))
}

// recordKey is the Redis key of one idempotency record:
// "<prefix>:{<tag>}:<key>". The prefix holds no braces (New checks it), so
// the first '{' is the store's and the tag decides the slot.
func recordKey(prefix string, scope idem.Scope, key idem.Key) string {
	return prefix + ":{" + hashTag(scope) + "}:" + string(key)
}

// recordPattern is the SCAN MATCH pattern of every record under prefix.
func recordPattern(prefix string) string {
	return globEscaper.Replace(prefix) + ":{*}:*"
}

// globEscaper escapes the characters Redis glob patterns give a meaning to.
var globEscaper = strings.NewReplacer(`\`, `\\`, "*", `\*`, "?", `\?`, "[", `\[`, "]", `\]`)
