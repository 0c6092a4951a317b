package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/deadletter"
	"github.com/idem-go/idem/payments"
)

// dlqFlags are the flags every `idem dlq` command shares.
type dlqFlags struct {
	db, pgSchema string
}

func (a *app) dlqCmd() *cobra.Command {
	var f dlqFlags
	cmd := &cobra.Command{
		Use:   "dlq",
		Short: "List, show, re-drive and discard dead letters",
		Long: `Act on the dead letters of the service's consumers: the messages a consumer
gave up on, because they can never succeed (class permanent: a malformed
message, a payment that does not exist) or because every attempt failed
(class exhausted). Nothing is deleted: a letter is re-driven (sent back to its
consumer through the outbox) or discarded, and its history says who did what
and why.

Every command takes the same --db as 'idem serve' (SQLite for now). A
re-driven message is published by the running service's outbox relay.`,
		Args: cobra.NoArgs,
	}
	cmd.PersistentFlags().StringVar(&f.db, "db", defaultDB, "the database: "+supportedDBs)
	cmd.PersistentFlags().StringVar(&f.pgSchema, "pg-schema", defaultPGSchema, "PostgreSQL schema, as given to serve")
	cmd.AddCommand(a.dlqLsCmd(&f), a.dlqShowCmd(&f), a.dlqRedriveCmd(&f), a.dlqDiscardCmd(&f))
	return cmd
}

// withDLQ opens --db and runs fn with its dead-letter service.
func (a *app) withDLQ(ctx context.Context, f *dlqFlags, fn func(svc *deadletter.Service) error) (err error) {
	t, err := parseDB(f.db)
	if err != nil {
		return err
	}
	db, err := openDB(ctx, f.db, f.pgSchema, true)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, db.Close()) }()
	var svc *deadletter.Service
	if t.postgres {
		svc, err = payments.DeadLetterServicePostgres(ctx, db.pg)
	} else {
		svc, err = payments.DeadLetterService(ctx, db.sqlite)
	}
	if err != nil {
		return err
	}
	return fn(svc)
}

// filterFlags are --consumer, --class and --since.
type filterFlags struct {
	consumer, class, since string
}

func (ff *filterFlags) add(cmd *cobra.Command, withSince bool) {
	cmd.Flags().StringVar(&ff.consumer, "consumer", "", "only the letters of this consumer")
	cmd.Flags().StringVar(&ff.class, "class", "", "only letters of this class: permanent or exhausted")
	if withSince {
		cmd.Flags().StringVar(&ff.since, "since", "", "only letters that last failed at or after T (RFC 3339, or a duration back from now: 1h)")
	}
}

func (ff *filterFlags) filter(now time.Time) (idem.DeadLetterFilter, error) {
	f := idem.DeadLetterFilter{Consumer: ff.consumer}
	switch ff.class {
	case "":
	case string(idem.DeadPermanent), string(idem.DeadExhausted):
		f.Class = idem.DeadLetterClass(ff.class)
	default:
		return f, &usageError{fmt.Errorf("--class %q: want permanent or exhausted", ff.class)}
	}
	if ff.since != "" {
		if d, err := time.ParseDuration(ff.since); err == nil && d >= 0 {
			f.Since = now.Add(-d)
		} else if t, err := time.Parse(time.RFC3339Nano, ff.since); err == nil {
			f.Since = t
		} else {
			return f, &usageError{fmt.Errorf("--since %q: want an RFC 3339 time or a duration such as 1h", ff.since)}
		}
	}
	return f, nil
}

// letterJSON is one letter in `idem dlq ls --json`.
type letterJSON struct {
	ID            string            `json:"id"`
	Consumer      string            `json:"consumer"`
	MessageID     string            `json:"message_id"`
	Topic         string            `json:"topic"`
	Key           string            `json:"key"`
	Headers       map[string]string `json:"headers,omitempty"`
	Attempts      int               `json:"attempts"`
	FirstFailedAt time.Time         `json:"first_failed_at"`
	LastFailedAt  time.Time         `json:"last_failed_at"`
	LastError     string            `json:"last_error"`
	ErrorClass    string            `json:"error_class"`
	State         string            `json:"state"`
	// Payload is the message body as JSON when it is JSON, as a string
	// otherwise, so that a malformed body is still shown as it arrived.
	Payload any `json:"payload"`
}

func toJSON(dl idem.DeadLetter) letterJSON {
	var payload any = string(dl.Message.Payload)
	if json.Valid(dl.Message.Payload) {
		payload = json.RawMessage(dl.Message.Payload)
	}
	return letterJSON{
		ID: dl.ID, Consumer: dl.Consumer, MessageID: dl.Message.ID, Topic: dl.Message.Topic, Key: dl.Message.Key,
		Headers: dl.Message.Headers, Attempts: len(dl.Attempts), FirstFailedAt: dl.FirstFailedAt,
		LastFailedAt: dl.LastFailedAt, LastError: dl.LastError(), ErrorClass: string(dl.Class),
		State: string(dl.State), Payload: payload,
	}
}

