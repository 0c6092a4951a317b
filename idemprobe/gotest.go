package idemprobe

import (
	"fmt"
	"testing"
)

// Test probes cfg's endpoint from within a test: every check, and every
// case of cfg.Cases, is a subtest of t named after it (t.Run with the
// check's name: sequential-replay, concurrent-duplicates, …), run one
// after the other in the order the checks run. A subtest passes with the
// report's reason logged; fails with the report's words, the rule's source
// and the requests and answers that show it; fails too, saying so, when
// its check could not finish (no answer, the budget or the timeout spent);
// and is skipped with the reason when its check does not apply (an option
// it needs was not given) or was not run.
//
//	func TestPaymentsIdempotency(t *testing.T) {
//		idemprobe.Test(t, &idemprobe.Config{
//			Handler: newRouter(),
//			URL:     "/v1/payments",
//			Body:    `{"amount":{{n}},"currency":"KRW"}`,
//			Header:  http.Header{"Authorization": {"Bearer test-key"}},
//		})
//	}
//
// go test -run 'TestPaymentsIdempotency/key-reuse' runs one check (and
// sequential-replay, whose first request every check needs, without its
// subtest). The probe runs within t's context and Config.Timeout. A Config
// that cannot be probed with fails t at once. Test returns the report, for
// what subtests do not show (WriteJUnit, Report.Requests).
func Test(t *testing.T, cfg *Config) *Report {
	t.Helper()
	rep, err := run(t.Context(), cfg, func(row *check, c *Check, do func()) {
		ran := false
		t.Run(row.name, func(t *testing.T) {
			ran = true
			do()
			tell(t, c)
		})
		if !ran && row.baseline {
			// Not selected, but every other check needs its first request.
			do()
			if c.Status == Fail || c.Status == Error {
				t.Errorf("%s, run though not selected, since every check needs its first request: %s", row.name, c.Reason)
			}
		}
	})
	if err != nil {
		t.Fatalf("idemprobe: %v", err)
	}
	return rep
}

// tell reports c's verdict on t, in the report's words: written to t's
// output as they are, without a source line of this package's.
func tell(t *testing.T, c *Check) {
	w := t.Output()
	switch c.Status {
	case Pass:
		fmt.Fprintf(w, "%s%s\n", c.Reason, cited(c.Source))
	case Fail:
		fmt.Fprintf(w, "%s\n%s", c.Reason, evidenceText(*c))
		t.Fail()
	case Error:
		fmt.Fprintf(w, "could not finish: %s\n%s", c.Reason, evidenceText(*c))
		t.Fail()
	case NotApplicable:
		fmt.Fprintf(w, "not applicable: %s\n", c.Reason)
		t.SkipNow()
	default:
		fmt.Fprintf(w, "%s: %s\n", c.Status, c.Reason)
		t.SkipNow()
	}
}
