package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/payments"
	"github.com/idem-go/idem/idemhttp"
)

// purgeBatch keeps each purge transaction short, so a purge run beside a
// live server never holds up its claims for long.
const purgeBatch = 1000

func (a *app) keysCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "keys",
		Short: "Inspect and purge stored idempotency keys",
		Args:  cobra.NoArgs,
	}
	cmd.AddCommand(a.keysPurgeCmd(), a.keysShowCmd(), a.keysSealCmd(), a.keysAbandonedCmd(), a.keysSettleCmd(), a.keysResumeCmd())
	return cmd
}

func (a *app) keysPurgeCmd() *cobra.Command {
	var dbURL, pgSchema, keysURL, keysPrefix string
	cmd := &cobra.Command{
		Use:   "purge",
		Short: "Delete expired idempotency keys now",
		Long: `Delete every idempotency key whose time to live has passed. The server does
this in the background as well; this is for doing it now. It is safe to run
beside a live server. Redis (--keys) expires keys by itself, so there is
little or nothing to purge there.`,
		Args: cobra.NoArgs,
	}
	dbFlags(cmd, &dbURL, &pgSchema)
	keysFlags(cmd, &keysURL, &keysPrefix)
	cmd.RunE = a.action(func(cmd *cobra.Command, _ []string) (err error) {
		ctx := cmd.Context()
		if err := checkPGSchema(cmd, dbURL); err != nil {
			return err
		}
		store, closeDB, err := keyStore(ctx, dbURL, pgSchema, keysURL, keysPrefix)
		if err != nil {
			return err
		}
		defer func() { err = errors.Join(err, closeDB()) }()
		total := 0
		for {
			n, err := store.Purge(ctx, purgeBatch)
			total += n
			if err != nil {
				return fmt.Errorf("purging after %d keys: %w", total, err)
			}
			if n < purgeBatch {
				break
			}
		}
		fmt.Fprintf(a.stdout, "purged %d expired idempotency keys\n", total)
		return nil
	})
	return cmd
}

func (a *app) keysSealCmd() *cobra.Command {
	var dbURL, pgSchema string
	cmd := &cobra.Command{
		Use:   "seal",
		Short: "Rewrite the keys kept in clear into their sealed form (" + envKeySecret + ")",
		Long: `Rewrite every idempotency key a payment database keeps in clear (the keys and
the payments', deposits' and refunds' origins) into the form a server with
` + envKeySecret + ` keeps: an HMAC-SHA-256 digest of tenant and key. All of it
commits in one transaction, or nothing does; keys already sealed are left
alone, so running it twice is harmless.

The answers and recovery points kept with a key are bound to it: they are
opened and sealed again for the sealed key, and, with ` + envBodyKeys + ` set as the
server has it, those kept in clear are sealed. A payment in flight at its
recovery point goes on after the rewrite and charges under the same key.

With ` + envBodyKeys + ` set, the payments' descriptions and the refunds' reasons
are sealed with its first key too: those kept in clear, and those sealed
with another of its keys. To rotate the body keys, put the new key first,
run 'idem keys seal', and remove the old key once no kept answer of it is
within its time to live.

This is the migration for turning ` + envKeySecret + ` on: stop every replica of
the server, run 'idem keys seal' with the secret in the environment, then
start the replicas with the same secret. A replica left running without it
would look duplicates up in clear, miss them, and run them again.`,
		Args: cobra.NoArgs,
	}
	dbFlags(cmd, &dbURL, &pgSchema)
	cmd.RunE = a.action(func(cmd *cobra.Command, _ []string) (err error) {
		ctx := cmd.Context()
		if err := checkPGSchema(cmd, dbURL); err != nil {
			return err
		}
		rest, err := a.atRestFromEnv()
		if err != nil {
			return err
		}
		if rest.keySecret == nil {
			return &usageError{fmt.Errorf("%s is not set: give the secret the server will run with (e.g. openssl rand -base64 32)", envKeySecret)}
		}
		db, err := openDB(ctx, dbURL, pgSchema, true)
		if err != nil {
			return err
		}
		defer func() { err = errors.Join(err, db.Close()) }()
		var n payments.SealedKeys
		if db.pg != nil {
			n, err = payments.SealKeysPostgres(ctx, db.pg, rest.keySecret, rest.bodyKeys)
		} else {
			n, err = payments.SealKeys(ctx, db.sqlite, rest.keySecret, rest.bodyKeys)
		}
		if err != nil {
			return fmt.Errorf("sealing the keys of %s (nothing was changed): %w", db.shown, err)
		}
		fmt.Fprintf(a.stdout, "sealed %d idempotency keys, %d payments', %d deposits' and %d refunds' keys, %d descriptions and reasons\n", n.Keys, n.Payments, n.Deposits, n.Refunds, n.Texts)
		return nil
	})
	return cmd
}

