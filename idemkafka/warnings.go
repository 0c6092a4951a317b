package idemkafka

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// ErrDropsMessages is what every Warning wraps: a setting of a topic that
// can lose a message before its consumers have it.
var ErrDropsMessages = errors.New("idemkafka: the setting can lose a message before its consumers have it")

// A Warning is a topic setting that can lose a message no consumer has
// settled. The transport goes on working and changes nothing; the setting
// wants an operator.
type Warning struct {
	// Topic is the topic the setting is on.
	Topic string
	// Setting names the setting as Kafka's configuration does:
	// "retention.ms", "retention.bytes", "cleanup.policy",
	// "min.insync.replicas", "unclean.leader.election.enable" or
	// "replication.factor".
	Setting string
	// Value is the setting's value.
	Value string
	// Meaning says what the setting does to a message.
	Meaning string
}

func (w *Warning) Error() string {
	return fmt.Sprintf("idemkafka: topic %q: %s %s: %s", w.Topic, w.Setting, w.Value, w.Meaning)
}

// Unwrap returns ErrDropsMessages.
func (w *Warning) Unwrap() error { return ErrDropsMessages }

// Warnings reads topic's settings and returns those that can lose a
// message:
//
//   - retention.ms shorter than Config.RetryHorizon: a message still
//     waiting for a retry, or for a stopped consumer, is deleted;
//   - retention.bytes set (0 or more): records are deleted by size as by
//     age, consumed or not;
//   - cleanup.policy with compact: a key's older records are deleted once
//     a newer one is written, consumed or not;
//   - replication.factor below 3, or min.insync.replicas below 2 (or
//     above the replication factor less one): an acknowledged write can be
//     held by one broker only, and lost with its disk;
//   - unclean.leader.election.enable=true: a replica that missed writes
//     can become leader and truncate what every other replica had.
//
// topic is an idem topic: Config.TopicPrefix is put before it, and
// Warning.Topic names the topic on Kafka. A topic that does not exist is
// an error.
func (t *Transport) Warnings(ctx context.Context, topic string) ([]*Warning, error) {
	topic = t.cfg.TopicPrefix + topic
	// A request of its own, not kadm's ListTopics: that one answers from
	// the client's metadata cache, which can still say that a topic just
	// created does not exist.
	req := kmsg.NewPtrMetadataRequest()
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, t.cl)
	if err != nil {
		return nil, fmt.Errorf("idemkafka: describing topic %q: %w", topic, err)
	}
	rf := 0
	found := false
	for _, mt := range resp.Topics {
		if mt.Topic == nil || *mt.Topic != topic {
			continue
		}
		if err := kerr.ErrorForCode(mt.ErrorCode); err != nil {
			return nil, fmt.Errorf("idemkafka: describing topic %q: %w", topic, err)
		}
		found = true
		for _, p := range mt.Partitions {
			if rf == 0 || len(p.Replicas) < rf {
				rf = len(p.Replicas)
			}
		}
	}
	if !found {
		return nil, fmt.Errorf("idemkafka: describing topic %q: %w", topic, kerr.UnknownTopicOrPartition)
	}
	rcs, err := t.adm.DescribeTopicConfigs(ctx, topic)
	if err != nil {
		return nil, fmt.Errorf("idemkafka: reading the settings of topic %q: %w", topic, err)
	}
	rc, err := rcs.On(topic, nil)
	if err != nil || rc.Err != nil {
		return nil, fmt.Errorf("idemkafka: reading the settings of topic %q: %w", topic, errors.Join(err, rc.Err))
	}
	settings := make(map[string]string)
	for _, c := range rc.Configs {
		settings[c.Key] = c.MaybeValue()
	}
	var ws []*Warning
	warn := func(setting, value, meaning string) {
		ws = append(ws, &Warning{Topic: topic, Setting: setting, Value: value, Meaning: meaning})
	}
	if v, ok := settings["retention.ms"]; ok {
		if ms, err := strconv.ParseInt(v, 10, 64); err == nil && ms >= 0 && time.Duration(ms)*time.Millisecond < t.cfg.RetryHorizon {
			warn("retention.ms", v, fmt.Sprintf("records are deleted after %v, before the retry horizon of %v: a message still waiting for a retry or for a stopped consumer is lost", time.Duration(ms)*time.Millisecond, t.cfg.RetryHorizon))
		}
	}
	if v, ok := settings["retention.bytes"]; ok {
		if n, err := strconv.ParseInt(v, 10, 64); err == nil && n >= 0 {
			warn("retention.bytes", v, "records are deleted once a partition holds more than this many bytes, consumed or not: a message still waiting for a retry or for a stopped consumer is lost")
		}
	}
	if v := settings["cleanup.policy"]; slices.Contains(strings.Split(strings.ReplaceAll(v, " ", ""), ","), "compact") {
		warn("cleanup.policy", v, "compaction deletes a key's older records once a newer one is written, consumed or not: a message waiting behind its parked key, for its retry or for a stopped consumer is lost")
	}
	if rf < 3 {
		warn("replication.factor", strconv.Itoa(rf), "fewer than 3 copies: losing a broker's disk can lose acknowledged messages, or stop writes")
	}
	if v, ok := settings["min.insync.replicas"]; ok {
		if n, err := strconv.Atoi(v); err == nil && n < 2 {
			warn("min.insync.replicas", v, "a write is acknowledged when one broker has it: losing that broker's disk loses it")
		}
	}
	if v := settings["unclean.leader.election.enable"]; v == "true" {
		warn("unclean.leader.election.enable", v, "a replica that missed acknowledged writes can become leader and truncate them")
	}
	return ws, nil
}