func (a *app) dlqLsCmd(f *dlqFlags) *cobra.Command {
	var ff filterFlags
	var asJSON, all bool
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List dead letters, the most recent failure first",
		Long: `List the dead letters waiting for a person (state dead), the most recent
failure first; --all lists re-driven and discarded ones too.`,
		Args: cobra.NoArgs,
	}
	ff.add(cmd, true)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array")
	cmd.Flags().BoolVar(&all, "all", false, "include re-driven and discarded letters")
	cmd.RunE = a.action(func(cmd *cobra.Command, _ []string) error {
		filter, err := ff.filter(time.Now())
		if err != nil {
			return err
		}
		if !all {
			filter.State = idem.LetterDead
		}
		return a.withDLQ(cmd.Context(), f, func(svc *deadletter.Service) error {
			dls, err := svc.List(cmd.Context(), filter)
			if err != nil {
				return err
			}
			if asJSON {
				out := make([]letterJSON, 0, len(dls))
				for _, dl := range dls {
					out = append(out, toJSON(dl))
				}
				enc := json.NewEncoder(a.stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(out)
			}
			return deadletter.RenderList(a.stdout, dls)
		})
	})
	return cmd
}

func (a *app) dlqShowCmd(f *dlqFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "show ID",
		Short: "Show one dead letter: its message, its attempts and its history",
		Args:  cobra.ExactArgs(1),
	}
	cmd.RunE = a.action(func(cmd *cobra.Command, args []string) error {
		return a.withDLQ(cmd.Context(), f, func(svc *deadletter.Service) error {
			dl, err := svc.Show(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return deadletter.Render(a.stdout, dl)
		})
	})
	return cmd
}

// actorFlag adds --actor, defaulting to $USER or "cli".
func (a *app) actorFlag(cmd *cobra.Command, actor *string) {
	def := "cli"
	if u, ok := a.lookupEnv("USER"); ok && strings.TrimSpace(u) != "" {
		def = strings.TrimSpace(u)
	}
	cmd.Flags().StringVar(actor, "actor", def, "who acts, for the letters' history")
}

func (a *app) dlqRedriveCmd(f *dlqFlags) *cobra.Command {
	var ff filterFlags
	var allMatching, dryRun bool
	var actor, reason string
	cmd := &cobra.Command{
		Use:   "redrive ID…|--all-matching",
		Short: "Send dead letters back to their consumers",
		Long: `Send dead letters back to their consumers: each message is written to the
outbox, with the messages of its key that were parked behind it, in order,
and the letter becomes re-driven. Give the letters' IDs, or --all-matching
with --consumer and --class to re-drive every dead letter they select.
--dry-run reports what would happen and changes nothing.`,
	}
	ff.add(cmd, true)
	cmd.Flags().BoolVar(&allMatching, "all-matching", false, "re-drive every dead letter --consumer, --class and --since select")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "report what would be re-driven, changing nothing")
	a.actorFlag(cmd, &actor)
	cmd.Flags().StringVar(&reason, "reason", "", "why, for the letters' history")
	cmd.RunE = a.action(func(cmd *cobra.Command, args []string) error {
		switch {
		case allMatching && len(args) > 0:
			return &usageError{errors.New("give letter IDs or --all-matching, not both")}
		case !allMatching && len(args) == 0:
			return &usageError{errors.New("give the IDs of the letters to re-drive, or --all-matching")}
		case !allMatching && (ff.consumer != "" || ff.class != "" || ff.since != ""):
			return &usageError{errors.New("--consumer, --class and --since select letters only with --all-matching")}
		}
		filter, err := ff.filter(time.Now())
		if err != nil {
			return err
		}
		opts := &deadletter.RedriveOptions{Actor: actor, Reason: reason, DryRun: dryRun}
		return a.withDLQ(cmd.Context(), f, func(svc *deadletter.Service) error {
			var res []deadletter.Result
			if allMatching {
				res, err = svc.RedriveMatching(cmd.Context(), filter, opts)
			} else {
				res, err = svc.Redrive(cmd.Context(), args, opts)
			}
			printResults(a.stdout, res)
			return err
		})
	})
	return cmd
}

func (a *app) dlqDiscardCmd(f *dlqFlags) *cobra.Command {
	var actor, reason string
	cmd := &cobra.Command{
		Use:   "discard ID… --reason \"…\"",
		Short: "Give dead letters up, saying why",
		Long: `Mark dead letters discarded: their messages are never applied. --reason is
required and kept in each letter's history; the letters themselves are kept.`,
		Args: cobra.MinimumNArgs(1),
	}
	a.actorFlag(cmd, &actor)
	cmd.Flags().StringVar(&reason, "reason", "", "why they are given up (required)")
	cmd.RunE = a.action(func(cmd *cobra.Command, args []string) error {
		if strings.TrimSpace(reason) == "" {
			return &usageError{errors.New(`--reason is required: say why the letters are given up`)}
		}
		return a.withDLQ(cmd.Context(), f, func(svc *deadletter.Service) error {
			res, err := svc.Discard(cmd.Context(), args, actor, reason)
			printResults(a.stdout, res)
			return err
		})
	})
	return cmd
}

func printResults(w io.Writer, res []deadletter.Result) {
	for _, r := range res {
		prefix := ""
		if r.DryRun {
			prefix = "would be "
		}
		line := fmt.Sprintf("%s: %s%s", r.Letter.ID, prefix, r.Action)
		if len(r.Released) > 0 {
			line += fmt.Sprintf(", releasing %d parked message(s)", len(r.Released))
		}
		if r.HeldBehind != "" {
			line += ", its key still held behind " + r.HeldBehind
		}
		fmt.Fprintln(w, line)
	}
}
