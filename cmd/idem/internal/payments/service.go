package payments

import (
	"cmp"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/acquirer"
	"github.com/idem-go/idem/idemgrpc"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/idemprom"
	"github.com/idem-go/idem/idemsqlite"
)

// Config configures a Service. The zero value of every optional field means
// its default.
type Config struct {
	// DB is a SQLite database for the service's tables and, unless Keys is
	// set, the idempotency keys. Exactly one of DB and Postgres is required.
	// The Service does not close it.
	DB *idemsqlite.DB
	// Postgres is a PostgreSQL database (its schema) for the service's
	// tables and, unless Keys is set, the idempotency keys: then every
	// payment commits in one PostgreSQL transaction with its key. Exactly one
	// of DB and Postgres is required. The Service does not close it.
	Postgres *idempg.DB
	// Keys is a separate store for the idempotency keys (an
	// *idemredis.Store, say) instead of the database's own. The middleware
	// then claims the key, runs the handler, whose writes commit on their
	// own, and completes the key afterwards, even if Keys is an
	// idem.TxStore; see "Two stores" in the package documentation for what
	// that costs and how the service makes up for it. The Service does not
	// close it. Defaults to nil: the keys live in DB or Postgres.
	Keys idem.Store
	// APIKeys maps each bearer API key to its tenant's name. Required,
	// non-empty. ParseAPIKeys builds it from "tenant:key,…".
	APIKeys map[string]string
	// KeyTTL is how long an idempotency key is remembered. Defaults to 24h.
	KeyTTL time.Duration
	// KeyLease is how long an execution holds its key, past its last
	// renewal, before a retry may take it over: a running execution renews
	// it every third of it, so this is how soon the key of a replica that
	// died is free again. Defaults to 10s (idemhttp.DefaultLease), or
	// KeyTTL when that is shorter.
	KeyLease time.Duration
	// Holder names this replica as the holder of the keys it claims: a
	// replica ID that stays the same when it restarts, and an incarnation
	// new at every start. On a key store that keeps holders (the
	// service's database), New ends at once the leases an earlier
	// incarnation of the replica held when it died (idemhttp.Middleware's
	// Restart), so a client's retry, or the completer, finishes them
	// without waiting out their leases. Defaults to none: anonymous
	// claims, taken over only when their leases end.
	Holder idem.Holder
	// InflightWait is how long a duplicate waits for the first request with
	// its key to finish before it gets 409. Defaults to 5s.
	InflightWait time.Duration
	// MemoryReplayFor is how long a completed payment's answer is kept in
	// this process for its duplicates (idemhttp.Config.MemoryReplayFor).
	// Defaults to 10s; negative keeps none. Turn it off when the database
	// can lose acknowledged writes (a failover to an asynchronous
	// standby): a retry then reads the keys anew and, finding its key
	// lost with its payment, pays again instead of being told of a
	// payment that no longer exists.
	MemoryReplayFor time.Duration
	// KeySecret, BodyKeys and DiscardBodies keep keys and answers out of a
	// dump of the stores: see idemhttp.Config. With KeySecret, the
	// payments' idempotency_key column holds the sealed keys too (a digest
	// of tenant and key without it); with BodyKeys, the payments'
	// descriptions and the refunds' reasons are sealed in their rows.
	// Default to none: keys and answers are kept as they are.
	KeySecret     []byte
	BodyKeys      []idemhttp.BodyKey
	DiscardBodies bool
	// Unsafe turns idempotency protection off entirely: the
	// Idempotency-Key header is ignored and retries charge again. It exists
	// to show the double charge the rest of the toolkit prevents. Defaults
	// to false.
	Unsafe bool
	// RequestTimeout bounds how long one API request may take: past it the
	// client gets 503 (problem+json, Retry-After) whatever the request was
	// waiting for, so a stalled disk or database never holds clients for
	// good. What the request was writing commits or not as a whole, and a
	// retry with its Idempotency-Key finds out which. It must be longer
	// than InflightWait, which a duplicate may spend waiting. Defaults to
	// DefaultRequestTimeout (15s), or InflightWait and 10s when that is
	// longer; negative turns it off.
	RequestTimeout time.Duration
	// ProbeTimeout is how long /healthz (a read) and /readyz (a durable
	// write) wait for the database before answering 503. Defaults to
	// DefaultProbeTimeout (2s).
	ProbeTimeout time.Duration
	// RequestsOnly serves requests without starting the outbox relay and
	// the settlement consumer in this process: payments still write their
	// events to the outbox, in their own transactions, and the events wait
	// there for a service on the same database that runs them (one with
	// RequestsOnly false). It lets the API scale apart from settlement, and
	// measures what the requests cost without the event pipeline's work.
	// Defaults to false.
	RequestsOnly bool
	// Faults makes the service honour the Idem-Fault request header (see
	// HeaderFault). Never turn it on in production. Defaults to false.
	Faults bool
	// Crash is what the crash-after-commit fault calls to end the process.
	// Tests in one process inject a function that records the call and
	// panics with http.ErrAbortHandler; if Crash returns, the service cuts
	// the connection without an answer anyway. Defaults to SIGKILL of this
	// process.
	Crash func()
	// Clock stamps records and, for the SQLite key store, decides key
	// expiry; idempg and idemredis stores use their own (see their
	// Config.Clock). Defaults to idem.SystemClock.
	Clock idem.Clock
	// Logger receives warnings and errors. Defaults to a logger that
	// discards everything.
	Logger *slog.Logger
	// MaxAttempts bounds the settlement consumer's attempts at one event,
	// the first included, before it is dead-lettered as exhausted.
	// Defaults to 10.
	MaxAttempts int
	// RetryBase is the scale of the settlement consumer's first retry
	// delay (full jitter). Defaults to 100ms.
	RetryBase time.Duration
	// RetryCap bounds every retry delay. Defaults to 30s.
	RetryCap time.Duration
	// MessageRetention is how long settled messages of the embedded
	// transport and the settlement consumer's inbox rows are kept before the
	// purger deletes them. An inbox row must outlive every redelivery of its
	// message: on the embedded transport a settled message is never
	// delivered again, and a copy a crashed relay publishes again arrives
	// within the relay's lease (30s), so days are ample. Defaults to 7 days.
	MessageRetention time.Duration
	// TransportPoll is how often the embedded transport looks for messages
	// it was not told about (Nack delays and AckWaits that ended, another
	// process's messages where nothing wakes it): what an idle service
	// costs its database. Defaults to the transport's own, 1s.
	TransportPoll time.Duration
	// Broker carries the payment events from the outbox relay to the
	// settlement consumer: an *idemnats.Transport or an
	// *idemamqp.Transport, say. The Service does not close it. Defaults to
	// nil: the database's own embedded transport.
	Broker Transport
	// AckWait is how long the transport waits for the settlement consumer
	// to acknowledge an event before it delivers it again (after a crash,
	// say); the consumer reports progress on slow events every quarter of
	// it. The embedded transports and JetStream honour it; RabbitMQ instead
	// redelivers when the consumer's connection drops. Defaults to 30s.
	AckWait time.Duration
	// Registry receives the service's metrics and is served at /metrics.
	// Defaults to a new registry with the Go and process collectors.
	Registry *prometheus.Registry
	// Acquirer is the card network a payment charges the account's card
	// at, before the payment is recorded (see "The card network" in the
	// package documentation). Its Transport should be ChargeFaults' when
	// Faults is on. Defaults to nil: payments move money in the service's
	// database alone.
	Acquirer *acquirer.Client
	// CompleterEvery is how often the completer looks for payments whose
	// execution died after its recovery point (see Completer). Defaults
	// to 1s.
	CompleterEvery time.Duration
	// GRPC builds the gRPC face (Service.GRPCServer): the payments' and
	// refunds' writes over gRPC, through idemgrpc's interceptor on the
	// same key store, with the same secrets and scopes as the HTTP face.
	// It needs the keys in the database (Keys unset) and the protected
	// mode (Unsafe false). Defaults to false.
	GRPC bool
	// Observers are observed beside the service's own latency histograms:
	// tracing, say (package idemotel). Defaults to nil: histograms only.
	Observers *Observers

	// completerOnly: NewCompleter's service, whose completer runs no
	// rounds of its own, serving no request (APIKeys may be empty).
	completerOnly bool
}

