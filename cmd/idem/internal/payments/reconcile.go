package payments

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"slices"
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
	//
	// A store that keeps no recovery points (idemredis: the service's two
	// stores, Config.Keys) lists its keys in flight without one: such a
	// key names its logical payment (its scope is the tenant, its key the
	// client's), whose charge, made and not yet recorded, is Pending, or
	// past Bound an unknown outcome, as a point's would be; its age counts
	// from the key's claim. A key sealed by Config.KeySecret names none
	// that Reconcile can read (Reconciliation.SealedInFlight counts them).
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
	// Window bounds what Reconcile holds at once, whatever the length of
	// the history: a page of this many of the network's charges, as many
	// payments read ahead, as many waiting for their charge, and as many
	// logical payments whose charges are counted (see Reconcile). A
	// larger one asks the network for fewer charges alone. Defaults to
	// DefaultReconcileWindow.
	Window int
	// KeyHorizon is how long after a logical payment's first charge
	// another charge of it is a DiffChargedTwice. Defaults to
	// DefaultKeyHorizon.
	KeyHorizon time.Duration
	// OnDifference, when set, is handed each difference as it is found,
	// and Reconciliation.Differences stays empty: a run that finds
	// millions holds none of them. An error it returns stops Reconcile,
	// which returns it. Defaults to nil: the differences are collected in
	// Reconciliation.Differences.
	OnDifference func(Difference) error
}

// Pending is a payment in flight at its recovery point, not yet in the
// books and not a difference while it is within the bound.
type Pending struct {
	// Payment is the payment's ID, chosen before the charge; empty when
	// the key store keeps no recovery point to read it from (keys in
	// Redis), and Charges name the charge made for it.
	Payment   string
	Tenant    string
	KeyDigest string // ClientKeyDigest of the tenant and the client's key
	Amount    int64
	Currency  string
	Point     string        // the recovery point's name; empty when the key store keeps none
	Age       time.Duration // since the point was saved, or the key claimed when there is none
	Bound     time.Duration
	Charges   []string // the network's charges for it, when there are
}

