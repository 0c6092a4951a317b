package idemtest_test

import (
	"fmt"
	"time"

	"github.com/idem-go/idem/idemmem"
)

// A lease ends when the test says so, not when a machine happens to be slow.
func ExampleClock() {
	clock := idemmem.NewClock(time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC))
	leaseEnds := clock.Now().Add(30 * time.Second)

	clock.Advance(29 * time.Second)
	fmt.Println("lease live:", clock.Now().Before(leaseEnds))
	clock.Advance(time.Second)
	fmt.Println("lease live:", clock.Now().Before(leaseEnds))
	// Output:
	// lease live: true
	// lease live: false
}
