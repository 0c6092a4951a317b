package stream

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/idem-go/idem"
)

// A poll takes records from the client's buffers just before the group
// takes their partition away; the partition comes back, and the poll's
// goroutine gets back to the stream only then. franz-go promises only that
// a poll begun after the revocation returns none of the partition's old
// records (see OnPartitionsRevoked); this one began before. The records it
// took must not stand in the way of those the partition's next fetch
// brings from the committed offset: five of them were handed out and
// never settled (their handler died), and must come again.
func TestRevokeAndReassignDuringAPoll(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, Config{CommitInterval: time.Second})
		h.call(h.s.assigned, p0)
		h.cl.answer(t, records(0, 10))
		first := h.taken()
		if len(first) != 10 {
			t.Fatalf("took %d deliveries, want 10", len(first))
		}
		h.ack(first[:5]...)
		// The consumer asks for more: the poll takes 10..19.
		if _, _, ok := h.cl.pending(); !ok {
			t.Fatal("no poll under way")
		}
		h.cl.fill(t, records(10, 20))
		// Revoked and assigned again; 5..9 are never settled.
		h.call(h.s.revoked, p0)
		h.call(h.s.assigned, p0)
		h.cl.releasePoll()
		// The new assignment fetches from the committed offset.
		from, ok := h.cl.committedAt(partition{"t", 0})
		if !ok || from != 5 {
			t.Fatalf("committed %d (%v) at the revocation, want 5", from, ok)
		}
		h.deliverAll(from, 20)
		h.close()
		h.checkCommitted(20)
		if c, _ := h.cl.committedAt(partition{"t", 0}); c != 20 {
			t.Errorf("committed %d at the end, want 20", c)
		}
	})
}

// deliverAll answers each poll with the records from..to-1 not yet taken
// by a poll, and acknowledges every delivery, until nothing more comes.
func (h *harness) deliverAll(from, to int64) {
	h.t.Helper()
	next := from
	for range 1000 {
		ds := h.taken()
		h.ack(ds...)
		// A commit comes between any two steps.
		time.Sleep(h.cfg.CommitInterval)
		synctest.Wait()
		h.checkCommitted(to)
		max, filled, ok := h.cl.pending()
		if len(ds) > 0 {
			continue
		}
		if !ok || filled || next >= to {
			return
		}
		end := min(next+int64(max), to)
		h.cl.answer(h.t, records(next, end))
		next = end
	}
	h.t.Fatal("deliveries never stopped")
}

// A Nack while a revocation waits for the partition's deliveries, or a
// poll that brings the partition's records meanwhile, must not put a
// record back in line after the partition is gone: handed out again, its
// acknowledgement would find no partition and never give back its place
// among the stream's MaxInFlight, which a stream holds until it stops.
func TestNoRecordOfARevokedPartitionIsHandedOut(t *testing.T) {
	for _, tc := range []struct {
		name string
		// during runs while the revocation waits for first's deliveries.
		during func(h *harness, first []idem.Delivery)
	}{
		{"nack", func(h *harness, first []idem.Delivery) {
			if err := first[0].Nack(context.Background(), 0); err != nil {
				h.t.Fatal(err)
			}
			h.ack(first[1:]...)
		}},
		{"poll", func(h *harness, first []idem.Delivery) {
			h.cl.releasePoll()
			synctest.Wait()
			h.ack(first...)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := newHarness(t, Config{})
				h.call(h.s.assigned, p0)
				h.cl.answer(t, records(0, 3))
				first := h.taken()
				// The next poll took 3..5 before the revocation.
				h.cl.fill(t, records(3, 6))
				done := h.callAsync(h.s.revoked, p0)
				synctest.Wait()
				tc.during(h, first)
				h.run(done)
				// The poll's goroutine, slow as can be, gets back now.
				h.cl.releasePoll()
				if ds := h.taken(); len(ds) > 0 {
					t.Errorf("handed out %d deliveries of a revoked partition", len(ds))
					h.ack(ds...)
				}
				if st := h.s.Stats(); st.InFlight != 0 || st.Held != 0 {
					t.Errorf("after the revocation: %d in flight, %d held; want none", st.InFlight, st.Held)
				}
				h.close()
			})
		})
	}
}

