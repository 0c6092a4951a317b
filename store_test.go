package idem_test

import (
	"testing"

	"github.com/idem-go/idem"
)

// TestZeroStateAndOutcomeAreNone protects the numbering of State and
// Outcome from 1: a Record whose State, or a Claim whose Outcome, was never
// set (a zero value, a decoding that missed the field) is neither in
// flight nor completed, nor any outcome of a claim, and prints as
// "unknown", so a caller switching on it falls to its default case instead
// of replaying an answer that is not there or running the effect.
func TestZeroStateAndOutcomeAreNone(t *testing.T) {
	t.Parallel()
	var rec idem.Record
	for _, s := range []idem.State{idem.StateInFlight, idem.StateCompleted} {
		if rec.State == s {
			t.Errorf("a zero Record's State is %s", s)
		}
	}
	if got := rec.State.String(); got != "unknown" {
		t.Errorf("a zero Record's State prints %q, want \"unknown\"", got)
	}
	var c idem.Claim
	for _, o := range []idem.Outcome{idem.Acquired, idem.InFlight, idem.Completed, idem.Mismatch} {
		if c.Outcome == o {
			t.Errorf("a zero Claim's Outcome is %s", o)
		}
	}
	if got := c.Outcome.String(); got != "unknown" {
		t.Errorf("a zero Claim's Outcome prints %q, want \"unknown\"", got)
	}
}
