package consumertest_test

import (
	"testing"
	"time"

	"github.com/idem-go/idem/consumer/consumertest"
	"github.com/idem-go/idem/idemmem"
)

// The order suite on the in-memory transport, which delivers copies.
func TestPerKeyOrderOnMemory(t *testing.T) {
	t.Parallel()
	tr := idemmem.NewTransport(&idemmem.TransportConfig{Poll: time.Millisecond})
	t.Cleanup(func() { _ = tr.Close() })
	consumertest.TestPerKeyOrder(t, tr, tr, consumertest.OrderOptions{Messages: 2000, Keys: 50, CopiesDelivered: true})
}