func (a *app) keysShowCmd() *cobra.Command {
	var dbURL, pgSchema, keysURL, keysPrefix, scope string
	cmd := &cobra.Command{
		Use:   "show --scope TENANT KEY",
		Short: "Show one idempotency key's record",
		Long: `Show the record kept for one idempotency key: its state, the fingerprint of the
request that claimed it, when it was claimed and when it expires, and the
stored answer. The payment service scopes keys by tenant, so --scope is the
tenant's name. Give --keys when the server keeps its keys in Redis.

When the server seals keys (IDEM_KEY_SECRET) or encrypts the answers it
keeps (IDEM_BODY_KEYS), give the same variables here: KEY is the key as the
client sent it, and is sealed the same way to be found.`,
		Args: cobra.ExactArgs(1),
	}
	dbFlags(cmd, &dbURL, &pgSchema)
	keysFlags(cmd, &keysURL, &keysPrefix)
	cmd.Flags().StringVar(&scope, "scope", "", "the key's scope: the tenant's name (required)")
	_ = cmd.MarkFlagRequired("scope")
	cmd.RunE = a.action(func(cmd *cobra.Command, args []string) (err error) {
		key, err := idem.ParseKey(args[0])
		if err != nil {
			return &usageError{err}
		}
		if err := checkPGSchema(cmd, dbURL); err != nil {
			return err
		}
		store, closeDB, err := keyStore(cmd.Context(), dbURL, pgSchema, keysURL, keysPrefix)
		if err != nil {
			return err
		}
		defer func() { err = errors.Join(err, closeDB()) }()
		rest, err := a.atRestFromEnv()
		if err != nil {
			return err
		}
		stored := key
		if rest.keySecret != nil {
			stored = idemhttp.SealKey(rest.keySecret, idem.Scope(scope), key)
		}
		rec, err := store.Get(cmd.Context(), idem.Scope(scope), stored)
		if errors.Is(err, idem.ErrNotFound) && stored != key {
			// Kept before the keys were sealed.
			rec, err = store.Get(cmd.Context(), idem.Scope(scope), key)
			stored = key
		}
		if errors.Is(err, idem.ErrNotFound) {
			hint := ""
			if rest.keySecret == nil {
				hint = "; if the server seals keys, set " + envKeySecret + " as it has it"
			}
			return fmt.Errorf("no idempotency key %q in scope %q (it was never used there, or it expired%s)", string(key), scope, hint)
		}
		if err != nil {
			return fmt.Errorf("reading the key: %w", err)
		}
		if stored != key {
			fmt.Fprintf(a.stdout, "sealed as\t%s\n", stored)
		}
		if rec.Response != nil && len(rec.Response.Body) > 0 {
			body, err := idemhttp.OpenBody(rest.bodyKeys, idem.Scope(scope), stored, rec.Response.Body)
			if err != nil {
				return fmt.Errorf("the kept answer: %w (set %s as the server has it)", err, envBodyKeys)
			}
			opened := *rec.Response
			opened.Body = body
			rec.Response = &opened
		}
		return writeRecord(a.stdout, rec, time.Now())
	})
	return cmd
}

