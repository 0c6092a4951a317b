package main

import (
	"context"
	crand "crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/acquirer"
	"github.com/idem-go/idem/cmd/idem/internal/payments"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemredis"
)

// envAPIKeys is the environment variable read for API keys when --api-keys
// is not given: secrets are better kept out of the process list.
const envAPIKeys = "IDEM_API_KEYS"

// HTTP server limits. The write timeout leaves room for the idempotency
// middleware's in-flight wait and the handler's own time budget.
const (
	readHeaderTimeout = 10 * time.Second
	readTimeout       = 30 * time.Second
	writeTimeout      = 2 * time.Minute
	idleTimeout       = 2 * time.Minute
	maxHeaderBytes    = 64 << 10
)

type serveFlags struct {
	strict          bool
	discardBodies   bool
	addr            string
	grpcAddr        string
	db              string
	pgSchema        string
	keys            string
	keysPrefix      string
	keyTTL          time.Duration
	keyLease        time.Duration
	inflightWait    time.Duration
	shutdownTimeout time.Duration
	apiKeys         string
	unsafe          bool
	faults          bool
	workers         bool
	requestTimeout  time.Duration
	logLevel        string
	broker          string
	brokerNamespace string
	ackWait         time.Duration
	maxAttempts     int
	retryBase       time.Duration
	retryCap        time.Duration
	acquirer        string
	acquirerKey     string
	acquirerKeySet  bool
	replicaID       string

	// console and operators are --console and --operators.
	console      bool
	operators    string
	operatorsSet bool
	// consoleHTTPS is --console-public-https.
	consoleHTTPS bool

	// pgSchemaSet and apiKeysSet say whether --pg-schema and --api-keys
	// were given at all: --pg-schema is refused without PostgreSQL only
	// when given, and --api-keys not given falls back to the environment.
	pgSchemaSet, apiKeysSet bool
}

func (a *app) serveCmd() *cobra.Command {
	var f serveFlags
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the payment service over HTTP",
		Long: `Run the reference payment service over HTTP until SIGINT or SIGTERM.

Every POST needs an Idempotency-Key header: the first request with a key runs,
every later one with the same key and body gets the first answer replayed.

API keys come from --api-keys or, when it is not given, from the environment
variable ` + envAPIKeys + `, as "tenant:key,tenant2:key2". With neither, a
development tenant "dev" is created with a random key, printed on stderr.

Data lives in --db: a SQLite file, or a PostgreSQL schema (--pg-schema) that
several replicas may share; the tables are created or updated at start.
The idempotency keys live there too, and commit with every payment in one
transaction, unless --keys names a Redis server for them: then a payment
commits first and its key completes afterwards, and a crash between the two
is caught by the payment's unique (tenant, key, claim time) constraint when
the client retries after --key-lease.

Every payment is announced as a payment.succeeded event, written to an outbox
in the payment's transaction and relayed to --broker: the database itself by
default, NATS JetStream or RabbitMQ. The consumer "settlement" applies each
event once; what keeps failing goes to the dead letters (idem dlq).

With --grpc ADDR the payments' and refunds' writes are also served over gRPC
(service ` + payments.GRPCService + `, methods CreatePayment and CreateRefund,
each taking and answering a google.protobuf.Struct of the HTTP body's
members): the same keys, secrets, scopes and handlers, the API key as
"authorization: Bearer KEY" metadata and the idempotency key as
"idempotency-key" metadata; a retry's answer carries
"idempotent-replayed: true". It prints "idem: grpc listening on ADDR".`,
		Args: cobra.NoArgs,
	}
	f.define(cmd)
	cmd.RunE = a.action(func(cmd *cobra.Command, _ []string) error {
		f.pgSchemaSet, f.apiKeysSet = cmd.Flags().Changed("pg-schema"), cmd.Flags().Changed("api-keys")
		f.operatorsSet = cmd.Flags().Changed("operators")
		f.acquirerKeySet = cmd.Flags().Changed("acquirer-key")
		p, err := a.planServe(&f)
		if err != nil {
			return err
		}
		return a.runServe(cmd.Context(), p)
	})
	return cmd
}

