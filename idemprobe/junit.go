package idemprobe

import (
	"encoding/xml"
	"fmt"
	"io"
	"strings"
)

// The JUnit XML a CI system reads: one test suite, one test case per check.
type junitSuites struct {
	XMLName xml.Name     `xml:"testsuites"`
	Suites  []junitSuite `xml:"testsuite"`
}

type junitSuite struct {
	Name     string      `xml:"name,attr"`
	Tests    int         `xml:"tests,attr"`
	Failures int         `xml:"failures,attr"`
	Errors   int         `xml:"errors,attr"`
	Skipped  int         `xml:"skipped,attr"`
	Time     string      `xml:"time,attr"`
	Cases    []junitCase `xml:"testcase"`
}

type junitCase struct {
	Name      string        `xml:"name,attr"`
	ClassName string        `xml:"classname,attr"`
	Failure   *junitMessage `xml:"failure,omitempty"`
	Error     *junitMessage `xml:"error,omitempty"`
	Skipped   *junitMessage `xml:"skipped,omitempty"`
	SystemOut string        `xml:"system-out,omitempty"`
}

type junitMessage struct {
	Message string `xml:"message,attr"`
	Text    string `xml:",chardata"`
}

// WriteJUnit writes the report as JUnit XML, so that a CI pipeline shows
// each check as a test: a failed check is a <failure>, one that could not
// finish an <error>, one not applicable or not run <skipped>, each with
// the reason as its message and the evidence as its text; a check that
// passed carries its reason as system-out.
func (r *Report) WriteJUnit(w io.Writer) error {
	s := junitSuite{Name: "idem probe " + r.Method + " " + r.URL, Tests: len(r.Checks),
		Time: fmt.Sprintf("%.3f", r.Elapsed.Seconds())}
	for _, c := range r.Checks {
		tc := junitCase{Name: fmt.Sprintf("%d %s: %s", c.Number, c.Name, c.Title), ClassName: "idem.probe"}
		m := &junitMessage{Message: c.Reason, Text: evidenceText(c)}
		switch c.Status {
		case Pass:
			tc.SystemOut = c.Reason
		case Fail:
			tc.Failure = m
			s.Failures++
		case Error:
			tc.Error = m
			s.Errors++
		default:
			tc.Skipped = &junitMessage{Message: string(c.Status) + ": " + c.Reason}
			s.Skipped++
		}
		s.Cases = append(s.Cases, tc)
	}
	if _, err := io.WriteString(w, xml.Header); err != nil {
		return fmt.Errorf("writing the JUnit report: %w", err)
	}
	enc := xml.NewEncoder(w)
	enc.Indent("", "  ")
	if err := enc.Encode(junitSuites{Suites: []junitSuite{s}}); err != nil {
		return fmt.Errorf("writing the JUnit report: %w", err)
	}
	_, err := io.WriteString(w, "\n")
	return err
}

// evidenceText is a check's source and evidence as the text report shows
// them.
func evidenceText(c Check) string {
	var b strings.Builder
	fmt.Fprintf(&b, "source: %s\n", c.Source)
	if c.Artifact != "" {
		fmt.Fprintf(&b, "saved: %s\n", c.Artifact)
	}
	for _, ex := range c.Evidence {
		writeExchange(&b, ex)
	}
	return b.String()
}
