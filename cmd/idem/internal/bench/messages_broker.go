package bench

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemamqp"
	"github.com/idem-go/idem/idemnats"
)

// broker is a message broker the consumer may run on, with its inbox in a
// database.
type broker struct {
	name string
	// open returns the broker's transport for one measurement, on names of
	// its own, and what deletes them.
	open func(ctx context.Context) (transport, error)
	// minimum publishes msgs with the broker's own client, then consumes
	// them by hand with workers goroutines, applying each with apply and
	// acknowledging it; it returns how long the consuming took, and how
	// long the publishing.
	minimum func(ctx context.Context, msgs []idem.Message, workers int, apply func(ctx context.Context, id, key string) error) (consumed, published time.Duration, err error)
}

// transport is a broker's idem transport.
type transport struct {
	pub   idem.Publisher
	sub   idem.Subscriber
	close func()
}

// brokerMeasurements are the consumer, its minimum, and publishing, on b,
// with the inboxes of db.
func brokerMeasurements(b broker, db backend) []measurement {
	consumerName := "idem-consumer-" + b.name
	minimumName := "minimum-consumer-" + b.name
	return []measurement{
		{consumerName, func(ctx context.Context, o *MessagesOptions) ([]point, error) {
			w, err := db.open(ctx)
			if err != nil {
				return nil, err
			}
			defer w.close()
			tr, err := b.open(ctx)
			if err != nil {
				return nil, err
			}
			defer tr.close()
			const name = "settlement"
			if err := subscribeOnce(ctx, tr.sub, name); err != nil {
				return nil, err
			}
			msgs := backlog(o, randomID())
			began := time.Now()
			if err := publishAll(ctx, tr.pub, msgs); err != nil {
				return nil, err
			}
			published := time.Since(began)
			d, err := runConsumer(ctx, w, tr.sub, name, len(msgs), false)
			if err != nil {
				return nil, err
			}
			if err := w.check(ctx, name, len(msgs)); err != nil {
				return nil, err
			}
			return []point{
				{consumerName, "msgs_per_s", rate(len(msgs), d), "msgs/s"},
				{"idem-publish-" + b.name, "publish_per_s", rate(len(msgs), published), "msgs/s"},
			}, nil
		}},
		{minimumName, func(ctx context.Context, o *MessagesOptions) ([]point, error) {
			w, err := db.open(ctx)
			if err != nil {
				return nil, err
			}
			defer w.close()
			msgs := backlog(o, randomID())
			consumed, published, err := b.minimum(ctx, msgs, defaultConcurrency, func(ctx context.Context, id, key string) error {
				return w.byHand(ctx, minimumConsumer, id, key)
			})
			if err != nil {
				return nil, err
			}
			if err := w.check(ctx, minimumConsumer, len(msgs)); err != nil {
				return nil, err
			}
			return []point{
				{minimumName, "msgs_per_s", rate(len(msgs), consumed), "msgs/s"},
				{"minimum-publish-" + b.name, "publish_per_s", rate(len(msgs), published), "msgs/s"},
			}, nil
		}},
		{"idem-transport-" + b.name, func(ctx context.Context, o *MessagesOptions) ([]point, error) {
			tr, err := b.open(ctx)
			if err != nil {
				return nil, err
			}
			defer tr.close()
			d, err := takeAndAck(ctx, tr.pub, tr.sub, backlog(o, randomID()))
			if err != nil {
				return nil, err
			}
			return []point{{"idem-transport-" + b.name, "take_ack_per_s", rate(o.Messages, d), "msgs/s"}}, nil
		}},
	}
}

func natsBroker(url string) broker {
	return broker{
		name: "nats",
		open: func(ctx context.Context) (transport, error) {
			id := randomID()
			stream := "IDEMBENCH_" + strings.ToUpper(id)
			tr, err := idemnats.Open(ctx, url, &idemnats.Config{Stream: stream, SubjectPrefix: "idembench" + id})
			if err != nil {
				return transport{}, err
			}
			return transport{pub: tr, sub: tr, close: func() {
				tr.Close()
				deleteNATSStream(url, stream)
			}}, nil
		},
		minimum: func(ctx context.Context, msgs []idem.Message, workers int, apply func(context.Context, string, string) error) (time.Duration, time.Duration, error) {
			return natsMinimum(ctx, url, msgs, workers, apply)
		},
	}
}

