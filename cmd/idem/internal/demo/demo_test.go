package demo_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/idem-go/idem/cmd/idem/internal/demo"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// progressOut is the demo's output, and its progress: the run is
// stopped once it has printed nothing for stall (each scenario prints
// when it begins and when it ends). A bound on the whole run's wall time
// failed on a loaded machine (a minute, where a quiet run takes 8 s and
// one under a load of 28 took over 60) without anything being stuck.
type progressOut struct {
	bytes.Buffer
	timer *time.Timer
}

const stall = time.Minute

func (o *progressOut) Write(p []byte) (int, error) {
	o.timer.Reset(stall)
	return o.Buffer.Write(p)
}

func TestRunShowsDoubleChargeThenExactlyOnce(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancelCause(t.Context())
	defer cancel(nil)
	out := &progressOut{timer: time.AfterFunc(stall, func() {
		cancel(fmt.Errorf("the demo printed nothing for %v", stall))
	})}
	defer out.timer.Stop()
	const customers = 3
	rep, err := demo.Run(ctx, &demo.Options{Out: out, Customers: customers})
	if err != nil {
		t.Fatalf("Run: %v (%v)\noutput:\n%s", err, context.Cause(ctx), out.String())
	}
	t.Logf("output:\n%s", out.String())

	if !rep.OK() {
		t.Errorf("OK() = false, want true")
	}
	var protected, unsafe int
	var taken, should int64
	for _, row := range rep.Rows {
		if row.Customers != customers {
			t.Errorf("%s/%s: Customers = %d, want %d", row.Mode, row.Scenario, row.Customers, customers)
		}
		owed := rep.Amount
		if row.Scenario == "double-clicked refund" {
			owed -= rep.Refund
			// Unsafe, both clicks refund; protected, one does.
			want := customers
			if row.Mode == demo.ModeUnsafe {
				want = 2 * customers
			}
			if row.Refunds != want {
				t.Errorf("%s/%s: Refunds = %d, want %d", row.Mode, row.Scenario, row.Refunds, want)
			}
			if row.Mode == demo.ModeUnsafe && !strings.HasPrefix(row.Verdict(), "REFUNDED TWICE") {
				t.Errorf("unsafe/%s: verdict %q, want REFUNDED TWICE", row.Scenario, row.Verdict())
			}
		}
		if row.ShouldBe != customers*owed {
			t.Errorf("%s/%s: ShouldBe = %d, want %d", row.Mode, row.Scenario, row.ShouldBe, customers*owed)
		}
		if row.Attempts < customers {
			t.Errorf("%s/%s: Attempts = %d, want at least one per customer", row.Mode, row.Scenario, row.Attempts)
		}
		switch row.Mode {
		case demo.ModeProtected:
			protected++
			if !row.ExactlyOnce() || row.Payments != customers || row.Taken != row.ShouldBe {
				t.Errorf("protected/%s: payments %d, taken %d, should be %d, verdict %q; want exactly once",
					row.Scenario, row.Payments, row.Taken, row.ShouldBe, row.Verdict())
			}
			if row.Verdict() != "exactly once" {
				t.Errorf("protected/%s: verdict %q, want %q", row.Scenario, row.Verdict(), "exactly once")
			}
			if row.Charges != customers {
				t.Errorf("protected/%s: %d card charges, want one per customer", row.Scenario, row.Charges)
			}
		case demo.ModeUnsafe:
			unsafe++
			if row.Scenario == "card network" && row.Charges <= customers {
				t.Errorf("unsafe/card network: %d card charges for %d customers; want the card charged twice", row.Charges, customers)
			}
			taken += row.Taken
			should += row.ShouldBe
		default:
			t.Errorf("row with unknown mode %q", row.Mode)
		}
	}
	if protected != 6 || unsafe != 6 {
		t.Errorf("rows: %d protected, %d unsafe; want 6 of each", protected, unsafe)
	}
	if taken <= should {
		t.Errorf("unsafe run took %d, should be %d: want a double charge", taken, should)
	}

	text := out.String()
	for _, want := range []string{
		"run", "scenario", "attempts", "payments", "money taken", "should be", "verdict",
		"frozen screen", "lost response", "card network", "retry storm", "transient failure", "card charges",
		"DOUBLE CHARGED (+", "exactly once", "KRW", "idem demo messages",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if !strings.Contains(text, "run        scenario") {
		t.Errorf("output lacks the table header line")
	}
}

func TestRunStopsWhenCancelled(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	rep, err := demo.Run(ctx, &demo.Options{Customers: 1})
	if err == nil {
		t.Fatalf("Run with a cancelled context: err = nil, want an error")
	}
	if rep.OK() {
		t.Errorf("OK() = true after a cancelled run")
	}
}