// A keyed message that keeps failing stays at the head of its partition,
// unsettled, while the records behind it are handled and acknowledged; a
// Nacked message waits for its delay. Neither may make the stream hold
// more than MaxInFlight records: those behind the head are settled, and
// waiting ones count.
func TestHeldWithinMaxInFlight(t *testing.T) {
	t.Run("poison at the head", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			h := newHarness(t, Config{MaxInFlight: 10})
			h.call(h.s.assigned, p0)
			const n = 1000
			next := int64(0)
			handled := 0
			for range 10 * n {
				ds := h.taken()
				for _, d := range ds {
					if offsetOf(d) == 0 {
						continue // the poison: held, never settled
					}
					h.ack(d)
					handled++
				}
				h.checkHeld()
				max, filled, ok := h.cl.pending()
				if len(ds) > 0 || !ok || filled || next >= n {
					if len(ds) == 0 {
						break
					}
					continue
				}
				end := min(next+int64(max), n)
				h.cl.answer(t, records(next, end))
				next = end
			}
			if handled != n-1 {
				t.Errorf("handled %d records behind the poison, want %d", handled, n-1)
			}
			h.close()
		})
	})
	t.Run("nacked", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			h := newHarness(t, Config{MaxInFlight: 10})
			h.call(h.s.assigned, p0)
			next := int64(0)
			for range 100 {
				for _, d := range h.taken() {
					if err := d.Nack(context.Background(), time.Hour); err != nil {
						t.Fatal(err)
					}
				}
				h.checkHeld()
				max, filled, ok := h.cl.pending()
				if !ok || filled {
					break
				}
				h.cl.answer(t, records(next, next+int64(max)))
				next += int64(max)
			}
			if st := h.s.Stats(); st.Delayed == 0 {
				t.Errorf("nothing delayed: %+v", st)
			}
			h.close()
		})
	})
}

// A commit the coordinator refuses for one partition is logged with the
// partition and counted, and tried again by the next commit.
func TestCommitRefusedForAPartition(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, Config{CommitInterval: time.Second})
		h.call(h.s.assigned, p0)
		h.cl.answer(t, records(0, 5))
		h.cl.mu.Lock()
		h.cl.refuse[partition{"t", 0}] = []error{kerr.RebalanceInProgress}
		h.cl.mu.Unlock()
		h.ack(h.taken()...)
		time.Sleep(1500 * time.Millisecond)
		synctest.Wait()
		if n := h.cfg.Counters.CommitFailures.Load(); n != 1 {
			t.Errorf("%d commit failures counted, want 1", n)
		}
		if log := h.logs.String(); !strings.Contains(log, "REBALANCE_IN_PROGRESS") || !strings.Contains(log, "partition=0") {
			t.Errorf("the refusal is not logged with its partition:\n%s", log)
		}
		if _, ok := h.cl.committedAt(partition{"t", 0}); ok {
			t.Fatal("committed though refused")
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if c, _ := h.cl.committedAt(partition{"t", 0}); c != 5 {
			t.Errorf("committed %d after the refusal, want 5", c)
		}
		h.close()
	})
}

// The commit loop's commit, slow to reach the coordinator, must not land
// after the newer one a revocation made: the partition's next owner would
// start further back, and apply again what was settled.
func TestCommitsLandInOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, Config{CommitInterval: time.Second})
		h.call(h.s.assigned, p0)
		h.cl.answer(t, records(0, 10))
		ds := h.taken()
		h.ack(ds[:5]...)
		h.cl.mu.Lock()
		h.cl.holdNext = true
		h.cl.mu.Unlock()
		time.Sleep(1500 * time.Millisecond) // the loop commits 5, slowly
		synctest.Wait()
		h.ack(ds[5:]...)
		h.call(h.s.revoked, p0)
		h.cl.releaseCommit()
		synctest.Wait()
		h.cl.mu.Lock()
		history := h.cl.history[partition{"t", 0}]
		h.cl.mu.Unlock()
		for i := 1; i < len(history); i++ {
			if history[i] < history[i-1] {
				t.Errorf("committed %v: an older offset landed after a newer one", history)
			}
		}
		if len(history) == 0 || history[len(history)-1] != 10 {
			t.Errorf("committed %v, want 10 last", history)
		}
		h.close()
	})
}

// countingContext counts the contexts derived from it that registered to
// hear of its end, and those that stopped listening: a derived context
// never cancelled stays registered as long as its parent lives.
type countingContext struct {
	context.Context
	done chan struct{}
	mu   sync.Mutex
	// live holds the registrations not stopped, by number.
	live map[int]bool
	n    int
}

func (c *countingContext) Done() <-chan struct{} { return c.done }

func (c *countingContext) AfterFunc(f func()) func() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n++
	n := c.n
	c.live[n] = true
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		was := c.live[n]
		delete(c.live, n)
		return was
	}
}

