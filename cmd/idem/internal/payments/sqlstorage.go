package payments

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/idem-go/idem"
)

// sqlStorage is the storage's logic, written once for SQLite and
// PostgreSQL: the order of each write's statements, its refusals, the rows
// an origin made already, the lists' cursors, the scanning of rows and the
// naming of errors. What the two databases do differently comes from d (how
// a transaction is begun or joined, how errors are classified, how times
// are stored) and sql (the text of the statements). What each does its own
// way, CreatePayment, Probe and the two steps of settle (settleSteps),
// belongs to each database's storage (sqliteStorage, pgStorage), which
// embeds this one.
type sqlStorage struct {
	d   dialect
	sql *statements
	// reads runs the reads made outside a transaction, which see
	// committed data only.
	reads runner
	// outbox, when set, receives each payment's and refund's event in its
	// transaction.
	outbox idem.Outbox
	// text seals the free text of the rows written and opens that of the
	// rows read.
	text textSealer
}

// dialect is how sqlStorage runs on one database: sqliteDialect or
// pgDialect.
type dialect interface {
	// withTx runs fn in the database's WithTx, which joins the
	// transaction ctx carries (the idempotency key's, under the
	// same-transaction form) or begins one and commits it.
	withTx(ctx context.Context, fn func(ctx context.Context, r runner) error) error
	// beginFailed is the error of a write whose transaction failed to
	// begin: the write never ran.
	beginFailed(err error) error
	// readSnapshot runs fn in a read-only transaction, so that its reads
	// see one snapshot.
	readSnapshot(ctx context.Context, fn func(r runner) error) error
	// wrap names the operation op that failed with err, and marks it
	// ErrTransient when the database's failure lets a retry succeed.
	wrap(op string, err error) error
	// timeArg is t as a statement's parameter for a time column.
	timeArg(t time.Time) any
	// kept is the time the database keeps of t. A write's answer is built
	// from it, so that the row reads back exactly as it was answered.
	kept(t time.Time) time.Time
}

// runner runs statements in a transaction of the storage's database, or
// outside one: sqliteRunner and pgRunner adapt database/sql and pgx.
type runner interface {
	// exec runs a statement and returns how many rows it changed.
	exec(ctx context.Context, query string, args ...any) (int64, error)
	queryRow(ctx context.Context, query string, args ...any) row
	query(ctx context.Context, query string, args ...any) (rows, error)
}

// row is one row of a result, as *sql.Row and pgx.Row give it. When the
// result has no row, Scan fails with an error matching sql.ErrNoRows
// (pgx.ErrNoRows matches it too).
type row interface {
	Scan(dest ...any) error
}

// rows iterates over a result's rows.
type rows interface {
	row
	Next() bool
	Err() error
	Close()
}

// statements is the SQL text of sqlStorage's statements in one dialect:
// sqliteStatements, pgStatements. Each statement takes its parameters, and
// returns its columns, in the order sqlStorage's code gives and scans them.
type statements struct {
	// param is the placeholder of a statement's nth parameter, counted
	// from 1: a list builds its statement for the page asked for.
	param func(n int) string

	insertAccount  string // id, tenant, balance, currency, created_at
	readAccount    string // the balance, currency and created_at of the account (id, tenant)
	accountExists  string // a row when the account (id, tenant) exists
	firstCurrency  string // the currency of the tenant's first account
	readSettlement string // total, events and refunds of the settlement (tenant, currency)

	readPayment string // paymentColumns of the payment (id, tenant)
	// chargedPage reads paymentColumns of at most $4 payments made at the
	// card network, in the order (created_at, id), after the payment at
	// ($1, $2), among those inserted up to the place $3 in the table's
	// insertion order (SQLite's rowid, PostgreSQL's seq); lastPayment
	// reads the last place taken (0 with none).
	chargedPage string
	lastPayment string
	// recordersOf reads (id, charge_id) of the payments that record one
	// of the charges of the list $1 (idList); committedOf reads the id of
	// those of the payments of the list $1 that exist.
	recordersOf string
	committedOf string
	// idList is a list of IDs as recordersOf and committedOf take it.
	idList func(ids []string) (any, error)
	// paymentOf, depositOf and refundOf read the earliest row of the
	// origin (tenant, key, claimed at, since, until), all its columns.
	paymentOf string
	depositOf string
	refundOf  string

	// depositAccount reads the balance of the account (id, tenant) a
	// deposit credits; insertDeposit records the deposit unless its
	// origin made one (depositColumns, then the key and its claim time);
	// creditDeposit adds the amount (amount, id, tenant, the largest
	// balance that can take it) and returns the balance.
	depositAccount string
	insertDeposit  string
	creditDeposit  string

	// refundPayment reads the account, amount, refunded total and
	// currency of the payment (id, tenant) being refunded, and then the
	// account's balance, unless refundAccount, which then reads the
	// balance of the account (id, tenant) in a statement of its own.
	refundPayment string
	refundAccount string
	// insertRefund records the refund unless its origin made one
	// (refundColumns, then the key and its claim time); raiseRefunded
	// raises the payment's refunded total (amount, id, tenant, amount)
	// unless that would pass the payment; creditRefund credits the
	// account (amount, id, tenant).
	insertRefund  string
	raiseRefunded string
	creditRefund  string
	readRefund    string // refundColumns of the refund (id, tenant)
}

