package consumer_test

import (
	"fmt"
	"testing"

	"github.com/idem-go/idem/internal/leakcheck"
)

// batchSize is the Config.BatchSize of the harness's consumers: the
// default (batches) in the first run of the tests, 1 (one message per
// transaction) in the second.
var batchSize = 0

func TestMain(m *testing.M) {
	leakcheck.Main(bothModes{m})
}

// bothModes runs the package's tests twice: with batches, then one message
// at a time, since both paths must keep every promise.
type bothModes struct{ m *testing.M }

func (b bothModes) Run() int {
	if code := b.m.Run(); code != 0 {
		return code
	}
	fmt.Println("consumer: the tests again, with BatchSize 1")
	batchSize = 1
	return b.m.Run()
}
