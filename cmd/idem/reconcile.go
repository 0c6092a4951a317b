package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/acquirer"
	"github.com/idem-go/idem/cmd/idem/internal/payments"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/idemredis"
	"github.com/idem-go/idem/idemsqlite"
)

func (a *app) reconcileCmd() *cobra.Command {
	var (
		dbURL, pgSchema, netURL, netKey string
		keysURL, keysPrefix             string
		since                           string
		bound, horizon                  time.Duration
		window                          int
		asJSON                          bool
	)
	cmd := &cobra.Command{
		Use:   "reconcile",
		Short: "Compare the service's payments with the card network's charges",
		Long: `Compare the payments that idem serve --acquirer recorded in --db with the
charges the card network (idem acquirer) made, and print every difference:
a charge no payment records (money taken that the books do not show, unless
it was refunded in full), a payment whose charge the network does not have,
a payment and its charge of different amounts, one logical payment (a
tenant's idempotency key) charged twice, and one charge recorded by two
payments.

A payment in flight at its recovery point (its replica died after it began
charging, or it is being charged now) is not in the books yet. Within
--bound of its point it is being finished (by its replica, a retry or the
completer) and is listed apart, with its age: not a difference. Past the
bound it is an unknown outcome, a difference, for a person to decide on
('idem keys abandoned', 'idem keys show').

The keys in flight are read where the service keeps them: in --db, or in
the Redis that --keys names (the URL and --keys-prefix 'idem serve' was
given). Redis keeps no recovery points, so there a payment whose charge is
made and not yet recorded, with its key in flight, is being finished
within --bound of the key's claim (by the client's retry, which takes the
key over once its lease ends), and an unknown outcome past it. A key the
service sealed (IDEM_KEY_SECRET) does not say which payment it is: a
charge made for one shows as a charge without its payment, and the run
says how many keys it could not read. Redis is only read: SCAN, GET and
TIME (opening it loads the store's scripts, which changes no key); one
that cannot be reached ends the run with status 3. Without --keys, a
database that does not hold the keys (the service ran with --keys) has no
keys in flight to show: reconcile says so, on stderr and in the --json
summary ("keys_seen": false), and a payment in flight after its charge is
a difference; with --keys, a prefix under which no key of the store lives
at all (not the one 'idem serve' was given, or another database of that
Redis) is said so alike, naming it. The keys in flight are held whole:
10,000 or more end the run with status 3. In Redis every request in flight
counts, and one whose client stopped retrying stays in flight until its
key's TTL (--key-ttl of 'idem serve').

Exit status: 0 when the books agree (payments being finished do not count);
1 when there is a difference (unknown outcomes included); 2 on bad usage;
3 when a side could not be read: nothing, or not everything, was compared.
A run that stops partway says so (with --json, a summary whose "complete"
is false and whose "error" says why); the differences it printed before
are real, but not all of them.

--since limits the comparison to what was made at or after a time (RFC 3339,
or a duration back from now such as 24h); by default everything is compared.
The card network is asked only for the charges made since then, and those
made within --key-horizon before it: these are compared with nothing but
the later charges of their logical payment, so that a payment charged once
before --since and again after it is a double charge.

It may run against a live service: a payment is called without its charge
only when the network, asked after the payment was read, has no such
charge; and each page of charges is read before the keys in flight are
listed and before the payments that record them are read, so a payment
made while it runs is never a difference.

Its memory is bounded by --window, not by the history: the charges and the
payments are streamed side by side in the order they were made (a page of
charges, the payments of that time), each matched with the other as they
pass; what the streams do not match (a charge made late by the completer,
a full window) is looked up alone, by its ID, so the report is the whole
history's. It holds at most a page of charges, --window payments read
ahead, --window waiting for their charge and --window logical payments
whose charges it counts; differences are printed as they are found and
not kept. Two charges of one logical payment are a double charge when made
within --key-horizon of its first (the service's --key-ttl); should more
logical payments than --window be charged within it, the oldest are let go
early, and the summary says how many.

It only reads: it never migrates --db and creates nothing in it, its
PostgreSQL connections are read-only, and a database without the service's
schema (or a PostgreSQL schema that does not exist) is refused with an
error that says so.`,
		Args: cobra.NoArgs,
	}
	dbFlags(cmd, &dbURL, &pgSchema)
	keysFlags(cmd, &keysURL, &keysPrefix)
	cmd.Flags().StringVar(&netURL, "acquirer", "", "the card network: http://HOST:PORT (required)")
	cmd.Flags().StringVar(&netKey, "acquirer-key", "", "the card network's API key (default from $"+envAcquirerKey+", or the file $"+envAcquirerKey+"_FILE names)")
	cmd.Flags().StringVar(&since, "since", "", "compare only what was made at or after this time: RFC 3339, or a duration back from now (24h)")
	cmd.Flags().DurationVar(&bound, "bound", payments.DefaultCompletionBound, "how long after its recovery point a payment in flight is still being finished; past it, its outcome is unknown")
	cmd.Flags().IntVar(&window, "window", payments.DefaultReconcileWindow, "how many charges, payments and logical payments of each kind are held at once: memory stays bounded by it, however long the history")
	cmd.Flags().DurationVar(&horizon, "key-horizon", payments.DefaultKeyHorizon, "how long after a logical payment's first charge another charge of it is a double charge (the service's --key-ttl)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON lines: one object per difference as found, one per payment being finished, then a summary (\"complete\": false, with its \"error\", when the run stopped partway)")
	cmd.RunE = a.action(func(cmd *cobra.Command, _ []string) (err error) {
		ctx := cmd.Context()
		if err := checkPGSchema(cmd, dbURL); err != nil {
			return err
		}
		if bound <= 0 {
			return &usageError{fmt.Errorf("--bound must be positive, got %s", bound)}
		}
		if window < 1 {
			return &usageError{fmt.Errorf("--window must be at least 1, got %d", window)}
		}
		if horizon <= 0 {
			return &usageError{fmt.Errorf("--key-horizon must be positive, got %s", horizon)}
		}
		if netURL == "" {
			return &usageError{errors.New("--acquirer is required: the card network to compare with")}
		}
		from, err := parseSince(since, time.Now())
		if err != nil {
			return &usageError{err}
		}
		if !cmd.Flags().Changed("acquirer-key") {
			if netKey, _, err = a.secretEnv(envAcquirerKey); err != nil {
				return err
			}
		}
		net, err := acquirer.NewClient(acquirer.ClientConfig{URL: netURL, APIKey: netKey, Timeout: 5 * time.Minute})
		if err != nil {
			return &usageError{fmt.Errorf("--acquirer: %w", err)}
		}
		out := &reconcileOutput{a: a, json: asJSON}
		db, err := openDBToRead(ctx, dbURL, pgSchema)
		if err != nil {
			return out.incomplete(nil, from, bound, err)
		}
		defer func() { err = errors.Join(err, db.Close()) }()
		rest, err := a.atRestFromEnv()
		if err != nil {
			return &usageError{err}
		}
		var rs *idemredis.Store
		if keysURL != "" {
			var t keysTarget
			rs, t, err = openKeys(ctx, keysURL, keysPrefix)
			if err != nil {
				if t.url == "" {
					return &usageError{err}
				}
				return out.incomplete(nil, from, bound, err)
			}
			defer func() { err = errors.Join(err, rs.Close()) }()
		}
		keys := keysInFlight(db, rs, keysPrefix)
		defer func() { err = errors.Join(err, keys.close()) }()
		out.keys = keys
		if !asJSON {
			window := "everything"
			if !from.IsZero() {
				window = "since " + from.UTC().Format(time.RFC3339)
			}
			fmt.Fprintf(a.stdout, "reconcile: the payments of %s and the charges at %s, %s\n", db.shown, netURL, window)
		}
		rec, err := payments.Reconcile(ctx, db.sqlite, db.pg, net, from, &payments.ReconcileOptions{InFlight: keys.list, Bound: bound,
			BodyKeys: rest.bodyKeys, Window: window, KeyHorizon: horizon, OnDifference: out.difference})
		if err != nil {
			if out.err != nil {
				return out.err
			}
			return out.incomplete(rec, from, bound, err)
		}
		return out.end(rec, from, bound)
	})
	return cmd
}