// Column lists and statements that read the same in both dialects.
const (
	paymentColumns = `id, tenant, account_id, amount, currency, description, status, created_at, charge_id`
	depositColumns = `id, tenant, account_id, amount, balance_after, created_at`
	refundColumns  = `id, tenant, payment_id, account_id, amount, currency, reason, status, created_at`

	sqlCounts = `SELECT (SELECT count(*) FROM accounts), (SELECT count(*) FROM payments), (SELECT count(*) FROM deposits)`
	sqlPing   = `SELECT 1`
)

// writeWork is what the work of a write transaction left, between the
// transaction's function and the write's result. The work returns the
// write's answer, or a refusal, or an error. A refusal has written nothing
// and is returned once the transaction has committed: under the
// idempotency middleware the enclosing transaction must still commit, so
// that the refusal's answer (a 402, a 404) is stored with the key. An
// error rolls the transaction back.
//
// Each write calls its database's WithTx itself, with a function literal
// that calls done, rather than through a shared helper taking WithTx as a
// function value: called directly, WithTx is known not to keep its
// function, so the literal and this value stay on the stack.
type writeWork[T any] struct {
	ran          bool
	answer       T
	refusal, err error
}

// done keeps what the work returned and returns what the transaction's
// function returns: nil for a refusal, so that it commits.
func (w *writeWork[T]) done(answer T, refusal, err error) error {
	w.ran = true
	w.answer, w.refusal, w.err = answer, refusal, err
	return err
}

// outcome is the write's result, once WithTx returned err. A failure to
// begin (the work never ran) wrote nothing; beginFailed says what it
// means. A failure after the work succeeded is the commit's, and is marked
// with errOutcomeUnknown: after a failed commit nobody knows whether it
// happened.
func (w *writeWork[T]) outcome(err error, beginFailed func(error) error) (T, error) {
	var zero T
	switch {
	case err != nil && w.err != nil:
		return zero, err
	case err != nil && !w.ran:
		return zero, beginFailed(err)
	case err != nil:
		return zero, fmt.Errorf("%w: %w", errOutcomeUnknown, err)
	case w.refusal != nil:
		return zero, w.refusal
	}
	return w.answer, nil
}

// noRows reports whether err says that a row read found none.
func noRows(err error) bool { return errors.Is(err, sql.ErrNoRows) }

// args are o's column values: NULLs for none.
func (o origin) args(d dialect) (key, claimedAt any) {
	if o.none() {
		return nil, nil
	}
	return o.key, d.timeArg(o.claimedAt)
}

// window is o.since and o.until as parameters: NULLs (matching nothing)
// when unset.
func (o origin) window(d dialect) (since, until any) {
	if o.none() || o.since.IsZero() {
		return nil, nil
	}
	return d.timeArg(o.since), d.timeArg(o.until)
}

