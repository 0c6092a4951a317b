package idemkafka_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consumer"
	"github.com/idem-go/idem/idemkafka"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemtest"
)

// severable is a network a test can cut, as a killed process's
// connections are: every connection is closed, and no new one opens. The
// client behind it can neither commit nor leave its group, so its
// partitions move only when its session times out.
type severable struct {
	mu    sync.Mutex
	conns []net.Conn
	cut   bool
}

func (n *severable) dial(ctx context.Context, network, host string) (net.Conn, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cut {
		return nil, errors.New("the test cut this client's network")
	}
	c, err := (&net.Dialer{}).DialContext(ctx, network, host)
	if err == nil {
		n.conns = append(n.conns, c)
	}
	return c, err
}

func (n *severable) sever() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.cut = true
	for _, c := range n.conns {
		_ = c.Close()
	}
}

// effects records, on the commit of idemmem's transaction, what each
// message wrote: the key and sequence number of every effect that
// committed, in commit order.
type effects struct {
	mu      sync.Mutex
	applied []effect
}

type effect struct {
	key, id string
	seq     int
}

func (e *effects) apply(ctx context.Context, m idem.Message) error {
	seq, err := strconv.Atoi(m.Headers["Seq"])
	if err != nil {
		return idem.Permanent(err)
	}
	tx, ok := idemmem.TxFromContext(ctx)
	if !ok {
		return idem.Permanent(errors.New("no transaction in the handler's context"))
	}
	return tx.OnCommit(func() {
		e.mu.Lock()
		defer e.mu.Unlock()
		e.applied = append(e.applied, effect{key: m.Key, id: m.ID, seq: seq})
	})
}

func (e *effects) count() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.applied)
}

// check fails t unless every message of perKey was applied once, each
// key's in order.
func (e *effects) check(t *testing.T, perKey map[string]int) {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	ids := make(map[string]int)
	seqs := make(map[string][]int)
	for _, a := range e.applied {
		ids[a.id]++
		seqs[a.key] = append(seqs[a.key], a.seq)
	}
	for id, n := range ids {
		if n != 1 {
			t.Errorf("%s applied %d times, want once", id, n)
		}
	}
	for key, n := range perKey {
		want := make([]int, n)
		for i := range want {
			want[i] = i + 1
		}
		if !slices.Equal(seqs[key], want) {
			t.Errorf("key %s applied %v, want 1 to %d in order", key, seqs[key], n)
		}
	}
}

// publishKeyed publishes n messages over keys keys, each key's numbered
// from 1 in its Seq header.
func publishKeyed(t *testing.T, tr *idemkafka.Transport, topic string, n, keys int) map[string]int {
	t.Helper()
	perKey := make(map[string]int)
	var batch []idem.Message
	for i := range n {
		key := fmt.Sprintf("acct-%03d", i%keys)
		perKey[key]++
		batch = append(batch, idem.Message{
			ID: fmt.Sprintf("evt-%05d", i), Topic: topic, Key: key,
			Headers: map[string]string{"Seq": strconv.Itoa(perKey[key])},
		})
		if len(batch) == 500 || i == n-1 {
			if err := tr.Publish(t.Context(), batch...); err != nil {
				t.Fatalf("Publish: %v", err)
			}
			batch = nil
		}
	}
	return perKey
}

// runner is one consumer process of the group: its transport, cut off by
// its network, and its consumer's Run.
type runner struct {
	net    *severable
	c      *consumer.Consumer
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
	err    error
}

func startRunner(t *testing.T, seeds []string, cfg idemkafka.Config, topic string, stores consumer.Config, handler consumer.Handler) *runner {
	t.Helper()
	r := &runner{net: &severable{}, done: make(chan error, 1)}
	cfg.ClientOptions = append(cfg.ClientOptions, kgo.Dialer(r.net.dial))
	tr := open(t, seeds, cfg)
	stores.Name, stores.Topic, stores.Subscriber = "settlement", topic, tr
	c, err := consumer.New(&stores)
	if err != nil {
		t.Fatalf("consumer.New: %v", err)
	}
	r.c = c
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { r.done <- c.Run(ctx, handler) }()
	t.Cleanup(r.stop)
	return r
}

// stop ends Run and waits for it.
func (r *runner) stop() {
	r.cancel()
	r.wait()
}

// wait waits for Run to return.
func (r *runner) wait() error {
	r.once.Do(func() { r.err = <-r.done })
	return r.err
}

