package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/consumer"
)

// The order scenario's plan: each account pays, then is refunded in part;
// the payment's event fails its first attempt (a timeout) and is retried
// after orderRetry, while the refund's goes on.
const (
	orderAccounts = 5
	orderRetry    = time.Second
	orderRefund   = 5_000
)

// The states an account goes through, in the order they happen.
const (
	statusPaid     = "paid"
	statusRefunded = "refunded"
)

var errTimeout = errors.New("database timeout")

// orderDesign is one consumer of the order scenario.
type orderDesign struct {
	mode     Mode
	consumer string
	// adds: the effect adds the amount to the account's balance; else it
	// sets the account's status to the event's.
	adds bool
	// ordered: the consumer keeps per-key order (the default); else it is
	// Unordered.
	ordered bool
	// versioned: the events carry the account's version, and the inbox
	// de-duplicates by it under idem.GapAllow (Config.Sequence).
	versioned bool
}

// orderDesigns are the order scenario's consumers: each effect without
// per-key order, then with it, then the status with a version and no
// order, so that every verdict's "needs order" is shown fixed by it.
var orderDesigns = []orderDesign{
	{mode: ModeUnsafe, consumer: "adds, unordered", adds: true},
	{mode: ModeUnsafe, consumer: "sets status, unordered"},
	{mode: ModeProtected, consumer: "adds, per-key order", adds: true, ordered: true},
	{mode: ModeProtected, consumer: "sets status, per-key order", ordered: true},
	{mode: ModeProtected, consumer: "sets status+version, unordered", versioned: true},
}

// OrderRow is one consumer of the order scenario: each account's payment
// and partial refund, the payment's event retried once.
type OrderRow struct {
	Mode     Mode
	Consumer string
	// Adds is true for the consumer whose effect adds amounts, false for
	// those that set a status.
	Adds bool
	// Ordered is true for the consumer that keeps per-key order.
	Ordered bool
	// Accounts, each with a payment and a refund; Events is twice as many.
	Accounts, Events int
	// RefundFirst counts the accounts whose refund was applied before
	// their payment (or whose payment never was, being older).
	RefundFirst int
	// FinalRight counts the accounts that ended in the right state (a
	// balance of the payment less the refund; the status "refunded").
	FinalRight int
	// HistoryRight counts the accounts whose every applied state was one
	// the account really went through, in its order.
	HistoryRight int
	// Lowest is the lowest balance an account went through, for the
	// consumer that adds.
	Lowest   int64
	Currency string
}

// Right reports whether every account ended right and went only through
// states it really had.
func (r OrderRow) Right() bool {
	return r.Accounts > 0 && r.FinalRight == r.Accounts && r.HistoryRight == r.Accounts
}

// Verdict says whether the design held, and what it needs.
func (r OrderRow) Verdict() string {
	switch {
	case r.FinalRight < r.Accounts:
		return fmt.Sprintf("WRONG STATE (%d refunds undone): setting needs order or versions", r.Accounts-r.FinalRight)
	case r.HistoryRight < r.Accounts:
		return fmt.Sprintf("HISTORY WRONG (went to %s): adding needs order", money(r.Lowest, r.Currency))
	case r.Ordered:
		return "right: it keeps per-key order"
	}
	return "right: a version needs no order"
}

// orderEvent is an order scenario event's body.
type orderEvent struct {
	Account string `json:"account"`
	Type    string `json:"type"`
	Version uint64 `json:"version"`
	Amount  int64  `json:"amount"`
	Status  string `json:"status"`
}