func (p Pending) String() string {
	charged := "no charge at the network yet"
	if len(p.Charges) > 0 {
		charged = fmt.Sprintf("charges %v", p.Charges)
	}
	if p.Point == "" {
		return fmt.Sprintf("payment not recorded yet: %d %s (tenant %q, idempotency key digest %q) with its key in flight for %s of its %s bound, %s",
			p.Amount, p.Currency, p.Tenant, p.KeyDigest, p.Age.Round(time.Millisecond), p.Bound, charged)
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
	// DifferenceCount counts the differences found, whether they are in
	// Differences or were handed to ReconcileOptions.OnDifference.
	DifferenceCount int
	// PeakHeld is the most charges, payments and logical payments
	// Reconcile held at once: bounded by the options' Window, not by the
	// length of the history.
	PeakHeld int
	// CutShort counts the logical payments let go before their
	// KeyHorizon ended because a window of them was held: a charge of one
	// of them made later is not compared with the earlier ones.
	CutShort int
	// SealedInFlight counts the keys in flight without a recovery point
	// (keys in Redis) whose key is sealed (Config.KeySecret), at the last
	// listing: the logical payment of each cannot be read, so a charge
	// made for one and not yet recorded is a DiffChargeWithoutPayment.
	SealedInFlight int
}

// reconcileSlack is how much earlier than Since the network's charges are
// read, and how long after a payment's creation its charge is looked for
// in their stream before it is asked for alone: a payment is stamped
// before its charge is made, by another clock than the network's, so the
// charge one made just before Since records may be made just after it,
// and one made at a time may carry the network's a little earlier.
const reconcileSlack = 10 * time.Minute

// DefaultReconcileWindow is how many of each thing Reconcile holds at once
// by default (ReconcileOptions.Window): a few megabytes, and the logical
// payments of a day of a modest service, so that their double charges are
// compared over the whole KeyHorizon.
const DefaultReconcileWindow = 10000

// DefaultKeyHorizon is how long after a logical payment's first charge
// Reconcile counts another charge of it as a second, by default: the
// service's own key TTL (DefaultKeyTTL), past which the client's key names
// a new payment.
const DefaultKeyHorizon = DefaultKeyTTL

// Reconcile compares the payments recorded in the service's database (db
// or pg, one of them) that a card network charge paid for, made at or
// after since, with the network's charges made at or after since, and
// reports every difference: a charge that no payment records (unless it
// was refunded in full: a payment refused after its charge gives it
// back), a payment whose charge the network does not have, amounts that
// differ, one logical payment (a tenant's idempotency key, as the charge's
// metadata names it) charged twice, and one charge recorded by two
// payments.
//
// # Bounded memory
//
// However long the history, Reconcile holds a bounded number of things:
// the network's charges are read a page of opts.Window at a time (at most
// the network's largest page, acquirer.MaxListLimit; made since since, less
// opts.KeyHorizon and a slack for the two clocks: the network filters
// them),
// the payments in pages of opts.Window in the order they were made, and
// each side is checked against the other as the two streams pass, in
// creation time, which both sides share. It holds at once one page of
// charges, at most Window payments read ahead of them, at most Window
// payments waiting for their charge in the stream, and at most Window
// logical payments whose charges it counts (Reconciliation.PeakHeld says
// how many it held). The streams are merged, not windowed: nothing is
// cut at a window's edge, and what the merge cannot match while it holds
// it is looked up alone, by its key, on the other side: a payment whose
// charge did not come within the slack of its creation (a charge made
// late by the completer, a clock far off, a full window) is asked of the
// network by its charge ID, and every charge of a page has its payments
// read by charge ID. So the report is the whole history's, whatever the
// window, with one bound: two charges of one logical payment are counted
// as a double charge when they were made within opts.KeyHorizon of its
// first (the service's key TTL by default: past it, the client's key names
// a new payment), and only while Window logical payments are enough to
// hold that horizon's (Reconciliation.CutShort counts those let go
// earlier). With since, the charges made within opts.KeyHorizon before it
// are read too, and compared with nothing but the later charges of their
// logical payment: a logical payment charged once before since and again
// after it is a double charge, as the whole history's run finds it;
// one charged twice before since only is outside the comparison. (One
// charged more than the horizon before since, then twice within it, may
// pair differently than in the whole history's run, which counts from its
// first charge.) With opts.OnDifference set, each difference is handed to it as
// found and none is held, so millions of them cost no memory.
//
// # A live service
//
// It may run while the service takes payments: nothing made between its
// reads is a difference. A payment is committed only after its charge is
// made, so a payment is called "without its charge" only when the network
// has no such charge when asked after the payment was read: a payment
// made while Reconcile runs is never one. Each page of charges is read,
// then the keys in flight are listed, then the payments of the page's
// charges are read: a charge is either a payment's committed by then
// (found), or an execution's still in flight (listed). The payments
// compared are those inserted before Reconcile began; the charges are the
// network's until its list ends.
//
// A payment in flight at its recovery point (opts.InFlight) is not in the
// books yet: within opts.Bound it is Pending, and its charge no
// difference; past the bound it is a DiffUnknownOutcome. Its charges are
// those of its logical payment the network listed while it was in flight.
//
// It only reads: it never migrates the database, and one whose schema is
// not (or not fully) there gets an error that says to migrate it.
//
// On an error once the comparison began (a side that stopped answering),
// it returns what it compared and found until then with the error: an
// incomplete Reconciliation, whose differences are real but not all of
// them. On an error before (bad options, a database not migrated) the
// Reconciliation is nil.
func Reconcile(ctx context.Context, db *idemsqlite.DB, pg *idempg.DB, net *acquirer.Client, since time.Time, opts *ReconcileOptions) (*Reconciliation, error) {
	var o ReconcileOptions
	if opts != nil {
		o = *opts
	}
	if o.Bound < 0 {
		return nil, fmt.Errorf("%w: ReconcileOptions.Bound must not be negative, got %s", ErrConfig, o.Bound)
	}
	if o.Window < 0 {
		return nil, fmt.Errorf("%w: ReconcileOptions.Window must not be negative, got %d", ErrConfig, o.Window)
	}
	if o.KeyHorizon < 0 {
		return nil, fmt.Errorf("%w: ReconcileOptions.KeyHorizon must not be negative, got %s", ErrConfig, o.KeyHorizon)
	}
	o.Bound = cmp.Or(o.Bound, DefaultCompletionBound)
	o.Window = cmp.Or(o.Window, DefaultReconcileWindow)
	o.KeyHorizon = cmp.Or(o.KeyHorizon, DefaultKeyHorizon)
	if o.Clock == nil {
		o.Clock = idem.SystemClock{}
	}
	var store *sqlStorage
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
		store = &s.sqlStorage
	default:
		if err := checkMigratedPostgres(ctx, pg); err != nil {
			return nil, err
		}
		store = &newPGStorage(pg).sqlStorage
	}
	// Reconciling reads no description: sealed ones are left shut.
	store.text = textSealer{skip: true}
	r := &reconciler{o: o, since: since, store: store, net: net, rec: &Reconciliation{Since: since},
		waiting: map[string]*waiter{}, logical: map[[2]string]*logicalPayment{}, pendCharges: map[string][]string{},
		bare: map[string][]acquirer.Charge{}}
	if err := r.run(ctx); err != nil {
		// What was compared until then, for a report that says it is
		// incomplete.
		return r.rec, err
	}
	return r.rec, nil
}

