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