// reconcileOutput prints reconcile's report as it is found: each
// difference when it is found, so that none is held however many there
// are; the payments being finished and the totals at the end. With json it
// prints JSON lines, for automation: a "difference" object per difference,
// a "pending" object per payment being finished, and a "summary"; the exit
// status is the text output's.
type reconcileOutput struct {
	a    *app
	json bool
	keys *inFlightKeys // where the keys in flight were read; nil before
	err  error         // the first failure to write, which stops the run
}

type reconcilePending struct {
	Type       string   `json:"type"`
	Payment    string   `json:"payment"`
	Tenant     string   `json:"tenant"`
	KeyDigest  string   `json:"key_digest,omitempty"`
	Amount     int64    `json:"amount"`
	Currency   string   `json:"currency"`
	Point      string   `json:"point"`
	AgeSeconds float64  `json:"age_s"`
	BoundSecs  float64  `json:"bound_s"`
	Charges    []string `json:"charges"`
}

type reconcileDifference struct {
	Type    string   `json:"type"`
	Kind    string   `json:"kind"`
	Payment string   `json:"payment,omitempty"`
	Charges []string `json:"charges"`
	Detail  string   `json:"detail"`
}

func (o *reconcileOutput) difference(d payments.Difference) error {
	if o.json {
		o.err = json.NewEncoder(o.a.stdout).Encode(reconcileDifference{Type: "difference", Kind: d.Kind, Payment: d.Payment, Charges: orEmpty(d.Charges), Detail: d.Detail})
	} else {
		_, o.err = fmt.Fprintf(o.a.stdout, "DIFFERENCE %s\n", d)
	}
	return o.err
}

