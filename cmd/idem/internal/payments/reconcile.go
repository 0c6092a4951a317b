package payments

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/acquirer"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/idemsqlite"
)

// The kinds of Difference.
const (
	// DiffChargeWithoutPayment: the network charged a card and no payment
	// records the charge (and it was not refunded in full): money taken
	// that the books do not show, what a crash between the charge and the
	// commit leaves until the payment is retried.
	DiffChargeWithoutPayment = "charge-without-payment"
	// DiffPaymentWithoutCharge: a payment records a charge the network
	// does not have.
	DiffPaymentWithoutCharge = "payment-without-charge"
	// DiffAmount: a payment and its charge disagree on the amount or the
	// currency.
	DiffAmount = "amount"
	// DiffChargedTwice: one logical payment (one tenant's idempotency
	// key) was charged more than once.
	DiffChargedTwice = "charged-twice"
	// DiffChargeShared: two payments record the same charge.
	DiffChargeShared = "charge-shared"
	// DiffUnknownOutcome: a payment in flight at its recovery point for
	// longer than the completer's bound (ReconcileOptions.Bound): its
	// execution stopped after it began charging, and nobody finished it.
	// Whether the card was charged is what the network says (its charge is
	// named when there is one); a person decides (see `idem keys`).
	DiffUnknownOutcome = "unknown-outcome"
)

// DefaultCompletionBound is how long a payment may stay in flight at its
// recovery point before Reconcile calls its outcome unknown. It counts from
// the point, which is earlier than the holder's death the completer's own
// bound counts from (keyed.Completer.Bound: a lease, a round and a resume,
// 20s with the service's defaults), so it adds the rest of the request
// (the live holder's charge and commit) and room to spare.
const DefaultCompletionBound = time.Minute

// ReconcileOptions are Reconcile's options. The zero value (or nil) means
// the defaults.
type ReconcileOptions struct {
	// InFlight lists the service's idempotency keys in flight with a
	// recovery point, whether their holder is alive or not (the records of
	// an idem.Recoverer's store). A payment among them is not yet in the
	// books: it is being finished, or its outcome is unknown past Bound.
	// Defaults to nil: none are listed, and a payment in flight after its
	// charge is a charge without its payment.
	InFlight func(ctx context.Context) ([]idem.Record, error)
	// Bound is how long after its recovery point was saved a payment in
	// flight is still being finished (by its holder, a retry or the
	// completer). Defaults to DefaultCompletionBound.
	Bound time.Duration
	// Clock tells the age of a recovery point. Defaults to
	// idem.SystemClock.
	Clock idem.Clock
	// BodyKeys open the recovery points the service sealed (its
	// idemhttp.Config.BodyKeys). Defaults to none: points kept in clear.
	BodyKeys []idemhttp.BodyKey
}

// Pending is a payment in flight at its recovery point, not yet in the
// books and not a difference while it is within the bound.
type Pending struct {
	Payment   string // the payment's ID, chosen before the charge
	Tenant    string
	KeyDigest string // ClientKeyDigest of the tenant and the client's key
	Amount    int64
	Currency  string
	Point     string        // the recovery point's name
	Age       time.Duration // since the point was saved
	Bound     time.Duration
	Charges   []string // the network's charges for it, when there are
}

func (p Pending) String() string {
	charged := "no charge at the network yet"
	if len(p.Charges) > 0 {
		charged = fmt.Sprintf("charges %v", p.Charges)
	}
	return fmt.Sprintf("payment %s: %d %s (tenant %q, idempotency key digest %q) at %q for %s of its %s bound, %s",
		p.Payment, p.Amount, p.Currency, p.Tenant, p.KeyDigest, p.Point, p.Age.Round(time.Millisecond), p.Bound, charged)
}

// Difference is one disagreement between the service's payments and the
// card network's charges.
type Difference struct {
	Kind    string
	Payment string // the payment's ID, when one is concerned
	Charges []string
	Detail  string
}

func (d Difference) String() string {
	s := d.Kind
	if d.Payment != "" {
		s += " payment " + d.Payment
	}
	if len(d.Charges) > 0 {
		s += fmt.Sprintf(" charges %v", d.Charges)
	}
	return s + ": " + d.Detail
}

// Reconciliation is what Reconcile compared and found.
type Reconciliation struct {
	Since       time.Time
	Payments    int // payments paid at the network since Since
	Charges     int // the network's charges since Since
	Differences []Difference
	// Pending are the payments in flight within the completer's bound:
	// being finished, not differences.
	Pending []Pending
}

// reconcileSlack is how much earlier than Since payments are read: a
// payment is stamped before its charge is made, so one made just before
// Since may be the one that records a charge made just after.
const reconcileSlack = 10 * time.Minute

