package idemnats

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"
)

// ErrDropsMessages is what every Warning wraps: a setting of the stream, or
// of a consumer, that can drop a message before every consumer has it.
var ErrDropsMessages = errors.New("idemnats: the setting can drop a message before its consumers have it")

// ErrSyncUnconfirmed is what the warning of DurabilityWarnings wraps: the
// servers' sync policy, which no client can read, has not been stated as
// sync_interval: always (Config.SyncAlways), so an acknowledged message may
// be in the servers' memory only, and lost if they all crash at once.
var ErrSyncUnconfirmed = errors.New("idemnats: the servers' sync policy is not known to fsync before acknowledging")

// A Warning is a setting found on the stream, or on one of its consumers,
// that can drop a message no consumer has settled. The transport goes on
// working and changes nothing; the setting wants an operator.
type Warning struct {
	// Stream is the stream the setting is on.
	Stream string
	// Consumer is the consumer the setting is on, or empty for a setting
	// of the stream.
	Consumer string
	// Setting names the setting as JetStream's configuration does:
	// "MaxAge", "MaxMsgs", "MaxBytes", "MaxMsgsPerSubject", "Retention",
	// "Storage", "MaxDeliver", "Replicas" or, from DurabilityWarnings,
	// "sync_interval".
	Setting string
	// Value is the setting's value.
	Value string
	// Meaning says what the setting does to a message.
	Meaning string

	// problem is what Unwrap returns, ErrDropsMessages when nil.
	problem error
}

func (w *Warning) Error() string {
	where := fmt.Sprintf("stream %q", w.Stream)
	if w.Consumer != "" {
		where += fmt.Sprintf(", consumer %q", w.Consumer)
	}
	return fmt.Sprintf("idemnats: %s: %s %s: %s", where, w.Setting, w.Value, w.Meaning)
}

// Unwrap returns ErrDropsMessages, or ErrSyncUnconfirmed for the warning
// of DurabilityWarnings.
func (w *Warning) Unwrap() error {
	if w.problem != nil {
		return w.problem
	}
	return ErrDropsMessages
}

// DurabilityWarnings returns what the transport cannot confirm about the
// servers' durability: unless Config.SyncAlways states otherwise, that
// the servers fsync before they acknowledge (sync_interval: always,
// nats-server 2.10 and later). A server keeps what it stores in the page
// cache and fsyncs it every 2 minutes by default, so a PubAck survives the
// server's process being killed, and the loss of one server of a
// replicated stream, but not a power loss or kernel crash of the single
// server, or of a majority of the stream's servers at once, within that
// interval. The setting is on the server, and no client can read it (the
// server's monitoring port shows it), so the transport reports it rather
// than checking it; see the package documentation. Unlike Warnings, it is
// reported whatever the stream, and not logged.
func (t *Transport) DurabilityWarnings() []*Warning {
	if t.cfg.SyncAlways {
		return nil
	}
	return []*Warning{{
		Stream:  t.cfg.Stream,
		Setting: "sync_interval",
		Value:   "unknown",
		Meaning: "a client cannot read the servers' sync policy; unless it is 'always' (nats-server 2.10 and later, " +
			"then set idemnats.Config.SyncAlways), a message acknowledged within the last sync interval (2 minutes " +
			"by default) is only in memory, and lost if its single server, or a majority of its replicas, crash " +
			"at once (a power loss, a kernel crash; a killed process loses nothing)",
		problem: ErrSyncUnconfirmed,
	}}
}

// replicasWarning returns the warning about the replicas of stream c on a
// server of cluster (empty when the server is alone), or nil.
func replicasWarning(c jetstream.StreamConfig, cluster string) *Warning {
	replicas := max(c.Replicas, 1)
	if cluster == "" || replicas >= 3 {
		return nil
	}
	return &Warning{Stream: c.Name, Setting: "Replicas", Value: strconv.Itoa(replicas),
		Meaning: "on a cluster, a stream on fewer than 3 servers loses its messages with the disk of its only " +
			"server (Replicas 1), and stops taking publishes when one of its servers is lost (Replicas 2, which " +
			"needs both for a quorum); 3 keeps them, and the stream, when one server is lost " +
			"(idemnats.Config.Replicas for a stream the transport creates, nats stream edit for one that exists)"}
}

// Warnings returns the settings found that can drop a message before its
// consumers have it, in the order found, each once: those of the stream
// and of its consumers when Open or New found it or created it, and the
// MaxDeliver of each consumer Subscribe has made with Config.MaxDeliver.
// Config.Logger receives each as it is found. The transport changes none
// of them; see the package documentation for what each means.
func (t *Transport) Warnings() []*Warning {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]*Warning, len(t.warnings))
	for i, w := range t.warnings {
		c := *w
		out[i] = &c
	}
	return out
}