func (o *reconcileOutput) end(rec *payments.Reconciliation, from time.Time, bound time.Duration) error {
	a := o.a
	o.notes(rec)
	failed := func() error {
		if rec.DifferenceCount > 0 {
			return &silentError{fmt.Errorf("%d differences", rec.DifferenceCount)}
		}
		return nil
	}
	if o.json {
		enc := json.NewEncoder(a.stdout)
		for _, p := range rec.Pending {
			if err := enc.Encode(reconcilePending{Type: "pending", Payment: p.Payment, Tenant: p.Tenant, KeyDigest: p.KeyDigest, Amount: p.Amount,
				Currency: p.Currency, Point: p.Point, AgeSeconds: p.Age.Seconds(), BoundSecs: p.Bound.Seconds(), Charges: orEmpty(p.Charges)}); err != nil {
				return err
			}
		}
		if err := enc.Encode(o.summary(rec, from, bound)); err != nil {
			return err
		}
		return failed()
	}
	for _, p := range rec.Pending {
		fmt.Fprintf(a.stdout, "BEING FINISHED %s\n", p)
	}
	if len(rec.Pending) > 0 {
		fmt.Fprintf(a.stdout, "%d payment(s) being finished: in flight (at their recovery point, or with their key, where the key store keeps no points) within the %s bound, not differences\n", len(rec.Pending), bound)
	}
	fmt.Fprintf(a.stdout, "compared %d payments and %d charges, holding at most %d at once\n", rec.Payments, rec.Charges, rec.PeakHeld)
	if rec.CutShort > 0 {
		fmt.Fprintf(a.stdout, "%d logical payment(s) let go before --key-horizon ended, the --window being full: a later charge of one was not compared with the earlier\n", rec.CutShort)
	}
	if rec.DifferenceCount > 0 {
		fmt.Fprintf(a.stdout, "%d difference(s): the books do not agree\n", rec.DifferenceCount)
		return failed()
	}
	fmt.Fprintln(a.stdout, "0 differences: every charge is a payment's, every payment's charge is there, once")
	return nil
}

// notes says on stderr what the run could not see of the keys in flight:
// none, the database not holding them (the service keeps them in Redis),
// or some, sealed keys in Redis that name no payment.
func (o *reconcileOutput) notes(rec *payments.Reconciliation) {
	if o.keys != nil && o.keys.unseen {
		fmt.Fprintf(o.a.stderr, "idem: %s\n", o.keys.note)
	}
	if rec.SealedInFlight > 0 {
		fmt.Fprintf(o.a.stderr, "idem: %s\n", sealedNote(rec.SealedInFlight))
	}
}

