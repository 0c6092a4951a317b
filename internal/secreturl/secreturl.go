package secreturl

import (
	"errors"
	"net/url"
	"slices"
	"strings"
)

// Mask is what every secret prints as, as net/url's URL.Redacted prints a
// password.
const Mask = "xxxxx"

// ErrUnparsable is what Redact returns for a URL that net/url does not
// parse. The error does not quote the URL: where a parser gives up, the
// boundaries of its secrets are uncertain too.
var ErrUnparsable = errors.New("the URL does not parse (it is not shown, as it may hold a secret)")

// Redact returns raw with every secret it carries masked, for messages and
// logs: the password of the user-info, the whole user-info of a NATS URL
// (nats://, tls://) that has no password, since NATS takes it for a token,
// and the value of every query parameter whose name says it is secret (see
// the package documentation). The rest is shown as given, the scheme
// lower-cased; a NATS server list (nats://a:4222,nats://b:4222) is
// redacted server by server.
//
// A URL that net/url does not parse is not shown at all: Redact returns
// ErrUnparsable. SQLite names (sqlite:PATH) are file paths, where '%' and
// spaces are ordinary characters, so they are redacted without having to
// parse.
func Redact(raw string) (string, error) {
	if parts, ok := natsServers(raw); ok {
		for i, p := range parts {
			r, err := redactOne(p.url)
			if err != nil {
				return "", err
			}
			parts[i].url = r
		}
		return joinServers(parts), nil
	}
	return redactOne(raw)
}

func redactOne(raw string) (string, error) {
	l := split(raw)
	if l.scheme != "sqlite" {
		if _, err := url.Parse(raw); err != nil {
			return "", ErrUnparsable
		}
	}
	var b strings.Builder
	b.WriteString(l.scheme)
	last := len(l.scheme)
	for _, s := range l.secrets() {
		b.WriteString(raw[last:s.start])
		b.WriteString(Mask)
		last = s.end
	}
	b.WriteString(raw[last:])
	return b.String(), nil
}

// Scrub returns err with every secret of raw masked in its message, for
// errors from drivers and clients that may quote the URL they were given,
// or a part of it. Each secret is masked as it appears in raw, decoded
// (percent-escapes, and '+' as a space in a query) and escaped again the
// ways net/url escapes, so that a client which parsed the URL and printed
// it anew is caught too. Unlike Redact, Scrub finds secrets in a URL that
// does not parse, as far as its shape can be told.
//
// When err's message holds none of them, Scrub returns err itself. Else
// the error it returns has the scrubbed message and wraps err, so that
// errors.Is and errors.As still see the causes; the message of a cause
// taken out that way is not scrubbed.
func Scrub(err error, raw string) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	scrubbed := msg
	for _, s := range secretValues(raw) {
		scrubbed = strings.ReplaceAll(scrubbed, s, Mask)
	}
	if scrubbed == msg {
		return err
	}
	return &scrubbedError{msg: scrubbed, err: err}
}

// scrubbedError is an error with its message scrubbed of secrets.
type scrubbedError struct {
	msg string
	err error
}

func (e *scrubbedError) Error() string { return e.msg }
func (e *scrubbedError) Unwrap() error { return e.err }

// secretValues returns the secrets of raw in every spelling Scrub masks,
// longest first, so that a secret containing another is masked whole.
func secretValues(raw string) []string {
	urls := []string{raw}
	if parts, ok := natsServers(raw); ok {
		urls = urls[:0]
		for _, p := range parts {
			urls = append(urls, p.url)
		}
	}
	var out []string
	add := func(s string) {
		if s != "" && !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	for _, u := range urls {
		l := split(u)
		for _, s := range l.secrets() {
			v := u[s.start:s.end]
			add(v)
			for _, dec := range decodings(v, s.inQuery) {
				add(dec)
				add(url.QueryEscape(dec))
				add(url.PathEscape(dec))
				add(strings.TrimPrefix(url.UserPassword("", dec).String(), ":"))
			}
		}
	}
	slices.SortStableFunc(out, func(a, b string) int { return len(b) - len(a) })
	return out
}

// decodings returns v percent-decoded the ways a client may decode it.
func decodings(v string, inQuery bool) []string {
	var out []string
	if d, err := url.PathUnescape(v); err == nil {
		out = append(out, d)
	}
	if inQuery {
		if d, err := url.QueryUnescape(v); err == nil {
			out = append(out, d)
		}
	}
	return out
}

// span is raw[start:end], a secret of a URL.
type span struct {
	start, end int
	inQuery    bool
}

// layout is where the parts of a URL lie in its text, found the way
// net/url's parser finds them: the fragment starts at the first '#', the
// query at the first '?' before it, the authority follows "scheme://" up to
// the next '/', and its user-info ends at the last '@'.
type layout struct {
	raw    string
	scheme string // lower-cased; empty when raw has none
	// userinfo is the user-info, without its '@'; ok is false when raw has
	// no user-info at all.
	userinfo    span
	hasUserinfo bool
	query       span
	hasQuery    bool
}

func split(raw string) layout {
	l := layout{raw: raw}
	end := len(raw)
	if i := strings.IndexByte(raw, '#'); i >= 0 {
		end = i
	}
	rest := 0
	if s, ok := schemeOf(raw[:end]); ok {
		l.scheme = strings.ToLower(s)
		rest = len(s) + 1
	}
	if i := strings.IndexByte(raw[rest:end], '?'); i >= 0 {
		l.query = span{start: rest + i + 1, end: end, inQuery: true}
		l.hasQuery = true
		end = rest + i
	}
	if strings.HasPrefix(raw[rest:end], "//") {
		auth := rest + 2
		authEnd := end
		if i := strings.IndexByte(raw[auth:end], '/'); i >= 0 {
			authEnd = auth + i
		}
		if i := strings.LastIndexByte(raw[auth:authEnd], '@'); i >= 0 {
			l.userinfo = span{start: auth, end: auth + i}
			l.hasUserinfo = true
		}
	}
	return l
}

// schemeOf returns the scheme of raw, as net/url's getScheme tells it: a
// letter, then letters, digits, '+', '-' or '.', up to the first ':'.
func schemeOf(raw string) (string, bool) {
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		switch {
		case 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z':
		case '0' <= c && c <= '9' || c == '+' || c == '-' || c == '.':
			if i == 0 {
				return "", false
			}
		case c == ':':
			if i == 0 {
				return "", false
			}
			return raw[:i], true
		default:
			return "", false
		}
	}
	return "", false
}