// define adds serve's flags to cmd, bound to f: apart from serveCmd so
// that planServe can be tested on parsed flags without a command running.
func (f *serveFlags) define(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.addr, "addr", "127.0.0.1:8080", "address to listen on (host:port; port 0 picks a free one)")
	fl.StringVar(&f.grpcAddr, "grpc", "", "also serve the payments' and refunds' writes over gRPC on this address (host:port; port 0 picks a free one), "+
		"through idemgrpc on the same keys, secrets and scopes (service "+payments.GRPCService+"; not with --keys or --unsafe-no-idempotency); empty: no gRPC")
	dbFlags(cmd, &f.db, &f.pgSchema)
	keysFlags(cmd, &f.keys, &f.keysPrefix)
	fl.DurationVar(&f.keyTTL, "key-ttl", payments.DefaultKeyTTL, "how long an idempotency key is remembered")
	fl.DurationVar(&f.keyLease, "key-lease", 0, "how long an execution holds its key before a retry may take it over (after a crash); default "+idemhttp.DefaultLease.String()+", or --key-ttl when that is shorter")
	fl.DurationVar(&f.inflightWait, "inflight-wait", payments.DefaultInflightWait, "how long a duplicate waits for the first request with its key to finish")
	fl.DurationVar(&f.requestTimeout, "request-timeout", payments.DefaultRequestTimeout, "longest an API request may take: past it the client gets 503 and retries with its key (a stalled disk or database never holds clients for good); must exceed --inflight-wait; 0 turns it off")
	fl.DurationVar(&f.shutdownTimeout, "shutdown-timeout", 15*time.Second, "how long a shutdown waits for requests in flight")
	fl.StringVar(&f.apiKeys, "api-keys", "", `API keys, "tenant:key,tenant2:key2" (default from $`+envAPIKeys+`, or the file $`+envAPIKeys+`_FILE names)`)
	fl.BoolVar(&f.discardBodies, "discard-bodies", false, "keep only the status and headers of each answer for replay, never its body (replays say Idempotent-Body-Omitted: true); "+
		envKeySecret+" seals the keys kept, "+envBodyKeys+" encrypts the bodies kept")
	fl.BoolVar(&f.console, "console", false, "serve the operators' console for dead letters under "+consolePath+" (needs --operators)")
	fl.BoolVar(&f.consoleHTTPS, "console-public-https", false, "with --console: browsers reach it over https, through a proxy that terminates TLS, so its session cookie is marked Secure")
	fl.StringVar(&f.operators, "operators", "", `the console's operators, "name:token,name2:token2", apart from the API keys (default from $`+envOperators+`, or the file $`+envOperators+`_FILE names)`)
	fl.BoolVar(&f.strict, "strict", false, "refuse to serve when a replicated database, key store or broker lacks a setting a guarantee rests on (asynchronous standbys or replicas, queues that can drop); without it, each is logged as a warning")
	fl.BoolVar(&f.unsafe, "unsafe-no-idempotency", false, "ignore Idempotency-Key entirely: retries DOUBLE CHARGE (the lab's 'before')")
	fl.BoolVar(&f.workers, "workers", true, "run the outbox relay and the settlement consumer in this process; --workers=false serves requests only, and their events wait in the outbox for a serve with workers on the same --db")
	fl.BoolVar(&f.faults, "faults", false, "honour the Idem-Fault request header (delay=DURATION, fail-before-commit, drop-after-commit, crash-after-commit; with --acquirer, crash-after-charge and drop-charge-answer) and, on payment events, fail-times=N (the settlement consumer fails their first N attempts) and crash-after-settle (the process dies after settling, before acknowledging)")
	fl.StringVar(&f.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	fl.StringVar(&f.broker, "broker", "", "where payment events travel: empty for the --db database itself (the embedded transport), nats://HOST:PORT (JetStream), amqp://USER:PASS@HOST:PORT/ (RabbitMQ) or kafka://HOST:PORT[,HOST:PORT] (Kafka)")
	fl.StringVar(&f.brokerNamespace, "broker-namespace", defaultBrokerNamespace, "names what serve uses on the broker: NATS stream NAMESPACE (upper-cased) with subjects NAMESPACE.>, RabbitMQ exchange NAMESPACE and queues NAMESPACE.CONSUMER, or Kafka topics NAMESPACE.TOPIC")
	fl.DurationVar(&f.ackWait, "ack-wait", 30*time.Second, "how long a delivered event may go unacknowledged before it is delivered again (embedded transport and NATS; RabbitMQ redelivers when the consumer's connection drops)")
	fl.IntVar(&f.maxAttempts, "max-attempts", payments.DefaultMaxAttempts, "attempts of the settlement consumer at one event, the first included, before it is dead-lettered")
	fl.DurationVar(&f.retryBase, "retry-base", 100*time.Millisecond, "scale of the settlement consumer's first retry delay (exponential backoff, full jitter)")
	fl.DurationVar(&f.retryCap, "retry-cap", 30*time.Second, "longest retry delay of the settlement consumer")
	fl.StringVar(&f.acquirer, "acquirer", "", "the card network (idem acquirer) a payment charges the account's card at before it is recorded: http://HOST:PORT; empty: payments move money in --db alone")
	fl.StringVar(&f.acquirerKey, "acquirer-key", "", acquirerKeyUsage)
	fl.StringVar(&f.replicaID, "replica-id", "", "this replica's name as the holder of the keys it claims: the same when it restarts, different for every replica that runs at once; "+
		"at start it ends the leases its earlier run held, so what that run left is finished at once (default: the host's name and the address it listens on; none on a host without a name of its own, such as localhost)")
}