// storedTime is a time column as either database gives it back: SQLite's
// fixed-width text (timeLayout) through database/sql's Scanner, and
// PostgreSQL's timestamptz through pgx's TimestamptzScanner, which pgx
// prefers to a Scanner and calls without boxing the time. Either way it
// reads back in UTC.
type storedTime time.Time

// Scan implements sql.Scanner.
func (t *storedTime) Scan(src any) error {
	var text string
	switch v := src.(type) {
	case string:
		text = v
	case []byte:
		text = string(v)
	default:
		return fmt.Errorf("stored time: %T is not text", src)
	}
	parsed, err := parseTime(text)
	if err != nil {
		return err
	}
	*t = storedTime(parsed)
	return nil
}

// ScanTimestamptz implements pgtype.TimestamptzScanner.
func (t *storedTime) ScanTimestamptz(v pgtype.Timestamptz) error {
	if !v.Valid || v.InfinityModifier != pgtype.Finite {
		return fmt.Errorf("stored time: %v is not a time", v)
	}
	*t = storedTime(v.Time.UTC())
	return nil
}

func (s *sqlStorage) scanPayment(r row) (Payment, error) {
	var p Payment
	err := r.Scan(&p.ID, &p.Tenant, &p.AccountID, &p.Amount, &p.Currency, &p.Description, &p.Status, (*storedTime)(&p.CreatedAt),
		(*optionalText)(&p.ChargeID))
	if err != nil {
		return Payment{}, err
	}
	if p.Description, err = s.text.open(colDescription, p.Tenant, p.ID, p.Description); err != nil {
		return Payment{}, err
	}
	return p, nil
}

// optionalText scans a text column that may be NULL, as "" when it is.
type optionalText string

// Scan implements sql.Scanner, which pgx honours too.
func (t *optionalText) Scan(src any) error {
	switch v := src.(type) {
	case nil:
		*t = ""
	case string:
		*t = optionalText(v)
	case []byte:
		*t = optionalText(v)
	default:
		return fmt.Errorf("optional text: cannot scan %T", src)
	}
	return nil
}

// optional stores s in a nullable text column: "" as NULL.
func optional(s string) any {
	if s == "" {
		return nil
	}
	return s
}

func scanDeposit(r row) (Deposit, error) {
	var d Deposit
	if err := r.Scan(&d.ID, &d.Tenant, &d.AccountID, &d.Amount, &d.Balance, (*storedTime)(&d.CreatedAt)); err != nil {
		return Deposit{}, err
	}
	return d, nil
}

func (s *sqlStorage) scanRefund(r row) (Refund, error) {
	var rf Refund
	err := r.Scan(&rf.ID, &rf.Tenant, &rf.PaymentID, &rf.AccountID, &rf.Amount, &rf.Currency, &rf.Reason, &rf.Status, (*storedTime)(&rf.CreatedAt))
	if err != nil {
		return Refund{}, err
	}
	if rf.Reason, err = s.text.open(colReason, rf.Tenant, rf.ID, rf.Reason); err != nil {
		return Refund{}, err
	}
	return rf, nil
}

func (s *sqlStorage) setOutbox(ob idem.Outbox) { s.outbox = ob }

// announce adds the event of the write being made to the outbox, in the
// write's transaction (ctx carries it): the event commits with the write,
// or neither does. Without an outbox it does nothing, and builds no event.
func (s *sqlStorage) announce(ctx context.Context, event func() (idem.Message, error)) error {
	if s.outbox == nil {
		return nil
	}
	msg, err := event()
	if err != nil {
		return err
	}
	noteEvent(ctx)
	if err := s.outbox.Add(ctx, msg); err != nil {
		return s.d.wrap("outbox", err)
	}
	return nil
}

func (s *sqlStorage) CreateAccount(ctx context.Context, a Account) error {
	var w writeWork[struct{}]
	err := s.d.withTx(ctx, func(ctx context.Context, r runner) error {
		if _, err := r.exec(ctx, s.sql.insertAccount, a.ID, a.Tenant, a.Balance, a.Currency, s.d.timeArg(a.CreatedAt)); err != nil {
			return w.done(struct{}{}, nil, s.d.wrap("insert account", err))
		}
		return w.done(struct{}{}, nil, injectBeforeCommit(ctx))
	})
	_, err = w.outcome(err, s.d.beginFailed)
	return err
}

