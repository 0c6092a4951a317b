package demo_test

import (
	"context"
	"fmt"
	"io"

	"github.com/idem-go/idem/cmd/idem/internal/demo"
)

// Run the lab quietly and ask whether it showed what it is for: retries
// double charge without idempotency keys, and charge exactly once with them.
// Set Out to os.Stdout to see the progress and the table.
func ExampleRun() {
	rep, err := demo.Run(context.Background(), &demo.Options{Out: io.Discard, Customers: 2})
	if err != nil {
		fmt.Println("the demo could not run:", err)
		return
	}
	for _, row := range rep.Rows {
		if row.Mode == demo.ModeProtected {
			fmt.Printf("%-21s %s\n", row.Scenario, row.Verdict())
		}
	}
	fmt.Println("OK:", rep.OK())
	// Output:
	// frozen screen         exactly once
	// lost response         exactly once
	// card network          exactly once
	// retry storm           exactly once
	// double-clicked refund exactly once
	// transient failure     exactly once
	// OK: true
}

// Run the lab's second half quietly and read each scenario's verdicts: the
// unsafe consumer first, then idem's. Set Out to os.Stdout to see the
// tables.
//
// The example is compiled, not run, by go test: a run of the lab is its
// costliest test (seconds, and many more under the race detector), and
// TestRunMessages already plays it and checks these verdicts and every
// figure behind them.
func ExampleRunMessages() {
	rep, err := demo.RunMessages(context.Background(), &demo.MessagesOptions{Out: io.Discard})
	if err != nil {
		fmt.Println("the demo could not run:", err)
		return
	}
	for _, r := range rep.Redelivery {
		fmt.Printf("redelivery %-9s %s\n", r.Mode, r.Verdict())
	}
	for _, r := range rep.Poison {
		fmt.Printf("poison     %-9s %s\n", r.Mode, r.Verdict())
	}
	for _, r := range rep.Storm {
		fmt.Printf("storm      %-9s %s\n", r.Mode, r.Verdict())
	}
	for _, r := range rep.Order {
		fmt.Printf("order      %-9s %s\n", r.Mode, r.Verdict())
	}
	fmt.Println("OK:", rep.OK())
	// It prints:
	// redelivery unsafe    COUNTED TWICE (+72,000 KRW)
	// redelivery protected exactly once
	// poison     unsafe    BLOCKED: 20 healthy events stuck behind it
	// poison     protected flows; poison dead-lettered after 10 attempts
	// storm      unsafe    FELL OVER AGAIN (3 times)
	// storm      protected held
	// order      unsafe    HISTORY WRONG (went to -5,000 KRW): adding needs order
	// order      unsafe    WRONG STATE (5 refunds undone): setting needs order or versions
	// order      protected right: it keeps per-key order
	// order      protected right: it keeps per-key order
	// order      protected right: a version needs no order
	// OK: true
}