// Defaults applied by New.
const (
	DefaultKeyTTL       = 24 * time.Hour
	DefaultInflightWait = 5 * time.Second
	// DefaultRequestTimeout is Config.RequestTimeout's default.
	DefaultRequestTimeout = 15 * time.Second
	// DefaultMessageRetention is Config.MessageRetention's default.
	DefaultMessageRetention = 7 * 24 * time.Hour
)

// ErrConfig is matched by every configuration error New returns.
var ErrConfig = errors.New("payments: invalid configuration")

const (
	purgeInterval = time.Minute
	purgeBatch    = 1000
)

// Service is the payment service: its HTTP handler and its background key
// purger.
type Service struct {
	store     storage
	keys      idem.Store
	closeKeys func()
	apiKeys   []apiKey
	clock     idem.Clock
	logger    *slog.Logger
	retention time.Duration
	unsafe    bool
	faults    bool
	// requestTimeout bounds each API request (0: unbounded).
	requestTimeout time.Duration
	// probeTimeout bounds /healthz and /readyz; probe runs /readyz's write.
	probeTimeout time.Duration
	probe        writeProbe
	// twoStores: the keys live apart from the money (Config.Keys), so the
	// handler's writes commit before the key completes.
	twoStores bool
	// keyTTL is Config.KeyTTL, defaults applied: how far back a payment
	// under the same key is still the same logical request's (origin.since).
	keyTTL time.Duration
	// crashInHandler: crash-after-commit fires inside the handler, after its
	// own commit, rather than outside the middleware (see HeaderFault).
	crashInHandler bool
	crashFn        func()

	// acquirer is Config.Acquirer: the card network payments charge at.
	acquirer *acquirer.Client

	paymentsMW *idemhttp.Middleware
	// completer finishes the payments at the card network whose execution
	// died after its recovery point; nil when payments charge no card, or
	// the key store keeps no points.
	completer  *idemhttp.Completer
	depositsMW *idemhttp.Middleware
	// grpcPayments and grpcRefunds are the gRPC face's interceptors
	// (Config.GRPC), grpcCompleter its completer; nil without it.
	grpcPayments, grpcRefunds *idemgrpc.Interceptor
	grpcCompleter             *idemgrpc.Completer
	refundsMW                 *idemhttp.Middleware
	accountsMW                *idemhttp.Middleware

	metrics http.Handler
	handler http.Handler

	// pipeline announces payments and settles them.
	pipeline *pipeline

	stop          context.CancelFunc
	done          chan struct{}
	completerDone chan struct{}
	closeOnce     sync.Once
}