func playOrder(ctx context.Context, l *msgLab, n int, d orderDesign) (OrderRow, error) {
	run := fmt.Sprintf("order/%d", n)
	clock := newLabClock(l.start)
	tr, err := l.transport(ctx, clock, wakePoll)
	if err != nil {
		return OrderRow{}, err
	}
	defer tr.Close()
	topic := fmt.Sprintf("demo.order.%d", n)
	var msgs []idem.Message
	for a := range orderAccounts {
		account := fmt.Sprintf("acct-%d", a+1)
		for _, ev := range []orderEvent{
			{Account: account, Type: "payment.succeeded", Version: 1, Amount: eventAmount, Status: statusPaid},
			{Account: account, Type: "refund.succeeded", Version: 2, Amount: -orderRefund, Status: statusRefunded},
		} {
			body, err := json.Marshal(ev)
			if err != nil {
				return OrderRow{}, err
			}
			msgs = append(msgs, idem.Message{
				ID: fmt.Sprintf("evt_order_%d_%s_v%d", n, account, ev.Version), Topic: topic, Key: account, Time: clock.Now(),
				Headers: map[string]string{"Content-Type": "application/json"}, Payload: body,
			})
		}
	}
	if err := tr.Publish(ctx, msgs...); err != nil {
		return OrderRow{}, err
	}

	cfg := &consumer.Config{
		Name: fmt.Sprintf("order-%d", n), Topic: topic,
		Inbox: l.inbox, DeadLetters: l.letters, Ledger: l.ledger, InTx: l.inTx,
		Unordered: !d.ordered,
		AckWait:   labAckWait, Clock: clock, Timers: clock, Logger: l.logger,
	}
	if d.versioned {
		cfg.Sequence = func(m idem.Message) (string, uint64, error) {
			var ev orderEvent
			err := json.Unmarshal(m.Payload, &ev)
			return ev.Account, ev.Version, err
		}
		cfg.Gap = idem.GapAllow
	}
	w := &wire{Subscriber: tr}
	cfg.Subscriber = w
	c, err := consumer.New(cfg)
	if err != nil {
		return OrderRow{}, err
	}
	h := func(ctx context.Context, m idem.Message) error {
		var ev orderEvent
		if err := json.Unmarshal(m.Payload, &ev); err != nil {
			return idem.Permanent(err)
		}
		if info, _ := consumer.InfoFromContext(ctx); ev.Version == 1 && info.Attempt == 1 {
			return idem.RetryAfter(errTimeout, orderRetry)
		}
		// Both writes join the inbox's transaction.
		if d.adds {
			if err := l.exec(ctx, `INSERT INTO demo_accounts (run, account, balance, status) VALUES (?, ?, ?, ?)
				ON CONFLICT (run, account) DO UPDATE SET balance = balance + excluded.balance`,
				run, ev.Account, ev.Amount, ""); err != nil {
				return err
			}
		} else {
			if err := l.exec(ctx, `INSERT INTO demo_accounts (run, account, balance, status) VALUES (?, ?, 0, ?)
				ON CONFLICT (run, account) DO UPDATE SET status = excluded.status`,
				run, ev.Account, ev.Status); err != nil {
				return err
			}
		}
		return l.exec(ctx, `INSERT INTO demo_history (run, account, step, balance, status, kind)
			SELECT run, account, (SELECT count(*) + 1 FROM demo_history h WHERE h.run = a.run AND h.account = a.account),
				balance, status, ?
			FROM demo_accounts a WHERE run = ? AND account = ?`, ev.Type, run, ev.Account)
	}
	stop := runConsumer(ctx, func(ctx context.Context) error { return c.Run(ctx, h) })
	defer func() { _ = stop() }()

	// Every payment has failed once and waits for its retry: in the
	// consumer, on a timer, when it keeps per-key order (its refund queued
	// behind it); in the transport, after a Nack, when it does not (its
	// refund applied meanwhile), unless its refund came first and made it
	// a duplicate.
	if err := waitUntil(ctx, "every payment's first attempt", func() bool {
		s := c.Stats()
		if d.ordered {
			return clock.waiting() == orderAccounts
		}
		return s.Processed == orderAccounts && int(w.nacks.Load())+int(s.Duplicates) == orderAccounts
	}); err != nil {
		return OrderRow{}, err
	}
	clock.Advance(orderRetry)
	if err := waitUntil(ctx, "every event applied", func() bool {
		s := c.Stats()
		return int(s.Processed+s.Duplicates) == 2*orderAccounts
	}); err != nil {
		return OrderRow{}, err
	}
	if err := stop(); err != nil {
		return OrderRow{}, err
	}
	return readOrder(ctx, l, run, d)
}

// readOrder reads back what each account went through.
func readOrder(ctx context.Context, l *msgLab, run string, d orderDesign) (OrderRow, error) {
	row := OrderRow{Mode: d.mode, Consumer: d.consumer, Adds: d.adds, Ordered: d.ordered,
		Accounts: orderAccounts, Events: 2 * orderAccounts, Currency: currency}
	rows, err := l.db.Reader().QueryContext(ctx, `SELECT account, balance, status, kind FROM demo_history
		WHERE run = ? ORDER BY account, step`, run)
	if err != nil {
		return OrderRow{}, fmt.Errorf("reading the accounts' histories: %w", err)
	}
	defer rows.Close()
	type step struct {
		balance int64
		status  string
		kind    string
	}
	histories := make(map[string][]step)
	for rows.Next() {
		var account string
		var s step
		if err := rows.Scan(&account, &s.balance, &s.status, &s.kind); err != nil {
			return OrderRow{}, err
		}
		histories[account] = append(histories[account], s)
	}
	if err := rows.Err(); err != nil {
		return OrderRow{}, err
	}
	for _, h := range histories {
		if len(h) == 0 {
			continue
		}
		if h[0].kind == "refund.succeeded" {
			row.RefundFirst++
		}
		last := h[len(h)-1]
		if d.adds && last.balance == eventAmount-orderRefund || !d.adds && last.status == statusRefunded {
			row.FinalRight++
		}
		// What was applied is what happened, in order, or a part of it:
		// never the refund before the payment.
		inOrder := true
		for i := 1; i < len(h); i++ {
			if h[i-1].kind == "refund.succeeded" && h[i].kind == "payment.succeeded" {
				inOrder = false
			}
		}
		if inOrder {
			row.HistoryRight++
		}
		for _, s := range h {
			row.Lowest = min(row.Lowest, s.balance)
		}
	}
	return row, nil
}