// reconciler is one run of Reconcile: the two streams and what it holds
// of them.
type reconciler struct {
	o     ReconcileOptions
	since time.Time
	store *sqlStorage
	net   *acquirer.Client
	rec   *Reconciliation

	// The payments' side: next are read and not yet waiting; after is
	// the key of the last read; until is the place of the last payment
	// inserted when the run began, the last to read; read says there are
	// no more.
	next  []Payment
	after paymentKey
	until int64
	read  bool
	// waiting are the payments whose charge has not passed in the stream
	// yet, by charge ID, and queue them in the order they were read, from
	// head on.
	waiting map[string]*waiter
	queue   []*waiter
	head    int

	// The charges' side: logical are the logical payments whose charges
	// are counted, and order them by their first charge, from lhead on.
	logical map[[2]string]*logicalPayment
	lorder  [][2]string
	lhead   int
	// flying are the logical payments in flight at the last listing, by
	// (tenant, key digest), with their handle (inFlightPayment.handle);
	// pendCharges are the charges of each such payment seen while it was
	// in flight, by handle, and bare those of the keys in flight without
	// a point, whose amounts only their charges tell.
	flying      map[[2]string]string
	pendCharges map[string][]string
	bare        map[string][]acquirer.Charge
	page        int // charges of the page in hand
	// err is the first error OnDifference returned: it stops the run.
	err error
}

// waiter is a payment waiting for its charge in the stream.
type waiter struct {
	p    Payment
	done bool
}

// logicalPayment is one logical payment's charges within the horizon.
// since says one of them was made at or after Reconcile's since: the
// others were read only to be paired with it.
type logicalPayment struct {
	first   time.Time
	charges []string
	since   bool
}

func (r *reconciler) run(ctx context.Context) error {
	var err error
	if r.until, err = r.store.lastPayment(ctx); err != nil {
		return err
	}
	r.read = r.until == 0
	r.after = paymentKey{at: r.since}
	from := r.since
	if !from.IsZero() {
		// Back to the horizon: the earlier charges of the logical
		// payments charged since, which a double charge may pair.
		from = from.Add(-r.o.KeyHorizon - reconcileSlack)
	}
	err = r.net.EachChargePage(ctx, from, r.o.Window, func(page []acquirer.Charge) error {
		r.page = len(page)
		defer func() { r.page = 0 }()
		return r.charges(ctx, page)
	})
	if err != nil {
		var e *acquirer.Error
		if errors.As(err, &e) || errors.Is(err, acquirer.ErrUnavailable) {
			return fmt.Errorf("payments: reading the network's charges: %w", err)
		}
		return err
	}
	// The payments left: their charges did not pass in the stream.
	for {
		if err := r.evict(ctx, time.Time{}); err != nil {
			return err
		}
		if r.read && len(r.next) == 0 {
			break
		}
		if err := r.fill(ctx, time.Time{}); err != nil {
			return err
		}
	}
	for r.lhead < len(r.lorder) {
		r.letGo()
	}
	points, err := r.inFlight(ctx)
	if err != nil {
		return err
	}
	return r.pending(ctx, points)
}

