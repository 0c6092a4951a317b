package torture

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consumer"
)

// WorkerEnv is the environment variable through which a message torture
// hands each consumer process its configuration, as JSON: the command that
// runs RunWorker reads it and passes it on.
const WorkerEnv = "IDEM_TORTURE_WORKER"

// consumingPrefix is the line a consumer process prints on stderr once it
// has subscribed.
const consumingPrefix = "idem: consuming"

// workerConfig is what a consumer process is told.
type workerConfig struct {
	N    int      `json:"n"`
	Site siteSpec `json:"site"`
	// Sequence de-duplicates by key and sequence number; otherwise by the
	// event number, in batches.
	Sequence bool `json:"sequence"`
	// Unsafe consumes with an inbox that records nothing.
	Unsafe      bool    `json:"unsafe,omitempty"`
	AckKillRate float64 `json:"ack_kill_rate,omitempty"`
	// AckKillAt, when above 0, makes the consumer SIGKILL itself after
	// its AckKillAt-th processed message, whatever AckKillRate draws: the
	// run gives it to one consumer until one such kill happened, so that
	// every run with an ack-kill rate meets at least one.
	AckKillAt int `json:"ack_kill_at,omitempty"`
	// AckKillMark, when set, is a file the kill at AckKillAt creates
	// first, and only when it does not exist yet: the run gives AckKillAt
	// to every consumer, and the first to process that many messages is
	// the one that kills itself then. However the transport shares the
	// messages out (a busy consumer of the SQLite transport can take
	// nearly all of them), one of C consumers processes at least 1/C of
	// the events, more than AckKillAt (at most a quarter of that).
	AckKillMark string        `json:"ack_kill_mark,omitempty"`
	AckWait     time.Duration `json:"ack_wait"`
	Seed        uint64        `json:"seed"`
}

// The consumers' policies: patient enough that a broker restart, a
// killed peer's unacknowledged messages or a long gap is ridden out, never
// dead-lettered, and quick to try again.
var (
	workerRetry       = idem.RetryPolicy{MaxAttempts: 100, Base: 50 * time.Millisecond, Cap: time.Second}
	workerResubscribe = idem.RetryPolicy{Base: 50 * time.Millisecond, Cap: time.Second}
)

// holdingEvery is how often a consumer says what its streams hold.
const holdingEvery = 100 * time.Millisecond

// sequencePending is MaxPending and BatchSize in sequence mode. A message
// whose key's previous one is still held by another consumer is handed
// back until that one is applied (GapHold), so each consumer holds few:
// the fewer it holds, the fewer it hands back.
const sequencePending = 32

