package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/acquirer"
	"github.com/idem-go/idem/cmd/idem/internal/payments"
	"github.com/idem-go/idem/console"
	"github.com/idem-go/idem/deadletter"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/idemsqlite"
	"github.com/idem-go/idem/keyed"
)

// envOperators is the environment variable read for the console's
// operators when --operators is not given: tokens are better kept out of
// the process list.
const envOperators = "IDEM_OPERATORS"

// consolePath is where the console is mounted, on serve's listener and on
// console's own.
const consolePath = console.DefaultPrefix + "/"

// consoleOperators returns the operators from --operators when it was
// given, else from the environment. None is an error: a console is only
// ever started for someone.
func (a *app) consoleOperators(flagValue string, flagSet bool) ([]console.Operator, error) {
	src, from := flagValue, "--operators"
	if !flagSet {
		src, from = "", "$"+envOperators
		v, ok, err := a.secretEnv(envOperators)
		if err != nil {
			return nil, err
		}
		if ok {
			src = v
		}
	}
	if strings.TrimSpace(src) == "" {
		return nil, fmt.Errorf(`the console needs operators: give --operators "alice:TOKEN,bob:TOKEN2" or set $%s (operators are not API keys: they act on every tenant's dead letters)`, envOperators)
	}
	ops, err := console.ParseOperators(src)
	if err != nil {
		// The value holds tokens: say where it came from, not what it was.
		return nil, fmt.Errorf("%s: %w", from, err)
	}
	return ops, nil
}

// openConsole builds the console on the open database db. keys is the
// service's key store, whose executions stopped at a recovery point the
// console shows (nil: the one in db); bodyKeys open the points it sealed.
func openConsole(ctx context.Context, db *database, keys idem.Store, bodyKeys []idemhttp.BodyKey, actions keyed.Completers, network *acquirer.Client, ops []console.Operator, publicHTTPS bool, logger *slog.Logger) (*console.Console, error) {
	var (
		letters  *deadletter.Service
		insights console.Insights
		history  console.KeyHistory
		err      error
	)
	if db.pg != nil {
		if letters, err = payments.DeadLetterServicePostgres(ctx, db.pg); err == nil {
			insights, err = payments.ConsoleInsightsPostgres(db.pg)
		}
		if err == nil {
			history, err = payments.KeyHistoryPostgres(db.pg)
		}
	} else {
		if letters, err = payments.DeadLetterService(ctx, db.sqlite); err == nil {
			insights, err = payments.ConsoleInsights(db.sqlite)
		}
		if err == nil {
			history, err = payments.KeyHistory(db.sqlite)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("starting the console: %w", err)
	}
	if keys == nil {
		if db.pg != nil {
			keys, err = idempg.NewStore(ctx, db.pg)
		} else {
			keys, err = idemsqlite.NewStore(ctx, db.sqlite, nil)
		}
		if err != nil {
			return nil, fmt.Errorf("starting the console: the key store: %w", err)
		}
	}
	cfg := &console.Config{Letters: letters, Insights: insights, Operators: ops, PublicHTTPS: publicHTTPS, Logger: logger}
	if rs, ok := keys.(idem.Recoverer); ok {
		cfg.Recoveries, cfg.ShowPoint, cfg.KeyHistory = rs, payments.ShowPointAt(bodyKeys, network), history
		if actions != nil {
			// The service's completers, one per face: the console's resumes
			// and settles are theirs, each acting on its own face's keys
			// (an answer kept in the form that face's retries read), and
			// their unknown-outcome counts follow them.
			cfg.Actions = actions
		}
	}
	con, err := console.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("starting the console: %w", err)
	}
	names := make([]string, len(ops))
	for i, op := range ops {
		names[i] = op.Name
	}
	logger.Info("console mounted", "path", consolePath, "operators", strings.Join(names, ","))
	return con, nil
}

// consolePlan is serve's --console, checked: nil when it is off.
type consolePlan struct {
	operators []console.Operator
	// publicHTTPS: browsers reach the console over https, through a proxy.
	publicHTTPS bool
}

// planConsole checks --console and --operators (or $IDEM_OPERATORS).
func (a *app) planConsole(on bool, operators string, operatorsSet bool) (*consolePlan, error) {
	if !on {
		if operatorsSet {
			return nil, errors.New("--operators applies only with --console")
		}
		return nil, nil
	}
	ops, err := a.consoleOperators(operators, operatorsSet)
	if err != nil {
		return nil, fmt.Errorf("--console: %w", err)
	}
	return &consolePlan{operators: ops}, nil
}