// charges takes one page of the network's charges: the payments made up
// to the page's end (and the slack) are read, those whose charge is in it
// are checked, those whose charge should have been are asked for alone,
// and each charge is checked against the payments that record it.
func (r *reconciler) charges(ctx context.Context, page []acquirer.Charge) error {
	if !r.since.IsZero() {
		// The charges made before since and its slack are read only for
		// the earlier charges of the logical payments charged since.
		rest := make([]acquirer.Charge, 0, len(page))
		for _, c := range page {
			if c.CreatedAt.Before(r.since.Add(-reconcileSlack)) {
				r.countCharge(c)
				continue
			}
			rest = append(rest, c)
		}
		if len(rest) == 0 {
			r.held()
			return r.err
		}
		page = rest
	}
	var end time.Time
	for _, c := range page {
		if c.CreatedAt.After(end) {
			end = c.CreatedAt
		}
	}
	if err := r.fill(ctx, end.Add(reconcileSlack)); err != nil {
		return err
	}
	for _, c := range page {
		if w := r.waiting[c.ID]; w != nil {
			delete(r.waiting, c.ID)
			w.done = true
			r.checkPayment(w.p, c, true)
		}
	}
	if err := r.evict(ctx, page[0].CreatedAt); err != nil {
		return err
	}
	// Listed after the page was read, before its payments are: a charge
	// of the page is a committed payment's or an execution's in flight.
	points, err := r.inFlight(ctx)
	if err != nil {
		return err
	}
	r.flying = make(map[[2]string]string, len(points))
	flyingIDs := make(map[string]bool, len(points))
	for _, f := range points {
		if f.pt.ClientKey != "" {
			r.flying[[2]string{f.pt.Tenant, ClientKeyDigest(f.pt.Tenant, f.pt.ClientKey)}] = f.handle()
			flyingIDs[f.handle()] = true
		}
	}
	// Only the payments in flight keep the charges seen for them; the
	// charges of a key without a point that left flight are checked again.
	if err := r.landed(ctx, flyingIDs); err != nil {
		return err
	}
	maps.DeleteFunc(r.pendCharges, func(id string, _ []string) bool { return !flyingIDs[id] })
	ids := make([]string, 0, len(page))
	for _, c := range page {
		if !c.CreatedAt.Before(r.since) {
			ids = append(ids, c.ID)
		}
	}
	recorders, err := r.store.recordersOf(ctx, ids)
	if err != nil {
		return err
	}
	for _, c := range page {
		k := [2]string{c.Metadata["tenant"], chargeKeyDigest(c)}
		id, inFlight := r.flying[k]
		if inFlight {
			r.pendCharges[id] = append(r.pendCharges[id], c.ID)
			if isBare(id) && !c.CreatedAt.Before(r.since) && len(recorders[c.ID]) == 0 && c.AmountRefunded < c.Amount {
				r.bare[id] = append(r.bare[id], c)
			}
		}
		if c.CreatedAt.Before(r.since) {
			r.countCharge(c)
			continue
		}
		r.rec.Charges++
		ps := recorders[c.ID]
		switch {
		case len(ps) == 0 && inFlight:
			// In flight: reported at the end, as pending or an unknown
			// outcome.
		case len(ps) == 0 && c.AmountRefunded < c.Amount:
			r.emit(Difference{Kind: DiffChargeWithoutPayment, Charges: []string{c.ID},
				Detail: fmt.Sprintf("%d %s charged to %s (tenant %q, idempotency key digest %q), %d refunded, and no payment records it",
					c.Amount, c.Currency, c.Reference, c.Metadata["tenant"], chargeKeyDigest(c), c.AmountRefunded)})
		case len(ps) > 1:
			r.emit(Difference{Kind: DiffChargeShared, Charges: []string{c.ID},
				Detail: fmt.Sprintf("payments %v all record this one charge", ps)})
		}
		r.countCharge(c)
	}
	r.held()
	return r.err
}

// countCharge counts c among its logical payment's charges, unless it
// names none or was refunded in full.
func (r *reconciler) countCharge(c acquirer.Charge) {
	if k := [2]string{c.Metadata["tenant"], chargeKeyDigest(c)}; k[1] != "" && c.AmountRefunded < c.Amount {
		r.count(k, c)
	}
}

