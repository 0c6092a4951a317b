package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/payments"
	"github.com/idem-go/idem/console"
	"github.com/idem-go/idem/deadletter"
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
	cmd.AddCommand(a.dlqLsCmd(&f), a.dlqShowCmd(&f), a.dlqRedriveCmd(&f), a.dlqEditCmd(&f), a.dlqDiscardCmd(&f))
	return cmd
}

// withDLQ opens --db and runs fn with its dead-letter service.
func (a *app) withDLQ(ctx context.Context, f *dlqFlags, fn func(svc *deadletter.Service) error) error {
	return a.withDLQInsights(ctx, f, func(svc *deadletter.Service, _ console.Insights) error { return fn(svc) })
}

// withDLQInsights is withDLQ that also gives fn what the console knows of
// the database beyond the letters (the parked messages).
func (a *app) withDLQInsights(ctx context.Context, f *dlqFlags, fn func(svc *deadletter.Service, in console.Insights) error) (err error) {
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
	var in console.Insights
	if t.postgres {
		if svc, err = payments.DeadLetterServicePostgres(ctx, db.pg); err == nil {
			in, err = payments.ConsoleInsightsPostgres(db.pg)
		}
	} else {
		if svc, err = payments.DeadLetterService(ctx, db.sqlite); err == nil {
			in, err = payments.ConsoleInsights(db.sqlite)
		}
	}
	if err != nil {
		return err
	}
	return fn(svc, in)
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
	// Parked counts the messages of the key parked behind the letter.
	Parked int `json:"parked"`
	// Payload is the message body as JSON when it is JSON, as a string
	// otherwise, so that a malformed body is still shown as it arrived.
	Payload any `json:"payload"`
}

func toJSON(dl idem.DeadLetter, parked int) letterJSON {
	var payload any = string(dl.Message.Payload)
	if json.Valid(dl.Message.Payload) {
		payload = json.RawMessage(dl.Message.Payload)
	}
	return letterJSON{
		ID: dl.ID, Consumer: dl.Consumer, MessageID: dl.Message.ID, Topic: dl.Message.Topic, Key: dl.Message.Key,
		Headers: dl.Message.Headers, Attempts: len(dl.Attempts), FirstFailedAt: dl.FirstFailedAt,
		LastFailedAt: dl.LastFailedAt, LastError: dl.LastError(), ErrorClass: string(dl.Class),
		State: string(dl.State), Payload: payload, Parked: parked,
	}
}