func (s *sqlStorage) Account(ctx context.Context, tenant, id string) (Account, error) {
	a := Account{ID: id, Tenant: tenant}
	err := s.reads.queryRow(ctx, s.sql.readAccount, id, tenant).Scan(&a.Balance, &a.Currency, (*storedTime)(&a.CreatedAt))
	if noRows(err) {
		return Account{}, ErrAccountNotFound
	}
	if err != nil {
		return Account{}, s.d.wrap("read account", err)
	}
	return a, nil
}

func (s *sqlStorage) Payment(ctx context.Context, tenant, id string) (Payment, error) {
	p, err := s.scanPayment(s.reads.queryRow(ctx, s.sql.readPayment, id, tenant))
	if noRows(err) {
		return Payment{}, ErrPaymentNotFound
	}
	if err != nil {
		return Payment{}, s.d.wrap("read payment", err)
	}
	return p, nil
}

// paymentOf returns the payment o made, if any: the earliest, with
// origin.since, the payment of the first claim of the logical request,
// whichever committed first. Writes to one account are ordered (by the
// single writer on SQLite, the account's row lock on PostgreSQL), so of two
// executions the second sees the first's payment.
func (s *sqlStorage) paymentOf(ctx context.Context, r runner, tenant string, o origin) (Payment, bool, error) {
	if o.none() {
		return Payment{}, false, nil
	}
	key, claimedAt := o.args(s.d)
	since, until := o.window(s.d)
	p, err := s.scanPayment(r.queryRow(ctx, s.sql.paymentOf, tenant, key, o.lookupAlt(), claimedAt, since, until))
	if noRows(err) {
		return Payment{}, false, nil
	}
	if err != nil {
		return Payment{}, false, s.d.wrap("read the payment of the idempotency key", err)
	}
	return p, true, nil
}

func (s *sqlStorage) AccountPayments(ctx context.Context, tenant, accountID string, pg listPage) ([]Payment, bool, error) {
	return list(ctx, s, "payments", paymentColumns, "payment", s.scanPayment, tenant, accountID, pg)
}

func (s *sqlStorage) AccountDeposits(ctx context.Context, tenant, accountID string, pg listPage) ([]Deposit, bool, error) {
	return list(ctx, s, "deposits", depositColumns, "deposit", scanDeposit, tenant, accountID, pg)
}

// list reads one page of the account's rows of table (payments or
// deposits), newest first by (created_at, id). SQLite's stored times are
// fixed-width text, so they compare in time order too.
func list[T any](ctx context.Context, s *sqlStorage, table, columns, what string,
	scan func(row) (T, error), tenant, accountID string, pg listPage) ([]T, bool, error) {
	p := s.sql.param
	var page []T
	var more bool
	// One snapshot for the account check, the cursor and the list.
	err := s.d.readSnapshot(ctx, func(r runner) error {
		var one int
		err := r.queryRow(ctx, s.sql.accountExists, accountID, tenant).Scan(&one)
		if noRows(err) {
			return ErrAccountNotFound
		}
		if err != nil {
			return s.d.wrap("read account", err)
		}
		query := `SELECT ` + columns + ` FROM ` + table + ` WHERE account_id = ` + p(1) + ` AND tenant = ` + p(2)
		args := []any{accountID, tenant}
		order := ` ORDER BY created_at DESC, id DESC`
		if id, field, newer := pg.cursor(); id != "" {
			var created storedTime
			err := r.queryRow(ctx, `SELECT created_at FROM `+table+` WHERE id = `+p(1)+` AND tenant = `+p(2)+` AND account_id = `+p(3),
				id, tenant, accountID).Scan(&created)
			if noRows(err) {
				return unknownCursor(field, what)
			}
			if err != nil {
				return s.d.wrap("read the cursor", err)
			}
			if newer {
				query += ` AND (created_at, id) > (` + p(3) + `, ` + p(4) + `)`
				order = ` ORDER BY created_at, id`
			} else {
				query += ` AND (created_at, id) < (` + p(3) + `, ` + p(4) + `)`
			}
			args = append(args, s.d.timeArg(time.Time(created)), id)
		}
		args = append(args, pg.limit+1)
		rows, err := r.query(ctx, query+order+` LIMIT `+p(len(args)), args...)
		if err != nil {
			return s.d.wrap("list "+table, err)
		}
		defer rows.Close()
		found := []T{}
		for rows.Next() {
			v, err := scan(rows)
			if err != nil {
				return s.d.wrap("list "+table, err)
			}
			found = append(found, v)
		}
		if err := rows.Err(); err != nil {
			return s.d.wrap("list "+table, err)
		}
		page, more = trimPage(found, pg)
		return nil
	})
	if err != nil {
		return nil, false, err
	}
	return page, more, nil
}

