package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/status"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/payments"
	"github.com/idem-go/idem/console"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/idemsqlite"
	"github.com/idem-go/idem/keyed"
)

func (a *app) keysSettleCmd() *cobra.Command {
	var dbURL, pgSchema, scope, reason, operator, contentType, body, bodyFile string
	var failed, dryRun bool
	var status int
	cmd := &cobra.Command{
		Use:   "settle --scope TENANT KEY --reason WHY (--failed | --status CODE --body JSON)",
		Short: "Settle an execution stopped at a recovery point whose outcome is unknown",
		Long: `Settle an idempotency key in flight at a recovery point whose holder is gone
(see 'idem keys abandoned'): a person decides what the client's retry gets,
without resuming it. As the console's actions of the same names:

  --failed            you checked that nothing happened outside (no charge at
                      the card network): the key is completed with a 409
                      saying an operator settled the request as failed.
  --status, --body    you learned the outcome elsewhere: the key is completed
                      with this answer, marked Idem-Settled-By-Operator.

--reason is required and kept, with --operator and the time, in the key's
history, which the console's page of the key shows. --dry-run checks that the
key could be settled and changes nothing. A key that is unknown, completed,
released, or held by a live execution (a completer's resume, a client's
retry) is refused, changing nothing; the settle takes the key over before
completing it, so an execution finishing it at the same moment either
refuses it or finds it settled.

A key stopped by the gRPC face (idem serve --grpc, at its point
"charging-grpc") is settled in gRPC's form, which its client's retry reads:
--failed is the status FailedPrecondition saying an operator settled the
call as failed; --status 2xx is the body's JSON object as the call's
google.protobuf.Struct (a body that is not an object is refused), and
another status the status whose code means it on the gRPC face, its
message the body's problem title and detail. Both carry the metadata
idem-settled-by-operator.

When the server seals keys (IDEM_KEY_SECRET) or encrypts the answers it keeps
(IDEM_BODY_KEYS), give the same variables here, and $` + envKeyDigestSecret + `,
under which its log lines name keys as serve's do. The server's completer drops
the key from its unknown count at its next round.`,
		Args: cobra.ExactArgs(1),
	}
	dbFlags(cmd, &dbURL, &pgSchema)
	fl := cmd.Flags()
	fl.StringVar(&scope, "scope", "", "the key's scope: the tenant's name (required)")
	fl.StringVar(&reason, "reason", "", "why, kept in the key's history (required)")
	fl.StringVar(&operator, "operator", os.Getenv("USER"), "who settles it, kept in the key's history (default $USER)")
	fl.BoolVar(&failed, "failed", false, "settle as failed: nothing happened outside")
	fl.IntVar(&status, "status", 0, "settle with this answer's HTTP status (200 to 499; not 408, 425 or 429, which ask the client to retry)")
	fl.StringVar(&body, "body", "", "with --status: the answer's body")
	fl.StringVar(&bodyFile, "body-file", "", "with --status: read the answer's body from this file")
	fl.StringVar(&contentType, "content-type", "application/json", "with --status: the answer's content type (a JSON type must parse)")
	fl.BoolVar(&dryRun, "dry-run", false, "check that the key could be settled; change nothing")
	_ = cmd.MarkFlagRequired("scope")
	cmd.RunE = a.action(func(cmd *cobra.Command, args []string) (err error) {
		ctx := cmd.Context()
		key, err := idem.ParseKey(args[0])
		if err != nil {
			return &usageError{err}
		}
		if err := checkOperator(&reason, &operator, "settles"); err != nil {
			return err
		}
		switch {
		case failed == (status != 0):
			return &usageError{errors.New("give --failed, or --status with --body: one of them")}
		case failed && (body != "" || bodyFile != ""):
			return &usageError{errors.New("--body and --body-file go with --status, not --failed")}
		case body != "" && bodyFile != "":
			return &usageError{errors.New("give --body or --body-file, not both")}
		}
		answer, action := console.FailedAnswer(), console.ActionSettleFailed
		if !failed {
			if bodyFile != "" {
				b, err := os.ReadFile(bodyFile)
				if err != nil {
					return &usageError{fmt.Errorf("--body-file: %w", err)}
				}
				body = string(b)
			}
			if answer, err = console.OperatorAnswer(status, contentType, body); err != nil {
				return &usageError{err}
			}
			action = console.ActionSettleAnswer
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
		// Each face's completer, each keeping the answer of its own face's
		// keys in the form that face's retries read.
		comp, err := payments.SettleCompleters(store, rest.bodyKeys)
		if err != nil {
			return err
		}
		stored := key
		if rest.keySecret != nil {
			stored = idemhttp.SealKey(rest.keySecret, idem.Scope(scope), key)
		}
		rec, err := comp.Settle(ctx, idem.Scope(scope), stored, answer, true)
		if errors.Is(err, idem.ErrNotFound) && stored != key {
			// Kept before the keys were sealed.
			stored = key
			rec, err = comp.Settle(ctx, idem.Scope(scope), stored, answer, true)
		}
		if err != nil {
			return refusedAction(err)
		}
		if dryRun {
			fmt.Fprintf(a.stdout, "dry run: key %q in scope %q can be settled; its client's retry would get %s (nothing was changed)\n", string(key), scope, settledAs(rec.Recovery.Name, answer))
			return nil
		}
		ev := console.KeyEvent{Scope: idem.Scope(scope), Key: stored, Actor: operator, Action: action, Reason: reason}
		settled, err := console.SettleAndRecord(ctx, comp, history, idem.SystemClock{}, ev, answer)
		switch {
		case settled && err != nil:
			return fmt.Errorf("the key was settled, but %w", err)
		case errors.Is(err, keyed.ErrNotStopped), errors.Is(err, keyed.ErrBeingFinished), errors.Is(err, keyed.ErrOtherPoint):
			return refusedAction(err)
		case err != nil:
			// A settle that failed once it held the key gave it back with a
			// Yield, which may have failed too, the key then held under the
			// settle's lease: give it back (giveBack), as this command ends. After a Complete
			// whose answer was lost, the Yield is fenced by the settle's
			// token, so it changes nothing if that Complete settled the key.
			gerr := giveBack(ctx, comp, store, idem.Scope(scope), stored)
			switch _, record := console.SettleResult(answer, err); {
			case errors.Is(err, keyed.ErrNotRecorded) && gerr != nil:
				return fmt.Errorf("settling the key: %w; it was not settled, and %w", err, gerr)
			case errors.Is(err, keyed.ErrNotRecorded):
				return fmt.Errorf("settling the key: %w; nothing was changed", err)
			case record && gerr != nil:
				return fmt.Errorf("settling the key: its result is unknown (the client's retry may get the answer or not; 'idem keys show' tells): %w; and if it was not settled, %w", err, gerr)
			case record:
				return fmt.Errorf("settling the key: its result is unknown (the client's retry may get the answer or not; 'idem keys show' tells): %w", err)
			case gerr != nil:
				return fmt.Errorf("settling the key: %w; %w", err, gerr)
			}
			return fmt.Errorf("settling the key: %w", err)
		}
		fmt.Fprintf(a.stdout, "settled key %q in scope %q: its client's retry gets %s\n", string(key), scope, settledAs(rec.Recovery.Name, answer))
		return nil
	})
	return cmd
}

// settleStores opens the key store and the history of the operators'
// actions of the payment database db, migrating the payments' tables.
func settleStores(ctx context.Context, db *database) (idem.Recoverer, console.KeyHistory, error) {
	if db.pg != nil {
		if err := payments.MigratePostgres(ctx, db.pg); err != nil {
			return nil, nil, err
		}
		store, err := idempg.NewStore(ctx, db.pg)
		if err != nil {
			return nil, nil, err
		}
		h, err := payments.KeyHistoryPostgres(db.pg)
		return store, h, err
	}
	if err := payments.Migrate(ctx, db.sqlite); err != nil {
		return nil, nil, err
	}
	store, err := idemsqlite.NewStore(ctx, db.sqlite, nil)
	if err != nil {
		return nil, nil, err
	}
	h, err := payments.KeyHistory(db.sqlite)
	return store, h, err
}

// settledAs says what the retry of a key stopped at point gets once it is
// settled with answer: the status, or on the gRPC face the call's.
func settledAs(point string, answer idem.Response) string {
	if !slices.Contains(payments.GRPCPoints(), point) {
		return strconv.Itoa(answer.Status)
	}
	_, err := payments.SettleGRPC(answer)
	return "gRPC status " + status.Code(err).String()
}
