package probe

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"
	"unicode/utf8"
)

// Status is a check's verdict.
type Status string

const (
	// Pass: the endpoint behaved as the check's source asks.
	Pass Status = "pass"
	// Fail: it did not; the evidence shows how.
	Fail Status = "fail"
	// NotApplicable: the check cannot be made against this endpoint or
	// with these flags; the reason says why.
	NotApplicable Status = "n/a"
	// Error: the probe could not finish the check (no answer, the budget
	// or the timeout spent). It counts as a failure of the probe.
	Error Status = "error"
)

// Report is the report card of one probe.
type Report struct {
	Method   string        `json:"method"`
	URL      string        `json:"url"`
	Requests int           `json:"requests"` // sent in all, count reads included
	Elapsed  time.Duration `json:"elapsed_ns"`
	Checks   []Check       `json:"checks"`
}

// Check is one check's verdict and evidence.
type Check struct {
	Number   int        `json:"number"`
	Name     string     `json:"name"` // stable, for machines
	Title    string     `json:"title"`
	Source   string     `json:"source"` // where the rule comes from
	Status   Status     `json:"status"`
	Reason   string     `json:"reason"`
	Evidence []Exchange `json:"evidence,omitempty"`
}

func (c *Check) passf(format string, args ...any) { c.set(Pass, format, args...) }
func (c *Check) failf(format string, args ...any) { c.set(Fail, format, args...) }
func (c *Check) errorf(format string, args ...any) {
	c.set(Error, format, args...)
}
func (c *Check) notApplicable(reason string) { c.Status, c.Reason = NotApplicable, reason }

func (c *Check) set(s Status, format string, args ...any) {
	c.Status, c.Reason = s, fmt.Sprintf(format, args...)
}

// Exchange is one request sent and its answer, or why there was none.
// Credentials are already hidden.
type Exchange struct {
	Request  *Sent   `json:"request,omitempty"`
	Response *Answer `json:"response,omitempty"`
	Error    string  `json:"error,omitempty"`
	Note     string  `json:"note,omitempty"` // what the probe read in it, or did with it
}

// Sent is a request as the report shows it: secret header values are
// replaced by xxxxx (an Authorization keeps its scheme: "Bearer xxxxx").
type Sent struct {
	Method string            `json:"method"`
	URL    string            `json:"url"`
	Header map[string]string `json:"header,omitempty"`
	Body   string            `json:"body,omitempty"` // shortened
}

// Answer is a response as the report shows it: the headers that matter
// to idempotency and the start of the body.
type Answer struct {
	Status int               `json:"status"`
	Header map[string]string `json:"header,omitempty"`
	Body   string            `json:"body,omitempty"` // shortened
	// ID is what tells executions apart: the body's top-level "id", or
	// else Location.
	ID string `json:"id,omitempty"`

	body []byte // whole, to compare answers
}

func (a *Answer) success() bool  { return a.Status >= 200 && a.Status < 300 }
func (a *Answer) replayed() bool { return strings.EqualFold(a.Header["Idempotent-Replayed"], "true") }
func (a *Answer) statusText() string {
	return fmt.Sprintf("%d %s", a.Status, http.StatusText(a.Status))
}

// OK reports whether every applicable check passed.
func (r *Report) OK() bool {
	for _, c := range r.Checks {
		if c.Status == Fail || c.Status == Error {
			return false
		}
	}
	return true
}

// WriteJSON writes the report as one JSON document.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("writing the report: %w", err)
	}
	return nil
}

var marks = map[Status]string{Pass: "✓", Fail: "✗", NotApplicable: "–", Error: "!"}

// WriteText writes the report card: one line per check, a summary, then
// the evidence of every check that did not pass.
func (r *Report) WriteText(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "idem probe %s %s: %d requests in %s\n\n", r.Method, r.URL, r.Requests, r.Elapsed.Round(time.Millisecond))
	width := 0
	for _, c := range r.Checks {
		width = max(width, utf8.RuneCountInString(c.Title))
	}
	var passed, failed, na int
	for _, c := range r.Checks {
		fmt.Fprintf(&b, "%s %d %-*s  %s [%s]\n", marks[c.Status], c.Number, width, c.Title, c.Reason, citation(c.Source))
		switch c.Status {
		case Pass:
			passed++
		case NotApplicable:
			na++
		default:
			failed++
		}
	}
	b.WriteString("\n")
	if failed == 0 {
		fmt.Fprintf(&b, "PASS: all %d applicable checks passed (%d not applicable)\n", passed, na)
	} else {
		fmt.Fprintf(&b, "FAIL: %d of %d applicable checks did not pass (%d not applicable)\n", failed, passed+failed, na)
	}
	for _, c := range r.Checks {
		if c.Status != Fail && c.Status != Error {
			continue
		}
		fmt.Fprintf(&b, "\n%s %d %s (%s)\n  %s\n", marks[c.Status], c.Number, c.Title, c.Name, c.Reason)
		fmt.Fprintf(&b, "  source: %s\n", c.Source)
		for _, ex := range c.Evidence {
			writeExchange(&b, ex)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func citation(source string) string {
	var cs []string
	if strings.Contains(source, sourceDraft) {
		cs = append(cs, "IETF draft")
	}
	if strings.Contains(source, "Stripe") && !strings.Contains(source, "Stripe instead") {
		cs = append(cs, "Stripe")
	}
	if strings.Contains(source, sourceIdem) {
		cs = append(cs, "idem")
	}
	return strings.Join(cs, ", ")
}

func writeExchange(b *strings.Builder, ex Exchange) {
	if s := ex.Request; s != nil {
		fmt.Fprintf(b, "    → %s %s%s\n", s.Method, s.URL, headerList(s.Header))
		if s.Body != "" {
			fmt.Fprintf(b, "      %s\n", s.Body)
		}
	}
	if a := ex.Response; a != nil {
		fmt.Fprintf(b, "    ← %s%s\n", a.statusText(), headerList(a.Header))
		if a.Body != "" {
			fmt.Fprintf(b, "      %s\n", a.Body)
		}
	}
	if ex.Error != "" {
		fmt.Fprintf(b, "    ← (%s)\n", ex.Error)
	}
	if ex.Note != "" {
		fmt.Fprintf(b, "      (%s)\n", ex.Note)
	}
}

func headerList(h map[string]string) string {
	names := make([]string, 0, len(h))
	for n := range h {
		names = append(names, n)
	}
	slices.Sort(names)
	var b strings.Builder
	for _, n := range names {
		if n == "Content-Type" {
			continue
		}
		// %q shows a control character in a key as what it is.
		v := h[n]
		if strings.ContainsFunc(v, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
			v = fmt.Sprintf("%q", v)
		}
		if len(v) > 64 {
			v = fmt.Sprintf("%s… (%d characters)", v[:32], len(h[n]))
		}
		fmt.Fprintf(&b, " | %s: %s", n, v)
	}
	return b.String()
}
