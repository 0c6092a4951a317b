package bench

import (
	"context"
	"fmt"
	"hash/fnv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemkafka"
)

// kafkaPartitions is the partition count of the topics of both sides: the
// transport's default, so that the minimum spreads its work as widely.
const kafkaPartitions = 8

func kafkaBroker(seeds []string) broker {
	return broker{
		name: "kafka",
		open: func(ctx context.Context) (transport, error) {
			prefix := "idembench-" + randomID() + "."
			tr, err := idemkafka.Open(ctx, seeds, &idemkafka.Config{TopicPrefix: prefix, Partitions: kafkaPartitions})
			if err != nil {
				return transport{}, err
			}
			return transport{pub: tr, sub: tr, close: func() {
				tr.Close()
				deleteKafkaTopics(seeds, prefix+benchTopic)
			}}, nil
		},
		minimum: func(ctx context.Context, msgs []idem.Message, workers int, apply func(context.Context, string, string) error) (time.Duration, time.Duration, error) {
			return kafkaMinimum(ctx, seeds, msgs, workers, apply)
		},
	}
}

func deleteKafkaTopics(seeds []string, topics ...string) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...))
	if err != nil {
		return
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kadm.NewClient(cl).DeleteTopics(ctx, topics...)
}

// kafkaMinimum is what anyone would write with franz-go: every message
// produced with the client's defaults (idempotent, acks=all), flushed at
// the end; then a group consumer that polls, applies each record of a
// poll in its own transaction, with workers goroutines each taking its
// share of the keys (a key's records in order), and commits the poll's
// offsets before the next poll.
func kafkaMinimum(ctx context.Context, seeds []string, msgs []idem.Message, workers int, apply func(context.Context, string, string) error) (time.Duration, time.Duration, error) {
	topic := "idembench-min-" + randomID()
	prod, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.ProducerLinger(time.Millisecond))
	if err != nil {
		return 0, 0, err
	}
	defer prod.Close()
	defer deleteKafkaTopics(seeds, topic)
	if _, err := kadm.NewClient(prod).CreateTopic(ctx, kafkaPartitions, -1, nil, topic); err != nil {
		return 0, 0, err
	}
	began := time.Now()
	var perr error
	var pmu sync.Mutex
	for _, m := range msgs {
		r := &kgo.Record{Topic: topic, Key: []byte(m.Key), Value: m.Payload, Headers: []kgo.RecordHeader{{Key: "id", Value: []byte(m.ID)}}}
		prod.Produce(ctx, r, func(_ *kgo.Record, err error) {
			if err != nil {
				pmu.Lock()
				perr = err
				pmu.Unlock()
			}
		})
	}
	if err := prod.Flush(ctx); err != nil {
		return 0, 0, err
	}
	if perr != nil {
		return 0, 0, perr
	}
	published := time.Since(began)

	cons, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.ConsumerGroup("minimum"), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.DisableAutoCommit())
	if err != nil {
		return 0, 0, err
	}
	defer cons.Close()
	began = time.Now()
	done := 0
	for done < len(msgs) {
		fetches := cons.PollRecords(ctx, 1000)
		if err := ctx.Err(); err != nil {
			return 0, 0, err
		}
		if errs := fetches.Errors(); len(errs) > 0 {
			return 0, 0, fmt.Errorf("fetch: %w", errs[0].Err)
		}
		// Each worker takes the records of its share of the keys, in
		// order, so that a key's records are applied in order.
		lanes := make([][]*kgo.Record, workers)
		fetches.EachRecord(func(r *kgo.Record) {
			h := fnv.New32a()
			h.Write(r.Key)
			lane := int(h.Sum32() % uint32(workers))
			lanes[lane] = append(lanes[lane], r)
		})
		var wg sync.WaitGroup
		var aerr error
		var amu sync.Mutex
		for _, lane := range lanes {
			wg.Go(func() {
				for _, r := range lane {
					var id string
					for _, h := range r.Headers {
						if h.Key == "id" {
							id = string(h.Value)
						}
					}
					if err := apply(ctx, id, string(r.Key)); err != nil {
						amu.Lock()
						aerr = err
						amu.Unlock()
						return
					}
				}
			})
		}
		wg.Wait()
		if aerr != nil {
			return 0, 0, aerr
		}
		records := fetches.Records()
		if err := cons.CommitRecords(ctx, records...); err != nil {
			return 0, 0, fmt.Errorf("commit: %w", err)
		}
		done += len(records)
	}
	return time.Since(began), published, nil
}
