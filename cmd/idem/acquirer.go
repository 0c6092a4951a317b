package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/idem-go/idem/cmd/idem/internal/acquirer"
	"github.com/idem-go/idem/idemsqlite"
)

// envAcquirerKey is the environment variable read for the acquirer's API
// key when --api-key (acquirer) or --acquirer-key (serve) is not given.
const envAcquirerKey = "IDEM_ACQUIRER_KEY"

// defaultAcquirerDB is where `idem acquirer` keeps its charges by default.
const defaultAcquirerDB = "sqlite:acquirer.db"

type acquirerFlags struct {
	addr, db, apiKey string
	apiKeySet        bool
	faults           bool
	faultRate        float64
	seed             uint64
	seedSet          bool
	keyTTL           time.Duration
	logLevel         string
}

func (a *app) acquirerCmd() *cobra.Command {
	var f acquirerFlags
	cmd := &cobra.Command{
		Use:   "acquirer",
		Short: "Run the lab's card network: charges and refunds over HTTP",
		Long: `Run the card network the payment service charges cards at (idem serve
--acquirer URL), as a process of its own, until SIGINT or SIGTERM.

  POST /v1/charges                {amount, currency, reference, description?, metadata?}
  POST /v1/charges/{id}/refunds   {amount?}
  GET  /v1/charges/{id}
  GET  /v1/charges?reference=R&limit=N&starting_after=ID   {"data": [...], "has_more": ...}

Charges and refunds need an Idempotency-Key: the acquirer is itself behind
idem's middleware, so a retry with the same key gets the first charge back.
Every charge shows the key it was made with. A reference starting with
"declined_" is a card that is always declined (402).

With --faults it honours the Idem-Fault header (delay=DURATION,
fail-before-commit, drop-after-commit), and --fault-rate refuses (503) or
drops the answer of that share of charges and refunds at random, so a caller
meets the ambiguous outcome for real.`,
		Args: cobra.NoArgs,
	}
	fl := cmd.Flags()
	fl.StringVar(&f.addr, "addr", "127.0.0.1:8090", "address to listen on (host:port; port 0 picks a free one)")
	fl.StringVar(&f.db, "db", defaultAcquirerDB, "where the charges live: sqlite:FILE")
	fl.StringVar(&f.apiKey, "api-key", "", "the bearer key callers must send (default from $"+envAcquirerKey+" or the file $"+envAcquirerKey+"_FILE names; none: open to anyone who reaches it, so only on a loopback --addr)")
	fl.BoolVar(&f.faults, "faults", false, "honour the Idem-Fault request header and --fault-rate")
	fl.Float64Var(&f.faultRate, "fault-rate", 0, "with --faults, the share (0 to 1) of charges and refunds refused with 503 or whose answer is dropped after the charge, at random")
	fl.Uint64Var(&f.seed, "seed", 0, "seed of the random faults, to repeat a run (default: random)")
	fl.DurationVar(&f.keyTTL, "key-ttl", 24*time.Hour, "how long a charge's idempotency key is remembered")
	fl.StringVar(&f.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	cmd.RunE = a.action(func(cmd *cobra.Command, _ []string) error {
		f.apiKeySet, f.seedSet = cmd.Flags().Changed("api-key"), cmd.Flags().Changed("seed")
		return a.runAcquirer(cmd.Context(), &f)
	})
	return cmd
}

func (a *app) runAcquirer(ctx context.Context, f *acquirerFlags) (err error) {
	// Every flag is checked before anything is opened.
	var level slog.Level
	if err := level.UnmarshalText([]byte(f.logLevel)); err != nil {
		return fmt.Errorf("--log-level %q: want debug, info, warn or error", f.logLevel)
	}
	t, err := parseDB(f.db)
	if err != nil {
		return err
	}
	if t.postgres {
		return errors.New("--db: the acquirer keeps its charges in a SQLite file (sqlite:FILE)")
	}
	if f.faultRate < 0 || f.faultRate > 1 {
		return fmt.Errorf("--fault-rate %v: want a share from 0 to 1", f.faultRate)
	}
	if f.faultRate > 0 && !f.faults {
		return errors.New("--fault-rate needs --faults")
	}
	if f.keyTTL <= 0 {
		return errors.New("--key-ttl must be positive")
	}
	apiKey := f.apiKey
	if !f.apiKeySet {
		if apiKey, _, err = a.secretEnv(envAcquirerKey); err != nil {
			return err
		}
	}
	if apiKey == "" && !loopbackAddr(f.addr) {
		// Its charges carry tenants, accounts and amounts: without a key,
		// anyone who reaches the address could list them, or charge.
		return fmt.Errorf("--addr %s: the card network refuses to listen beyond loopback without an API key (--api-key or $%s)", f.addr, envAcquirerKey)
	}
	logger := slog.New(slog.NewTextHandler(a.stderr, &slog.HandlerOptions{Level: level}))
	seed := f.seed
	if !f.seedSet {
		seed = mrand.Uint64()
	}
	rng := mrand.New(mrand.NewPCG(seed, seed^0x9e3779b97f4a7c15))

	db, err := idemsqlite.Open(t.path, nil)
	if err != nil {
		return fmt.Errorf("opening database %s: %w", t.shown, err)
	}
	defer func() {
		if cerr := db.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("closing the database: %w", cerr))
		}
	}()
	srv, err := acquirer.New(ctx, acquirer.Config{DB: db, APIKey: apiKey, Faults: f.faults, FaultRate: f.faultRate,
		Rand: rng.Float64, KeyTTL: f.keyTTL, Logger: logger})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", f.addr)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", f.addr, err)
	}
	hs := &http.Server{
		Handler:           srv.Handler(),
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       readTimeout,
		WriteTimeout:      writeTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	if f.faults {
		logger.Warn("fault injection is on: requests may ask for delays, failures and dropped answers with the Idem-Fault header",
			"fault_rate", f.faultRate, "seed", seed)
	}
	logger.Info("idem acquirer started", "addr", ln.Addr().String(), "db", t.shown, "api_key", apiKey != "")
	fmt.Fprintf(a.stderr, "idem: acquirer listening on http://%s\n", displayAddr(ln.Addr()))
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	select {
	case err := <-served:
		return fmt.Errorf("serving HTTP: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil {
		hs.Close()
	}
	if err := <-served; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serving HTTP: %w", err)
	}
	return nil
}

// loopbackAddr reports whether addr (host:port) listens on loopback alone:
// a loopback IP, or localhost. An empty host listens on every interface.
func loopbackAddr(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil || host == "" {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}
