package idemtest_test

import (
	"testing"
	"time"

	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemtest"
)

// The order suite on the in-memory transport, which delivers copies.
func TestPerKeyOrderOnMemory(t *testing.T) {
	t.Parallel()
	tr := idemmem.NewTransport(&idemmem.TransportConfig{Poll: time.Millisecond})
	t.Cleanup(func() { _ = tr.Close() })
	idemtest.TestPerKeyOrder(t, tr, tr, idemtest.OrderOptions{Messages: 2000, Keys: 50, CopiesDelivered: true})
}
