package idemnats_test

import (
	"testing"

	"github.com/idem-go/idem/idemnats"
	"github.com/idem-go/idem/idemtest"
)

// The consumer keeps each key's order across retries through JetStream:
// 10,000 messages over 100 keys, a quarter of early attempts failing.
// JetStream drops the copies published under an ID it has stored.
func TestPerKeyOrderWithTransientFailures(t *testing.T) {
	t.Parallel()
	tr := newIsolated(t, idemnats.Config{})
	idemtest.TestPerKeyOrder(t, tr, tr, idemtest.OrderOptions{})
}