func (a *app) dlqLsCmd(f *dlqFlags) *cobra.Command {
	var ff filterFlags
	var asJSON, all bool
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List dead letters, the most recent failure first",
		Long: `List the dead letters waiting for a person (state dead), the most recent
failure first; --all lists re-driven and discarded ones too. Below the table,
the keys held back behind a letter, with how many of their messages are
parked behind it (in --json, each letter's "parked").`,
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
		return a.withDLQInsights(cmd.Context(), f, func(svc *deadletter.Service, in console.Insights) error {
			dls, err := svc.List(cmd.Context(), filter)
			if err != nil {
				return err
			}
			parked, err := in.ParkedCounts(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				out := make([]letterJSON, 0, len(dls))
				for _, dl := range dls {
					out = append(out, toJSON(dl, parked[dl.ID]))
				}
				enc := json.NewEncoder(a.stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(out)
			}
			if err := deadletter.RenderList(a.stdout, dls); err != nil {
				return err
			}
			return printParked(a.stdout, dls, parked)
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

// printParked writes, for each letter of dls that holds its key back with
// messages parked behind it, the key and how many. Keys are quoted, so
// that a key cannot write escape sequences to the terminal.
func printParked(w io.Writer, dls []idem.DeadLetter, parked map[string]int) error {
	var b strings.Builder
	for _, dl := range dls {
		if n := parked[dl.ID]; n > 0 {
			fmt.Fprintf(&b, "  key %s (%s): %d parked behind %s\n", strconv.QuoteToASCII(dl.Message.Key), strconv.QuoteToASCII(dl.Consumer), n, dl.ID)
		}
	}
	if b.Len() == 0 {
		return nil
	}
	_, err := io.WriteString(w, "\nparked messages, per key held back:\n"+b.String())
	return err
}

// actorFlag adds --actor, defaulting to the OS user (defaultActor).
func (a *app) actorFlag(cmd *cobra.Command, actor *string) {
	cmd.Flags().StringVar(actor, "actor", defaultActor(user.Current, a.lookupEnv), "who acts, for the letters' history (default: the OS user)")
}

// defaultActor is the OS user's name: the login name, else $USER, else
// "cli" when neither is known.
func defaultActor(current func() (*user.User, error), lookupEnv func(string) (string, bool)) string {
	if u, err := current(); err == nil && strings.TrimSpace(u.Username) != "" {
		return strings.TrimSpace(u.Username)
	}
	if u, ok := lookupEnv("USER"); ok && strings.TrimSpace(u) != "" {
		return strings.TrimSpace(u)
	}
	return "cli"
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

func (a *app) dlqEditCmd(f *dlqFlags) *cobra.Command {
	var actor, reason, payloadFile string
	var dryRun bool
	cmd := &cobra.Command{
		Use:   "edit ID",
		Short: "Edit a dead letter's payload, then re-drive it",
		Long: `Replace the payload of a dead letter's message and re-drive it: the edited
message goes to the outbox, followed by the messages of its key parked behind
the letter, and the letter's history records who edited it and why. The
letter keeps the original message.

The new payload comes from --payload-file or, without it, from $VISUAL or
$EDITOR, opened on the current payload (JSON indented). It must parse as one
JSON value unless the message's Content-Type header names another type; an
edit that does not parse, or changes nothing, is refused and nothing is
re-driven (an edit made in the editor is kept in its file, which is named).
--dry-run checks the edit and reports what would happen, changing nothing.`,
		Args: cobra.ExactArgs(1),
	}
	cmd.Flags().StringVar(&payloadFile, "payload-file", "", "read the new payload from this file instead of opening an editor")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "check the edit and report what would be re-driven, changing nothing")
	a.actorFlag(cmd, &actor)
	cmd.Flags().StringVar(&reason, "reason", "", "why, for the letter's history")
	cmd.RunE = a.action(func(cmd *cobra.Command, args []string) error {
		editor := ""
		if payloadFile == "" {
			for _, v := range []string{"VISUAL", "EDITOR"} {
				if e, ok := a.lookupEnv(v); ok && strings.TrimSpace(e) != "" {
					editor = strings.TrimSpace(e)
					break
				}
			}
			if editor == "" {
				return &usageError{errors.New("give the new payload with --payload-file FILE, or set $EDITOR to edit it")}
			}
		}
		id := args[0]
		return a.withDLQ(cmd.Context(), f, func(svc *deadletter.Service) error {
			dl, err := svc.Show(cmd.Context(), id)
			if err != nil {
				return err
			}
			if dl.State != idem.LetterDead {
				return fmt.Errorf("dead letter %q is %s, not dead: only a dead letter can be edited and re-driven: %w", id, dl.State, idem.ErrInvalidTransition)
			}
			var edited []byte
			kept := ""
			if payloadFile != "" {
				if edited, err = os.ReadFile(payloadFile); err != nil {
					return fmt.Errorf("--payload-file: %w", err)
				}
			} else {
				if edited, kept, err = a.editInEditor(cmd.Context(), editor, dl); err != nil {
					return err
				}
			}
			payload, err := console.EditedPayload(dl, edited)
			if err != nil {
				if kept != "" {
					return fmt.Errorf("%w; nothing was re-driven, and the edit is kept in %s", err, kept)
				}
				return fmt.Errorf("%w; nothing was re-driven", err)
			}
			if kept != "" {
				os.Remove(kept)
			}
			res, err := svc.Redrive(cmd.Context(), []string{id}, &deadletter.RedriveOptions{Actor: actor, Reason: reason, Payload: payload, DryRun: dryRun})
			printResults(a.stdout, res)
			return err
		})
	})
	return cmd
}

// editInEditor opens editor (a shell command, as $EDITOR may carry
// arguments) on a temporary file holding dl's payload, and returns what
// the file holds once it exits, with the file's name: it is removed only
// once the edit has been accepted.
func (a *app) editInEditor(ctx context.Context, editor string, dl idem.DeadLetter) (edited []byte, path string, err error) {
	ext := ".txt"
	if json.Valid(dl.Message.Payload) || len(dl.Message.Payload) == 0 {
		ext = ".json"
	}
	tmp, err := os.CreateTemp("", "idem-dlq-"+strings.NewReplacer("/", "_", "\\", "_").Replace(dl.ID)+"-*"+ext)
	if err != nil {
		return nil, "", fmt.Errorf("the editor's file: %w", err)
	}
	path = tmp.Name()
	_, werr := tmp.WriteString(console.EditableText(dl.Message.Payload))
	if err := errors.Join(werr, tmp.Close()); err != nil {
		os.Remove(path)
		return nil, "", fmt.Errorf("the editor's file: %w", err)
	}
	ed := exec.CommandContext(ctx, "/bin/sh", "-c", editor+` "$1"`, "idem-dlq-edit", path)
	ed.Stdin, ed.Stdout, ed.Stderr = os.Stdin, a.stdout, a.stderr
	if err := ed.Run(); err != nil {
		return nil, "", errors.Join(fmt.Errorf("the editor (%s) failed: %w; nothing was re-driven", editor, err), os.Remove(path))
	}
	if edited, err = os.ReadFile(path); err != nil {
		return nil, "", fmt.Errorf("reading the edit back: %w", err)
	}
	return edited, path, nil
}