// Reconcile compares the payments recorded in the service's database (db
// or pg, one of them) that a card network charge paid for, made at or
// after since, with the network's charges made at or after since, and
// returns every difference: a charge that no payment records (unless it
// was refunded in full: a payment refused after its charge gives it
// back), a payment whose charge the network does not have, amounts that
// differ, one logical payment (a tenant's idempotency key, as the charge's
// metadata names it) charged twice, and one charge recorded by two
// payments.
//
// It may run while the service takes payments: nothing made between its
// reads is a difference. The payments are read first, then the network's
// charges, then the payments again. A payment is committed only after its
// charge is made, so every payment of the first read has its charge among
// the charges read after it; and a charge whose payment committed while
// the charges were read is found in the second read. A payment made after
// the first read is compared only through its charge, so it cannot be
// "without its charge".
//
// It only reads: it never migrates the database, and one whose schema is
// not (or not fully) there gets an error that says to migrate it. The
// network is asked only for the charges made since since (less a slack
// for the two clocks), not its whole history.
//
// A payment in flight at its recovery point (opts.InFlight) is not in the
// books yet: within opts.Bound it is Pending, and its charge no
// difference; past the bound it is a DiffUnknownOutcome. The keys in
// flight are read after the charges and before the second read of the
// payments, so a charge is either a committed payment's (found by that
// read) or an execution's still in flight (listed).
func Reconcile(ctx context.Context, db *idemsqlite.DB, pg *idempg.DB, net *acquirer.Client, since time.Time, opts *ReconcileOptions) (*Reconciliation, error) {
	var o ReconcileOptions
	if opts != nil {
		o = *opts
	}
	if o.Bound < 0 {
		return nil, fmt.Errorf("%w: ReconcileOptions.Bound must not be negative, got %s", ErrConfig, o.Bound)
	}
	o.Bound = cmp.Or(o.Bound, DefaultCompletionBound)
	if o.Clock == nil {
		o.Clock = idem.SystemClock{}
	}
	var store interface {
		ChargedPayments(ctx context.Context, since time.Time) ([]Payment, error)
	}
	switch {
	case (db == nil) == (pg == nil):
		return nil, errors.New("payments: reconcile needs one database")
	case db != nil:
		if err := checkMigratedSQLite(ctx, db); err != nil {
			return nil, err
		}
		s, err := newSQLiteStorage(ctx, db)
		if err != nil {
			return nil, fmt.Errorf("payments: %w", err)
		}
		// Reconciling reads no description: sealed ones are left shut.
		s.text = textSealer{skip: true}
		store = s
	default:
		if err := checkMigratedPostgres(ctx, pg); err != nil {
			return nil, err
		}
		s := newPGStorage(pg)
		s.text = textSealer{skip: true}
		store = s
	}
	from := since
	if !from.IsZero() {
		from = from.Add(-reconcileSlack)
	}
	before, err := store.ChargedPayments(ctx, from)
	if err != nil {
		return nil, err
	}
	charges, err := net.ChargesSince(ctx, from)
	if err != nil {
		return nil, fmt.Errorf("payments: reading the network's charges: %w", err)
	}
	var inFlight []idem.Record
	if o.InFlight != nil {
		if inFlight, err = o.InFlight(ctx); err != nil {
			return nil, fmt.Errorf("payments: listing the keys in flight: %w", err)
		}
	}
	after, err := store.ChargedPayments(ctx, from)
	if err != nil {
		return nil, err
	}
	points, err := inFlightPayments(inFlight, after, o.BodyKeys, o.Clock.Now())
	if err != nil {
		return nil, err
	}
	return compareBooks(since, before, after, charges, points, o.Bound), nil
}

// inFlightPayment is a payment an execution in flight began charging.
type inFlightPayment struct {
	pt    chargingPoint
	point string
	age   time.Duration
}

// inFlightPayments returns the payments of the keys in flight at their
// "charging" point that no payment of after records: those committed
// since the keys were listed are in the books already.
func inFlightPayments(recs []idem.Record, after []Payment, keys []idemhttp.BodyKey, now time.Time) ([]inFlightPayment, error) {
	committed := make(map[string]bool, len(after))
	for _, p := range after {
		committed[p.ID] = true
	}
	var out []inFlightPayment
	for _, r := range recs {
		if r.State != idem.StateInFlight || !isChargingPoint(r.Recovery.Name) {
			continue
		}
		data, err := idemhttp.OpenPoint(keys, r.Scope, r.Key, r.Recovery.Name, r.Recovery.Data)
		if err != nil {
			return nil, fmt.Errorf("payments: the recovery point of a key in flight of tenant %q: %w (give the service's body keys)", r.Scope, err)
		}
		pt, err := decodeCharging(data)
		if err != nil {
			return nil, fmt.Errorf("payments: the recovery point of a key in flight of tenant %q: %w", r.Scope, err)
		}
		if committed[pt.Payment.ID] {
			continue
		}
		out = append(out, inFlightPayment{pt: pt, point: r.Recovery.Name, age: max(0, now.Sub(r.Recovery.SavedAt))})
	}
	return out, nil
}