// keysUnseenNote is what reconcile says of a database without the key
// store's tables.
const keysUnseenNote = "cannot see the keys in flight: the database does not hold the idempotency keys, so a payment being finished is reported as a difference; if the service keeps them in Redis, give --keys (and --keys-prefix) as 'idem serve' has them"

// prefixUnseenNote is what reconcile says of a Redis prefix (%q) under
// which no key of the store lives.
const prefixUnseenNote = "cannot see the keys in flight: no idempotency key at all lives under --keys-prefix %q in that Redis, so a payment being finished is reported as a difference; give --keys (its database too) and --keys-prefix as 'idem serve' has them"

func sealedNote(n int) string {
	return fmt.Sprintf("%d key(s) in flight in the key store are sealed (IDEM_KEY_SECRET) and do not say which payment they are: a charge made for one and not yet recorded is reported as a charge without its payment", n)
}

// summary is the --json summary of rec: complete, unless the caller says
// otherwise. keys_seen is false when the keys in flight could not be seen
// (keys_note says why), and keys_sealed counts those that were seen and
// could not be read.
func (o *reconcileOutput) summary(rec *payments.Reconciliation, from time.Time, bound time.Duration) map[string]any {
	s := map[string]any{"type": "summary", "complete": true, "payments": rec.Payments, "charges": rec.Charges, "pending": len(rec.Pending),
		"differences": rec.DifferenceCount, "bound_s": bound.Seconds(), "peak_held": rec.PeakHeld, "keys_seen": true}
	if o.keys != nil {
		s["keys_in"] = o.keys.where
		if o.keys.unseen {
			s["keys_seen"], s["keys_note"] = false, o.keys.note
		}
	}
	if rec.SealedInFlight > 0 {
		s["keys_sealed"] = rec.SealedInFlight
	}
	if rec.CutShort > 0 {
		s["cut_short"] = rec.CutShort
	}
	if !from.IsZero() {
		s["since"] = from.UTC().Format(time.RFC3339Nano)
	}
	return s
}

// incomplete ends a run that failed (err) before its comparison was
// whole, having compared rec until then (nil when it compared nothing):
// it says so, in a --json summary marked incomplete with its error, or a
// line of text, and exits with exitUnreadable. The differences printed
// before are real; they are not all.
func (o *reconcileOutput) incomplete(rec *payments.Reconciliation, from time.Time, bound time.Duration, err error) error {
	if rec == nil {
		rec = &payments.Reconciliation{}
	}
	o.notes(rec)
	if o.json {
		s := o.summary(rec, from, bound)
		s["complete"], s["error"] = false, oneLine(err.Error())
		if werr := json.NewEncoder(o.a.stdout).Encode(s); werr != nil {
			err = errors.Join(err, werr)
		}
	} else if rec.Payments+rec.Charges+rec.DifferenceCount > 0 {
		fmt.Fprintf(o.a.stdout, "INCOMPLETE: stopped after comparing %d payments and %d charges, with %d difference(s) found so far; the rest was not compared\n",
			rec.Payments, rec.Charges, rec.DifferenceCount)
	}
	return o.a.unreadable(err)
}