// fill reads payments into the waiting ones, those made up to upTo (all
// of them when it is zero), while fewer than a window wait.
func (r *reconciler) fill(ctx context.Context, upTo time.Time) error {
	for len(r.queue)-r.head < r.o.Window {
		if len(r.next) == 0 {
			if r.read {
				return nil
			}
			page, err := r.store.chargedPage(ctx, r.after, r.until, r.o.Window)
			if err != nil {
				return err
			}
			if len(page) < r.o.Window {
				r.read = true
			}
			if len(page) == 0 {
				return nil
			}
			last := page[len(page)-1]
			r.after = paymentKey{at: last.CreatedAt, id: last.ID}
			r.next = page
			r.held()
		}
		p := r.next[0]
		if !upTo.IsZero() && p.CreatedAt.After(upTo) {
			return nil
		}
		r.next[0] = Payment{}
		r.next = r.next[1:]
		if p.CreatedAt.Before(r.since) {
			continue
		}
		r.rec.Payments++
		w := &waiter{p: p}
		if r.waiting[p.ChargeID] != nil {
			// Two payments of one charge: the second is checked alone
			// (the charge's side names them both).
			if err := r.lookUp(ctx, w); err != nil {
				return err
			}
			continue
		}
		r.waiting[p.ChargeID] = w
		r.queue = append(r.queue, w)
	}
	return nil
}

// evict lets go of the payments at the head of the queue that are matched,
// and asks the network alone for the charge of those made more than the
// slack before from (every one when from is zero): their charge did not
// pass in the stream where it should have.
func (r *reconciler) evict(ctx context.Context, from time.Time) error {
	for r.head < len(r.queue) {
		w := r.queue[r.head]
		if !w.done && !from.IsZero() && !w.p.CreatedAt.Add(reconcileSlack).Before(from) {
			break
		}
		r.queue[r.head] = nil
		r.head++
		if w.done {
			continue
		}
		delete(r.waiting, w.p.ChargeID)
		if err := r.lookUp(ctx, w); err != nil {
			return err
		}
	}
	if r.head > len(r.queue)/2 {
		r.queue = append(r.queue[:0], r.queue[r.head:]...)
		clear(r.queue[len(r.queue):cap(r.queue)])
		r.head = 0
	}
	return nil
}

// lookUp checks w's payment against its charge, asked of the network
// alone: the payment was read before, so its charge was made before.
func (r *reconciler) lookUp(ctx context.Context, w *waiter) error {
	c, ok, err := r.net.ChargeByID(ctx, w.p.ChargeID)
	if err != nil {
		return fmt.Errorf("payments: reading the network's charge %s: %w", w.p.ChargeID, err)
	}
	w.done = true
	r.checkPayment(w.p, c, ok)
	return r.err
}

// checkPayment checks a payment against its charge c (found says the
// network has it).
func (r *reconciler) checkPayment(p Payment, c acquirer.Charge, found bool) {
	switch {
	case !found:
		r.emit(Difference{Kind: DiffPaymentWithoutCharge, Payment: p.ID,
			Charges: []string{p.ChargeID}, Detail: "the network has no such charge"})
	case c.Amount != p.Amount || c.Currency != p.Currency:
		r.emit(Difference{Kind: DiffAmount, Payment: p.ID, Charges: []string{c.ID},
			Detail: fmt.Sprintf("the payment is %d %s, the charge %d %s", p.Amount, p.Currency, c.Amount, c.Currency)})
	}
}

// count counts charge c of logical payment k, and lets go of the logical
// payments whose horizon ended before c was made, or the oldest when a
// window of them is held.
func (r *reconciler) count(k [2]string, c acquirer.Charge) {
	for r.lhead < len(r.lorder) {
		old := r.logical[r.lorder[r.lhead]]
		if !old.first.Add(r.o.KeyHorizon).Before(c.CreatedAt) {
			break
		}
		r.letGo()
	}
	inWindow := !c.CreatedAt.Before(r.since)
	if l := r.logical[k]; l != nil {
		l.charges = append(l.charges, c.ID)
		l.since = l.since || inWindow
		return
	}
	if len(r.logical) >= r.o.Window {
		r.rec.CutShort++
		r.letGo()
	}
	r.logical[k] = &logicalPayment{first: c.CreatedAt, charges: []string{c.ID}, since: inWindow}
	r.lorder = append(r.lorder, k)
}

