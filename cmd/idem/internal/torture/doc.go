// Package torture puts idem's promise under load and faults, at scale,
// and checks that it held. For the request half (Run): however often a
// payment is sent, and whatever is lost or killed on the way, it is
// charged exactly once and every answer for its key names the same
// payment. For the message half (RunMessages): however often an event is
// delivered, and whichever consumer or broker dies on the way, it is
// applied exactly once, in its key's order.
//
// # The request run
//
// Run starts Config.Replicas replicas of `idem serve` as child processes
// of Config.Executable (`idem torture requests` passes its own binary),
// each listening on 127.0.0.1 with a port of its own (--addr 127.0.0.1:0,
// read from its "idem: listening on URL" line), all on one database: a
// SQLite file in a temporary directory, or with Config.DB a PostgreSQL
// schema of the run's own (serve's --pg-schema); with Config.Keys the
// idempotency keys live in Redis under a key prefix of the run's own
// (--keys-prefix). The replicas share one API key, given in their
// environment (IDEM_API_KEYS) rather than on their command line, where any
// user of the machine could read it. The run creates 64 accounts with a
// balance no run exhausts.
//
// In front of every replica stands a fault proxy, on a listener of its own
// that outlives the replica's restarts. It forwards each request and, for
// Config.DropRate of them (10% by default), waits for the replica's answer
// and then closes the client's connection without passing it on: the lost
// acknowledgement, after the charge; the first answer of one payment whose
// client stays, drawn from the seed (and never made abandoned during the
// load), is dropped whatever the rate draws, so a run meets at least one.
// While the replica is down it answers 502.
//
// Config.Clients clients work on Config.Payments logical payments, each
// with its own Idempotency-Key, account and amount, attempted Config.Dups
// times: half of the attempts at once, racing, the rest one after another
// once those have their answers. Each attempt goes to a random replica's
// proxy and is retried, with the same key and body and a short jittered
// backoff, until it gets a 2xx: an attempt that got no answer, a 409 (the
// key still in flight) or a 5xx is sent again, through a replica chosen
// again. Bodies are sent so that net/http never resends a request by itself
// (it would for one with an Idempotency-Key on a kept-alive connection): each
// attempt on the wire is counted, and retried by the run alone. Every
// Config.KillEvery (2s by default) a random replica is SIGKILLed, its proxy
// answering 502 meanwhile, and started again.
//
// With Config.StoreFaults, a TCP proxy of the run's own also stands
// between the replicas and each store (PostgreSQL, and Redis with
// Config.Keys), and once the load starts (and after a connection's first
// three seconds, so that replicas start and migrate) it delays chunks of
// bytes, resets connections, and, on PostgreSQL, drops the answer to a
// COMMIT the database carried out and resets the connection instead: the
// ambiguous commit, after which a replica cannot tell whether its
// transaction committed. The proxy reads PostgreSQL's plain protocol, so
// the replicas reach it with sslmode=disable; it never touches the stores
// themselves. With StoreFaults.OutageEvery it also takes a random store
// down now and then (every connection reset, new ones refused, for
// OutageFor), never while a killed replica restarts. Rates alone would
// leave the faults to chance (replicas killed more often than a
// connection's grace keep almost every connection young), so the first
// fault of each kind asked for is scheduled: at a payment of the first
// half of the load, drawn from the seed, the run waits until no replica
// is starting and resets a connection open to a store drawn too, at once
// whatever its age or traffic (the next chunk when none is open), cuts
// that store's next COMMIT's answer, or starts an outage; the load's last
// quarter waits for the resets and outages, as for the kills and restarts
// below, and for the cut: a cut needs a COMMIT, which only the load makes,
// so while its order stands (no replica starting meanwhile) payments go on
// being handed out, each committed through the store before it is
// answered, and the first COMMIT's answer after the order is cut, even one
// split across two reads. A cut (or a reset with no connection open) that
// met no traffic before the load's end is the run's error, naming the
// seed. A run with a rate meets at least one of its faults. Report.StoreResets,
// Report.CommitCuts and Report.StoreOutages count what it did. Kills and
// store restarts are scheduled alike, since a ticker alone leaves a short
// or fast run without them: the first SIGKILL of a replica, and a restart
// of each private store (two at least in all), each come at a payment of
// the first half drawn from the seed, and the load hands out its last
// quarter only once they have happened.
//
// With Config.DB or Config.Keys Private, the run starts a PostgreSQL or a
// Redis server of its own (package internal/localserver), on a free
// loopback port, its data in the temporary directory: PostgreSQL with
// fsync on, Redis with an append-only file fsynced on every write, so
// that what a store acknowledged survives its crash, as it would a
// production store's; with Config.Keys PrivateVolatile, a Redis that
// keeps nothing on disk instead, as one run as a cache does, which forgets
// every key at each restart. With Config.RestartStoresEvery it SIGKILLs one of
// them, at random, that long after the last came back (PostgreSQL with its
// backends), starts it again on the same port and data, and waits until it serves, never while
// a killed replica restarts or a store outage lasts: whatever the store
// had acknowledged must still be there, and whatever was in flight is
// lost, a transaction rolled back, a COMMIT's answer never sent. Meanwhile
// the replicas answer 5xx, and the clients retry; the replicas are not
// restarted, so their connection pools must find their way back to the
// store by themselves. Only these private servers are ever restarted:
// one given by URL is shared with others, and the run only connects to
// it. The store proxies of Config.StoreFaults stand in front of the
// private servers as they would in front of any other. Report.StoreRestarts
// counts the restarts.
//
// Config.Timeout bounds the load's stalls, not its length: the load ends
// once no logical payment has completed for that long, so a run on a busy
// machine takes as long as it keeps completing payments and a stuck one
// still ends, with a violation naming the scheduled faults its last
// quarter still awaited (each not yet happened, and whether its order
// stood for the load's traffic to carry out), or saying none was; the
// checks and the clean-up each have a minute of their own. Whatever happens, on failure and on cancellation
// (Ctrl-C) too, every replica is stopped (SIGTERM, then SIGKILL), every
// proxy and private server closed, and the temporary directory, the schema
// and the Redis keys deleted. On Linux the replicas run in a process group of their own, so a
// Ctrl-C reaches the run alone, and the kernel kills them should the run
// itself die.
//
// # The checks
//
// Each payment's description is its logical payment's key, so the
// database says which logical payment every row belongs to, even in unsafe
// mode, which keeps no keys. Once the load is over the run reads the
// payments and the balances from the database itself, and the balances
// and every answered payment from the API, and reports a violation for:
//
//   - a logical payment with more than one payment in the database, or
//     none though it was answered 2xx; a payment that is none of the run's;
//   - a logical payment whose answers carry more than one payment id, or an
//     id the database or the API has with another account or amount;
//   - an attempt that never got a 2xx (before the load stalled) or got another
//     answer (402, 422, …);
//   - money taken from the accounts, by the database's balances or the
//     API's, other than the sum of the logical payments' amounts.
//
// Report holds the figures (attempts sent, lost responses, kills, store
// faults and restarts, payments, money taken against owed, time) and the violations, by key and
// payment; Report.Print writes them as a table, Report.PrintResults as
// lines RESULT,torture-requests-<db>,<metric>,<value>,<unit> (<db> is
// sqlite or pg, with -keys for Redis keys and -unsafe against unsafe
// mode). Report.OK is true only when the promise held. Config.Unsafe runs
// the replicas with --unsafe-no-idempotency, against which the checks must
// find double charges: that is the torture's own test.
//
// # The full run
//
// At least 100,000 attempts over at least 10,000 logical payments, on
// SQLite, with the defaults (3 replicas, 10% of answers lost, a replica
// killed every 2s):
//
//	idem torture requests --payments 12500 --dups 8 --replicas 3
//
// and on PostgreSQL with the keys in Redis:
//
//	idem torture requests --payments 12500 --db postgres://postgres@127.0.0.1:5432/test --keys redis://127.0.0.1:6379/0
//
// and on private PostgreSQL and Redis servers, one of which crashes every
// 15s:
//
//	idem torture requests --payments 12500 --dups 8 --db private --keys private --restart-stores-every 15s
//
// # The message run
//
// RunMessages publishes MessagesConfig.Events events (a million by
// default) spread over MessagesConfig.Keys keys: event i is about key
// i mod Keys, with sequence number i div Keys + 1 in it, and its payload
// says so ("event key seq"). They go out in batches of 500, each followed
// by the copies of the batch before, so every event is published twice;
// every other copy carries a message ID of its own, which only the inbox
// can catch, and the rest the original's, which a broker's own
// de-duplication (JetStream's Nats-Msg-Id window) may catch first. A
// batch whose publication fails, on a broker restarting, is published
// again whole. The publisher keeps at most MessagesConfig.Backlog
// messages (100,000) ahead of the consumers, as a producer held back by
// flow control would: a broker restarted with millions of messages
// queued spends its time recovering them (a RabbitMQ quorum queue with
// 1.8 million queued fell from a thousand events a second to fifty), and
// that tests the broker, not idem.
//
// MessagesConfig.Consumers consumer processes (`idem torture
// messages-worker`, started with their configuration in WorkerEnv)
// compete for the events under one durable name, each a consumer.Consumer
// whose handler writes one row per event to an effects table, in the
// inbox's transaction. By default they de-duplicate by key and sequence
// number (consumer.Config.Sequence, a gap held back), so each key's events
// must be applied in order, one at a time; with MessagesConfig.ByID by the
// event number, in batches (consumer.Config.DedupKey with RunBatch), and
// competing consumers may then apply a key's events in any order. Every
// MessagesConfig.KillEvery a random consumer is SIGKILLed; each consumer
// also SIGKILLs itself, at MessagesConfig.AckKillRate, as soon as an event
// is processed (its effect and its inbox row committed) and before its
// acknowledgement is sent (one consumer drawn from the seed does so too
// after a message number drawn from it, in each life until it has, so
// that a short run meets at least one such kill): the broker delivers it
// again after MessagesConfig.AckWait, and the inbox must catch it. A consumer that
// exits is started again; one that exits by itself, not by a SIGKILL, is
// a violation.
//
// The broker is the SQLite file that also holds the inbox, a PostgreSQL
// schema of the run's own, a JetStream stream or a RabbitMQ exchange and
// queues of the run's own (with the inbox in SQLite or PostgreSQL, and
// RabbitMQ's delivery limit set above the consumer's, so that the consumer
// decides what is dead); or, with PrivatePostgres, PrivateNATS or
// PrivateRabbitMQ, a server the run starts itself, which
// MessagesConfig.RestartBrokerEvery SIGKILLs and starts again on its data,
// never while a consumer starts: the consumers resubscribe by themselves.
//
// Once every event has an effect, and every copy was published, the kills
// stop, and the run waits AckWait and two seconds more, for the
// redeliveries of what was applied and never acknowledged. Then it reads
// the effects and reports a violation for an event applied more than once
// or never, an effect out of its key's order (in sequence mode), a dead
// letter (with its reason), a consumer that exited by itself, or the
// time running out. MessagesReport holds the figures; Print writes them
// as a table, PrintResults as lines
// RESULT,torture-messages-<broker>[-<db>][-byid],<metric>,<value>,<unit>.
// MessagesConfig.Unsafe gives the consumers an inbox that records
// nothing, against which the checks must find events applied twice.
//
// Sequence mode on a broker that spreads a key's messages over competing
// consumers (JetStream, RabbitMQ) is slow: the consumer that gets a key's
// next event while another still holds the one before hands it back
// (GapHold) until that one is applied, so throughput falls with every
// consumer added; one consumer, or de-duplication by ID, avoids it.
//
// # The full message run
//
// A million events, each published twice, by event ID on SQLite:
//
//	idem torture messages --by-id
//
// by key and sequence number, on SQLite and on PostgreSQL:
//
//	idem torture messages --events 50000
//	idem torture messages --events 50000 --broker postgres://postgres@127.0.0.1:5432/test
//
// and on JetStream and RabbitMQ, their broker restarted now and then:
//
//	idem torture messages --broker private-nats --restart-broker-every 20s --by-id --events 200000
//	idem torture messages --broker private-rabbitmq --restart-broker-every 20s --by-id --events 200000
package torture