// errNotMigrated is what Reconcile says of a database without the
// service's schema: an audit never creates it.
func errNotMigrated(missing []int64) error {
	return fmt.Errorf("payments: the database is not migrated (the payments schema lacks migrations %v); reconcile only reads: run 'idem migrate' on it first, or point --db at the service's database", missing)
}

// migrationVersions returns the versions of the migrations in dir of fsys:
// the numbers their file names begin with.
func migrationVersions(fsys fs.FS, dir string) ([]int64, error) {
	entries, err := fs.ReadDir(fsys, dir)
	if err != nil {
		return nil, err
	}
	var vs []int64
	for _, e := range entries {
		n, _, ok := strings.Cut(e.Name(), "_")
		if !ok || !strings.HasSuffix(e.Name(), ".sql") {
			continue
		}
		v, err := strconv.ParseInt(n, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("migration %s: %w", e.Name(), err)
		}
		vs = append(vs, v)
	}
	return vs, nil
}

// missingVersions returns the versions of want not in applied.
func missingVersions(want []int64, applied map[int64]bool) []int64 {
	var missing []int64
	for _, v := range want {
		if !applied[v] {
			missing = append(missing, v)
		}
	}
	return missing
}

// checkMigratedSQLite reports, through the read-only pool, whether every
// payments migration is applied to db.
func checkMigratedSQLite(ctx context.Context, db *idemsqlite.DB) error {
	want, err := migrationVersions(migrationFiles, "migrations")
	if err != nil {
		return err
	}
	var exists int
	if err := db.Reader().QueryRowContext(ctx,
		`SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'idem_schema_migrations'`).Scan(&exists); err != nil {
		return fmt.Errorf("payments: reading the database's schema: %w", err)
	}
	if exists == 0 {
		return errNotMigrated(want)
	}
	rows, err := db.Reader().QueryContext(ctx, `SELECT version FROM idem_schema_migrations WHERE component = ?`, migrationComponent)
	if err != nil {
		return fmt.Errorf("payments: reading the database's migrations: %w", err)
	}
	defer rows.Close()
	applied := map[int64]bool{}
	for rows.Next() {
		var v int64
		if err := rows.Scan(&v); err != nil {
			return fmt.Errorf("payments: reading the database's migrations: %w", err)
		}
		applied[v] = true
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("payments: reading the database's migrations: %w", err)
	}
	if missing := missingVersions(want, applied); len(missing) > 0 {
		return errNotMigrated(missing)
	}
	return nil
}

// checkMigratedPostgres is checkMigratedSQLite for PostgreSQL.
func checkMigratedPostgres(ctx context.Context, db *idempg.DB) error {
	want, err := migrationVersions(pgMigrationFiles, "pgmigrations")
	if err != nil {
		return err
	}
	var exists bool
	if err := db.Pool().QueryRow(ctx, `SELECT to_regclass('idem_schema_migrations') IS NOT NULL`).Scan(&exists); err != nil {
		return fmt.Errorf("payments: reading the database's schema: %w", err)
	}
	if !exists {
		return errNotMigrated(want)
	}
	rows, err := db.Pool().Query(ctx, `SELECT version FROM idem_schema_migrations WHERE component = $1`, migrationComponent)
	if err != nil {
		return fmt.Errorf("payments: reading the database's migrations: %w", err)
	}
	defer rows.Close()
	applied := map[int64]bool{}
	for rows.Next() {
		var v int64
		if err := rows.Scan(&v); err != nil {
			return fmt.Errorf("payments: reading the database's migrations: %w", err)
		}
		applied[v] = true
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("payments: reading the database's migrations: %w", err)
	}
	if missing := missingVersions(want, applied); len(missing) > 0 {
		return errNotMigrated(missing)
	}
	return nil
}