// servePlan is what serve runs, as its flags asked: plain values, checked,
// with nothing opened yet. planServe makes it; runServe opens and runs it.
// Keeping the two apart is what lets bad flags change nothing: no database
// file is created, no broker dialled, before every flag has been checked.
type servePlan struct {
	addr string
	// grpcAddr is --grpc: where the gRPC face listens; empty for none.
	grpcAddr string
	db       dbTarget
	pgSchema string
	// keys is the --keys store; its url is empty when the keys live in
	// the --db database.
	keys       keysTarget
	keysPrefix string
	// broker is the --broker transport; its kind is empty for the --db
	// database's own, embedded one.
	broker          brokerTarget
	brokerNamespace string
	logLevel        slog.Level
	shutdownTimeout time.Duration
	// payments holds the service's settings; runServe adds what only an
	// open connection gives (DB, Postgres, Keys, Broker) and the Logger.
	payments payments.Config
	// strict refuses to serve when a guarantee lacks its server setting.
	strict bool
	// console is the operators' console to mount; nil for none.
	console *consolePlan
	// devKey is the development tenant's key when no API keys were
	// configured, to be shown once the server listens; else empty.
	devKey string
	// replicaID is --replica-id; empty for the default, which needs the
	// address the server listens on.
	replicaID string
	// keyDigestSecret is $IDEM_KEY_DIGEST_SECRET: the secret of the
	// digests under which the logs name keys (idem.SetKeyDigestSecret);
	// nil for one of the process's own.
	keyDigestSecret []byte
	// writerWatchdog is $IDEM_SQLITE_WRITER_WATCHDOG (see
	// envWriterWatchdog); 0 for none.
	writerWatchdog time.Duration
}

// envKeyDigestSecret is the environment variable of the secret under
// which the logs name keys: the same on every replica, their logs name a
// key alike.
const envKeyDigestSecret = "IDEM_KEY_DIGEST_SECRET"

// keyDigestSecret reads $IDEM_KEY_DIGEST_SECRET (or the file
// $IDEM_KEY_DIGEST_SECRET_FILE names): nil when neither is set, an error
// naming the variable when it is shorter than idem.SetKeyDigestSecret
// takes.
func (a *app) keyDigestSecret() ([]byte, error) {
	v, ok, err := a.secretEnv(envKeyDigestSecret)
	if err != nil || !ok {
		return nil, err
	}
	if len(v) < 16 {
		return nil, fmt.Errorf("$%s: %d bytes long; at least 16 are needed", envKeyDigestSecret, len(v))
	}
	return []byte(v), nil
}

