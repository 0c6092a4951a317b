package idemtest_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemtest"
)

// counterEffects are InboxEffects on idemmem.Counters, which join the Tx
// that idemmem.Inbox gives fn.
type counterEffects struct{ c *idemmem.Counters }

func (e counterEffects) Write(ctx context.Context, tag string) error {
	if _, ok := idemmem.TxFromContext(ctx); !ok {
		return errors.New("no idemmem.Tx in the context")
	}
	return e.c.Add(ctx, tag, 1)
}

func (e counterEffects) Count(_ context.Context, tag string) (int, error) {
	return int(e.c.Get(tag)), nil
}

type inboxFunc func(ctx context.Context, consumer, key string, fn func(context.Context) error) error

func (f inboxFunc) Process(ctx context.Context, consumer, key string, fn func(context.Context) error) error {
	return f(ctx, consumer, key, fn)
}

// batchFunc is a reference inbox whose ProcessBatch is replaced.
type batchFunc struct {
	*idemmem.Inbox
	batch func(ctx context.Context, consumer string, keys []string, fn func(context.Context, []bool) error) error
}

func (b batchFunc) ProcessBatch(ctx context.Context, consumer string, keys []string, fn func(context.Context, []bool) error) error {
	if fn == nil {
		return b.Inbox.ProcessBatch(ctx, consumer, keys, fn)
	}
	return b.batch(ctx, consumer, keys, fn)
}

// seqFunc is a reference inbox whose ProcessSequence is replaced.
type seqFunc struct {
	*idemmem.Inbox
	seq func(ctx context.Context, consumer, aggregate string, seq uint64, gap idem.GapPolicy, fn func(context.Context) error) error
}

func (s seqFunc) ProcessSequence(ctx context.Context, consumer, aggregate string, seq uint64, gap idem.GapPolicy, fn func(context.Context) error) error {
	return s.seq(ctx, consumer, aggregate, seq, gap, fn)
}

// racyMarks is a sequence inbox that reads the mark, runs fn and only then
// writes the mark, holding nothing in between: right one call at a time,
// wrong for two calls of one aggregate at once.
type racyMarks struct {
	*idemmem.Inbox
	mu    sync.Mutex
	marks map[[2]string]uint64
}

func (r *racyMarks) ProcessSequence(ctx context.Context, consumer, aggregate string, seq uint64, gap idem.GapPolicy, fn func(context.Context) error) error {
	if err := idem.CheckSequenceArgs(consumer, aggregate, seq, gap, fn); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	k := [2]string{consumer, aggregate}
	r.mu.Lock()
	mark := r.marks[k]
	r.mu.Unlock()
	if err := idem.CheckSequence(aggregate, mark, seq, gap); err != nil {
		return err
	}
	return idemmem.Transact(ctx, func(ctx context.Context) error {
		if err := fn(ctx); err != nil {
			return err
		}
		tx, _ := idemmem.TxFromContext(ctx)
		return tx.OnCommit(func() {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.marks[k] = seq
		})
	})
}

// inboxCase runs TestInbox on an inbox that broken builds over a
// reference one.
func inboxCase(wantFail string, broken func(in *idemmem.Inbox) idem.Inbox) brokenCase {
	return brokenCase{wantFail, func(t *testing.T) {
		idemtest.TestInbox(t, func(t *testing.T) (idem.Inbox, idemtest.InboxEffects) {
			return broken(idemmem.NewInbox()), counterEffects{&idemmem.Counters{}}
		})
	}}
}