// warn records each of ws not recorded yet, and logs it.
func (t *Transport) warn(ctx context.Context, ws ...*Warning) {
	for _, w := range ws {
		t.mu.Lock()
		seen := false
		for _, old := range t.warnings {
			if old.Stream == w.Stream && old.Consumer == w.Consumer && old.Setting == w.Setting {
				seen = true
				break
			}
		}
		if !seen {
			t.warnings = append(t.warnings, w)
		}
		t.mu.Unlock()
		if !seen {
			t.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "JetStream setting can drop messages",
				slog.String("stream", w.Stream), slog.String("consumer", w.Consumer),
				slog.String("setting", w.Setting), slog.String("value", w.Value), slog.String("meaning", w.Meaning))
		}
	}
}

// streamWarnings returns the settings of c that can drop a message before
// its consumers have it.
func streamWarnings(c jetstream.StreamConfig) []*Warning {
	var ws []*Warning
	add := func(setting, value, meaning string) {
		ws = append(ws, &Warning{Stream: c.Name, Setting: setting, Value: value, Meaning: meaning})
	}
	if c.MaxAge > 0 {
		add("MaxAge", c.MaxAge.String(), "a message older than that is removed, whether its consumers have it or not, "+
			"so a consumer stopped (or retrying) for longer loses it")
	}
	if c.Discard == jetstream.DiscardOld {
		if c.MaxMsgs > 0 {
			add("MaxMsgs", strconv.FormatInt(c.MaxMsgs, 10), "with Discard old, each message past that many removes the "+
				"oldest, whether its consumers have it or not (with Discard new the stream refuses the publish, which "+
				"the outbox retries)")
		}
		if c.MaxBytes > 0 {
			add("MaxBytes", strconv.FormatInt(c.MaxBytes, 10), "with Discard old, each message past that many bytes "+
				"removes the oldest, whether its consumers have it or not (with Discard new the stream refuses the "+
				"publish, which the outbox retries)")
		}
	}
	if c.MaxMsgsPerSubject > 0 && (c.Discard != jetstream.DiscardNew || !c.DiscardNewPerSubject) {
		add("MaxMsgsPerSubject", strconv.FormatInt(c.MaxMsgsPerSubject, 10), "each message past that many on one "+
			"subject (one topic) removes the subject's oldest, whether its consumers have it or not, unless "+
			"Discard is new and DiscardNewPerSubject set")
	}
	switch c.Retention {
	case jetstream.InterestPolicy:
		add("Retention", c.Retention.String(), "a message that no consumer's filter matches when it is published is "+
			"removed at once, and one is removed once the consumers it matched have acknowledged it: a consumer "+
			"name subscribed later never has it")
	case jetstream.WorkQueuePolicy:
		add("Retention", c.Retention.String(), "a message is removed once one consumer has acknowledged it, and the "+
			"server refuses a consumer whose filter overlaps another's: two consumer names cannot both have a topic")
	}
	if c.Storage == jetstream.MemoryStorage {
		add("Storage", c.Storage.String(), "the stream holds its messages in memory: a restart of the server loses them")
	}
	return ws
}

// maxDeliverWarning returns the warning about a consumer's MaxDeliver.
func maxDeliverWarning(stream, consumer string, maxDeliver int) *Warning {
	return &Warning{Stream: stream, Consumer: consumer, Setting: "MaxDeliver", Value: strconv.Itoa(maxDeliver),
		Meaning: "after that many deliveries the server stops delivering a message to the consumer, without a word: " +
			"the message stays in the stream, but the consumer never has it again, and it reaches idem's dead " +
			"letters only if the consumer package gave it up before (Retry.MaxAttempts below MaxDeliver)"}
}

// inspectStream returns the settings of st, and of its consumers, that can
// drop a message before its consumers have it. A server that refuses to
// list the consumers (the account may not) is logged and passed over.
func inspectStream(ctx context.Context, st jetstream.Stream, log *slog.Logger) []*Warning {
	info := st.CachedInfo()
	ws := streamWarnings(info.Config)
	consumers := st.ListConsumers(ctx)
	// The lister's goroutine ends only once its channel is drained.
	for ci := range consumers.Info() {
		if ci.Config.MaxDeliver > 0 {
			ws = append(ws, maxDeliverWarning(info.Config.Name, ci.Name, ci.Config.MaxDeliver))
		}
	}
	if err := consumers.Err(); err != nil {
		log.LogAttrs(ctx, slog.LevelWarn, "cannot list the stream's consumers to check their MaxDeliver",
			slog.String("stream", info.Config.Name), slog.String("error", err.Error()))
	}
	return ws
}