// CreateDeposit refuses like CreatePayment, and orders its steps the same
// way: the account (locked, on PostgreSQL), the deposit of the same
// origin, the checks, the insert (the constraint on the origin decides),
// then the credit.
func (s *sqlStorage) CreateDeposit(ctx context.Context, d Deposit, o origin) (Deposit, error) {
	d.CreatedAt = s.d.kept(d.CreatedAt)
	var w writeWork[Deposit]
	err := s.d.withTx(ctx, func(ctx context.Context, r runner) error { return w.done(s.deposit(ctx, r, d, o)) })
	return w.outcome(err, s.d.beginFailed)
}

// deposit is CreateDeposit's work, in the transaction r runs in.
func (s *sqlStorage) deposit(ctx context.Context, r runner, d Deposit, o origin) (Deposit, error, error) {
	var balance int64
	err := r.queryRow(ctx, s.sql.depositAccount, d.AccountID, d.Tenant).Scan(&balance)
	switch {
	case noRows(err):
		return Deposit{}, ErrAccountNotFound, nil
	case err != nil:
		return Deposit{}, nil, s.d.wrap("read account", err)
	}
	existing, found, err := s.depositOf(ctx, r, d.Tenant, o)
	switch {
	case err != nil:
		return Deposit{}, nil, err
	case found:
		out, refusal := existingDeposit(existing, d)
		return out, refusal, nil
	}
	if balance > math.MaxInt64-d.Amount {
		return Deposit{}, ErrBalanceOverflow, nil
	}
	d.Balance = balance + d.Amount
	key, claimedAt := o.args(s.d)
	n, err := r.exec(ctx, s.sql.insertDeposit,
		d.ID, d.Tenant, d.AccountID, d.Amount, d.Balance, s.d.timeArg(d.CreatedAt), key, claimedAt)
	if err != nil {
		return Deposit{}, nil, s.d.wrap("insert deposit", err)
	}
	if n != 1 {
		existing, found, err := s.depositOf(ctx, r, d.Tenant, o)
		if err != nil {
			return Deposit{}, nil, err
		}
		if !found {
			return Deposit{}, nil, errors.New("insert deposit: conflict on the idempotency origin, but no deposit has it")
		}
		out, refusal := existingDeposit(existing, d)
		return out, refusal, nil
	}
	var after int64
	err = r.queryRow(ctx, s.sql.creditDeposit, d.Amount, d.AccountID, d.Tenant, math.MaxInt64-d.Amount).Scan(&after)
	if err != nil {
		return Deposit{}, nil, s.d.wrap("credit account", err)
	}
	if after != d.Balance {
		return Deposit{}, nil, fmt.Errorf("credit account: the balance changed during the transaction (%d, expected %d)", after, d.Balance)
	}
	return d, nil, injectBeforeCommit(ctx)
}