// New checks cfg, applies the service's migrations (and the key store's,
// when the keys live in the same database), builds the idempotency
// middleware, registers the metrics and starts the purger of expired keys.
// Call Close to stop it.
func New(ctx context.Context, cfg *Config) (*Service, error) {
	if cfg == nil {
		cfg = &Config{}
	}
	c := *cfg
	if err := c.defaults(); err != nil {
		return nil, err
	}

	s := &Service{
		clock:          c.Clock,
		logger:         c.Logger,
		unsafe:         c.Unsafe,
		faults:         c.Faults,
		twoStores:      c.Keys != nil && !c.Unsafe,
		keyTTL:         cmp.Or(c.KeyTTL, DefaultKeyTTL),
		crashInHandler: c.Keys != nil || c.Unsafe,
		crashFn:        c.Crash,
		acquirer:       c.Acquirer,
		closeKeys:      func() {},
		retention:      cmp.Or(c.MessageRetention, DefaultMessageRetention),
		requestTimeout: max(c.RequestTimeout, 0),
		probeTimeout:   c.ProbeTimeout,
	}
	if err := s.openStorage(ctx, &c); err != nil {
		return nil, err
	}
	built := false
	defer func() {
		if !built {
			s.closeKeys()
		}
	}()
	for k, tenant := range c.APIKeys {
		s.apiKeys = append(s.apiKeys, apiKey{sum: sha256.Sum256([]byte(k)), tenant: tenant})
	}

	var metrics collectorSet
	if c.Unsafe {
		c.Logger.Warn("payments: UNSAFE MODE: idempotency keys are ignored; every retry and duplicate charges again. " +
			"This mode exists to show the double charge; never run it for real money.")
	} else {
		mws := []struct {
			name     string
			optional bool
			dst      **idemhttp.Middleware
		}{
			{"payments", false, &s.paymentsMW},
			{"deposits", false, &s.depositsMW},
			{"refunds", false, &s.refundsMW},
			{"accounts", true, &s.accountsMW},
		}
		for _, m := range mws {
			mwObs := idemprom.NewMiddlewareObserver(m.name)
			mw, err := idemhttp.New(&idemhttp.Config{
				Store: s.keys,
				// A payment at a card network runs in phases, each
				// committed on its own (see phases.go): claim first.
				SeparateTx:      s.twoStores || (m.name == "payments" && s.phased()),
				Lease:           c.KeyLease,
				Holder:          c.Holder,
				Optional:        m.optional,
				Scope:           scopeByTenant,
				TTL:             c.KeyTTL,
				InflightWait:    c.InflightWait,
				MemoryReplayFor: c.MemoryReplayFor,
				MaxBodyBytes:    MaxBodyBytes,
				KeySecret:       c.KeySecret,
				BodyKeys:        c.BodyKeys,
				DiscardBodies:   c.DiscardBodies,
				Keep:            keep,
				Observer:        idemhttp.Observers(mwObs, c.Observers.middleware(m.name)),
				Clock:           c.Clock,
				Logger:          c.Logger,
			})
			if err != nil {
				return nil, fmt.Errorf("payments: %s idempotency middleware: %w", m.name, err)
			}
			metrics = append(metrics, idemprom.NewMiddlewareCollector(m.name, mw), mwObs)
			*m.dst = mw
		}
		if s.phased() {
			comp, err := s.paymentsMW.NewCompleter(&idemhttp.CompleterConfig{Resume: s.resume, Every: c.CompleterEvery, Logger: c.Logger,
				Points: HTTPPoints()})
			if err != nil {
				return nil, fmt.Errorf("payments: completer: %w", err)
			}
			s.completer = comp
			metrics = append(metrics, idemprom.NewCompleterCollector("payments", comp))
		}
		if c.GRPC {
			gm, err := s.newGRPCFace(&c)
			if err != nil {
				return nil, err
			}
			metrics = append(metrics, gm...)
		}
	}
	var msgs messaging
	var err error
	if c.DB != nil {
		msgs, err = sqliteMessaging(ctx, c.DB, &c)
	} else {
		msgs, err = pgMessaging(ctx, c.Postgres, &c)
	}
	if err != nil {
		return nil, err
	}
	p, err := newPipeline(ctx, s.store, msgs, &c)
	if err != nil {
		return nil, err
	}
	s.pipeline = p
	s.store.setOutbox(c.Observers.outbox(msgs.outbox))
	defer func() {
		if !built {
			p.close() //nolint:errcheck // the error New returns says more
		}
	}()
	pm, err := p.collectors(&c)
	if err != nil {
		return nil, err
	}
	metrics = append(metrics, pm...)
	// One registration, so a failure leaves nothing half-registered.
	metrics = append(metrics, &countsCollector{store: s.store, logger: c.Logger})
	if err := c.Registry.Register(metrics); err != nil {
		return nil, fmt.Errorf("payments: metrics: %w", err)
	}
	s.metrics = promhttp.HandlerFor(c.Registry, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(c.Logger.Handler(), slog.LevelError)})
	s.handler = s.routes()

	if s.paymentsMW != nil && !c.Holder.IsZero() {
		// Before the completer's first round, which then finds the keys
		// with a recovery point among those ended here.
		if n, err := s.paymentsMW.Restart(ctx); err != nil {
			c.Logger.Warn("payments: could not end the leases an earlier run of this replica held; they end on their own", "err", err)
		} else if n > 0 {
			c.Logger.Info("payments: ended the leases an earlier run of this replica held", "replica", c.Holder.Replica, "keys", n)
		}
	}
	pctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	s.stop = stop
	s.done = make(chan struct{})
	go s.purge(pctx)
	s.completerDone = make(chan struct{})
	go func() {
		defer close(s.completerDone)
		var wg sync.WaitGroup
		if s.grpcCompleter != nil && !c.completerOnly {
			wg.Go(func() { s.grpcCompleter.Run(pctx) }) //nolint:errcheck // ends with pctx
		}
		if s.completer != nil && !c.completerOnly {
			s.completer.Run(pctx) //nolint:errcheck // ends with pctx
		}
		wg.Wait()
	}()
	if s.pipeline != nil && !c.RequestsOnly {
		s.pipeline.start()
	}
	built = true
	return s, nil
}