func orEmpty(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// exitUnreadable is reconcile's status when a side could not be read: no
// comparison was made, which is not a difference in the books.
const exitUnreadable = 3

// unreadable reports err and ends reconcile with exitUnreadable.
func (a *app) unreadable(err error) error {
	fmt.Fprintf(a.stderr, "idem: %s\n", oneLine(err.Error()))
	return &statusError{code: exitUnreadable, err: err}
}

// inFlightLister lists the keys in flight with a recovery point, held or
// not (idemsqlite.Store and idempg.Store).
type inFlightLister interface {
	InFlightAtPoints(ctx context.Context, limit int) ([]idem.Record, error)
}

// inFlightKeys lists the keys in flight for Reconcile, from the database or
// from Redis (--keys).
type inFlightKeys struct {
	// list lists the keys in flight, held or not: with a recovery point
	// (the database's store), or all of them (Redis, which keeps none).
	list func(ctx context.Context) ([]idem.Record, error)
	// close closes the store list opened.
	close func() error
	// where says where the keys were read: "database", or "redis"; and
	// unseen that the database, without --keys, holds none, or that no
	// key at all lives under the Redis prefix; note says which.
	where  string
	unseen bool
	note   string
}

// keysInFlight returns what lists the keys in flight: in rs when it is
// set (--keys), else in db. The database's store is opened when Reconcile
// first asks, after it found the database migrated, so opening it
// migrates nothing, and once: Reconcile asks after every page of the card
// network's charges. A database without the key store's tables (a
// service whose keys live in Redis, --keys) lists none, and says it could
// not see them (unseen): opening the store there would create them
// (SQLite), or fail on the read-only pool (PostgreSQL). In rs, none in
// flight under a prefix (prefix) where no key of the store lives at all
// is not seen either: the prefix, or the database of the --keys URL, is
// not the service's (or no key was claimed there within its TTL), and a
// payment in flight there would go unseen in silence.
func keysInFlight(db *database, rs *idemredis.Store, prefix string) *inFlightKeys {
	// The keys in flight are as many as the requests running at once
	// and those stopped: a bounded number, held whole.
	const page = 10000
	k := &inFlightKeys{where: "database", close: func() error { return nil }}
	all := func(recs []idem.Record, err error) ([]idem.Record, error) {
		if err != nil {
			return nil, err
		}
		if len(recs) == page {
			return nil, fmt.Errorf("more than %d keys in flight", page)
		}
		return recs, nil
	}
	if rs != nil {
		k.where = "redis"
		used := false // a key was seen under the prefix: it is in use
		k.list = func(ctx context.Context) ([]idem.Record, error) {
			recs, err := all(rs.InFlight(ctx, page))
			if err != nil || len(recs) > 0 || used {
				used = used || len(recs) > 0
				k.unseen = k.unseen && !used
				return recs, err
			}
			if used, err = rs.HoldsKeys(ctx); err != nil {
				return nil, err
			}
			k.unseen, k.note = !used, fmt.Sprintf(prefixUnseenNote, prefix)
			return nil, nil
		}
		return k
	}
	var ls inFlightLister
	k.list = func(ctx context.Context) ([]idem.Record, error) {
		if k.unseen {
			return nil, nil
		}
		if ls == nil {
			has, err := hasKeyStore(ctx, db)
			if err != nil {
				return nil, err
			}
			if !has {
				k.unseen, k.note = true, keysUnseenNote
				return nil, nil
			}
			if db.sqlite != nil {
				s, err := idemsqlite.NewStore(ctx, db.sqlite, nil)
				if err != nil {
					return nil, err
				}
				ls = s
			} else {
				s, err := idempg.NewStore(ctx, db.pg)
				if err != nil {
					return nil, err
				}
				k.close = func() error { s.Close(); return nil }
				ls = s
			}
		}
		return all(ls.InFlightAtPoints(ctx, page))
	}
	return k
}

// hasKeyStore reports whether the key store's tables were made in db: its
// component has migrations recorded there.
func hasKeyStore(ctx context.Context, db *database) (bool, error) {
	var n int
	var err error
	if db.sqlite != nil {
		err = db.sqlite.Reader().QueryRowContext(ctx, `SELECT count(*) FROM idem_schema_migrations WHERE component = ?`,
			idemsqlite.StoreComponent).Scan(&n)
	} else {
		err = db.pg.Pool().QueryRow(ctx, `SELECT count(*) FROM idem_schema_migrations WHERE component = $1`,
			idempg.StoreComponent).Scan(&n)
	}
	if err != nil {
		return false, fmt.Errorf("reading whether the database holds the idempotency keys: %w", err)
	}
	return n > 0, nil
}

// parseSince reads --since: an RFC 3339 time, or a duration back from now.
// Empty is the zero time: everything.
func parseSince(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return time.Time{}, fmt.Errorf("--since %q: want an RFC 3339 time (2026-12-01T00:00:00Z) or a duration back from now (24h)", s)
	}
	return now.Add(-d), nil
}