// compareBooks finds the differences Reconcile reports: before are the
// payments read before the charges, after those read after them. A
// payment's side is checked with before (its charge was made before it
// was read), a charge's with after (its payment, if committed by then,
// was read).
func compareBooks(since time.Time, before, after []Payment, charges []acquirer.Charge, inFlight []inFlightPayment, bound time.Duration) *Reconciliation {
	rec := &Reconciliation{Since: since}
	byID := make(map[string]acquirer.Charge, len(charges))
	for _, c := range charges {
		byID[c.ID] = c
	}
	// The logical payments in flight, by (tenant, key digest): their
	// charges are not in the books yet, and are reported with them.
	flying := make(map[[2]string]*Pending, len(inFlight))
	var pendings []*Pending
	for _, f := range inFlight {
		p := &Pending{Payment: f.pt.Payment.ID, Tenant: f.pt.Tenant, Amount: f.pt.Payment.Amount, Currency: f.pt.Payment.Currency,
			Point: f.point, Age: f.age, Bound: bound}
		if f.pt.ClientKey != "" {
			p.KeyDigest = ClientKeyDigest(f.pt.Tenant, f.pt.ClientKey)
			flying[[2]string{f.pt.Tenant, p.KeyDigest}] = p
		}
		pendings = append(pendings, p)
	}
	for _, c := range charges {
		if len(flying) == 0 {
			break
		}
		if p := flying[[2]string{c.Metadata["tenant"], chargeKeyDigest(c)}]; p != nil {
			p.Charges = append(p.Charges, c.ID)
		}
	}
	recorded := make(map[string][]string) // charge ID → payment IDs
	for _, p := range after {
		recorded[p.ChargeID] = append(recorded[p.ChargeID], p.ID)
	}
	for _, p := range before {
		if p.CreatedAt.Before(since) {
			continue // read only to find the charges it records
		}
		rec.Payments++
		c, ok := byID[p.ChargeID]
		switch {
		case !ok:
			rec.Differences = append(rec.Differences, Difference{Kind: DiffPaymentWithoutCharge, Payment: p.ID,
				Charges: []string{p.ChargeID}, Detail: "the network has no such charge"})
		case c.Amount != p.Amount || c.Currency != p.Currency:
			rec.Differences = append(rec.Differences, Difference{Kind: DiffAmount, Payment: p.ID, Charges: []string{c.ID},
				Detail: fmt.Sprintf("the payment is %d %s, the charge %d %s", p.Amount, p.Currency, c.Amount, c.Currency)})
		}
	}
	logical := make(map[[2]string][]string) // (tenant, idempotency key) → charge IDs
	for _, c := range charges {
		if c.CreatedAt.Before(since) {
			continue
		}
		rec.Charges++
		ps := recorded[c.ID]
		switch {
		case len(ps) == 0 && flying[[2]string{c.Metadata["tenant"], chargeKeyDigest(c)}] != nil:
			// In flight: reported below, as pending or an unknown outcome.
		case len(ps) == 0 && c.AmountRefunded < c.Amount:
			rec.Differences = append(rec.Differences, Difference{Kind: DiffChargeWithoutPayment, Charges: []string{c.ID},
				Detail: fmt.Sprintf("%d %s charged to %s (tenant %q, idempotency key digest %q), %d refunded, and no payment records it",
					c.Amount, c.Currency, c.Reference, c.Metadata["tenant"], chargeKeyDigest(c), c.AmountRefunded)})
		case len(ps) > 1:
			rec.Differences = append(rec.Differences, Difference{Kind: DiffChargeShared, Charges: []string{c.ID},
				Detail: fmt.Sprintf("payments %v all record this one charge", ps)})
		}
		if k := chargeKeyDigest(c); k != "" && c.AmountRefunded < c.Amount {
			t := [2]string{c.Metadata["tenant"], k}
			logical[t] = append(logical[t], c.ID)
		}
	}
	keys := make([][2]string, 0, len(logical))
	for k, ids := range logical {
		if len(ids) > 1 {
			keys = append(keys, k)
		}
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i][0]+"\x00"+keys[i][1] < keys[j][0]+"\x00"+keys[j][1] })
	for _, k := range keys {
		rec.Differences = append(rec.Differences, Difference{Kind: DiffChargedTwice, Charges: logical[k],
			Detail: fmt.Sprintf("tenant %q's payment under idempotency key digest %q was charged %d times", k[0], k[1], len(logical[k]))})
	}
	for _, p := range pendings {
		if p.Age <= bound {
			rec.Pending = append(rec.Pending, *p)
			continue
		}
		charged := "the network has no charge for it"
		if len(p.Charges) > 0 {
			charged = "the network charged it"
		}
		rec.Differences = append(rec.Differences, Difference{Kind: DiffUnknownOutcome, Payment: p.Payment, Charges: p.Charges,
			Detail: fmt.Sprintf("%d %s (tenant %q, idempotency key digest %q) in flight at %q for %s, past the completer's %s bound, and not in the books; %s",
				p.Amount, p.Currency, p.Tenant, p.KeyDigest, p.Point, p.Age.Round(time.Millisecond), p.Bound, charged)})
	}
	return rec
}

// chargeKeyDigest is the digest of the client's key a charge's metadata
// names (MetaKeyDigest): a charge made by an earlier version, which sent
// the key itself, is digested here, so that no client key is printed.
func chargeKeyDigest(c acquirer.Charge) string {
	if d := c.Metadata[MetaKeyDigest]; d != "" {
		return d
	}
	if k := c.Metadata["idempotency_key"]; k != "" {
		return ClientKeyDigest(c.Metadata["tenant"], k)
	}
	return ""
}