// useKeyDigestSecret makes $IDEM_KEY_DIGEST_SECRET (or its _FILE) the
// secret under which this process's logs name keys, as serve's do, for
// the commands that log about keys without serving (console, keys resume,
// keys settle); neither set leaves the process's own. A secret refused is
// a usage error, to be returned before anything is opened.
func (a *app) useKeyDigestSecret() error {
	secret, err := a.keyDigestSecret()
	if err != nil {
		return &usageError{err}
	}
	if secret != nil {
		if err := idem.SetKeyDigestSecret(secret); err != nil {
			return &usageError{fmt.Errorf("$%s: %w", envKeyDigestSecret, err)}
		}
	}
	return nil
}

// planServe checks every flag of serve and returns what to run. It opens
// nothing; it only reads the environment (for the API keys) and makes the
// development key when there are none. Each error names the flag at fault.
func (a *app) planServe(f *serveFlags) (*servePlan, error) {
	// --pg-schema without a PostgreSQL --db would be silently ignored (as
	// checkPGSchema refuses it for the other commands).
	if f.pgSchemaSet {
		if t, err := parseDB(f.db); err == nil && !t.postgres {
			return nil, errors.New("--pg-schema applies only to --db postgres://…")
		}
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(f.logLevel)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", f.logLevel)
	}
	db, err := parseDB(f.db)
	if err != nil {
		return nil, err
	}
	var keys keysTarget
	if f.keys != "" {
		if keys, err = parseKeys(f.keys); err != nil {
			return nil, err
		}
	}
	if f.keyTTL <= 0 || f.keyLease < 0 || f.inflightWait <= 0 || f.shutdownTimeout <= 0 {
		return nil, errors.New("--key-ttl, --inflight-wait and --shutdown-timeout must be positive, and --key-lease must not be negative")
	}
	var broker brokerTarget
	if f.broker != "" {
		if broker, err = parseBroker(f.broker); err != nil {
			return nil, err
		}
	}
	if err := checkNamespace(f.brokerNamespace); err != nil {
		return nil, err
	}
	if f.ackWait <= 0 {
		return nil, errors.New("--ack-wait must be positive")
	}
	if f.maxAttempts <= 0 || f.retryBase <= 0 || f.retryCap <= 0 {
		return nil, errors.New("--max-attempts, --retry-base and --retry-cap must be positive")
	}
	if f.retryCap < f.retryBase {
		return nil, fmt.Errorf("--retry-cap (%s) must not be shorter than --retry-base (%s)", f.retryCap, f.retryBase)
	}
	// payments.New refuses it too, but only after the database is open:
	// bad flags must change nothing, not even create the database file.
	if f.keyLease > f.keyTTL {
		return nil, fmt.Errorf("--key-lease (%s) must not be longer than --key-ttl (%s)", f.keyLease, f.keyTTL)
	}
	if f.replicaID != "" {
		if err := (idem.Holder{Replica: f.replicaID, Incarnation: "x"}).Validate(); err != nil {
			return nil, fmt.Errorf("--replica-id: %w", err)
		}
	}
	if f.requestTimeout < 0 || (f.requestTimeout > 0 && f.requestTimeout <= f.inflightWait) {
		return nil, fmt.Errorf("--request-timeout (%s) must be longer than --inflight-wait (%s), or 0 for none", f.requestTimeout, f.inflightWait)
	}
	if f.grpcAddr != "" && (f.keys != "" || f.unsafe) {
		return nil, errors.New("--grpc needs the keys in the --db database: not with --keys or --unsafe-no-idempotency")
	}
	apiKeys, devKey, err := a.apiKeys(f.apiKeys, f.apiKeysSet)
	if err != nil {
		return nil, err
	}
	con, err := a.planConsole(f.console, f.operators, f.operatorsSet)
	if err != nil {
		return nil, err
	}
	if con != nil {
		con.publicHTTPS = f.consoleHTTPS
	}
	rest, err := a.atRestFromEnv()
	if err != nil {
		return nil, err
	}
	digestSecret, err := a.keyDigestSecret()
	if err != nil {
		return nil, err
	}
	card, err := a.planAcquirer(f)
	if err != nil {
		return nil, err
	}
	watchdog, err := a.writerWatchdog()
	if err != nil {
		return nil, err
	}
	requestTimeout := f.requestTimeout
	if requestTimeout == 0 {
		requestTimeout = -1 // off: payments.Config's zero means its default
	}
	return &servePlan{
		keyDigestSecret: digestSecret,
		addr:            f.addr,
		grpcAddr:        f.grpcAddr,
		db:              db,
		pgSchema:        f.pgSchema,
		keys:            keys,
		keysPrefix:      f.keysPrefix,
		broker:          broker,
		brokerNamespace: f.brokerNamespace,
		logLevel:        level,
		shutdownTimeout: f.shutdownTimeout,
		payments: payments.Config{
			APIKeys:        apiKeys,
			KeyTTL:         f.keyTTL,
			KeyLease:       f.keyLease,
			InflightWait:   f.inflightWait,
			Unsafe:         f.unsafe,
			Faults:         f.faults,
			RequestsOnly:   !f.workers,
			RequestTimeout: requestTimeout,
			MaxAttempts:    f.maxAttempts,
			RetryBase:      f.retryBase,
			RetryCap:       f.retryCap,
			AckWait:        f.ackWait,
			KeySecret:      rest.keySecret,
			BodyKeys:       rest.bodyKeys,
			DiscardBodies:  f.discardBodies,
			Acquirer:       card,
			GRPC:           f.grpcAddr != "",
		},
		devKey:         devKey,
		strict:         f.strict,
		console:        con,
		replicaID:      f.replicaID,
		writerWatchdog: watchdog,
	}, nil
}