// kill cuts the runner off as a SIGKILL would: nothing more reaches
// Kafka, neither a commit nor a goodbye to the group. Its Run is then
// stopped, in the background, so that its handlers write nothing more.
func (r *runner) kill() {
	r.net.sever()
	r.cancel()
}

// A second consumer joins the group while the first holds deliveries in
// flight, then the first is killed: the partitions move twice, the second
// time with uncommitted deliveries, and still every message is applied
// once, each key's in order.
func TestRebalanceMidBatch(t *testing.T) {
	t.Parallel()
	const n, keys, topic = 6000, 60, "payments.succeeded"
	seeds := startKafka(t)
	pub := open(t, seeds, idemkafka.Config{})
	cfg := idemkafka.Config{SessionTimeout: time.Second, RevokeWait: 2 * time.Second, CommitInterval: 50 * time.Millisecond}
	stores := consumer.Config{
		Inbox: idemmem.NewInbox(), DeadLetters: idemmem.NewDeadLetters(nil), Ledger: idemmem.NewLedger(),
		InTx:  idemmem.Transact,
		Retry: idem.RetryPolicy{MaxAttempts: 10, Base: time.Millisecond, Cap: 5 * time.Millisecond},
	}
	var fx effects
	// A gate slows the handlers until the second consumer has joined, so
	// that the rebalance meets deliveries handed out and not yet settled.
	gate := make(chan struct{})
	gated := func(waiting *atomic.Int64) consumer.Handler {
		return func(ctx context.Context, m idem.Message) error {
			select {
			case <-gate:
			default:
				waiting.Add(1)
				select {
				case <-gate:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			return fx.apply(ctx, m)
		}
	}
	perKey := publishKeyed(t, pub, topic, n, keys)

	var firstWaiting, secondWaiting atomic.Int64
	first := startRunner(t, seeds, cfg, topic, stores, gated(&firstWaiting))
	idemtest.Eventually(t, 30*time.Second, "the first consumer holding deliveries", func() bool { return firstWaiting.Load() > 0 })
	second := startRunner(t, seeds, cfg, topic, stores, gated(&secondWaiting))
	// The second gets partitions only once the first gave them up, with
	// deliveries of them in its handlers: RevokeWait ends, and what they
	// hold is given back.
	idemtest.Eventually(t, 30*time.Second, "the second consumer holding deliveries", func() bool { return secondWaiting.Load() > 0 })
	close(gate)
	// How long 6,000 messages take depends on the machine (on two busy
	// cores, more than a minute): the waits fail when no message has been
	// applied for a while, not when the load outlasts a fixed time.
	applied := func() int64 { return int64(fx.count()) }
	idemtest.EventuallyProgressing(t, 30*time.Second, "a third of the messages applied", n/3, applied)
	first.kill()
	idemtest.EventuallyProgressing(t, 30*time.Second, "every message applied", n, applied)
	second.stop()
	fx.check(t, perKey)
	t.Logf("first: %+v; second: %+v", first.c.Stats(), second.c.Stats())
}

// A crash between the effect's commit and the offsets' commit costs a
// redelivery, which the inbox absorbs: the consumer is killed after
// applying everything and before any commit, and its next incarnation gets
// every message again and applies none of them twice.
func TestCrashBeforeOffsetCommit(t *testing.T) {
	t.Parallel()
	const n, keys, topic = 500, 10, "payments.succeeded"
	seeds := startKafka(t)
	pub := open(t, seeds, idemkafka.Config{})
	// No commit comes within the test: the crash always falls between an
	// effect and its offset.
	cfg := idemkafka.Config{CommitInterval: time.Hour, SessionTimeout: time.Second, RevokeWait: time.Second}
	stores := consumer.Config{
		Inbox: idemmem.NewInbox(), DeadLetters: idemmem.NewDeadLetters(nil), Ledger: idemmem.NewLedger(),
		InTx: idemmem.Transact,
	}
	var fx effects
	perKey := publishKeyed(t, pub, topic, n, keys)
	first := startRunner(t, seeds, cfg, topic, stores, fx.apply)
	idemtest.Eventually(t, 30*time.Second, "every message applied", func() bool { return fx.count() >= n })
	first.kill()
	_ = first.wait()

	second := startRunner(t, seeds, cfg, topic, stores, fx.apply)
	idemtest.Eventually(t, 30*time.Second, "every message redelivered", func() bool { return second.c.Stats().Duplicates >= n })
	second.stop()
	if s := second.c.Stats(); s.Processed != 0 || s.Duplicates != n {
		t.Errorf("after the crash: %+v, want %d duplicates and nothing processed", s, n)
	}
	fx.check(t, perKey)
}
