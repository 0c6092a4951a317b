package idemmem_test

import (
	"time"

	"testing"

	"github.com/idem-go/idem/internal/leakcheck"
)

func TestMain(m *testing.M) {
	leakcheck.Main(m)
}

// start is the time the package's tests start their clocks at.
var start = time.Date(2030, time.January, 2, 3, 4, 5, 0, time.UTC)