// planAcquirer makes the card network's client of --acquirer, or nil
// without it. It opens nothing: the client dials on its first charge.
func (a *app) planAcquirer(f *serveFlags) (*acquirer.Client, error) {
	if f.acquirerKeySet && f.acquirer == "" {
		return nil, errors.New("--acquirer-key applies only with --acquirer")
	}
	if f.acquirer == "" {
		return nil, nil
	}
	var transport http.RoundTripper
	if f.faults {
		transport = payments.ChargeFaults(nil)
	}
	return a.cardNetwork(f.acquirer, f.acquirerKey, f.acquirerKeySet, transport)
}

// cardNetwork makes the client of the card network at url (--acquirer),
// as serve charges it: its API key is key when --acquirer-key was given
// (keySet), else $IDEM_ACQUIRER_KEY or the file $IDEM_ACQUIRER_KEY_FILE
// names. It opens nothing: the client dials on its first call.
func (a *app) cardNetwork(url, key string, keySet bool, transport http.RoundTripper) (*acquirer.Client, error) {
	if !keySet {
		var err error
		if key, _, err = a.secretEnv(envAcquirerKey); err != nil {
			return nil, err
		}
	}
	c, err := acquirer.NewClient(acquirer.ClientConfig{URL: url, APIKey: key, Transport: transport})
	if err != nil {
		return nil, fmt.Errorf("--acquirer: %w", err)
	}
	return c, nil
}

// acquirerKeyUsage is the help of --acquirer-key, wherever it is taken.
const acquirerKeyUsage = "the card network's API key (default from $" + envAcquirerKey + ", or the file $" + envAcquirerKey + "_FILE names)"

