// Package idemkafka is an idem.Publisher and idem.Subscriber on Apache
// Kafka, built on franz-go: the transport that lets a Kafka consumer write
// to a database, or call another service, exactly once in effect.
//
//	seeds, _ := idemkafka.ParseURL("kafka://broker-1:9092,broker-2:9092")
//	tr, err := idemkafka.Open(ctx, seeds, &idemkafka.Config{})
//	c, err := consumer.New(&consumer.Config{
//		Name: "settlement", Topic: "payments.succeeded",
//		Subscriber: tr, Inbox: inbox, DeadLetters: letters, Ledger: ledger, InTx: inTx,
//	})
//	err = c.Run(ctx, handler)
//
// # What idem adds to Kafka's exactly-once
//
// Kafka's exactly-once semantics (the idempotent producer, transactions,
// read_committed consumers) make a read-process-write loop exactly once
// when everything it writes is in Kafka: the output records and the
// consumer's offsets commit in one Kafka transaction. They end at Kafka's
// edge. A consumer whose effect is a row in PostgreSQL, or a call to a card
// network, cannot put that effect in a Kafka transaction: whichever it
// commits first, a crash before the second leaves the effect without its
// offset (the record comes again and the effect is applied twice) or the
// offset without its effect (the record is lost). That consumer is at least
// once, whatever the producer's settings.
//
// idem closes the gap on the receiving side: the consumer (package
// consumer) records each message's ID in an inbox in the same database
// transaction as the handler's writes. The offset is committed after that
// transaction, so a crash between the two costs a redelivery, which the
// inbox finds a duplicate and acknowledges without running the handler.
// Kafka's own guarantees are used where they hold: the relay's records
// are written by the idempotent producer with acks=all, so a producer
// retry does not write a batch twice; and where a copy is written anyway
// (the relay crashed after publishing and before marking its outbox rows,
// or another process published the same event), the event's ID travels in
// the record's header idem.id and the inbox absorbs the copy.
//
// # Records and messages
//
// Message.ID travels in the header idem.id, Key is the record's key,
// Headers are the record's other headers, Payload its value, and Time its
// timestamp (in milliseconds). A record another producer wrote, without
// idem.id, gets the ID topic/partition/offset, which every redelivery of
// it shares. Records of one key go to one partition (Kafka's murmur2
// partitioner), so per-key order is per-partition order; messages without
// a key are spread over the partitions, with no order between them.
//
// Missing topics are created with Config.Partitions and
// Config.ReplicationFactor, unless Config.ManualTopics.
//
// # Consumer groups, offsets and rebalances
//
// A Subscription's Consumer is a consumer group, its Topic the topic the
// group consumes; a group that has committed nothing starts at the oldest
// record. Each stream is one member of its group. It hands out the records
// of the partitions it owns, in offset order, and keeps, per partition,
// the records it holds from the oldest unsettled one on: the offset it
// commits is that record's, since everything before it is settled. So an
// offset never passes a record whose effect has not committed.
//
// Offsets commit asynchronously, in batches, every Config.CommitInterval
// (200ms by default): Ack costs no round trip. A crash loses at most that
// interval's commits; their records are delivered again, and the inbox
// absorbs them (TestCrashBeforeOffsetCommit kills a consumer after every
// effect committed and before any offset did: its next incarnation gets
// every record again and applies none twice).
//
// When a rebalance takes partitions away, the stream stops handing out
// their records, waits up to Config.RevokeWait for the deliveries of them
// it handed out to be settled, commits what was settled, and lets the
// rebalance go on; what is still unsettled is given back: the partition's
// next owner starts at the committed offset and gets it again, and the old
// owner's deliveries of it answer ErrStaleDelivery (from the moment the
// wait ends: a settlement after the commit read the marks would be in no
// commit). Should the old owner's
// handler commit it after all, the inbox stops the new owner's copy, and since both owners handle a key's records in offset order, a
// key's effects stay in order. A member that dies without leaving (a
// SIGKILL) keeps its partitions until Config.SessionTimeout passes, then
// they move with nothing committed past what it had committed.
// TestRebalanceMidBatch has a second member join while the first holds
// deliveries in its handlers, then kills the first.
//
// A poll under way when franz-go revokes a partition may still return
// records of it (franz-go promises only that a poll begun after
// OnPartitionsRevoked returns none), and on a lost session franz-go drops
// what it buffered only after OnPartitionsLost: each rebalance callback
// therefore waits for the poll under way to take its records in first, and
// no record of a partition being revoked is taken in or handed out, so the
// records of an ended assignment never mix with those the partition brings
// when it comes back. A model-based test (module
// idemkafka/internal/streammodel) holds the stream to this under arbitrary
// interleavings; docs/kafka.md says what was proven and how.
//
// # Memory
//
// A stream holds no more than MaxInFlight records (the Subscription's, the
// consumer's MaxPending): fetched and not handed out, handed out and not
// settled, waiting for a Nack's delay, or given back by a revocation under
// way. Settled records are not kept, so a message that keeps failing at the
// head of its partition holds only itself; the partition's committed
// position stays at it meanwhile. Transport.StreamStats tells what the
// streams of a consumer hold, how far they have fetched past the committed
// position and since when the oldest is held; idemprom.RegisterStream
// exports it.
//
// Every change of membership is a rebalance, and a member that died
// without leaving holds the next one up for RevokeWait and as long again
// (5s at most). Consumers that come and go faster than that keep the
// group rebalancing and consume little: nothing is lost or applied twice,
// but `idem torture messages --broker private-kafka` with a consumer
// killed every 700ms applied 12.5 events a second, against 115 with one
// killed every 3s.
//
// # Retries without blocking the partition
//
// Kafka settles a partition's records by moving one offset, not one record
// at a time, so a record that failed cannot be left on the broker for later
// while the records behind it are settled. idemkafka does not stop the
// partition for it. The consumer (package consumer) keeps a keyed message
// that failed at the head of its key, on a timer, with its backoff and its
// attempts in the Ledger: the key's later messages wait behind it, other
// keys, in the same partition too, flow. A keyless message is Nacked: the
// stream hands it out again after the delay, from memory. Either way its
// offset stays uncommitted meanwhile, which costs nothing while the
// consumer runs, and a redelivery of the records past it (absorbed by the
// inbox) should it crash. What fails for good, or too often, goes to idem's
// dead letters, as on every transport; the key's later messages are parked
// behind it. Attempt counts this stream's deliveries only: Kafka keeps no
// delivery count, and the Ledger's count is what survives a restart.
//
// # Settings Kafka needs
//
// The guarantee that a published message reaches its consumers rests on
// the topic keeping it. Warnings (logged when the transport first meets a
// topic, and refused by idem serve --strict) reports:
//
//   - retention.ms shorter than Config.RetryHorizon (7 days by default):
//     Kafka deletes records by age whether or not a group consumed them, so
//     a message waiting for a stopped consumer, or behind a parked key, is
//     lost, like a JetStream stream's MaxAge;
//   - retention.bytes set (Kafka's default is -1): records are deleted by
//     size as well, consumed or not;
//   - cleanup.policy with compact: compaction deletes a key's older
//     records once a newer one is written, consumed or not, so a message
//     behind a parked key or waiting for its retry is lost;
//   - a replication factor below 3 and min.insync.replicas below 2: with
//     acks=all a write is acknowledged once every in-sync replica has it,
//     and with one in-sync replica that is one disk;
//   - unclean.leader.election.enable=true: an out-of-sync replica may
//     become leader and truncate acknowledged records.
//
// Brokers should also keep offsets.retention.minutes above the longest a
// group may be stopped: a group whose offsets expire starts again at the
// oldest record (a redelivery of everything, absorbed by the inbox, at a
// cost). Transactions are not used; streams read with read_committed, so
// that records of other producers' aborted transactions are never
// delivered.
//
// # Tested against kfake, not Apache Kafka
//
// No Apache Kafka or Redpanda can be installed on the machines this project
// is built on, so CI runs every test against kfake, franz-go's in-process
// Kafka, started by the tests themselves: the transport conformance suite,
// per-key order over 10,000 messages with transient failures, the
// rebalance and crash tests above, and the e2e tests of the command. kfake
// speaks the wire protocol, consumer groups and the idempotent producer;
// but it is one process with no disks and no replication, so what follows
// was checked only against its model of Kafka, not against a broker:
//
//   - the idempotent producer's sequence checks and its fencing of an old
//     producer epoch (a retried batch written once);
//   - transaction timeouts and read_committed (the transport writes no
//     transactions, and reads past other producers' aborted ones);
//   - retention: kfake stores retention.ms, which Warnings reads, but the
//     deletion by age was not observed;
//   - acks=all, min.insync.replicas and leader elections, which mean
//     nothing on one broker without replicas;
//   - group rebalances, with kfake's coordinator and franz-go's
//     cooperative-sticky balancer.
//
// The conformance suite and the per-key order test also run against a real
// broker when IDEM_KAFKA_URL names one (kafka://HOST:PORT[,HOST:PORT]);
// they skip otherwise.
package idemkafka