var brokenInboxes = map[string]brokenCase{
	"inbox: none": inboxCase("", func(in *idemmem.Inbox) idem.Inbox { return in }),
	// Watermill's de-duplicator: the message is marked seen before the
	// handler runs, and stays marked when it fails.
	"inbox: records before fn runs": inboxCase("FailureLeavesNothing", func(in *idemmem.Inbox) idem.Inbox {
		return inboxFunc(func(ctx context.Context, c, k string, fn func(context.Context) error) error {
			if err := in.Process(ctx, c, k, func(context.Context) error { return nil }); err != nil {
				return err
			}
			return idemmem.Transact(ctx, fn)
		})
	}),
	"inbox: commits a failed fn": inboxCase("FailureLeavesNothing", func(in *idemmem.Inbox) idem.Inbox {
		return inboxFunc(func(ctx context.Context, c, k string, fn func(context.Context) error) error {
			var fnErr error
			if err := in.Process(ctx, c, k, func(ctx context.Context) error { fnErr = fn(ctx); return nil }); err != nil {
				return err
			}
			return fnErr
		})
	}),
	"inbox: never a duplicate": inboxCase("FirstRunsThenDuplicate", func(*idemmem.Inbox) idem.Inbox {
		return inboxFunc(func(ctx context.Context, _, _ string, fn func(context.Context) error) error {
			return idemmem.Transact(ctx, fn)
		})
	}),
	"batch inbox: every key fresh": inboxCase("BatchFreshAndDuplicates", func(in *idemmem.Inbox) idem.Inbox {
		return batchFunc{in, func(ctx context.Context, c string, keys []string, fn func(context.Context, []bool) error) error {
			return in.ProcessBatch(ctx, c, keys, func(ctx context.Context, fresh []bool) error {
				return fn(ctx, slices.Repeat([]bool{true}, len(fresh)))
			})
		}}
	}),
	"batch inbox: commits a failed fn": inboxCase("BatchFailureLeavesNothing", func(in *idemmem.Inbox) idem.Inbox {
		return batchFunc{in, func(ctx context.Context, c string, keys []string, fn func(context.Context, []bool) error) error {
			var fnErr error
			if err := in.ProcessBatch(ctx, c, keys, func(ctx context.Context, fresh []bool) error { fnErr = fn(ctx, fresh); return nil }); err != nil {
				return err
			}
			return fnErr
		}}
	}),
	"batch inbox: takes a repeated key": inboxCase("BatchInvalid", func(in *idemmem.Inbox) idem.Inbox {
		return batchFunc{in, func(ctx context.Context, c string, keys []string, fn func(context.Context, []bool) error) error {
			if len(keys) == 3 && keys[0] == keys[2] {
				keys = keys[:2]
				return in.ProcessBatch(ctx, c, keys, func(ctx context.Context, fresh []bool) error { return fn(ctx, append(fresh, false)) })
			}
			return in.ProcessBatch(ctx, c, keys, fn)
		}}
	}),
	"inbox: one namespace for every consumer": inboxCase("Namespaces", func(in *idemmem.Inbox) idem.Inbox {
		return inboxFunc(func(ctx context.Context, _, k string, fn func(context.Context) error) error {
			return in.Process(ctx, "everyone", k, fn)
		})
	}),
	"sequence inbox: ignores the mark": inboxCase("SequenceDuplicates", func(in *idemmem.Inbox) idem.Inbox {
		return seqFunc{in, func(ctx context.Context, c, a string, seq uint64, gap idem.GapPolicy, fn func(context.Context) error) error {
			if err := idem.CheckSequenceArgs(c, a, seq, gap, fn); err != nil {
				return err
			}
			return idemmem.Transact(ctx, fn)
		}}
	}),
	// fn's writes roll back, but the mark it was to guard moves on: the
	// message is lost, and a redelivery is taken for a duplicate.
	"sequence inbox: raises the mark when fn fails": inboxCase("SequenceFailureLeavesMark", func(in *idemmem.Inbox) idem.Inbox {
		return seqFunc{in, func(ctx context.Context, c, a string, seq uint64, gap idem.GapPolicy, fn func(context.Context) error) error {
			if fn == nil {
				return in.ProcessSequence(ctx, c, a, seq, gap, fn)
			}
			var fnErr error
			err := in.ProcessSequence(ctx, c, a, seq, gap, func(ctx context.Context) error {
				fnErr = idemmem.Transact(ctx, fn)
				return nil
			})
			if err != nil {
				return err
			}
			return fnErr
		}}
	}),
	"sequence inbox: reads the mark without holding it": inboxCase("SequenceConcurrent", func(in *idemmem.Inbox) idem.Inbox {
		return &racyMarks{Inbox: in, marks: make(map[[2]string]uint64)}
	}),
	"sequence inbox: lets gaps through under GapHold": inboxCase("SequenceGapHold", func(in *idemmem.Inbox) idem.Inbox {
		return seqFunc{in, func(ctx context.Context, c, a string, seq uint64, gap idem.GapPolicy, fn func(context.Context) error) error {
			if gap == idem.GapHold {
				gap = idem.GapAllow
			}
			return in.ProcessSequence(ctx, c, a, seq, gap, fn)
		}}
	}),
	"sequence inbox: one mark for every aggregate": inboxCase("SequenceNamespaces", func(in *idemmem.Inbox) idem.Inbox {
		return seqFunc{in, func(ctx context.Context, c, a string, seq uint64, gap idem.GapPolicy, fn func(context.Context) error) error {
			if a == "" {
				return in.ProcessSequence(ctx, c, a, seq, gap, fn)
			}
			return in.ProcessSequence(ctx, c, "every aggregate", seq, gap, fn)
		}}
	}),
	// What a Lua script that compares numbers, not strings, does: past
	// 2^53 neighbouring numbers round to one value.
	"sequence inbox: keeps numbers as float64": inboxCase("SequenceLargeNumbers", func(in *idemmem.Inbox) idem.Inbox {
		return seqFunc{in, func(ctx context.Context, c, a string, seq uint64, gap idem.GapPolicy, fn func(context.Context) error) error {
			if seq < 1<<53 {
				return in.ProcessSequence(ctx, c, a, seq, gap, fn)
			}
			return in.ProcessSequence(ctx, c, a, uint64(float64(seq)), gap, fn)
		}}
	}),
}