// runServe opens the database, the broker and the key store of p, starts
// the payment service and its HTTP server, and serves until ctx ends; then
// it shuts down, waiting up to p.shutdownTimeout for requests in flight,
// and closes all it opened.
func (a *app) runServe(ctx context.Context, p *servePlan) (err error) {
	logger := slog.New(slog.NewTextHandler(a.stderr, &slog.HandlerOptions{Level: p.logLevel}))
	if p.keyDigestSecret != nil {
		if err := idem.SetKeyDigestSecret(p.keyDigestSecret); err != nil {
			return fmt.Errorf("$%s: %w", envKeyDigestSecret, err)
		}
	}
	stopTracing, err := a.startTracing(ctx, &p.payments)
	if err != nil {
		return err
	}
	defer stopTracing()
	db, err := openDB(ctx, p.db.url, p.pgSchema, false)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := db.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("closing the database: %w", cerr))
		}
	}()
	if db.sqlite != nil && p.writerWatchdog > 0 {
		defer startWriterWatch(db.sqlite, p.writerWatchdog, logger, a.stderr)()
	}
	// A copy, so that filling in what was opened leaves the plan as parsed.
	cfg := p.payments
	cfg.DB, cfg.Postgres, cfg.Logger = db.sqlite, db.pg, logger
	brokerShown := "the --db database"
	if p.broker.kind != "" {
		b, err := openBroker(ctx, p.broker.url, p.brokerNamespace, logger)
		if err != nil {
			return err
		}
		defer func() {
			if cerr := b.close(); cerr != nil {
				err = errors.Join(err, fmt.Errorf("closing the broker connection: %w", cerr))
			}
		}()
		cfg.Broker = b
		brokerShown = b.shown + " (namespace " + p.brokerNamespace + ")"
	}
	keysShown := "the --db database"
	if p.keys.url != "" {
		rs, kt, err := openKeys(ctx, p.keys.url, p.keysPrefix)
		if err != nil {
			return err
		}
		defer func() {
			if cerr := rs.Close(); cerr != nil {
				err = errors.Join(err, fmt.Errorf("closing the key store: %w", cerr))
			}
		}()
		cfg.Keys = rs
		keysShown = kt.shown + " (prefix " + p.keysPrefix + ")"
	}
	// Listening before the service starts, whose holder's name defaults
	// to the address: connections wait in the backlog until it serves.
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", p.addr, err)
	}
	defer ln.Close() // when the server never took it over
	cfg.Holder = idem.Holder{Replica: p.replicaID, Incarnation: newIncarnation()}
	if cfg.Holder.Replica == "" {
		host, herr := os.Hostname()
		cfg.Holder.Replica = defaultReplicaID(host, herr, ln.Addr())
	}
	if cfg.Holder.Replica == "" {
		cfg.Holder = idem.Holder{}
		logger.Warn("the host has no name of its own: claims name no replica, and the keys a killed run held wait out their leases; --replica-id names this replica")
	}
	svc, err := payments.New(ctx, &cfg)
	if err != nil {
		return fmt.Errorf("starting the payment service: %w", err)
	}
	defer func() {
		if cerr := svc.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("stopping the payment service: %w", cerr))
		}
	}()

	// nil without a completer: the console then only shows the stopped
	// executions. With --grpc, the gRPC face's completer acts on its keys.
	actions, _ := svc.KeyActions()
	handler, err := mountConsole(ctx, p.console, db, p.payments.Keys, p.payments.BodyKeys, actions, p.payments.Acquirer, logger, svc.Handler())
	if err != nil {
		return err
	}
	srv := &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       readTimeout,
		WriteTimeout:      writeTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	base := "http://" + displayAddr(ln.Addr())
	var gs *grpc.Server
	var gln net.Listener
	if p.grpcAddr != "" {
		if gln, err = net.Listen("tcp", p.grpcAddr); err != nil {
			return fmt.Errorf("listening on %s (--grpc): %w", p.grpcAddr, err)
		}
		defer gln.Close() // when the server never took it over
		gs = svc.GRPCServer(grpc.MaxRecvMsgSize(payments.MaxBodyBytes))
	}

	if p.payments.Unsafe {
		printUnsafeBanner(a.stderr)
	}
	if p.devKey != "" {
		printDevKeyBanner(a.stderr, base, p.devKey, p.payments.Unsafe)
	}
	var keyStore *idemredis.Store
	if rs, ok := cfg.Keys.(*idemredis.Store); ok {
		keyStore = rs
	}
	var broker *openedBroker
	if b, ok := cfg.Broker.(*openedBroker); ok {
		broker = b
	}
	if err := checkGuarantees(ctx, logger, p.strict, db, keyStore, broker); err != nil {
		ln.Close()
		return err
	}
	if p.payments.Faults {
		logger.Warn("fault injection is on: requests may ask for delays, failures, dropped answers and a crash of this process with the Idem-Fault header")
	}
	logger.Info("idem serve started", "addr", ln.Addr().String(), "db", db.shown, "keys", keysShown, "broker", brokerShown,
		"acquirer", p.payments.Acquirer != nil, "key_ttl", p.payments.KeyTTL, "key_lease", p.payments.KeyLease, "inflight_wait", p.payments.InflightWait, "unsafe", p.payments.Unsafe, "faults", p.payments.Faults,
		"replica", cfg.Holder.Replica, "incarnation", cfg.Holder.Incarnation)
	// A plain line, not a log record: scripts and tests wait for it to learn
	// the port when --addr asks for port 0. The gRPC face's comes first,
	// so that whoever waits for the HTTP line knows both.
	if gs != nil {
		fmt.Fprintf(a.stderr, "idem: grpc listening on %s\n", displayAddr(gln.Addr()))
	}
	fmt.Fprintf(a.stderr, "idem: listening on %s\n", base)

	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	var grpcServed chan error // nil without a gRPC face: never ready
	if gs != nil {
		grpcServed = make(chan error, 1)
		go func() { grpcServed <- gs.Serve(gln) }()
	}

	// A face that fails stops the other as a shutdown does: its requests
	// in flight finish within the shutdown's time.
	var failed error
	select {
	case err := <-served:
		failed, served = fmt.Errorf("serving HTTP: %w", err), nil
	case err := <-grpcServed:
		failed, grpcServed = fmt.Errorf("serving gRPC: %w", err), nil
	case <-ctx.Done():
	}
	if failed != nil {
		logger.Error("a face failed; shutting down the rest", "err", failed, "timeout", p.shutdownTimeout)
	} else {
		logger.Info("shutting down: finishing requests in flight", "timeout", p.shutdownTimeout)
	}
	// Both faces drain together, within the one --shutdown-timeout: each
	// stops taking new work at once, and what is left at the deadline is
	// cut off. Keys of cut-off work are released or expire with their
	// lease, so retries stay safe.
	sctx, cancel := context.WithTimeout(context.Background(), p.shutdownTimeout)
	defer cancel()
	grpcStopped := make(chan struct{})
	if gs != nil {
		go func() {
			defer close(grpcStopped)
			graceful := make(chan struct{})
			go func() { gs.GracefulStop(); close(graceful) }()
			select {
			case <-graceful:
			case <-sctx.Done():
				logger.Warn("shutdown deadline passed; cutting off the gRPC calls left")
				gs.Stop()
				<-graceful
			}
		}()
	} else {
		close(grpcStopped)
	}
	if err := srv.Shutdown(sctx); err != nil {
		logger.Warn("shutdown deadline passed; closing the connections left", "err", err)
		srv.Close()
	}
	<-grpcStopped
	if served != nil {
		if err := <-served; err != nil && !errors.Is(err, http.ErrServerClosed) && failed == nil {
			failed = fmt.Errorf("serving HTTP: %w", err)
		}
	}
	if grpcServed != nil {
		if err := <-grpcServed; err != nil && failed == nil {
			failed = fmt.Errorf("serving gRPC: %w", err)
		}
	}
	if failed != nil {
		return failed
	}
	logger.Info("stopped")
	return nil
}