// mountConsole returns h with the console of cp served under consolePath
// beside it; h itself when cp is nil.
func mountConsole(ctx context.Context, cp *consolePlan, db *database, keys idem.Store, bodyKeys []idemhttp.BodyKey, actions keyed.Completers, network *acquirer.Client, logger *slog.Logger, h http.Handler) (http.Handler, error) {
	if cp == nil {
		return h, nil
	}
	con, err := openConsole(ctx, db, keys, bodyKeys, actions, network, cp.operators, cp.publicHTTPS, logger)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle(consolePath, con.Handler())
	mux.Handle("/", h)
	return mux, nil
}

func (a *app) consoleCmd() *cobra.Command {
	var addr, dbURL, pgSchema, operators, logLevel string
	cmd := &cobra.Command{
		Use:   "console",
		Short: "Serve the operators' console for dead letters, without the service",
		Long: `Serve the operators' web console on --addr, under ` + consolePath + `, over the
database of a payment service (--db, as given to serve): its dead letters, to
read, re-drive, edit and re-drive, or discard, and an overview of the
consumers and backlogs. Re-driven messages go to the service's outbox; the
running service's relay publishes them.

'idem serve --console' serves the same console on the service's own listener.

Operators come from --operators or, when it is not given, from the
environment variable ` + envOperators + `, as "alice:TOKEN,bob:TOKEN2". They log in
with their token (a form that sets a session cookie) or send it as
"Authorization: Bearer TOKEN"; their name is recorded in each letter's
history. The console refuses to start without them.

Its log lines name keys by a digest under $` + envKeyDigestSecret + `, as serve's do:
give it the replicas' secret to correlate its lines with theirs.`,
		Args: cobra.NoArgs,
	}
	fl := cmd.Flags()
	fl.StringVar(&addr, "addr", "127.0.0.1:8081", "address to listen on (host:port; port 0 picks a free one)")
	dbFlags(cmd, &dbURL, &pgSchema)
	fl.StringVar(&operators, "operators", "", `the console's operators, "name:token,name2:token2" (default from $`+envOperators+`, or the file $`+envOperators+`_FILE names)`)
	fl.StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn or error")
	var publicHTTPS bool
	fl.BoolVar(&publicHTTPS, "public-https", false, "browsers reach the console over https, through a proxy that terminates TLS: its session cookie is marked Secure")
	cmd.RunE = a.action(func(cmd *cobra.Command, _ []string) error {
		if err := checkPGSchema(cmd, dbURL); err != nil {
			return &usageError{err}
		}
		var level slog.Level
		if err := level.UnmarshalText([]byte(logLevel)); err != nil {
			return &usageError{fmt.Errorf("--log-level %q: want debug, info, warn or error", logLevel)}
		}
		ops, err := a.consoleOperators(operators, cmd.Flags().Changed("operators"))
		if err != nil {
			return &usageError{err}
		}
		if _, err := parseDB(dbURL); err != nil {
			return &usageError{err}
		}
		// Its completers' lines name keys as the replicas' do.
		if err := a.useKeyDigestSecret(); err != nil {
			return err
		}
		return a.runConsole(cmd.Context(), addr, dbURL, pgSchema, ops, publicHTTPS, level)
	})
	return cmd
}

// runConsole serves the console until ctx ends.
func (a *app) runConsole(ctx context.Context, addr, dbURL, pgSchema string, ops []console.Operator, publicHTTPS bool, level slog.Level) (err error) {
	logger := slog.New(slog.NewTextHandler(a.stderr, &slog.HandlerOptions{Level: level}))
	db, err := openDB(ctx, dbURL, pgSchema, true)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := db.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("closing the database: %w", cerr))
		}
	}()
	rest, err := a.atRestFromEnv()
	if err != nil {
		return err
	}
	con, err := openConsole(ctx, db, nil, rest.bodyKeys, nil, nil, ops, publicHTTPS, logger)
	if err != nil {
		return err
	}
	root := http.NewServeMux()
	root.Handle(consolePath, con.Handler())
	root.Handle("GET /{$}", http.RedirectHandler(consolePath, http.StatusSeeOther))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", addr, err)
	}
	srv := &http.Server{
		Handler:           root,
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       readTimeout,
		WriteTimeout:      writeTimeout,
		IdleTimeout:       idleTimeout,
		MaxHeaderBytes:    maxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	logger.Info("idem console started", "addr", ln.Addr().String(), "db", db.shown)
	// A plain line, as serve's: scripts and tests wait for it.
	fmt.Fprintf(a.stderr, "idem: console on http://%s%s\n", displayAddr(ln.Addr()), consolePath)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return fmt.Errorf("serving HTTP: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		srv.Close()
	}
	if err := <-served; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serving HTTP: %w", err)
	}
	return nil
}