// tokenSchemes are the schemes whose user-info, when it has no password, is
// a secret token (nats.go reads nats://TOKEN@host so).
var tokenSchemes = map[string]bool{"nats": true, "tls": true}

// secrets returns the spans of raw's secrets, in order.
func (l layout) secrets() []span {
	var out []span
	if l.hasUserinfo {
		ui := l.raw[l.userinfo.start:l.userinfo.end]
		if i := strings.IndexByte(ui, ':'); i >= 0 {
			// As URL.Redacted does, even an empty password is masked: the
			// text shows only that there is one.
			out = append(out, span{start: l.userinfo.start + i + 1, end: l.userinfo.end})
		} else if tokenSchemes[l.scheme] && ui != "" {
			out = append(out, l.userinfo)
		}
	}
	if l.hasQuery {
		out = append(out, querySecrets(l.raw, l.query)...)
	}
	return out
}

// querySecrets returns the spans of the secret values of the query q.
//
// Pairs are separated by '&'. A ';' inside a pair makes net/url drop the
// pair, but other parsers take ';' for a separator, so each ';'-separated
// part is looked at too, and from the first one whose name is secret to
// the end of the pair everything is masked.
func querySecrets(raw string, q span) []span {
	var out []span
	for start := q.start; start <= q.end; {
		end := q.end
		if i := strings.IndexByte(raw[start:q.end], '&'); i >= 0 {
			end = start + i
		}
		for part := start; part < end; {
			partEnd := end
			if i := strings.IndexByte(raw[part:end], ';'); i >= 0 {
				partEnd = part + i
			}
			if eq := strings.IndexByte(raw[part:partEnd], '='); eq >= 0 && secretName(raw[part:part+eq]) {
				out = append(out, span{start: part + eq + 1, end: end, inQuery: true})
				break
			}
			part = partEnd + 1
		}
		start = end + 1
	}
	return out
}

// secretName reports whether a query parameter of this (raw) name carries
// a secret. A name that does not decode is taken to: what a client makes
// of it cannot be told.
func secretName(raw string) bool {
	name, err := url.QueryUnescape(raw)
	if err != nil {
		return true
	}
	name = strings.ReplaceAll(strings.ToLower(name), "-", "_")
	switch name {
	case "key", "apikey", "api_key":
		return true
	}
	return strings.Contains(name, "pass") || strings.Contains(name, "secret") || strings.Contains(name, "token")
}

// server is one URL of a NATS server list, with the spaces around it.
type server struct {
	before, url, after string
	// prefixed is set when the URL had no scheme and got the list's own for
	// redaction; it is taken off again when shown.
	prefixed string
}

// natsServers splits a NATS server list (nats.go takes a comma-separated
// list of URLs; one without a scheme takes the first one's). ok is false
// for a URL that is not a list, or not a NATS one.
func natsServers(raw string) ([]server, bool) {
	s, _ := schemeOf(raw)
	scheme := strings.ToLower(s)
	if !tokenSchemes[scheme] || !strings.Contains(raw, ",") {
		return nil, false
	}
	var out []server
	for _, p := range strings.Split(raw, ",") {
		trimmed := strings.TrimSpace(p)
		lead := p[:strings.Index(p, trimmed)]
		sv := server{before: lead, url: trimmed, after: p[len(lead)+len(trimmed):]}
		if trimmed != "" && !strings.Contains(trimmed, "://") {
			sv.prefixed = scheme + "://"
			sv.url = sv.prefixed + trimmed
		}
		out = append(out, sv)
	}
	return out, true
}

func joinServers(parts []server) string {
	var b strings.Builder
	for i, p := range parts {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(p.before)
		u := p.url
		if p.prefixed != "" {
			u = strings.TrimPrefix(u, p.prefixed)
		}
		b.WriteString(u)
		b.WriteString(p.after)
	}
	return b.String()
}
