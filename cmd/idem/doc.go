// Command idem runs the idem reference payment service and its tools.
//
//	idem serve     run the payment service over HTTP
//	idem demo      run the lab: retries double charge without idempotency keys, and never with them
//	               (demo messages: redeliveries, a poison message, a retry storm, reordered events)
//	idem migrate   create or update the database's tables
//	idem keys      inspect, purge, seal and settle stored idempotency keys (show, purge, seal, abandoned, settle)
//	idem dlq       list, show, edit, re-drive and discard dead letters (ls, show, edit, redrive, discard)
//	idem console   serve the operators' console for dead letters, without the service
//	idem torture   duplicate payments through lost answers and killed replicas, and check each charged once (torture requests)
//	idem probe     check from outside whether any endpoint honours idempotency keys (a report card)
//	idem version   print the version
//
// `idem demo` needs no flags and no setup: it is the place to start, and
// `idem demo messages` the second half, on consumers.
// `idem <command> --help` describes each command's flags.
//
// Data lives in --db: a SQLite file (sqlite:idem.db, the default) or a
// PostgreSQL schema (--db postgres://USER@HOST/DB --pg-schema idem) that
// several `idem serve` replicas behind a load balancer can share; a key
// claimed on one replica is then claimed for all. The idempotency keys live
// in the same database, and commit with each payment in one transaction,
// unless --keys redis://HOST:PORT/DB puts them in Redis (--keys-prefix).
// `idem serve` and `idem migrate` create or update the tables; on
// PostgreSQL several processes may do so at once. No URL is ever printed
// with a secret, in start-up records or errors: passwords, NATS tokens
// (nats://TOKEN@HOST) and query parameters such as ?password= or ?token=
// show as xxxxx, and a URL that does not parse is not shown at all.
//
// `idem serve` also runs the message pipeline: each payment's event goes
// through the outbox to --broker and is settled once by the consumer
// "settlement", retried up to --max-attempts with backoff between
// --retry-base and --retry-cap, and dead-lettered when it cannot succeed.
// --broker is empty for the database itself as the transport (SQLite or
// PostgreSQL with SKIP LOCKED), nats://HOST:PORT for NATS JetStream (stream
// IDEM, subject idem.payments.succeeded) or amqp://USER:PASS@HOST:PORT/ for
// RabbitMQ (topic exchange idem, routing key payments.succeeded, quorum queue
// idem.settlement); --broker-namespace renames those. `idem dlq` takes the
// same --db.
//
// Configuration comes from flags, and for secrets also from the environment:
// IDEM_API_KEYS holds the service's API keys ("tenant:key,tenant2:key2")
// when --api-keys is not given; IDEM_OPERATORS the console's operators
// ("name:token,…", `serve --console` and `idem console`), apart from the
// API keys; IDEM_KEY_SECRET seals the idempotency keys kept in the stores
// (an HMAC of tenant and key) and IDEM_BODY_KEYS ("id:key,…", AES-256)
// encrypts the answers kept for replay (see `idem keys seal` for turning
// sealing on for keys kept in clear); IDEM_KEY_DIGEST_SECRET (16 bytes at
// least) is the secret of the digests under which the logs name keys
// (serve's, `idem console`'s, `idem keys resume`'s and
// `idem keys settle`'s), the same on every replica and console to
// correlate their logs (a random one of each process's own otherwise); each of these, and IDEM_ACQUIRER_KEY,
// may instead be in a file that the variable of its name and _FILE names
// (IDEM_API_KEYS_FILE, …), as mounted secrets are; OTEL_TRACES_EXPORTER (console, otlp
// or none, the default) and the other OTEL_* variables configure tracing.
// IDEM_SQLITE_WRITER_WATCHDOG (a duration, 5s) makes serve on SQLite log
// every goroutine's stack on stderr when one transaction has held the
// database's single writer longer than that: what holds every write of the
// process up, named while it still does (idem torture sets it on its
// replicas when it keeps their logs).
// `serve --strict` refuses to start when a replicated database, key store
// or broker lacks a setting a guarantee rests on (docs/scale.md); without
// it each is logged. Only this command reads flags and the
// environment; the packages it wires together take their configuration as
// arguments.
//
// Exit status: 0 on success, 1 on failure (the message is on stderr), 2 on a
// usage error such as an unknown flag.
package main