// letGo lets go of the oldest logical payment held, reporting it when it
// was charged more than once.
func (r *reconciler) letGo() {
	k := r.lorder[r.lhead]
	r.lorder[r.lhead] = [2]string{}
	r.lhead++
	if r.lhead > len(r.lorder)/2 {
		r.lorder = append(r.lorder[:0], r.lorder[r.lhead:]...)
		r.lhead = 0
	}
	l := r.logical[k]
	delete(r.logical, k)
	if len(l.charges) > 1 && l.since {
		r.emit(Difference{Kind: DiffChargedTwice, Charges: l.charges,
			Detail: fmt.Sprintf("tenant %q's payment under idempotency key digest %q was charged %d times", k[0], k[1], len(l.charges))})
	}
}

// emit reports d: to OnDifference, or in the Reconciliation.
func (r *reconciler) emit(d Difference) {
	if r.err != nil {
		return
	}
	r.rec.DifferenceCount++
	if r.o.OnDifference != nil {
		r.err = r.o.OnDifference(d)
		return
	}
	r.rec.Differences = append(r.rec.Differences, d)
}

// held notes how many charges, payments and logical payments are held.
func (r *reconciler) held() {
	n := r.page + len(r.next) + len(r.queue) - r.head + len(r.logical)
	r.rec.PeakHeld = max(r.rec.PeakHeld, n)
}

// inFlight lists the payments in flight at their recovery point that are
// not committed: those committed since the keys were listed are in the
// books already.
func (r *reconciler) inFlight(ctx context.Context) ([]inFlightPayment, error) {
	if r.o.InFlight == nil {
		return nil, nil
	}
	recs, err := r.o.InFlight(ctx)
	if err != nil {
		return nil, fmt.Errorf("payments: listing the keys in flight: %w", err)
	}
	points, sealed, err := inFlightPayments(recs, r.o.BodyKeys, r.o.Clock.Now())
	r.rec.SealedInFlight = sealed
	if err != nil || len(points) == 0 {
		return nil, err
	}
	ids := make([]string, 0, len(points))
	for _, f := range points {
		if !f.bare {
			ids = append(ids, f.pt.Payment.ID)
		}
	}
	committed, err := r.store.committedOf(ctx, ids)
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(points, func(f inFlightPayment) bool { return !f.bare && committed[f.pt.Payment.ID] }), nil
}

// pending reports the payments in flight: within the bound as Pending,
// past it as unknown outcomes.
func (r *reconciler) pending(ctx context.Context, points []inFlightPayment) error {
	flying := make(map[string]bool, len(points))
	for _, f := range points {
		flying[f.handle()] = true
	}
	if err := r.landed(ctx, flying); err != nil {
		return err
	}
	for _, f := range points {
		p := Pending{Payment: f.pt.Payment.ID, Tenant: f.pt.Tenant, Amount: f.pt.Payment.Amount, Currency: f.pt.Payment.Currency,
			Point: f.point, Age: f.age, Bound: r.o.Bound}
		if f.pt.ClientKey != "" {
			p.KeyDigest = ClientKeyDigest(f.pt.Tenant, f.pt.ClientKey)
			p.Charges = r.pendCharges[f.handle()]
		}
		if f.bare {
			// A key in flight without a point is a payment only once
			// its charge is made and not recorded: the others are
			// requests of every kind, running.
			charges, err := r.unrecorded(ctx, r.bare[f.handle()])
			if err != nil {
				return err
			}
			if len(charges) == 0 {
				continue
			}
			p.Amount, p.Currency, p.Charges = charges[0].Amount, charges[0].Currency, chargeIDs(charges)
		}
		if p.Age <= r.o.Bound {
			r.rec.Pending = append(r.rec.Pending, p)
			continue
		}
		charged := "the network has no charge for it"
		if len(p.Charges) > 0 {
			charged = "the network charged it"
		}
		at, who := fmt.Sprintf("at %q", p.Point), "the completer's"
		if p.Point == "" {
			// No completer finishes it: only the client's retry.
			at, who = "with its key (no recovery point: the key store keeps none)", "the"
		}
		r.emit(Difference{Kind: DiffUnknownOutcome, Payment: p.Payment, Charges: p.Charges,
			Detail: fmt.Sprintf("%d %s (tenant %q, idempotency key digest %q) in flight %s for %s, past %s %s bound, and not in the books; %s",
				p.Amount, p.Currency, p.Tenant, p.KeyDigest, at, p.Age.Round(time.Millisecond), who, p.Bound, charged)})
	}
	return r.err
}

