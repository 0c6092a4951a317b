package idemgrpc_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemgrpc"
	"github.com/idem-go/idem/idemmem"
)

// plainStore is a store that keeps no recovery points: the memory store
// with its idem.Recoverer methods hidden.
type plainStore struct{ idem.Store }

// NewCompleter takes its CompleterConfig as given, refuses one without a
// Resume, and refuses a store that keeps no recovery points (no Completer
// could find an abandoned call there), each with an ArgumentError.
func TestNewCompleterRefuses(t *testing.T) {
	t.Parallel()
	resume := func(context.Context, idemgrpc.Execution) (any, error) { return nil, idemgrpc.ErrNothingDone }
	ic, err := idemgrpc.New(&idemgrpc.Config{Store: idemmem.NewStore(nil), SharedScope: true})
	if err != nil {
		t.Fatal(err)
	}
	for name, cfg := range map[string]*idemgrpc.CompleterConfig{"nil": nil, "no Resume": {Limit: 3}} {
		comp, err := ic.NewCompleter(cfg)
		if !errors.Is(err, idem.ErrInvalidArgument) || !strings.Contains(err.Error(), "Resume") || comp != nil {
			t.Errorf("NewCompleter(%s): %v, %v; want an ArgumentError naming Resume", name, comp, err)
		}
	}
	comp, err := ic.NewCompleter(&idemgrpc.CompleterConfig{Resume: resume})
	if err != nil || comp == nil {
		t.Fatalf("NewCompleter with a Resume, on a Recoverer: %v, %v; want a Completer", comp, err)
	}

	plain, err := idemgrpc.New(&idemgrpc.Config{Store: plainStore{idemmem.NewStore(nil)}, SharedScope: true})
	if err != nil {
		t.Fatal(err)
	}
	comp, err = plain.NewCompleter(&idemgrpc.CompleterConfig{Resume: resume})
	if !errors.Is(err, idem.ErrInvalidArgument) || !strings.Contains(err.Error(), "Recoverer") || comp != nil {
		t.Fatalf("NewCompleter on a store with no recovery points: %v, %v; want an ArgumentError naming idem.Recoverer", comp, err)
	}
}