// depositOf returns the deposit o made, if any: the earliest, as
// paymentOf's.
func (s *sqlStorage) depositOf(ctx context.Context, r runner, tenant string, o origin) (Deposit, bool, error) {
	if o.none() {
		return Deposit{}, false, nil
	}
	key, claimedAt := o.args(s.d)
	since, until := o.window(s.d)
	d, err := scanDeposit(r.queryRow(ctx, s.sql.depositOf, tenant, key, o.lookupAlt(), claimedAt, since, until))
	if noRows(err) {
		return Deposit{}, false, nil
	}
	if err != nil {
		return Deposit{}, false, s.d.wrap("read the deposit of the idempotency key", err)
	}
	return d, true, nil
}

// CreateRefund orders its steps like CreateDeposit: the payment and its
// account's balance, the refund of the same origin, the checks, the insert
// (the constraint on the origin decides), then the conditional raise of the
// payment's refunded total, the credit and the event. The raise repeats the
// check in its WHERE, so no interleaving can take the refunds past the
// payment. Refusals are returned as CreatePayment's are, so the key's
// transaction still commits them; no statement fails on purpose (in
// PostgreSQL a failed statement aborts the whole transaction, the key's
// included).
func (s *sqlStorage) CreateRefund(ctx context.Context, rf Refund, o origin) (Refund, error) {
	rf.CreatedAt = s.d.kept(rf.CreatedAt)
	var w writeWork[Refund]
	err := s.d.withTx(ctx, func(ctx context.Context, r runner) error { return w.done(s.refund(ctx, r, rf, o)) })
	return w.outcome(err, s.d.beginFailed)
}

// refund is CreateRefund's work, in the transaction r runs in.
func (s *sqlStorage) refund(ctx context.Context, r runner, rf Refund, o origin) (Refund, error, error) {
	requested := rf.Amount
	// SQLite reads the payment and its account's balance in one
	// statement, its single writer serialising the refunds already.
	// PostgreSQL locks the payment's row, then the account's, each in a
	// statement of its own: an order no other write takes the other way
	// round, so the refunds of one payment queue up and what they read
	// still holds when they write.
	var paid, refunded, balance int64
	dest := []any{&rf.AccountID, &paid, &refunded, &rf.Currency, &balance}
	if s.sql.refundAccount != "" {
		dest = dest[:4]
	}
	err := r.queryRow(ctx, s.sql.refundPayment, rf.PaymentID, rf.Tenant).Scan(dest...)
	switch {
	case noRows(err):
		return Refund{}, ErrPaymentNotFound, nil
	case err != nil:
		return Refund{}, nil, s.d.wrap("read payment", err)
	}
	if s.sql.refundAccount != "" {
		if err := r.queryRow(ctx, s.sql.refundAccount, rf.AccountID, rf.Tenant).Scan(&balance); err != nil {
			return Refund{}, nil, s.d.wrap("lock account", err)
		}
	}
	existing, found, err := s.refundOf(ctx, r, rf.Tenant, o)
	switch {
	case err != nil:
		return Refund{}, nil, err
	case found:
		out, refusal := existingRefund(existing, rf.PaymentID, requested)
		return out, refusal, nil
	}
	if refusal := refundRefusal(&rf, paid, refunded, balance); refusal != nil {
		return Refund{}, refusal, nil
	}
	key, claimedAt := o.args(s.d)
	reason, err := s.text.seal(colReason, rf.Tenant, rf.ID, rf.Reason)
	if err != nil {
		return Refund{}, nil, err
	}
	n, err := r.exec(ctx, s.sql.insertRefund,
		rf.ID, rf.Tenant, rf.PaymentID, rf.AccountID, rf.Amount, rf.Currency, reason, rf.Status, s.d.timeArg(rf.CreatedAt), key, claimedAt)
	if err != nil {
		return Refund{}, nil, s.d.wrap("insert refund", err)
	}
	if n != 1 {
		existing, found, err := s.refundOf(ctx, r, rf.Tenant, o)
		if err != nil {
			return Refund{}, nil, err
		}
		if !found {
			return Refund{}, nil, errors.New("insert refund: conflict on the idempotency origin, but no refund has it")
		}
		out, refusal := existingRefund(existing, rf.PaymentID, requested)
		return out, refusal, nil
	}
	n, err = r.exec(ctx, s.sql.raiseRefunded, rf.Amount, rf.PaymentID, rf.Tenant, rf.Amount)
	if err != nil {
		return Refund{}, nil, s.d.wrap("raise the refunded total", err)
	}
	if n != 1 {
		return Refund{}, nil, errors.New("raise the refunded total: the payment changed during the transaction")
	}
	if _, err := r.exec(ctx, s.sql.creditRefund, rf.Amount, rf.AccountID, rf.Tenant); err != nil {
		return Refund{}, nil, s.d.wrap("credit account", err)
	}
	if err := s.announce(ctx, func() (idem.Message, error) { return refundEvent(rf) }); err != nil {
		return Refund{}, nil, err
	}
	return rf, nil, injectBeforeCommit(ctx)
}

