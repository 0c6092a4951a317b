package jsonrpc_test

import (
	"testing"

	"github.com/idem-go/idem/internal/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }
