package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/payments"
	"github.com/idem-go/idem/console"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/keyed"
)

// historyTimeout bounds the giving back of the lease of a failed resume
// or settle (giveBack), which goes on when the command is interrupted
// (Ctrl-C).
const historyTimeout = 30 * time.Second

// checkOperator trims and checks an action's --reason and --operator,
// which are kept in the key's history; verb is what the operator does
// ("settles"). A refusal is a usage error.
func checkOperator(reason, operator *string, verb string) error {
	*reason, *operator = strings.TrimSpace(*reason), strings.TrimSpace(*operator)
	switch {
	case *reason == "":
		return &usageError{errors.New("--reason is required: say why, it is kept in the key's history")}
	case utf8.RuneCountInString(*reason) > console.MaxReason:
		return &usageError{fmt.Errorf("--reason must be at most %d characters", console.MaxReason)}
	case *operator == "":
		return &usageError{fmt.Errorf("--operator is required when $USER is not set: who %s it is kept in the key's history", verb)}
	}
	return nil
}

func (a *app) keysResumeCmd() *cobra.Command {
	var dbURL, pgSchema, scope, reason, operator, netURL, netKey string
	var dryRun bool
	cmd := &cobra.Command{
		Use:   "resume --scope TENANT KEY --reason WHY --acquirer URL",
		Short: "Resume now an execution stopped at a recovery point (one completer round for this key)",
		Long: `Resume an idempotency key in flight at a recovery point whose holder is gone
(see 'idem keys abandoned'), now: one round of the completer for this key
alone, as the console's "Resume now" and as 'idem serve --acquirer' runs
them. The payment is charged at the card network under the key derived
from the client's (so a charge the dead execution made is the one found,
never a second), recorded, and its answer kept for the client's retry; or,
when the network made no charge, the key is released and the retry runs the
payment anew.

--acquirer and --acquirer-key name the card network as serve takes them
(the key also from $` + envAcquirerKey + ` or the file $` + envAcquirerKey + `_FILE
names). --reason is required and kept, with --operator, the time and what
came of it, in the key's history, which the console's page of the key
shows.

--dry-run checks that the key could be resumed and that the card network
answers, and changes nothing. A key that is unknown, completed, released,
without a recovery point, or held by a live execution (a completer's
resume, a client's retry), and a card network that does not answer, are
refused, changing nothing. A resume that fails on the way (the network
went away) leaves the key as it was, in flight at its point, its outcome
still unknown; that attempt is kept in the history.

When the server seals keys (IDEM_KEY_SECRET) or encrypts what it keeps
(IDEM_BODY_KEYS), give the same variables here; and $` + envKeyDigestSecret + `,
under which its log lines name keys as serve's do.`,
		Args: cobra.ExactArgs(1),
	}
	dbFlags(cmd, &dbURL, &pgSchema)
	fl := cmd.Flags()
	fl.StringVar(&scope, "scope", "", "the key's scope: the tenant's name (required)")
	fl.StringVar(&reason, "reason", "", "why, kept in the key's history (required)")
	fl.StringVar(&operator, "operator", os.Getenv("USER"), "who resumes it, kept in the key's history (default $USER)")
	fl.StringVar(&netURL, "acquirer", "", "the card network the payment is charged at, as serve's --acquirer: http://HOST:PORT (required)")
	fl.StringVar(&netKey, "acquirer-key", "", acquirerKeyUsage)
	fl.BoolVar(&dryRun, "dry-run", false, "check that the key could be resumed and that the card network answers; change nothing")
	_ = cmd.MarkFlagRequired("scope")
	cmd.RunE = a.action(func(cmd *cobra.Command, args []string) (err error) {
		ctx := cmd.Context()
		key, err := idem.ParseKey(args[0])
		if err != nil {
			return &usageError{err}
		}
		if err := checkOperator(&reason, &operator, "resumes"); err != nil {
			return err
		}
		switch {
		case netURL == "":
			return &usageError{errors.New("--acquirer is required: the card network the payment is resumed at")}
		}
		network, err := a.cardNetwork(netURL, netKey, cmd.Flags().Changed("acquirer-key"), nil)
		if err != nil {
			return &usageError{err}
		}
		if err := checkPGSchema(cmd, dbURL); err != nil {
			return err
		}
		// Its completer's lines name keys as the replicas' do.
		if err := a.useKeyDigestSecret(); err != nil {
			return err
		}
		rest, err := a.atRestFromEnv()
		if err != nil {
			return err
		}
		db, err := openDB(ctx, dbURL, pgSchema, true)
		if err != nil {
			return err
		}
		defer func() { err = errors.Join(err, db.Close()) }()
		store, history, err := settleStores(ctx, db)
		if err != nil {
			return err
		}
		// The service's own completer, as serve builds it, running no
		// rounds: its resume of this key is the one serve would run.
		comp, stop, err := payments.NewCompleter(ctx, &payments.Config{DB: db.sqlite, Postgres: db.pg, Acquirer: network,
			KeySecret: rest.keySecret, BodyKeys: rest.bodyKeys, Logger: slog.New(slog.NewTextHandler(a.stderr, &slog.HandlerOptions{Level: slog.LevelError}))})
		if err != nil {
			return err
		}
		defer func() { err = errors.Join(err, stop()) }()

		stored := key
		if rest.keySecret != nil {
			stored = idemhttp.SealKey(rest.keySecret, idem.Scope(scope), key)
		}
		_, err = comp.ResumeKey(ctx, idem.Scope(scope), stored, true)
		if errors.Is(err, idem.ErrNotFound) && stored != key {
			// Kept before the keys were sealed.
			stored = key
			_, err = comp.ResumeKey(ctx, idem.Scope(scope), stored, true)
		}
		if err != nil {
			return refusedAction(err)
		}
		if err := network.Ping(ctx); err != nil {
			return fmt.Errorf("the card network at %s does not answer: %w; nothing was changed", netURL, err)
		}
		if dryRun {
			fmt.Fprintf(a.stdout, "dry run: key %q in scope %q can be resumed now from its recovery point, and the card network answers (nothing was changed)\n", string(key), scope)
			return nil
		}

		// A resume that finishes the key is recorded in the transaction
		// that completes it (console.ResumeAndRecord).
		ev := console.KeyEvent{Scope: idem.Scope(scope), Key: stored, Actor: operator, Action: console.ActionResume, Reason: reason}
		finished, rerr := console.ResumeAndRecord(ctx, comp, history, idem.SystemClock{}, ev)
		switch {
		case finished && rerr != nil:
			return fmt.Errorf("the key was resumed (%s), but %w", resumedAnswer(ctx, store, idem.Scope(scope), stored), rerr)
		case errors.Is(rerr, keyed.ErrNotStopped), errors.Is(rerr, keyed.ErrBeingFinished), errors.Is(rerr, keyed.ErrOtherPoint):
			// Taken on, or finished, since the dry run: nothing was done.
			return refusedAction(rerr)
		case errors.Is(rerr, keyed.ErrNotRecorded):
			// Its own give-back (a Yield) may have failed too, the key
			// then held under the resume's lease: give it back.
			if gerr := giveBack(ctx, comp, store, idem.Scope(scope), stored); gerr != nil {
				return fmt.Errorf("resuming the key: %w; it was not resumed, and %w; what the resume found or did at the card network stands for the next resume", rerr, gerr)
			}
			return fmt.Errorf("resuming the key: %w; nothing was changed: the key is in flight at its point, as it was, and what the resume found or did at the card network stands for the next resume", rerr)
		case !finished:
			// This command ends now: the lease its resume took goes back,
			// so that the service's completer or the client's retry can
			// take the key on at once. After a write whose answer was lost
			// too: the Yield is fenced by the resume's token, so it changes
			// nothing if that write finished the key.
			if gerr := giveBack(ctx, comp, store, idem.Scope(scope), stored); gerr != nil {
				rerr = errors.Join(rerr, gerr)
			}
			if errors.Is(rerr, keyed.ErrResultUnknown) {
				// The key may have been finished: the message must not say
				// the resume failed.
				return fmt.Errorf("the resume of key %q in scope %q may have finished it: the store's answer to its last write was lost; 'idem keys show' says what the key holds now: %w", string(key), scope, rerr)
			}
			return fmt.Errorf("the resume of key %q in scope %q failed, and its outcome is still unknown (kept in its history): %w", string(key), scope, rerr)
		}
		said := resumedAnswer(ctx, store, idem.Scope(scope), stored)
		fmt.Fprintf(a.stdout, "resumed key %q in scope %q: %s\n", string(key), scope, said)
		return nil
	})
	return cmd
}

// giveBack ends the lease comp may hold scope/key under after this
// command's action on it failed once it held the key and could not give
// it back (keyed.ErrNotRecorded or a failed resume, whose Yield failed
// too: ResumeFailures.Holding), so that the service's completer or the
// client's retry can take the key on at once: once the command has ended,
// nobody renews that lease, nor gives it back. LetGo tries the give-back
// again; ErrHeldAnew, a hold taken anew meanwhile, is let go in turn. It
// returns nil when the key is not held (any more), and otherwise an error
// saying that the key stays held until that lease ends, and when.
func giveBack(ctx context.Context, comp keyed.Completers, store idem.Recoverer, scope idem.Scope, key idem.Key) error {
	// Given back even when the command is interrupted (Ctrl-C).
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), historyTimeout)
	defer cancel()
	err := comp.LetGo(lctx, scope, key)
	for range 3 {
		if !errors.Is(err, keyed.ErrHeldAnew) {
			break
		}
		err = comp.LetGo(lctx, scope, key)
	}
	if err == nil {
		return nil
	}
	// No renewal follows the failed give-back: the lease ends at the end
	// the store holds, which its last renewal set (within a lease of now:
	// the lease of the completer that held it, the longest of comp's).
	var lease time.Duration
	for _, c := range comp {
		lease = max(lease, c.Lease())
	}
	until := fmt.Sprintf("its lease ends, by %s at the latest", time.Now().Add(lease).UTC().Format(time.RFC3339))
	if rec, gerr := store.Get(lctx, scope, key); gerr == nil && rec.State == idem.StateInFlight {
		until = "its lease ends at " + rec.LeaseExpiresAt.UTC().Format(time.RFC3339)
	}
	return fmt.Errorf("the key could not be given back (%w): it stays held under the lease this command took, which nobody renews or gives back now, until %s; then the service's completer or the client's retry can take it on", err, until)
}

// refusedAction is the error of an action refused for the key's state,
// having changed nothing.
func refusedAction(err error) error {
	switch {
	case errors.Is(err, keyed.ErrOtherPoint):
		// Neither face's point: no completer here keeps its answer in the
		// form its face's retries read.
		return fmt.Errorf("the key stopped at a recovery point of neither face of the service: %w; nothing was changed", err)
	case errors.Is(err, keyed.ErrNotStopped), errors.Is(err, keyed.ErrBeingFinished):
		return fmt.Errorf("%w; nothing was changed", err)
	case errors.Is(err, idem.ErrInvalidArgument):
		// A settle's answer the key's face cannot keep.
		return fmt.Errorf("%w; nothing was changed", err)
	}
	return fmt.Errorf("reading the key: %w; nothing was changed", err)
}

// resumedAnswer says how a resume that finished the key left it.
func resumedAnswer(ctx context.Context, store idem.Recoverer, scope idem.Scope, key idem.Key) string {
	rec, err := store.Get(ctx, scope, key)
	switch {
	case errors.Is(err, idem.ErrNotFound), err == nil && rec.State != idem.StateCompleted:
		return "the card network had made no charge under its key: the key was released, and the client's retry runs the request anew"
	case err != nil:
		return "finished (its record could not be read back: " + err.Error() + ")"
	case rec.Response != nil && rec.Response.Header.Get("Grpc-Status") != "":
		// Kept by the gRPC face: its code, as its client gets it.
		n, _ := strconv.ParseUint(rec.Response.Header.Get("Grpc-Status"), 10, 32)
		return fmt.Sprintf("finished; its gRPC client's retry gets status %s", codes.Code(n))
	case rec.Response != nil:
		return fmt.Sprintf("finished; its client's retry gets %d", rec.Response.Status)
	}
	return "finished"
}
