package idemtest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/idem-go/idem"
)

// inboxCall is one Process call of the inbox's history: the dedup key it
// delivers, and whether its fn fails.
type inboxCall struct {
	consumer, key string
	fails         bool
}

// inboxAnswer is what the call returned, and whether its fn ran.
type inboxAnswer struct {
	result string // "processed", "duplicate", "failed"
	ran    bool
}

// inboxKeyModel is the sequential specification of one (consumer, dedup
// key): unprocessed until a Process whose fn succeeds, processed for good
// after. Its state is whether the key was processed.
var inboxKeyModel = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		by := map[[2]string][]porcupine.Operation{}
		for _, op := range history {
			c := op.Input.(inboxCall)
			k := [2]string{c.consumer, c.key}
			by[k] = append(by[k], op)
		}
		var out [][]porcupine.Operation
		for _, ops := range by {
			out = append(out, ops)
		}
		return out
	},
	Init: func() any { return false },
	Step: func(state, input, output any) (bool, any) {
		processed, in, out := state.(bool), input.(inboxCall), output.(inboxAnswer)
		switch {
		case processed:
			// A duplicate, and its fn never runs.
			return out.result == "duplicate" && !out.ran, true
		case in.fails:
			return out.result == "failed" && out.ran, false
		}
		return out.result == "processed" && out.ran, true
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(inboxCall), output.(inboxAnswer)
		return fmt.Sprintf("Process(%s, %s, fails %v) → %s, fn ran %v", in.consumer, in.key, in.fails, out.result, out.ran)
	},
	DescribeState: func(state any) string {
		if state.(bool) {
			return "processed"
		}
		return "not processed"
	},
}

// testInboxLinearizable delivers a few messages many times, from many
// goroutines at once, their handlers failing now and then, and checks with
// Porcupine that every answer is explained by some order of the calls
// against the model: the first Process whose handler succeeds processes
// the key, every later one is a duplicate whose handler never ran. Then it
// checks that each processed key's effect committed exactly once.
func testInboxLinearizable(t *testing.T, e *inboxEnv) {
	const (
		clients = 8
		calls   = 40
		keys    = 4
	)
	n := linearizabilityScale(t)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d, %d calls", seed, clients*calls*n)
	errFn := errors.New("idemtest: the handler fails this delivery")
	start := time.Now()
	stamp := func() int64 { return int64(time.Since(start)) }
	var (
		mu      sync.Mutex
		history []porcupine.Operation
	)
	var wg sync.WaitGroup
	for c := range clients {
		rng := rand.New(rand.NewPCG(seed, uint64(c)))
		wg.Go(func() {
			for range calls * n {
				in := inboxCall{consumer: "lin-" + strconv.Itoa(rng.IntN(2)), key: "msg-" + strconv.Itoa(rng.IntN(keys)), fails: rng.IntN(3) == 0}
				var out inboxAnswer
				begin := stamp()
				err := e.inbox.Process(e.ctx, in.consumer, in.key, func(ctx context.Context) error {
					out.ran = true
					if err := e.effects.Write(ctx, in.consumer+"/"+in.key); err != nil {
						return err
					}
					if in.fails {
						return errFn
					}
					return nil
				})
				switch {
				case err == nil:
					out.result = "processed"
				case errors.Is(err, idem.ErrDuplicate):
					out.result = "duplicate"
				case errors.Is(err, errFn):
					out.result = "failed"
				default:
					t.Errorf("%s: unexpected error: %v", inboxKeyModel.DescribeOperation(in, out), err)
					return
				}
				mu.Lock()
				history = append(history, porcupine.Operation{ClientId: c, Input: in, Call: begin, Output: out, Return: stamp()})
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	if !checkLinearizable(t, inboxKeyModel, history, "deliveries", "processing once per key", seed) {
		return
	}
	processed := map[string]bool{}
	for _, op := range history {
		if op.Output.(inboxAnswer).result == "processed" {
			c := op.Input.(inboxCall)
			processed[c.consumer+"/"+c.key] = true
		}
	}
	for c := range 2 {
		for k := range keys {
			tag := "lin-" + strconv.Itoa(c) + "/msg-" + strconv.Itoa(k)
			want := 0
			if processed[tag] {
				want = 1
			}
			e.wantCount(tag, want, "each processed delivery's effect commits once, a failed one's never")
		}
	}
}
