package idemtest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/idem-go/idem"
)

// The subtests of TestInbox for an inbox that is an idem.BatchInbox.
var batchInboxTests = []struct {
	name string
	run  func(t *testing.T, e *inboxEnv, in idem.BatchInbox)
}{
	{"BatchFreshAndDuplicates", testBatchFresh},
	{"BatchFailureLeavesNothing", testBatchFailure},
	{"BatchInvalid", testBatchInvalid},
	{"BatchConcurrentOverlapping", testBatchConcurrent},
}

// batchWriter returns a ProcessBatch fn that writes "<prefix>/<key>" for
// every fresh key, notes which were fresh, and returns err.
func (e *inboxEnv) batchWriter(keys []string, prefix string, got *[]bool, err error) func(context.Context, []bool) error {
	return func(ctx context.Context, fresh []bool) error {
		if len(fresh) != len(keys) {
			return fmt.Errorf("idemtest: fn got %d fresh flags for %d keys", len(fresh), len(keys))
		}
		if got != nil {
			*got = slices.Clone(fresh)
		}
		for i, k := range keys {
			if fresh[i] {
				if werr := e.effects.Write(ctx, prefix+"/"+k); werr != nil {
					return fmt.Errorf("idemtest: InboxEffects.Write in fn: %w", werr)
				}
			}
		}
		return err
	}
}

func testBatchFresh(t *testing.T, e *inboxEnv, in idem.BatchInbox) {
	var calls int
	if err := e.inbox.Process(e.ctx, "c", "m-1", func(ctx context.Context) error {
		calls++
		return e.effects.Write(ctx, "fx/m-1")
	}); err != nil {
		t.Fatalf("Process(m-1) = %v", err)
	}
	keys := []string{"m-1", "m-2", "m-3"}
	var fresh []bool
	ctx := context.WithValue(e.ctx, ctxMarker{}, "caller's")
	sawValue := false
	write := e.batchWriter(keys, "fx", &fresh, nil)
	err := in.ProcessBatch(ctx, "c", keys, func(ctx context.Context, f []bool) error {
		sawValue = ctx.Value(ctxMarker{}) == "caller's"
		return write(ctx, f)
	})
	if err != nil {
		t.Fatalf("ProcessBatch(%v) = %v, want nil", keys, err)
	}
	if !slices.Equal(fresh, []bool{false, true, true}) {
		t.Errorf("fresh = %v, want [false true true]: m-1 was processed before", fresh)
	}
	if !sawValue {
		t.Error("fn's context does not carry the values of the context given to ProcessBatch")
	}
	for _, k := range keys {
		e.wantCount("fx/"+k, 1, "each message applied once")
	}
	for _, k := range []string{"m-2", "m-3"} {
		if err := e.inbox.Process(e.ctx, "c", k, func(context.Context) error { calls++; return nil }); !errors.Is(err, idem.ErrDuplicate) {
			t.Errorf("Process(%s) after the batch recorded it = %v, want idem.ErrDuplicate", k, err)
		}
	}
	if calls != 1 {
		t.Errorf("Process ran fn %d times, want 1", calls)
	}
	if err := in.ProcessBatch(e.ctx, "c", keys, e.batchWriter(keys, "fx", &fresh, nil)); err != nil {
		t.Fatalf("ProcessBatch again = %v, want nil: fn runs even when nothing is fresh", err)
	}
	if !slices.Equal(fresh, []bool{false, false, false}) {
		t.Errorf("fresh = %v on a batch processed already, want all false", fresh)
	}
	if err := in.ProcessBatch(e.ctx, "other", keys, e.batchWriter(keys, "other", &fresh, nil)); err != nil {
		t.Fatalf("ProcessBatch of another consumer = %v", err)
	}
	if !slices.Equal(fresh, []bool{true, true, true}) {
		t.Errorf("fresh = %v for another consumer, want all true: consumers are separate namespaces", fresh)
	}
}