// refundOf returns the refund o made, if any: the earliest, as
// paymentOf's.
func (s *sqlStorage) refundOf(ctx context.Context, r runner, tenant string, o origin) (Refund, bool, error) {
	if o.none() {
		return Refund{}, false, nil
	}
	key, claimedAt := o.args(s.d)
	since, until := o.window(s.d)
	rf, err := s.scanRefund(r.queryRow(ctx, s.sql.refundOf, tenant, key, o.lookupAlt(), claimedAt, since, until))
	if noRows(err) {
		return Refund{}, false, nil
	}
	if err != nil {
		return Refund{}, false, s.d.wrap("read the refund of the idempotency key", err)
	}
	return rf, true, nil
}

func (s *sqlStorage) Refund(ctx context.Context, tenant, id string) (Refund, error) {
	rf, err := s.scanRefund(s.reads.queryRow(ctx, s.sql.readRefund, id, tenant))
	if noRows(err) {
		return Refund{}, ErrRefundNotFound
	}
	if err != nil {
		return Refund{}, s.d.wrap("read refund", err)
	}
	return rf, nil
}

// paymentKey is a payment's place in the order Reconcile reads them in.
type paymentKey struct {
	at time.Time
	id string
}

// chargedPage returns at most limit payments paid by a charge at the card
// network, in the order (created_at, id), after the payment at after,
// among those inserted up to the place until (lastPayment's).
func (s *sqlStorage) chargedPage(ctx context.Context, after paymentKey, until int64, limit int) ([]Payment, error) {
	rs, err := s.reads.query(ctx, s.sql.chargedPage, s.d.timeArg(after.at), after.id, until, limit)
	if err != nil {
		return nil, s.d.wrap("read charged payments", err)
	}
	defer rs.Close()
	// Grown as rows come, not made limit long: a window is a bound on
	// what is held, and may be far larger than the history.
	var out []Payment
	for rs.Next() {
		p, err := s.scanPayment(rs)
		if err != nil {
			return nil, s.d.wrap("read charged payments", err)
		}
		out = append(out, p)
	}
	if err := rs.Err(); err != nil {
		return nil, s.d.wrap("read charged payments", err)
	}
	return out, nil
}

// lastPayment returns the place in the table's insertion order of the last
// payment inserted, 0 when there is none: the payments inserted after it
// are not read by a chargedPage up to it, however their times compare.
func (s *sqlStorage) lastPayment(ctx context.Context) (int64, error) {
	var n int64
	if err := s.reads.queryRow(ctx, s.sql.lastPayment).Scan(&n); err != nil {
		return 0, s.d.wrap("read the last payment", err)
	}
	return n, nil
}

// recordersOf returns the IDs of the payments that record each of the
// charges named, by charge.
func (s *sqlStorage) recordersOf(ctx context.Context, chargeIDs []string) (map[string][]string, error) {
	out := make(map[string][]string, len(chargeIDs))
	err := s.eachIDPair(ctx, s.sql.recordersOf, chargeIDs, 2, func(id, charge string) { out[charge] = append(out[charge], id) })
	if err != nil {
		return nil, s.d.wrap("read the payments of charges", err)
	}
	return out, nil
}

