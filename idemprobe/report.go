package idemprobe

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
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
	// or the timeout spent). The report then says the probe could not run
	// (OutcomeNotRun), unless another check failed.
	Error Status = "error"
	// NotRun: the check was not made because the endpoint accepted none of
	// the baseline's requests; the baseline's check says why.
	NotRun Status = "not run"
)

// Outcome is a whole report's verdict, which the command's exit status
// follows: 0, 1 and 2 in the order below.
type Outcome string

const (
	// OutcomePass: every check that applies passed.
	OutcomePass Outcome = "pass"
	// OutcomeFail: at least one check failed: the endpoint broke a rule.
	OutcomeFail Outcome = "fail"
	// OutcomeNotRun: no check failed, but at least one could not finish
	// (the endpoint accepted nothing, the budget or the timeout ran out):
	// the probe could not tell.
	OutcomeNotRun Outcome = "not run"
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
	Number int    `json:"number"`
	Name   string `json:"name"` // stable, for machines
	Title  string `json:"title"`
	Source string `json:"source"` // where the rule comes from
	Status Status `json:"status"`
	Reason string `json:"reason"`
	// Artifact is a file the check saved (check 12's visualisation of a
	// history that is not linearizable).
	Artifact string     `json:"artifact,omitempty"`
	Evidence []Exchange `json:"evidence,omitempty"`
}

func (c *Check) passf(format string, args ...any) { c.set(Pass, format, args...) }
func (c *Check) failf(format string, args ...any) { c.set(Fail, format, args...) }
func (c *Check) errorf(format string, args ...any) {
	c.set(Error, format, args...)
}
func (c *Check) notApplicable(reason string) { c.Status, c.Reason = NotApplicable, reason }
func (c *Check) notRun(reason string)        { c.Status, c.Reason = NotRun, reason }

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

	body   []byte      // whole, to compare answers
	header http.Header // all of them, for the checks written as cases
	// replayHeader is the name of Config.ReplayHeader when the answer is
	// marked as a replay by it, "" otherwise.
	replayHeader string
}

func (a *Answer) success() bool  { return a.Status >= 200 && a.Status < 300 }
func (a *Answer) replayed() bool { return a.replayHeader != "" }
func (a *Answer) statusText() string {
	return fmt.Sprintf("%d %s", a.Status, http.StatusText(a.Status))
}

// OK reports whether every applicable check passed.
func (r *Report) OK() bool { return r.Outcome() == OutcomePass }

// Outcome is the report's verdict: a failed check makes it OutcomeFail, a
// check that could not finish OutcomeNotRun, and OutcomePass otherwise.
// A failure wins over a check that could not finish, since it is a finding.
func (r *Report) Outcome() Outcome {
	o := OutcomePass
	for _, c := range r.Checks {
		switch c.Status {
		case Fail:
			return OutcomeFail
		case Error:
			o = OutcomeNotRun
		}
	}
	return o
}

// WriteJSON writes the report as one JSON document, its outcome included.
func (r *Report) WriteJSON(w io.Writer) error {
	type report Report // without the methods, so as not to recurse
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(struct {
		Outcome Outcome `json:"outcome"`
		*report
	}{r.Outcome(), (*report)(r)}); err != nil {
		return fmt.Errorf("writing the report: %w", err)
	}
	return nil
}

var marks = map[Status]string{Pass: "✓", Fail: "✗", NotApplicable: "–", NotRun: "–", Error: "!"}

// WriteText writes the report card: one line per check, a summary, then
// the evidence of every check that did not pass.
func (r *Report) WriteText(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "idem probe %s %s: %d requests in %s\n\n", r.Method, r.URL, r.Requests, r.Elapsed.Round(time.Millisecond))
	width := 0
	for _, c := range r.Checks {
		width = max(width, utf8.RuneCountInString(c.Title))
	}
	var passed, failed, na, notRun int
	for _, c := range r.Checks {
		fmt.Fprintf(&b, "%s %2d %-*s  %s%s\n", marks[c.Status], c.Number, width, c.Title, c.Reason, cited(c.Source))
		switch c.Status {
		case Pass:
			passed++
		case NotApplicable:
			na++
		case NotRun:
			notRun++
		default:
			failed++
		}
	}
	b.WriteString("\n")
	switch {
	case notRun > 0 && r.Outcome() == OutcomeFail:
		fmt.Fprintf(&b, "FAIL: %d of %d checks made did not pass; %d not run, since the endpoint accepted none of the probe's requests\n",
			failed, passed+failed, notRun)
	case notRun > 0:
		fmt.Fprintf(&b, "COULD NOT RUN: the endpoint accepted none of the probe's requests; %d checks not run\n", notRun)
	case failed == 0:
		fmt.Fprintf(&b, "PASS: all %d applicable checks passed (%d not applicable)\n", passed, na)
	case r.Outcome() == OutcomeNotRun:
		fmt.Fprintf(&b, "COULD NOT RUN: %d of %d applicable checks could not finish, and none failed (%d not applicable)\n",
			failed, passed+failed, na)
	default:
		fmt.Fprintf(&b, "FAIL: %d of %d applicable checks did not pass (%d not applicable)\n", failed, passed+failed, na)
	}
	for _, c := range r.Checks {
		if c.Status != Fail && c.Status != Error {
			continue
		}
		fmt.Fprintf(&b, "\n%s %d %s (%s)\n  %s\n", marks[c.Status], c.Number, c.Title, c.Name, c.Reason)
		fmt.Fprintf(&b, "  source: %s\n", c.Source)
		if c.Artifact != "" {
			fmt.Fprintf(&b, "  saved: %s\n", c.Artifact)
		}
		for _, ex := range c.Evidence {
			writeExchange(&b, ex)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// citation is the short reference a report line ends with: the draft's
// revision and sections, Stripe, Adyen, idem; a source it names none of
// (a case's own) as it is.
func citation(source string) string {
	var cs []string
	if strings.Contains(source, sourceDraft) {
		d := "IETF draft-" + sourceDraft[len(sourceDraft)-2:]
		if secs := draftSection.FindAllString(source, -1); len(secs) > 0 {
			d += " " + strings.Join(secs, ", ")
		}
		cs = append(cs, d)
	}
	if strings.Contains(source, "Stripe") && !strings.Contains(source, "Stripe instead") {
		cs = append(cs, "Stripe")
	}
	if strings.Contains(source, sourceAdyen) {
		cs = append(cs, "Adyen")
	}
	if strings.Contains(source, sourceIdem) {
		cs = append(cs, "idem")
	}
	if len(cs) == 0 {
		return source
	}
	return strings.Join(cs, ", ")
}

// cited is the citation of source as a line ends with it, " [IETF
// draft-07 §2.6, Stripe]", or nothing for a case that names no source.
func cited(source string) string {
	if c := citation(source); c != "" {
		return " [" + c + "]"
	}
	return ""
}

// draftSection finds the draft's section numbers a source names.
var draftSection = regexp.MustCompile(`§[0-9]+(\.[0-9]+)*`)

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