// landed checks again the charges of the keys in flight without a point
// that are no longer (not in flying): each is recorded by a payment by
// now, or is a charge without its payment (the execution failed or died
// after the charge, and its key expired or was released).
func (r *reconciler) landed(ctx context.Context, flying map[string]bool) error {
	for h, charges := range r.bare {
		if flying[h] {
			continue
		}
		delete(r.bare, h)
		left, err := r.unrecorded(ctx, charges)
		if err != nil {
			return err
		}
		for _, c := range left {
			r.emit(Difference{Kind: DiffChargeWithoutPayment, Charges: []string{c.ID},
				Detail: fmt.Sprintf("%d %s charged to %s (tenant %q, idempotency key digest %q), %d refunded, and no payment records it",
					c.Amount, c.Currency, c.Reference, c.Metadata["tenant"], chargeKeyDigest(c), c.AmountRefunded)})
		}
	}
	return r.err
}

// unrecorded returns those of charges that no payment records yet.
func (r *reconciler) unrecorded(ctx context.Context, charges []acquirer.Charge) ([]acquirer.Charge, error) {
	if len(charges) == 0 {
		return nil, nil
	}
	recorders, err := r.store.recordersOf(ctx, chargeIDs(charges))
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(slices.Clone(charges), func(c acquirer.Charge) bool { return len(recorders[c.ID]) > 0 }), nil
}

func chargeIDs(charges []acquirer.Charge) []string {
	ids := make([]string, len(charges))
	for i, c := range charges {
		ids[i] = c.ID
	}
	return ids
}

// inFlightPayment is a payment an execution in flight began charging, or
// (bare) a key in flight in a store that keeps no points, which may be
// one: pt then names its tenant and client's key alone.
type inFlightPayment struct {
	pt    chargingPoint
	point string
	age   time.Duration
	bare  bool
}

// handle names f among those in flight: its payment's ID, or for a bare
// key its logical payment, in a form no payment ID takes.
func (f inFlightPayment) handle() string {
	if f.bare {
		return "\x00" + f.pt.Tenant + "\x00" + ClientKeyDigest(f.pt.Tenant, f.pt.ClientKey)
	}
	return f.pt.Payment.ID
}

// isBare reports whether h is a bare key's handle.
func isBare(h string) bool { return strings.HasPrefix(h, "\x00") }

// inFlightPayments returns the payments of the keys in flight at their
// "charging" point, and the keys in flight without a point (a store that
// keeps none) as bare ones; sealed counts those of them whose key is
// sealed, which name no logical payment that can be read.
func inFlightPayments(recs []idem.Record, keys []idemhttp.BodyKey, now time.Time) (out []inFlightPayment, sealed int, err error) {
	for _, r := range recs {
		if r.State != idem.StateInFlight {
			continue
		}
		if r.Recovery.IsZero() {
			if strings.HasPrefix(string(r.Key), idemhttp.SealedKeyPrefix) {
				sealed++
				continue
			}
			out = append(out, inFlightPayment{pt: chargingPoint{Tenant: string(r.Scope), ClientKey: string(r.Key)}, age: max(0, now.Sub(r.CreatedAt)), bare: true})
			continue
		}
		if !isChargingPoint(r.Recovery.Name) {
			continue
		}
		data, err := idemhttp.OpenPoint(keys, r.Scope, r.Key, r.Recovery.Name, r.Recovery.Data)
		if err != nil {
			return nil, 0, fmt.Errorf("payments: the recovery point of a key in flight of tenant %q: %w (give the service's body keys)", r.Scope, err)
		}
		pt, err := decodeCharging(data)
		if err != nil {
			return nil, 0, fmt.Errorf("payments: the recovery point of a key in flight of tenant %q: %w", r.Scope, err)
		}
		out = append(out, inFlightPayment{pt: pt, point: r.Recovery.Name, age: max(0, now.Sub(r.Recovery.SavedAt))})
	}
	return out, sealed, nil
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
