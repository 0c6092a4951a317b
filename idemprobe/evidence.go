package idemprobe

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"unicode/utf8"
)

// record adds exchanges to the check's evidence, in the order they
// happened.
func (c *Check) record(exs ...Exchange) { c.Evidence = append(c.Evidence, exs...) }

// answerHeaders are the response headers the report keeps, besides
// Config.ReplayHeader.
var answerHeaders = []string{"Content-Type", "Location", "Retry-After", "Set-Cookie"}

// shortBody is how many characters of a body the report shows.
const shortBody = 200

// describeRequest is req as the report shows it, its secrets hidden.
func (p *prober) describeRequest(req *http.Request, body string) *Sent {
	s := &Sent{Method: req.Method, URL: req.URL.Redacted(), Body: shorten([]byte(body)), Header: map[string]string{}}
	for name, vs := range req.Header {
		v := strings.Join(vs, ", ")
		if p.secret[http.CanonicalHeaderKey(name)] {
			v = redact(name, v)
		}
		s.Header[name] = v
	}
	return s
}

// redact hides a secret header's value; an Authorization keeps its scheme,
// which says what kind of credential was sent without giving it away.
func redact(name, v string) string {
	if strings.HasSuffix(http.CanonicalHeaderKey(name), "Authorization") {
		if scheme, _, ok := strings.Cut(strings.TrimSpace(v), " "); ok {
			return scheme + " xxxxx"
		}
	}
	return "xxxxx"
}

// describeResponse is resp as the report shows it, body the whole of what
// was read of it.
func (p *prober) describeResponse(resp *http.Response, body []byte) *Answer {
	a := &Answer{Status: resp.StatusCode, Header: map[string]string{}, Body: shorten(body), body: body, header: resp.Header}
	for _, name := range append(answerHeaders, p.cfg.ReplayHeader) {
		vs := resp.Header.Values(name)
		if len(vs) == 0 {
			continue
		}
		if name == "Set-Cookie" {
			// Cookies are credentials: their names are evidence enough.
			for i, v := range vs {
				cookie, _, _ := strings.Cut(v, "=")
				vs[i] = strings.TrimSpace(cookie) + "=xxxxx"
			}
		}
		a.Header[name] = strings.Join(vs, ", ")
	}
	a.ID = answerID(body, resp.Header.Get("Location"))
	if strings.EqualFold(strings.TrimSpace(resp.Header.Get(p.cfg.ReplayHeader)), "true") {
		a.replayHeader = http.CanonicalHeaderKey(p.cfg.ReplayHeader)
	}
	return a
}

// answerID finds the id an answer names: a top-level "id" of a JSON object,
// or else the Location header.
func answerID(body []byte, location string) string {
	var v struct {
		ID any `json:"id"`
	}
	d := json.NewDecoder(bytes.NewReader(body))
	d.UseNumber()
	if d.Decode(&v) == nil {
		switch id := v.ID.(type) {
		case string:
			if id != "" {
				return id
			}
		case json.Number:
			return id.String()
		}
	}
	return location
}

// shorten makes a body one short line.
func shorten(b []byte) string {
	s := strings.Join(strings.Fields(string(b)), " ")
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "?")
	}
	if utf8.RuneCountInString(s) <= shortBody {
		return s
	}
	r := []rune(s)
	return string(r[:shortBody]) + "…"
}

// noteReplay keeps a for check 6 if it is marked as a replay.
func (p *prober) noteReplay(a *Answer) {
	if a != nil && a.replayed() {
		p.replays = append(p.replays, a)
	}
}

// Comparing and describing answers, for the checks' verdicts.

// sameBody compares two bodies as JSON when both are, else byte for byte.
func sameBody(a, b []byte) bool {
	if bytes.Equal(a, b) {
		return true
	}
	var va, vb any
	if json.Unmarshal(a, &va) != nil || json.Unmarshal(b, &vb) != nil {
		return false
	}
	ca, _ := json.Marshal(va)
	cb, _ := json.Marshal(vb)
	return bytes.Equal(ca, cb)
}

// sameAnswer reports whether b is a again: the same status, body and id.
func sameAnswer(a, b *Answer) bool {
	return a.Status == b.Status && sameBody(a.body, b.body) && a.ID == b.ID
}

func allSame(as []*Answer) bool {
	for _, a := range as[1:] {
		if a.Status != as[0].Status || !sameBody(a.body, as[0].body) {
			return false
		}
	}
	return true
}

func idNote(a *Answer) string {
	if a.ID == "" {
		return ""
	}
	return ", " + a.ID
}

func replayedNote(a *Answer) string {
	if a.replayed() {
		return ", " + a.replayHeader + ": true"
	}
	return ""
}

func answerOrError(ex Exchange) string {
	if ex.Response != nil {
		return ex.Response.statusText()
	}
	return ex.Error
}