func deleteNATSStream(url, stream string) {
	nc, err := nats.Connect(url)
	if err != nil {
		return
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	js.DeleteStream(ctx, stream)
}

// natsMinimum is what anyone would write with nats.go's JetStream API: an
// asynchronous publish of every message, awaited at the end; then workers
// each iterating a durable pull consumer's messages, applying and
// acknowledging each.
func natsMinimum(ctx context.Context, url string, msgs []idem.Message, workers int, apply func(context.Context, string, string) error) (time.Duration, time.Duration, error) {
	nc, err := nats.Connect(url)
	if err != nil {
		return 0, 0, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(256))
	if err != nil {
		return 0, 0, err
	}
	id := randomID()
	stream, subject := "IDEMBENCH_MIN_"+strings.ToUpper(id), "idembenchmin"+id
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{subject + ".>"}}); err != nil {
		return 0, 0, err
	}
	defer deleteNATSStream(url, stream)
	began := time.Now()
	for _, m := range msgs {
		msg := nats.NewMsg(subject + "." + m.Topic)
		msg.Data = m.Payload
		msg.Header.Set("Nats-Msg-Id", m.ID)
		msg.Header.Set("Key", m.Key)
		if _, err := js.PublishMsgAsync(msg); err != nil {
			return 0, 0, err
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		return 0, 0, ctx.Err()
	}
	published := time.Since(began)
	cons, err := js.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: "minimum", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		return 0, 0, err
	}
	var done atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	finished := make(chan struct{})
	var once sync.Once
	var its []jetstream.MessagesContext
	defer func() {
		for _, it := range its {
			it.Stop()
		}
		wg.Wait()
	}()
	began = time.Now()
	for range workers {
		it, err := cons.Messages()
		if err != nil {
			return 0, 0, err
		}
		its = append(its, it)
		wg.Go(func() {
			for {
				m, err := it.Next()
				if err != nil {
					if !errors.Is(err, jetstream.ErrMsgIteratorClosed) {
						errs <- err
					}
					return
				}
				meta, err := m.Metadata()
				if err == nil {
					err = apply(ctx, m.Headers().Get("Nats-Msg-Id"), m.Headers().Get("Key"))
				}
				if err == nil {
					err = m.Ack()
				}
				if err != nil {
					errs <- err
					return
				}
				if meta.NumDelivered == 1 && done.Add(1) == int64(len(msgs)) {
					once.Do(func() { close(finished) })
				}
			}
		})
	}
	select {
	case <-finished:
		return time.Since(began), published, nil
	case err := <-errs:
		return 0, 0, err
	case <-ctx.Done():
		return 0, 0, ctx.Err()
	}
}

func amqpBroker(url string) broker {
	return broker{
		name: "amqp",
		open: func(ctx context.Context) (transport, error) {
			ns := "idembench-" + randomID()
			tr, err := idemamqp.Open(ctx, url, &idemamqp.Config{Exchange: ns, QueuePrefix: ns})
			if err != nil {
				return transport{}, err
			}
			return transport{pub: tr, sub: tr, close: func() {
				dctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				tr.DeleteQueues(dctx)
				tr.Close()
				deleteAMQPExchange(url, ns)
			}}, nil
		},
		minimum: func(ctx context.Context, msgs []idem.Message, workers int, apply func(context.Context, string, string) error) (time.Duration, time.Duration, error) {
			return amqpMinimum(ctx, url, msgs, workers, apply)
		},
	}
}

func deleteAMQPExchange(url, name string) {
	conn, err := amqp.Dial(url)
	if err != nil {
		return
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return
	}
	ch.ExchangeDelete(name, false, false)
}

// amqpMinimum is what anyone would write with amqp091-go: a quorum queue,
// every message published with publisher confirms, awaited at the end;
// then one consumer with a prefetch of 256 whose deliveries workers apply
// and acknowledge.
func amqpMinimum(ctx context.Context, url string, msgs []idem.Message, workers int, apply func(context.Context, string, string) error) (time.Duration, time.Duration, error) {
	conn, err := amqp.Dial(url)
	if err != nil {
		return 0, 0, err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return 0, 0, err
	}
	queue := "idembench-min-" + randomID()
	if _, err := ch.QueueDeclare(queue, true, false, false, false, amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum}); err != nil {
		return 0, 0, err
	}
	defer func() {
		if c, err := conn.Channel(); err == nil {
			c.QueueDelete(queue, false, false, false)
		}
	}()
	if err := ch.Confirm(false); err != nil {
		return 0, 0, err
	}
	began := time.Now()
	confirms := make([]*amqp.DeferredConfirmation, 0, len(msgs))
	for _, m := range msgs {
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, false, false, amqp.Publishing{
			MessageId: m.ID, Headers: amqp.Table{"key": m.Key}, DeliveryMode: amqp.Persistent, Body: m.Payload,
		})
		if err != nil {
			return 0, 0, err
		}
		confirms = append(confirms, dc)
	}
	for _, dc := range confirms {
		ok, err := dc.WaitContext(ctx)
		if err != nil || !ok {
			return 0, 0, fmt.Errorf("publish not confirmed: %v", err)
		}
	}
	published := time.Since(began)
	cch, err := conn.Channel()
	if err != nil {
		return 0, 0, err
	}
	if err := cch.Qos(256, 0, false); err != nil {
		return 0, 0, err
	}
	deliveries, err := cch.ConsumeWithContext(ctx, queue, "", false, false, false, false, nil)
	if err != nil {
		return 0, 0, err
	}
	var done atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	finished := make(chan struct{})
	var once sync.Once
	began = time.Now()
	for range workers {
		wg.Go(func() {
			for {
				select {
				case <-finished:
					return
				case d, ok := <-deliveries:
					if !ok {
						return
					}
					key, _ := d.Headers["key"].(string)
					if err := apply(ctx, d.MessageId, key); err != nil {
						errs <- err
						return
					}
					if err := d.Ack(false); err != nil {
						errs <- err
						return
					}
					if !d.Redelivered && done.Add(1) == int64(len(msgs)) {
						once.Do(func() { close(finished) })
					}
				}
			}
		})
	}
	select {
	case <-finished:
	case err := <-errs:
		once.Do(func() { close(finished) })
		wg.Wait()
		return 0, 0, err
	case <-ctx.Done():
		once.Do(func() { close(finished) })
		wg.Wait()
		return 0, 0, ctx.Err()
	}
	d := time.Since(began)
	wg.Wait()
	cch.Close()
	return d, published, nil
}