// apiKeys returns the configured API keys, from the flag when it was given,
// else from the environment. With none, it makes a key for a development
// tenant and returns it as devKey so it can be shown.
func (a *app) apiKeys(flagValue string, flagSet bool) (keys map[string]string, devKey string, err error) {
	src, from := flagValue, "--api-keys"
	if !flagSet {
		src, from = "", ""
		v, ok, err := a.secretEnv(envAPIKeys)
		if err != nil {
			return nil, "", err
		}
		if ok {
			src, from = v, envAPIKeys
		}
	}
	if strings.TrimSpace(src) == "" {
		if flagSet {
			return nil, "", errors.New("--api-keys is empty; give tenant:key pairs or leave the flag out for a development key")
		}
		devKey = "idem_dev_" + crand.Text()
		return map[string]string{devKey: "dev"}, devKey, nil
	}
	keys, err = payments.ParseAPIKeys(src)
	if err != nil {
		// The value holds secrets: say where it came from, not what it was.
		return nil, "", fmt.Errorf("%s: %w", from, err)
	}
	return keys, "", nil
}

// defaultReplicaID is --replica-id's default, given the host's name (and
// the error that reading it gave): that name and the address the server
// listens on, the same when a replica restarts on its address, and
// different for two replicas on one host (they cannot listen on one
// address). A replica on a port picked at random (--addr :0) gets a new
// name at every start: it then never ends its earlier runs' leases, which
// end on their own.
//
// It returns "" (anonymous claims, no ending of earlier leases) for a host
// with no name of its own: none, or localhost, which some container
// platforms give every instance. Replicas that shared a name would each,
// as it started, end the live leases of the others. A long host name is
// shortened, never the address.
func defaultReplicaID(host string, err error, addr net.Addr) string {
	if err != nil || host == "" || !distinctiveHost(host) {
		return ""
	}
	a := "/" + addr.String()
	if n := idem.MaxHolderLen - len(a); len(host) > n {
		host = strings.ToValidUTF8(host[:max(n, 0)], "")
	}
	id := host + a
	if len(id) > idem.MaxHolderLen {
		return ""
	}
	return id
}

