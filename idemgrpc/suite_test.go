package idemgrpc_test

import (
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemgrpc/internal/grpcsuite"
	"github.com/idem-go/idem/idemmem"
)

// The conformance suite on the in-memory store; idemgrpc/internal/storetest
// runs it on SQLite, PostgreSQL and Redis.
func TestSuite(t *testing.T) {
	t.Parallel()
	grpcsuite.Run(t, func(t *testing.T, clock idem.Clock) idem.Store {
		return idemmem.NewStore(&idemmem.Config{Clock: clock})
	})
}