// openStorage applies the service's migrations to its database and picks
// the key store: c.Keys, or one on the same database, whose same-transaction
// form commits every write with its key.
func (s *Service) openStorage(ctx context.Context, c *Config) error {
	switch {
	case c.DB != nil:
		if err := migrateSQLite(ctx, c.DB); err != nil {
			return fmt.Errorf("payments: migrate: %w", err)
		}
		store, err := newSQLiteStorage(ctx, c.DB)
		if err != nil {
			return fmt.Errorf("payments: %w", err)
		}
		store.text = textSealer{keys: c.BodyKeys}
		s.store = store
		if c.Keys == nil {
			keys, err := idemsqlite.NewStore(ctx, c.DB, &idemsqlite.StoreConfig{Clock: c.Clock})
			if err != nil {
				return fmt.Errorf("payments: idempotency store: %w", err)
			}
			s.keys = keys
		}
	default:
		if err := migratePostgres(ctx, c.Postgres); err != nil {
			return fmt.Errorf("payments: migrate: %w", err)
		}
		store := newPGStorage(c.Postgres)
		store.text = textSealer{keys: c.BodyKeys}
		s.store = store
		if c.Keys == nil {
			keys, err := idempg.NewStore(ctx, c.Postgres)
			if err != nil {
				return fmt.Errorf("payments: idempotency store: %w", err)
			}
			s.keys = keys
			s.closeKeys = keys.Close
		}
	}
	if c.Keys != nil {
		s.keys = c.Keys
	}
	return nil
}