// distinctiveHost reports whether a host name may tell a host apart: not
// localhost, nor one of its common forms.
func distinctiveHost(host string) bool {
	h := strings.ToLower(strings.TrimSuffix(host, "."))
	return h != "localhost" && !strings.HasPrefix(h, "localhost.") && h != "localhost6" &&
		!strings.HasPrefix(h, "localhost6.")
}

// newIncarnation names this run of the process: its start time and a
// random part, so that no two runs share one.
func newIncarnation() string {
	return time.Now().UTC().Format("20060102T150405.000Z") + "-" + crand.Text()[:8]
}

// displayAddr is the address to show people: a wildcard listen address is
// reached through localhost.
func displayAddr(addr net.Addr) string {
	tcp, ok := addr.(*net.TCPAddr)
	if !ok || !tcp.IP.IsUnspecified() {
		return addr.String()
	}
	return net.JoinHostPort("localhost", fmt.Sprint(tcp.Port))
}

func printUnsafeBanner(w io.Writer) {
	fmt.Fprint(w, `
!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!
!!                                                                      !!
!!  WARNING: --unsafe-no-idempotency is set.                            !!
!!                                                                      !!
!!  Idempotency-Key headers are IGNORED. Every retry and every          !!
!!  duplicate request is executed again: customers WILL be charged      !!
!!  twice. This mode exists to show the problem idem solves.            !!
!!  Never point real clients or real money at it.                       !!
!!                                                                      !!
!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!

`)
}

func printDevKeyBanner(w io.Writer, base, key string, unsafe bool) {
	tryIt := `Try it. Send each request twice: the second answer is the first one
  replayed (Idempotent-Replayed: true), and nothing is charged twice.`
	if unsafe {
		tryIt = `Try it. Send the payment twice: in this unsafe mode the key is
  ignored, and the account is charged twice.`
	}
	fmt.Fprintf(w, `
==========================================================================
  No API keys were configured (--api-keys or $%[1]s), so a
  development tenant "dev" was created with this key, valid until the
  server stops:

      %[2]s

  %[4]s

    KEY=%[2]s
    curl -si %[3]s/v1/accounts \
      -H "Authorization: Bearer $KEY" -H 'Content-Type: application/json' \
      -H 'Idempotency-Key: my-first-account' \
      -d '{"balance":100000,"currency":"KRW"}'
    curl -si %[3]s/v1/payments \
      -H "Authorization: Bearer $KEY" -H 'Content-Type: application/json' \
      -H 'Idempotency-Key: my-first-payment' \
      -d '{"account_id":"ACCOUNT_ID","amount":12000,"currency":"KRW"}'
==========================================================================

`, envAPIKeys, key, base, tryIt)
}