// RunWorker runs one consumer of a message torture until ctx ends: config
// is the JSON a run put in WorkerEnv. It prints "idem: consuming" on
// stderr once subscribed, and its warnings after; the run watches for the
// first. With an ack-kill rate, it SIGKILLs its own process, now and then,
// right after a message's effect committed and before its
// acknowledgement: the broker delivers it again, and the inbox must catch
// it.
func RunWorker(ctx context.Context, config string, stderr io.Writer) error {
	var cfg workerConfig
	if err := json.Unmarshal([]byte(config), &cfg); err != nil {
		return fmt.Errorf("torture worker: reading %s: %w", WorkerEnv, err)
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	s, err := openSite(ctx, cfg.Site, logger)
	if err != nil {
		return fmt.Errorf("torture worker %d: %w", cfg.N, err)
	}
	defer s.close()
	cc := &consumer.Config{
		Name:        messagesConsumer,
		Topic:       messagesTopic,
		Subscriber:  s.sub,
		Inbox:       s.inbox,
		DeadLetters: s.letters,
		Ledger:      s.ledger,
		InTx:        s.inTx,
		Retry:       workerRetry,
		Resubscribe: workerResubscribe,
		AckWait:     cfg.AckWait,
		Logger:      logger,
	}
	if cfg.AckKillRate > 0 || cfg.AckKillAt > 0 {
		cc.Observer = &ackKiller{rate: cfg.AckKillRate, at: cfg.AckKillAt, mark: cfg.AckKillMark, rng: rand.New(rand.NewPCG(cfg.Seed, uint64(os.Getpid())))}
	}
	switch {
	case cfg.Unsafe:
		cc.Inbox = forgetfulInbox{s.inTx}
		cc.DedupKey = eventKey
	case cfg.Sequence:
		cc.Sequence = func(m idem.Message) (string, uint64, error) {
			e, err := parseEvent(m)
			if err != nil {
				return "", 0, err
			}
			return "k" + strconv.FormatInt(e.key, 10), uint64(e.seq), nil
		}
		cc.Gap = idem.GapHold
		cc.MaxPending = sequencePending
		cc.BatchSize = sequencePending
	default:
		cc.DedupKey = eventKey
	}
	c, err := consumer.New(cc)
	if err != nil {
		return fmt.Errorf("torture worker %d: %w", cfg.N, err)
	}
	go func() {
		select {
		case <-c.Subscribed():
			fmt.Fprintln(stderr, consumingPrefix)
		case <-ctx.Done():
		}
	}()
	// A transport that tells what its streams hold (Kafka's) has it said
	// now and then, for the run to hold against the limit.
	if h, ok := s.sub.(interface {
		StreamStats(consumer string) idem.StreamStats
	}); ok {
		go func() {
			t := time.NewTicker(holdingEvery)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
				st := h.StreamStats(messagesConsumer)
				fmt.Fprintf(stderr, "%s%d peak %d limit %d bytes %d\n", heldPrefix, st.Held, st.HeldPeak, st.Limit, st.HeldBytes)
			}
		}()
	}
	one := func(ctx context.Context, m idem.Message) error {
		e, err := parseEvent(m)
		if err != nil {
			return idem.Permanent(err)
		}
		return s.apply(ctx, []effect{e})
	}
	if cfg.Sequence || cfg.Unsafe {
		err = c.Run(ctx, one)
	} else {
		err = c.RunBatch(ctx, func(ctx context.Context, msgs []idem.Message) error {
			effects := make([]effect, len(msgs))
			for i, m := range msgs {
				e, err := parseEvent(m)
				if err != nil {
					return &consumer.ItemError{Index: i, Err: idem.Permanent(err)}
				}
				effects[i] = e
			}
			return s.apply(ctx, effects)
		})
	}
	if err != nil && ctx.Err() == nil {
		return fmt.Errorf("torture worker %d: %w", cfg.N, err)
	}
	return nil
}

// eventKey de-duplicates by the event number in the payload, so that a
// copy re-published under another message ID is caught.
func eventKey(m idem.Message) (string, error) {
	e, err := parseEvent(m)
	if err != nil {
		return "", err
	}
	return "e" + strconv.FormatInt(e.event, 10), nil
}

// ackKiller SIGKILLs its own process, at rate, once a message was
// processed: its effect and inbox row committed, its acknowledgement not
// yet sent (the consumer observes OutcomeProcessed before it
// acknowledges).
type ackKiller struct {
	rate float64
	at   int    // kill after this many processed messages (0: only at rate)
	mark string // the kill at at is this consumer's only if it creates mark (workerConfig.AckKillMark)
	mu   sync.Mutex
	rng  *rand.Rand
	n    int // messages processed
}

func (k *ackKiller) Begin(ctx context.Context, _ consumer.Event) context.Context { return ctx }

func (k *ackKiller) End(_ context.Context, e consumer.Event) {
	if e.Outcome != consumer.OutcomeProcessed {
		return
	}
	k.mu.Lock()
	k.n++
	hit := k.n == k.at && k.first() || k.n != k.at && k.rng.Float64() < k.rate
	k.mu.Unlock()
	if hit {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal is on its way; nothing more may happen
	}
}

// first reports whether the kill at k.at is this consumer's: there is no
// mark, or this consumer created it.
func (k *ackKiller) first() bool {
	if k.mark == "" {
		return true
	}
	f, err := os.OpenFile(k.mark, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return false // another consumer's kill, or the run's mark: it happened
	}
	if err == nil {
		_ = f.Close()
	}
	// A mark this consumer cannot make (its directory gone, say) must not
	// take the scheduled kill away: the run waits for one.
	return true
}

// forgetfulInbox runs every message's handler and records nothing: the
// unsafe mode, in which a redelivered message is applied again. The run's
// own test uses it to show that the checks catch that.
type forgetfulInbox struct {
	inTx func(ctx context.Context, fn func(ctx context.Context) error) error
}

func (f forgetfulInbox) Process(ctx context.Context, _, _ string, fn func(ctx context.Context) error) error {
	return f.inTx(ctx, fn)
}