// A poll that waits for a Nacked record's delay cancels every context it
// derives from the caller's.
func TestPollReleasesItsContexts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, Config{})
		h.call(h.s.assigned, p0)
		h.cl.answer(t, records(0, 1))
		ds := h.taken()
		h.cancel() // the harness's consumer stops; this test takes
		synctest.Wait()
		if err := ds[0].Nack(context.Background(), time.Minute); err != nil {
			t.Fatal(err)
		}
		ctx := &countingContext{Context: context.Background(), done: make(chan struct{}), live: make(map[int]bool)}
		got, err := h.s.NextBatch(ctx, 1)
		if err != nil || len(got) != 1 {
			t.Fatalf("NextBatch: %d, %v", len(got), err)
		}
		ctx.mu.Lock()
		if len(ctx.live) > 0 {
			t.Errorf("%d contexts derived from the caller's, %d never released", ctx.n, len(ctx.live))
		}
		ctx.mu.Unlock()
		h.ack(got...)
		h.close()
	})
}

// A delivery stands for its record until it is settled, or until its
// partition is taken away and the record left for the next owner. Past
// that, Ack, Nack, Term and InProgress say so (ErrStaleDelivery), as every
// other transport's do, instead of reporting a settlement that counts for
// nothing: an Ack that returned nil after the revocation promised that the
// record would not come again, and the next owner gets it.
func TestStaleDeliveries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, Config{})
		h.call(h.s.assigned, p0)
		h.cl.answer(t, records(0, 3))
		ds := h.taken()
		if len(ds) != 3 {
			t.Fatalf("took %d deliveries, want 3", len(ds))
		}
		stale := func(what string, d idem.Delivery) {
			t.Helper()
			for name, err := range map[string]error{
				"Ack":        d.Ack(context.Background()),
				"Nack":       d.Nack(context.Background(), 0),
				"Term":       d.Term(context.Background()),
				"InProgress": d.InProgress(context.Background()),
			} {
				if !errors.Is(err, ErrStaleDelivery) {
					t.Errorf("%s of %s = %v, want ErrStaleDelivery", name, what, err)
				}
			}
		}
		h.ack(ds[0])
		stale("a delivery acknowledged already", ds[0])
		if err := ds[1].InProgress(context.Background()); err != nil {
			t.Errorf("InProgress of a delivery that stands: %v", err)
		}
		// RevokeWait ends with ds[1] and ds[2] unsettled: they go back.
		h.call(h.s.revoked, p0)
		stale("a delivery whose partition was revoked", ds[1])
		h.acked[offsetOf(ds[1])] = true // its effect committed after all
		if n, err := h.s.AckBatch(context.Background(), ds[1:]); n != 0 || err != nil {
			t.Errorf("AckBatch of stale deliveries = %d, %v; want them passed over", n, err)
		}
		if c, _ := h.cl.committedAt(partition{"t", 0}); c != 1 {
			t.Errorf("committed %d at the revocation, want 1", c)
		}
		h.close()
	})
}

// An Ack that comes while a revocation commits, after its RevokeWait ended
// with the delivery unsettled, counts for nothing: the commit carries the
// offsets read before it, and the partition is dropped right after. It
// must say so (ErrStaleDelivery), as it does once the partition is gone,
// rather than answer nil for a record the next owner gets again.
func TestAckDuringARevocationsCommitIsStale(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, Config{RevokeWait: time.Second})
		h.call(h.s.assigned, p0)
		h.cl.answer(t, records(0, 3))
		ds := h.taken()
		if len(ds) != 3 {
			t.Fatalf("took %d deliveries, want 3", len(ds))
		}
		h.ack(ds[0])
		h.cl.mu.Lock()
		h.cl.holdNext = true
		h.cl.mu.Unlock()
		done := h.callAsync(h.s.revoked, p0)
		// The RevokeWait ends with 1 and 2 unsettled; the commit of 1 is
		// on its way.
		time.Sleep(2 * time.Second)
		synctest.Wait()
		h.cl.mu.Lock()
		held := h.cl.held != nil
		h.cl.mu.Unlock()
		if !held {
			t.Fatal("no commit on its way after the RevokeWait")
		}
		err := ds[1].Ack(context.Background())
		if !errors.Is(err, ErrStaleDelivery) || !errors.Is(err, idem.ErrStaleDelivery) {
			t.Errorf("Ack while the revocation commits = %v, want ErrStaleDelivery: its offset is not in the commit", err)
		}
		if err := ds[2].InProgress(context.Background()); !errors.Is(err, ErrStaleDelivery) {
			t.Errorf("InProgress while the revocation commits = %v, want ErrStaleDelivery", err)
		}
		h.run(done)
		if c, _ := h.cl.committedAt(partition{"t", 0}); c != 1 {
			t.Errorf("committed %d at the revocation, want 1", c)
		}
		h.close()
	})
}