func (a *app) keysAbandonedCmd() *cobra.Command {
	var dbURL, pgSchema string
	var limit int
	cmd := &cobra.Command{
		Use:   "abandoned",
		Short: "List the executions stopped after a recovery point that nobody has finished",
		Long: `List the idempotency keys in flight whose execution reached a recovery point
(a payment at the card network, before or after the charge) and whose holder
is gone: their outcome is unknown until the completer, or a retry of the
client, goes on from the point. The server's completer takes each within a
lease and a second; a key listed here for longer means the completer cannot
learn the outcome (the card network down, say). Such keys are never released.
Exits 1 when there is one.`,
		Args: cobra.NoArgs,
	}
	dbFlags(cmd, &dbURL, &pgSchema)
	cmd.Flags().IntVar(&limit, "limit", 100, "list at most this many, oldest first")
	cmd.RunE = a.action(func(cmd *cobra.Command, _ []string) (err error) {
		if limit <= 0 {
			return &usageError{fmt.Errorf("--limit must be positive, got %d", limit)}
		}
		if err := checkPGSchema(cmd, dbURL); err != nil {
			return err
		}
		store, closeDB, err := keyStore(cmd.Context(), dbURL, pgSchema, "", "")
		if err != nil {
			return err
		}
		defer func() { err = errors.Join(err, closeDB()) }()
		rs, ok := store.(idem.Recoverer)
		if !ok {
			return fmt.Errorf("the key store (%T) keeps no recovery points", store)
		}
		recs, err := rs.Abandoned(cmd.Context(), limit)
		if err != nil {
			return fmt.Errorf("listing abandoned executions: %w", err)
		}
		if len(recs) == 0 {
			fmt.Fprintln(a.stdout, "no abandoned executions")
			return nil
		}
		now := time.Now()
		tw := tabwriter.NewWriter(a.stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "SCOPE\tKEY\tPOINT\tSAVED\tUNKNOWN SINCE")
		for _, r := range recs {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", r.Scope, r.Key, r.Recovery.Name, when(r.Recovery.SavedAt, now), when(r.LeaseExpiresAt, now))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		return fmt.Errorf("%d executions stopped after a recovery point and are not finished", len(recs))
	})
	return cmd
}

// writeRecord prints a record for a person: one field per line, times with
// how far away they are, and the stored body indented when it is JSON.
func writeRecord(w io.Writer, rec idem.Record, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(name, format string, args ...any) {
		fmt.Fprintf(tw, "%s\t"+format+"\n", append([]any{name}, args...)...)
	}
	row("scope", "%s", string(rec.Scope))
	row("key", "%s", string(rec.Key))
	row("state", "%s", rec.State)
	row("fingerprint", "%s", rec.Fingerprint)
	row("token", "%d", rec.Token)
	row("created", "%s", when(rec.CreatedAt, now))
	if rec.State == idem.StateInFlight {
		row("lease ends", "%s", when(rec.LeaseExpiresAt, now))
	}
	if !rec.CompletedAt.IsZero() {
		row("completed", "%s", when(rec.CompletedAt, now))
	}
	row("expires", "%s", when(rec.ExpiresAt, now))
	if rp := rec.Recovery; !rp.IsZero() {
		row("recovery point", "%s, saved %s", rp.Name, when(rp.SavedAt, now))
		if rec.State == idem.StateInFlight && !now.Before(rec.LeaseExpiresAt) {
			row("outcome", "unknown since %s: the execution stopped after reaching %q and nobody has finished it yet; "+
				"the completer (or a retry) goes on from there; the key is never released meanwhile", when(rec.LeaseExpiresAt, now), rp.Name)
		}
	}
	resp := rec.Response
	if resp != nil {
		row("status", "%d %s", resp.Status, http.StatusText(resp.Status))
		for _, name := range slices.Sorted(maps.Keys(resp.Header)) {
			for _, v := range resp.Header[name] {
				row("header", "%s: %s", name, v)
			}
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if resp == nil {
		_, err := fmt.Fprintln(w, "no stored answer yet (the request is still in flight)")
		return err
	}
	_, err := fmt.Fprintf(w, "body:\n%s\n", formatBody(resp))
	return err
}

// when formats a time in UTC with how long ago or ahead it is.
func when(t, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := t.Sub(now).Round(time.Second)
	rel := "in " + d.String()
	if d < 0 {
		rel = (-d).String() + " ago"
	}
	return fmt.Sprintf("%s (%s)", t.UTC().Format(time.RFC3339), rel)
}

// formatBody shows a stored body: JSON indented, other text as it is,
// anything else by its size only.
func formatBody(resp *idem.Response) string {
	switch {
	case resp.BodyOmitted:
		return "  (not kept: larger than the store keeps, or the server keeps no bodies)"
	case len(resp.Body) == 0:
		return "  (empty)"
	}
	var b bytes.Buffer
	if json.Valid(resp.Body) && json.Indent(&b, resp.Body, "  ", "  ") == nil {
		return "  " + b.String()
	}
	if utf8.Valid(resp.Body) && !strings.ContainsFunc(string(resp.Body), isControl) {
		return "  " + strings.ReplaceAll(strings.TrimRight(string(resp.Body), "\n"), "\n", "\n  ")
	}
	return fmt.Sprintf("  (%d bytes of binary data)", len(resp.Body))
}

func isControl(r rune) bool { return r < 0x20 && r != '\n' && r != '\r' && r != '\t' || r == 0x7f }