func (c *Config) defaults() error {
	var problems []string
	switch {
	case c.DB == nil && c.Postgres == nil:
		problems = append(problems, "a database is required: set DB (SQLite) or Postgres")
	case c.DB != nil && c.Postgres != nil:
		problems = append(problems, "DB (SQLite) and Postgres are both set; set exactly one")
	}
	if len(c.APIKeys) == 0 && !c.completerOnly {
		problems = append(problems, "APIKeys must hold at least one key")
	}
	for k, tenant := range c.APIKeys {
		if strings.TrimSpace(k) == "" || k != strings.TrimSpace(k) {
			problems = append(problems, "an API key is empty or has surrounding white space")
		}
		if tenant == "" {
			problems = append(problems, "an API key has an empty tenant")
		}
	}
	if c.KeyTTL < 0 {
		problems = append(problems, fmt.Sprintf("KeyTTL must not be negative, got %s", c.KeyTTL))
	}
	if c.KeyLease < 0 {
		problems = append(problems, fmt.Sprintf("KeyLease must not be negative, got %s", c.KeyLease))
	}
	if err := c.Holder.Validate(); err != nil {
		problems = append(problems, err.Error())
	}
	// A lease left to its default is lowered to a shorter TTL (idemhttp
	// does so); only a lease set longer than the TTL is refused.
	if ttl := cmp.Or(c.KeyTTL, DefaultKeyTTL); c.KeyTTL >= 0 && c.KeyLease > ttl {
		problems = append(problems, fmt.Sprintf("KeyLease (%s) must not be longer than KeyTTL (%s)", c.KeyLease, ttl))
	}
	if c.MessageRetention < 0 {
		problems = append(problems, fmt.Sprintf("MessageRetention must not be negative, got %s", c.MessageRetention))
	}
	if c.MaxAttempts < 0 || c.RetryBase < 0 || c.RetryCap < 0 || c.TransportPoll < 0 || c.AckWait < 0 {
		problems = append(problems, "MaxAttempts, RetryBase, RetryCap, TransportPoll and AckWait must not be negative")
	}
	if c.GRPC && (c.Keys != nil || c.Unsafe) {
		problems = append(problems, "GRPC needs the keys in the database (Keys unset) and the protected mode (Unsafe false)")
	}
	if c.InflightWait < 0 {
		problems = append(problems, fmt.Sprintf("InflightWait must not be negative, got %s", c.InflightWait))
	}
	if c.ProbeTimeout < 0 {
		problems = append(problems, fmt.Sprintf("ProbeTimeout must not be negative, got %s", c.ProbeTimeout))
	}
	if c.RequestTimeout == 0 {
		c.RequestTimeout = max(DefaultRequestTimeout, cmp.Or(max(c.InflightWait, 0), DefaultInflightWait)+10*time.Second)
	}
	if c.ProbeTimeout == 0 {
		c.ProbeTimeout = DefaultProbeTimeout
	}
	if wait := cmp.Or(c.InflightWait, DefaultInflightWait); c.RequestTimeout > 0 && c.InflightWait >= 0 && c.RequestTimeout <= wait {
		problems = append(problems, fmt.Sprintf("RequestTimeout (%s) must be longer than InflightWait (%s), which a duplicate may spend waiting", c.RequestTimeout, wait))
	}
	if len(problems) > 0 {
		sort.Strings(problems)
		return fmt.Errorf("%w: %s", ErrConfig, strings.Join(problems, "; "))
	}
	if c.KeyTTL == 0 {
		c.KeyTTL = DefaultKeyTTL
	}
	if c.KeyLease == 0 {
		c.KeyLease = min(idemhttp.DefaultLease, c.KeyTTL)
	}
	if c.InflightWait == 0 {
		c.InflightWait = DefaultInflightWait
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = DefaultMaxAttempts
	}
	if c.Crash == nil {
		c.Crash = killSelf
	}
	if c.Clock == nil {
		c.Clock = idem.SystemClock{}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Registry == nil {
		c.Registry = prometheus.NewRegistry()
		c.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	return nil
}

// Handler returns the service's HTTP handler: the /v1 API, /healthz and
// /metrics.
func (s *Service) Handler() http.Handler { return s.handler }

// Close stops the purger, the outbox relay and the settlement consumer and
// waits for them, and closes what New opened (the embedded transport,
// idempg's listener). It closes neither the database nor Config.Keys.
// Calling it again does nothing.
func (s *Service) Close() error {
	var err error
	s.closeOnce.Do(func() {
		s.stop()
		<-s.done
		<-s.completerDone
		if s.pipeline != nil {
			err = s.pipeline.close()
		}
		s.closeKeys()
	})
	return err
}

func (s *Service) now() time.Time { return s.clock.Now().UTC() }

// scopeByTenant makes every tenant's keys its own: the same key sent by two
// tenants names two unrelated requests.
func scopeByTenant(r *http.Request) (idem.Scope, error) {
	t := tenantFrom(r.Context())
	if t == "" {
		return "", errors.New("payments: no tenant on the request; authentication must run first")
	}
	return idem.Scope(t), nil
}

// keep decides which answers are stored with their key. A 400 or 413 means
// the request was refused before anything ran, so a corrected request with
// the same key must run rather than be told it mismatches; everything else
// follows DefaultKeep (402 and 404 are deterministic and are replayed).
func keep(r *http.Request, status int) bool {
	switch status {
	case http.StatusBadRequest, http.StatusRequestEntityTooLarge:
		return false
	}
	return idemhttp.DefaultKeep(r, status)
}

// purge deletes expired keys every purgeInterval, in batches small enough
// not to hold SQLite's writer (or PostgreSQL's row locks) for long.
func (s *Service) purge(ctx context.Context) {
	defer close(s.done)
	t := time.NewTicker(purgeInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		total, err := s.purgeExpired(ctx, purgeBatch)
		if err != nil && ctx.Err() == nil {
			s.logger.Warn("payments: purging expired idempotency keys failed", "err", err, "purged", total)
		} else if total > 0 {
			s.logger.Info("payments: purged expired idempotency keys", "count", total)
		}
		if s.pipeline != nil {
			inbox, msgs, err := s.pipeline.purgeOld(ctx, time.Now().Add(-s.retention), purgeBatch)
			if err != nil && ctx.Err() == nil {
				s.logger.Warn("payments: purging old messages failed", "err", err)
			} else if inbox+msgs > 0 {
				s.logger.Info("payments: purged old messages", "inbox_rows", inbox, "messages", msgs)
			}
		}
	}
}

// purgeExpired deletes expired keys in batches of batch until a batch comes
// back short, and returns how many it deleted.
func (s *Service) purgeExpired(ctx context.Context, batch int) (int, error) {
	total := 0
	for {
		n, err := s.keys.Purge(ctx, batch)
		total += n
		if err != nil {
			return total, fmt.Errorf("purge: %w", err)
		}
		if n < batch {
			return total, nil
		}
	}
}

// ParseAPIKeys parses "tenant:key,tenant2:key2" into the key -> tenant map
// Config.APIKeys wants. A tenant may have several keys (to rotate them); a
// key belongs to one tenant. White space around items is ignored.
func ParseAPIKeys(s string) (map[string]string, error) {
	keys := map[string]string{}
	for item := range strings.SplitSeq(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		tenant, key, ok := strings.Cut(item, ":")
		tenant, key = strings.TrimSpace(tenant), strings.TrimSpace(key)
		switch {
		case !ok:
			return nil, fmt.Errorf("payments: API key item %q: want tenant:key", redactItem(item))
		case tenant == "":
			return nil, fmt.Errorf("payments: API key item %q: the tenant is empty", redactItem(item))
		case key == "":
			return nil, fmt.Errorf("payments: API key for tenant %q is empty", tenant)
		case strings.ContainsAny(key, " \t"):
			return nil, fmt.Errorf("payments: API key for tenant %q contains white space", tenant)
		}
		if other, dup := keys[key]; dup {
			return nil, fmt.Errorf("payments: the same API key is given to tenants %q and %q", other, tenant)
		}
		keys[key] = tenant
	}
	if len(keys) == 0 {
		return nil, errors.New("payments: no API keys given; want tenant:key[,tenant:key…]")
	}
	return keys, nil
}

// redactItem keeps the tenant part of a malformed item for the error
// message and hides what may be a key.
func redactItem(item string) string {
	tenant, _, ok := strings.Cut(item, ":")
	if ok {
		return tenant + ":…"
	}
	return "…"
}

// collectorSet registers the service's collectors in one call, so a
// failure leaves nothing half-registered. It is also what lets the three
// middlewares share a registry: idemprom's collectors all describe the same
// metric (told apart by the label middleware=<name>), and a registry refuses
// a second collector whose descriptors equal a registered one's, so
// idemprom.RegisterMiddleware can register only one middleware per registry.
type collectorSet []prometheus.Collector

func (cs collectorSet) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range cs {
		c.Describe(ch)
	}
}

func (cs collectorSet) Collect(ch chan<- prometheus.Metric) {
	for _, c := range cs {
		c.Collect(ch)
	}
}

// countsCollector exports the recorded totals, read from the database at
// each scrape.
type countsCollector struct {
	store  storage
	logger *slog.Logger
}

var (
	accountsDesc = prometheus.NewDesc("payments_accounts", "Accounts recorded.", nil, nil)
	paymentsDesc = prometheus.NewDesc("payments_created_total",
		"Payments recorded (committed). In unsafe mode, compare it with the requests sent to see the double charges.", nil, nil)
	depositsDesc = prometheus.NewDesc("payments_deposits_total", "Deposits recorded (committed).", nil, nil)
)

func (c *countsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- accountsDesc
	ch <- paymentsDesc
	ch <- depositsDesc
}

func (c *countsCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	accounts, payments, deposits, err := c.store.Counts(ctx)
	if err != nil {
		c.logger.Warn("payments: reading totals for metrics failed", "err", err)
		ch <- prometheus.NewInvalidMetric(paymentsDesc, err)
		return
	}
	ch <- prometheus.MustNewConstMetric(accountsDesc, prometheus.GaugeValue, float64(accounts))
	ch <- prometheus.MustNewConstMetric(paymentsDesc, prometheus.CounterValue, float64(payments))
	ch <- prometheus.MustNewConstMetric(depositsDesc, prometheus.CounterValue, float64(deposits))
}