func testBatchFailure(t *testing.T, e *inboxEnv, in idem.BatchInbox) {
	boom := idem.Permanent(errors.New("boom"))
	keys := []string{"a", "b", "c"}
	err := in.ProcessBatch(e.ctx, "c", keys, e.batchWriter(keys, "fx", nil, boom))
	if err != boom {
		t.Fatalf("ProcessBatch with a failing fn = %v, want fn's error unchanged", err)
	}
	for _, k := range keys {
		e.wantCount("fx/"+k, 0, "a failed batch commits nothing")
	}
	var fresh []bool
	if err := in.ProcessBatch(e.ctx, "c", keys, e.batchWriter(keys, "fx", &fresh, nil)); err != nil {
		t.Fatalf("ProcessBatch after the failure = %v", err)
	}
	if !slices.Equal(fresh, []bool{true, true, true}) {
		t.Errorf("fresh = %v after a failed batch, want all true: it must leave no record", fresh)
	}
	for _, k := range keys {
		e.wantCount("fx/"+k, 1, "applied once, by the second batch")
	}
}

func testBatchInvalid(t *testing.T, e *inboxEnv, in idem.BatchInbox) {
	ran := false
	fn := func(context.Context, []bool) error { ran = true; return nil }
	for _, tc := range []struct {
		name     string
		consumer string
		keys     []string
		fn       func(context.Context, []bool) error
	}{
		{"a repeated key", "c", []string{"x", "y", "x"}, fn},
		{"an empty key", "c", []string{"x", ""}, fn},
		{"an empty consumer", "", []string{"x"}, fn},
		{"a nil fn", "c", []string{"x"}, nil},
	} {
		if err := in.ProcessBatch(e.ctx, tc.consumer, tc.keys, tc.fn); !errors.Is(err, idem.ErrInvalidArgument) {
			t.Errorf("ProcessBatch with %s = %v, want idem.ErrInvalidArgument", tc.name, err)
		}
	}
	if ran {
		t.Error("fn ran for an invalid batch")
	}
	var fresh []bool
	if err := in.ProcessBatch(e.ctx, "c", []string{"x", "y"}, e.batchWriter([]string{"x", "y"}, "fx", &fresh, nil)); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(fresh, []bool{true, true}) {
		t.Errorf("fresh = %v, want all true: an invalid batch must record nothing", fresh)
	}
}

// testBatchConcurrent runs batches that share keys, listed in different
// orders, at once with single Process calls of the same keys: each key's
// effect commits exactly once, and no batch waits for another for good.
func testBatchConcurrent(t *testing.T, e *inboxEnv, in idem.BatchInbox) {
	const workers, keys = 8, 24
	all := make([]string, keys)
	for i := range all {
		all[i] = fmt.Sprintf("k-%02d", i)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 2*workers)
	for w := range workers {
		r := rand.New(rand.NewPCG(uint64(w), 7))
		batch := slices.Clone(all)
		r.Shuffle(len(batch), func(i, j int) { batch[i], batch[j] = batch[j], batch[i] })
		batch = batch[:keys/2]
		wg.Go(func() {
			if err := in.ProcessBatch(e.ctx, "c", batch, e.batchWriter(batch, "fx", nil, nil)); err != nil {
				errs <- fmt.Errorf("ProcessBatch(%v) = %w", batch, err)
			}
		})
		one := all[r.IntN(keys)]
		wg.Go(func() {
			err := e.inbox.Process(e.ctx, "c", one, func(ctx context.Context) error { return e.effects.Write(ctx, "fx/"+one) })
			if err != nil && !errors.Is(err, idem.ErrDuplicate) {
				errs <- fmt.Errorf("Process(%s) = %w", one, err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for _, k := range all {
		if n := e.count("fx/" + k); n > 1 {
			t.Errorf("%s applied %d times by concurrent batches, want at most once", k, n)
		}
	}
}