// committedOf returns which of the payments named exist.
func (s *sqlStorage) committedOf(ctx context.Context, ids []string) (map[string]bool, error) {
	out := make(map[string]bool, len(ids))
	err := s.eachIDPair(ctx, s.sql.committedOf, ids, 1, func(id, _ string) { out[id] = true })
	if err != nil {
		return nil, s.d.wrap("read payments", err)
	}
	return out, nil
}

// eachIDPair runs query on the list ids and calls fn with each row's one
// or two text columns.
func (s *sqlStorage) eachIDPair(ctx context.Context, query string, ids []string, columns int, fn func(a, b string)) error {
	if len(ids) == 0 {
		return nil
	}
	arg, err := s.sql.idList(ids)
	if err != nil {
		return err
	}
	rs, err := s.reads.query(ctx, query, arg)
	if err != nil {
		return err
	}
	defer rs.Close()
	for rs.Next() {
		var a, b string
		dest := []any{&a, &b}[:columns]
		if err := rs.Scan(dest...); err != nil {
			return err
		}
		fn(a, b)
	}
	return rs.Err()
}

// Counts reads the totals from the database rather than counting in
// memory, so the metrics show what was committed, including what another
// process (or an unsafe run) wrote.
func (s *sqlStorage) Counts(ctx context.Context) (accounts, payments, deposits int64, err error) {
	if err := s.reads.queryRow(ctx, sqlCounts).Scan(&accounts, &payments, &deposits); err != nil {
		return 0, 0, 0, s.d.wrap("count rows", err)
	}
	return accounts, payments, deposits, nil
}

func (s *sqlStorage) Ping(ctx context.Context) error {
	var one int
	if err := s.reads.queryRow(ctx, sqlPing).Scan(&one); err != nil {
		return s.d.wrap("ping", err)
	}
	return nil
}

// settlement reads the tenant's settlement in the currency of its first
// account; zero values when it has none.
func (s *sqlStorage) settlement(ctx context.Context, tenant string) (Settlement, error) {
	var st Settlement
	err := s.reads.queryRow(ctx, s.sql.firstCurrency, tenant).Scan(&st.Currency)
	if noRows(err) {
		return Settlement{}, nil
	}
	if err != nil {
		return Settlement{}, s.d.wrap("read accounts", err)
	}
	err = s.reads.queryRow(ctx, s.sql.readSettlement, tenant, st.Currency).Scan(&st.Total, &st.Events, &st.Refunds)
	if err != nil && !noRows(err) {
		return Settlement{}, s.d.wrap("read settlement", err)
	}
	return st, nil
}

// settleSteps are the two steps of settle that each database takes its own
// way, in the transaction Tx of its driver.
type settleSteps[Tx any] interface {
	// markSettled marks the rows of table (payments or refunds) with ids
	// settled, where they were not, and returns every one of them found,
	// with whether this call marked it.
	markSettled(ctx context.Context, tx Tx, table string, ids []string) (map[string]settledPayment, error)
	// addSettlements adds each of totals to its tenant's settlement, in
	// the order given.
	addSettlements(ctx context.Context, tx Tx, totals []settlementTotal) error
}

// settleIn is the sequence of storage's settle on either database, in
// the transaction tx that joins the one ctx carries: the events' payments
// and then their refunds are read and marked settled, the events are
// checked and summed (settlementTotals), and the sums are added. It returns
// the indexes of the events that added nothing.
func settleIn[Tx any](ctx context.Context, steps settleSteps[Tx], tx Tx, evs []PaymentEvent) ([]int, error) {
	payIDs, refundIDs := splitEvents(evs)
	payments, err := steps.markSettled(ctx, tx, "payments", payIDs)
	if err != nil {
		return nil, err
	}
	refunds, err := steps.markSettled(ctx, tx, "refunds", refundIDs)
	if err != nil {
		return nil, err
	}
	totals, already, err := settlementTotals(evs, func(ev PaymentEvent) (settledPayment, bool) {
		found := payments
		if ev.isRefund() {
			found = refunds
		}
		p, ok := found[ev.subject()]
		return p, ok
	})
	if err != nil {
		return nil, err
	}
	if err := steps.addSettlements(ctx, tx, totals); err != nil {
		return nil, err
	}
	return already, nil
}
