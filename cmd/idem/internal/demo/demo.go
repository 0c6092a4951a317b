package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/acquirer"
	"github.com/idem-go/idem/cmd/idem/internal/payments"
	"github.com/idem-go/idem/idemsqlite"
)

// Options configures Run. A nil *Options means all defaults.
type Options struct {
	// Out receives the live progress, the table and the explanation.
	// Defaults to io.Discard.
	Out io.Writer
	// Customers is how many customers play each scenario, each paying once.
	// Defaults to 8.
	Customers int
	// Logger receives the payment services' logs and the demo's own debug
	// lines. Defaults to discarding them.
	Logger *slog.Logger
}

// The lab's numbers. KRW has no minor unit, so amounts are whole won.
const (
	currency       = "KRW"
	openingBalance = 200_000
	paymentAmount  = 12_000
	// refundAmount is what the refund scenario gives back: a partial
	// refund, so that two of them still fit in the payment and the unsafe
	// service makes both.
	refundAmount = 5_000
	tenant       = "demo"
)

// Mode names one of the two runs of the service.
type Mode string

const (
	// ModeUnsafe is the service with idempotency switched off: every request
	// that arrives is executed.
	ModeUnsafe Mode = "unsafe"
	// ModeProtected is the service as shipped: a POST is claimed by its
	// Idempotency-Key, executed at most once, and duplicates get the first
	// answer replayed.
	ModeProtected Mode = "protected"
)

// Row is the result of one scenario in one run, as read back from the
// service's own API.
type Row struct {
	Mode     Mode
	Scenario string
	// Customers is how many customers played; each meant to pay once.
	Customers int
	// Attempts is how many payment requests the clients sent, retries and
	// duplicates included.
	Attempts int
	// Payments is how many payments the service created, summed over the
	// customers' payment lists.
	Payments int
	// Taken is the money taken, the sum of the customers' balance decreases.
	Taken int64
	// ShouldBe is the money that should have been taken: Customers times
	// the amount.
	ShouldBe int64
	// Charges is how many charges the card network made on the customers'
	// cards: one per payment, each charged once, when all goes well.
	Charges int
	// Refunds is how many refunds the service made, in a scenario where
	// each customer asks for one (else 0).
	Refunds int
	// Overcharged sums, over the customers, what was taken beyond what each
	// owed; Missing sums what each owed but was not taken (given back twice,
	// in the refund scenario).
	Overcharged, Missing int64
	// ChargedOnce counts the customers with exactly one payment and exactly
	// the amount taken.
	ChargedOnce int
	// Currency of the amounts.
	Currency string
	// Elapsed is how long the scenario took to play.
	Elapsed time.Duration
}

// ExactlyOnce reports whether every customer was charged exactly once (and,
// in the refund scenario, refunded exactly once).
func (r Row) ExactlyOnce() bool {
	return r.Customers > 0 && r.ChargedOnce == r.Customers && r.Overcharged == 0 && r.Missing == 0 &&
		r.Payments == r.Customers && r.Charges == r.Customers && r.Taken == r.ShouldBe && (r.Refunds == 0 || r.Refunds == r.Customers)
}

// Verdict is the row's verdict in words: "exactly once",
// "DOUBLE CHARGED (+N CUR)", "lost payment (-N CUR)" (or both), or
// "inconsistent" when the payments and the balances disagree.
func (r Row) Verdict() string {
	switch {
	case r.ExactlyOnce():
		return "exactly once"
	case r.Overcharged > 0 && r.Missing > 0:
		return fmt.Sprintf("DOUBLE CHARGED (+%s) and lost payment (-%s)", money(r.Overcharged, r.Currency), money(r.Missing, r.Currency))
	case r.Overcharged > 0:
		return fmt.Sprintf("DOUBLE CHARGED (+%s)", money(r.Overcharged, r.Currency))
	case r.Missing > 0 && r.Refunds > r.Customers:
		return fmt.Sprintf("REFUNDED TWICE (-%s)", money(r.Missing, r.Currency))
	case r.Missing > 0:
		return fmt.Sprintf("lost payment (-%s)", money(r.Missing, r.Currency))
	case r.Charges > r.Customers:
		return fmt.Sprintf("CARD CHARGED TWICE (+%d charges)", r.Charges-r.Customers)
	default:
		return "inconsistent (payments and balances disagree)"
	}
}

// Report is what Run found.
type Report struct {
	// Customers per scenario; Amount is what each meant to pay, from an
	// account opened with Balance, in Currency.
	Customers       int
	Amount, Balance int64
	// Refund is what the refund scenario's customers ask back.
	Refund   int64
	Currency string
	// Rows holds one row per run and scenario, the unsafe run first.
	Rows []Row
	// Elapsed is how long the whole demo took.
	Elapsed time.Duration
}

// OK reports whether the demo showed what it is for: the protected run
// charged exactly once in every scenario, and the unsafe run took more money
// than it should have.
func (r *Report) OK() bool { return len(r.problems()) == 0 }

// problems says, in words, how the report falls short of OK.
func (r *Report) problems() []string {
	if r == nil {
		return []string{"no report"}
	}
	var out []string
	var unsafeRows, protectedRows int
	var taken, should int64
	for _, row := range r.Rows {
		switch row.Mode {
		case ModeUnsafe:
			unsafeRows++
			taken += row.Taken
			should += row.ShouldBe
		case ModeProtected:
			protectedRows++
			if !row.ExactlyOnce() {
				out = append(out, fmt.Sprintf("protected run, %s: %s", row.Scenario, row.Verdict()))
			}
		}
	}
	if protectedRows != len(scenarios) {
		out = append(out, fmt.Sprintf("the protected run played %d of %d scenarios", protectedRows, len(scenarios)))
	}
	if unsafeRows != len(scenarios) {
		out = append(out, fmt.Sprintf("the unsafe run played %d of %d scenarios", unsafeRows, len(scenarios)))
	}
	if taken <= should {
		out = append(out, fmt.Sprintf("the unsafe run took %s, no more than the %s it should have: no double charge was shown",
			money(taken, r.Currency), money(should, r.Currency)))
	}
	return out
}

// Run plays every scenario against the unsafe service, then against the
// protected one, printing progress and then the table to opts.Out, and
// returns the report.
//
// An error means the demo itself could not run (the service did not start,
// an account could not be opened or read back, ctx was cancelled); the
// report then holds the rows played so far. Double charges and lost payments
// are not errors: they are what the report is for.
func Run(ctx context.Context, opts *Options) (*Report, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Out == nil {
		o.Out = io.Discard
	}
	if o.Customers <= 0 {
		o.Customers = 8
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}

	start := time.Now()
	rep := &Report{Customers: o.Customers, Amount: paymentAmount, Balance: openingBalance, Refund: refundAmount, Currency: currency}
	p := &printer{w: o.Out}
	p.intro(rep)
	for i, mode := range []Mode{ModeUnsafe, ModeProtected} {
		p.runStarts(i+1, mode)
		rows, err := runMode(ctx, &o, mode, p)
		rep.Rows = append(rep.Rows, rows...)
		if err != nil {
			rep.Elapsed = time.Since(start)
			return rep, fmt.Errorf("demo: %s run: %w", mode, err)
		}
	}
	rep.Elapsed = time.Since(start)
	p.table(rep)
	p.closing(rep)
	return rep, nil
}

// lab is one payment service, on its own database, behind a real HTTP
// server on a loopback port.
type lab struct {
	dir    string
	db     *idemsqlite.DB
	svc    *payments.Service
	srv    *http.Server
	served chan error
	client *client
	// The card network every payment charges at: its database, its
	// server, and a client that reads its charges.
	netDB  *idemsqlite.DB
	netSrv *http.Server
	// netTransport carries the service's requests to the card network.
	netTransport *http.Transport
	netServed    chan error
	net          *acquirer.Client
}

// startNetwork starts the lab's card network on a file of its own, behind
// an HTTP server on a loopback port.
func (l *lab) startNetwork(ctx context.Context, logger *slog.Logger) error {
	db, err := idemsqlite.Open(filepath.Join(l.dir, "acquirer.db"), nil)
	if err != nil {
		return fmt.Errorf("opening the card network's database: %w", err)
	}
	l.netDB = db
	net, err := acquirer.New(ctx, acquirer.Config{DB: db, Logger: logger})
	if err != nil {
		return fmt.Errorf("starting the card network: %w", err)
	}
	ln, err := listenLoopback()
	if err != nil {
		return err
	}
	l.netSrv = &http.Server{Handler: net.Handler(), ReadHeaderTimeout: 5 * time.Second,
		ErrorLog: slog.NewLogLogger(logger.Handler(), slog.LevelDebug)}
	l.netServed = make(chan error, 1)
	go func() { l.netServed <- l.netSrv.Serve(ln) }()
	// A transport of the lab's own, whose connections close lets the card
	// network shut down at once: a connection the client opened and never
	// sent a request on counts as active to the server for five seconds.
	l.netTransport = http.DefaultTransport.(*http.Transport).Clone()
	l.net, err = acquirer.NewClient(acquirer.ClientConfig{URL: "http://" + ln.Addr().String(), Transport: payments.ChargeFaults(l.netTransport)})
	return err
}

func startLab(ctx context.Context, mode Mode, logger *slog.Logger) (_ *lab, err error) {
	l := &lab{}
	defer func() {
		if err != nil {
			err = errors.Join(err, l.close())
		}
	}()
	l.dir, err = os.MkdirTemp("", "idem-demo-*")
	if err != nil {
		return nil, fmt.Errorf("making a temporary directory: %w", err)
	}
	l.db, err = idemsqlite.Open(filepath.Join(l.dir, "payments.db"), nil)
	if err != nil {
		return nil, fmt.Errorf("opening the database: %w", err)
	}
	if err := l.startNetwork(ctx, logger.With("run", string(mode), "service", "card network")); err != nil {
		return nil, err
	}
	apiKey := newAPIKey()
	l.svc, err = payments.New(ctx, &payments.Config{
		DB:       l.db,
		APIKeys:  map[string]string{apiKey: tenant},
		Unsafe:   mode == ModeUnsafe,
		Faults:   true,
		Acquirer: l.net,
		Logger:   logger.With("run", string(mode)),
	})
	if err != nil {
		return nil, fmt.Errorf("starting the payment service: %w", err)
	}
	ln, err := listenLoopback()
	if err != nil {
		return nil, err
	}
	l.srv = &http.Server{
		Handler:           l.svc.Handler(),
		ReadHeaderTimeout: 5 * time.Second,
		// The drop-after-commit fault closes connections on purpose; keep
		// what the server says about that out of the demo's output.
		ErrorLog: slog.NewLogLogger(logger.Handler(), slog.LevelDebug),
	}
	l.served = make(chan error, 1)
	go func() { l.served <- l.srv.Serve(ln) }()
	l.client = newClient("http://"+ln.Addr().String(), apiKey)
	return l, nil
}

func listenLoopback() (net.Listener, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("listening: %w", err)
	}
	return ln, nil
}

// close stops the server, the service, the card network and the
// databases, and removes the temporary directory, in that order.
func (l *lab) close() error {
	var errs []error
	if l.client != nil {
		l.client.close()
	}
	if l.srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := l.srv.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("stopping the HTTP server: %w", err), l.srv.Close())
		}
		cancel()
		if err := <-l.served; err != nil && !errors.Is(err, http.ErrServerClosed) {
			errs = append(errs, fmt.Errorf("serving: %w", err))
		}
	}
	if l.svc != nil {
		if err := l.svc.Close(); err != nil {
			errs = append(errs, fmt.Errorf("closing the payment service: %w", err))
		}
	}
	if l.netTransport != nil {
		l.netTransport.CloseIdleConnections()
	}
	if l.netSrv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := l.netSrv.Shutdown(ctx); err != nil {
			errs = append(errs, fmt.Errorf("stopping the card network: %w", err), l.netSrv.Close())
		}
		cancel()
		if err := <-l.netServed; err != nil && !errors.Is(err, http.ErrServerClosed) {
			errs = append(errs, fmt.Errorf("serving the card network: %w", err))
		}
	}
	for _, db := range []*idemsqlite.DB{l.db, l.netDB} {
		if db != nil {
			if err := db.Close(); err != nil {
				errs = append(errs, fmt.Errorf("closing a database: %w", err))
			}
		}
	}
	if l.dir != "" {
		if err := os.RemoveAll(l.dir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func runMode(ctx context.Context, o *Options, mode Mode, p *printer) (rows []Row, err error) {
	l, err := startLab(ctx, mode, o.Logger)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, l.close()) }()
	for _, sc := range scenarios {
		row, err := play(ctx, l, mode, sc, o, p)
		if err != nil {
			return rows, fmt.Errorf("%s: %w", sc.name, err)
		}
		rows = append(rows, row)
	}
	return rows, nil
}

// account is an account as the service shows it. The ID is kept as raw
// JSON so that it is sent back exactly as the service spelled it.
type account struct {
	ID       json.RawMessage `json:"id"`
	Balance  int64           `json:"balance"`
	Currency string          `json:"currency"`
}

// path returns the account's URL path under /v1/accounts.
func (a *account) path() string {
	var s string
	if err := json.Unmarshal(a.ID, &s); err != nil {
		s = string(a.ID)
	}
	return "/v1/accounts/" + url.PathEscape(s)
}

type paymentRequest struct {
	AccountID   json.RawMessage `json:"account_id"`
	Amount      int64           `json:"amount"`
	Currency    string          `json:"currency"`
	Description string          `json:"description"`
}

type paymentList struct {
	Data []struct {
		Amount int64  `json:"amount"`
		Status string `json:"status"`
	} `json:"data"`
}

// intent is one payment a customer means to make once, under one
// idempotency key.
type intent struct {
	c    *client
	key  string
	body paymentRequest
	log  *slog.Logger
}

// pay sends the intent as a careful client does, retrying under the same
// key until a definitive answer; firstFault goes on the first attempt only.
func (in *intent) pay(ctx context.Context, firstFault string) outcome {
	out := in.c.post(ctx, "/v1/payments", in.key, firstFault, in.body)
	in.log.Debug("payment request ended", "key", idem.Key(in.key), "fault", firstFault,
		"attempts", out.attempts, "status", out.status, "err", out.err)
	return out
}

// scenario is one way the same payment (or refund) reaches the service
// more than once.
type scenario struct {
	name  string
	story string
	// refund: each customer pays once, then asks for refundAmount back,
	// and the duplicates are of the refund.
	refund bool
	// customer plays one customer's intent and returns how many payment
	// requests were sent.
	customer func(ctx context.Context, in *intent) int
}

// Timings of the scenarios: long enough for the duplicates to overlap the
// first request on a busy machine, short enough for the demo to take
// seconds.
const (
	frozenDelay  = 400 * time.Millisecond
	stormDelay   = 200 * time.Millisecond
	stormCopies  = 10
	pressStagger = 50 * time.Millisecond
)

var scenarios = []scenario{
	{
		name:  "frozen screen",
		story: fmt.Sprintf("the first press hangs %v; the customer presses Pay twice more", frozenDelay),
		customer: func(ctx context.Context, in *intent) int {
			var attempts atomic.Int64
			var wg sync.WaitGroup
			for press := range 3 {
				wg.Go(func() {
					// A person, not a program: the later presses come a
					// moment after the first, while it hangs.
					if sleep(ctx, time.Duration(press)*pressStagger) != nil {
						return
					}
					fault := ""
					if press == 0 {
						fault = "delay=" + frozenDelay.String()
					}
					attempts.Add(int64(in.pay(ctx, fault).attempts))
				})
			}
			wg.Wait()
			return int(attempts.Load())
		},
	},
	{
		name:  "lost response",
		story: "the payment commits, then the connection drops; the client retries",
		customer: func(ctx context.Context, in *intent) int {
			return in.pay(ctx, "drop-after-commit").attempts
		},
	},
	{
		name:  "card network",
		story: "the card network's answer is lost, then the service's; both are retried",
		customer: func(ctx context.Context, in *intent) int {
			return in.pay(ctx, "drop-charge-answer,drop-after-commit").attempts
		},
	},
	{
		name:  "retry storm",
		story: fmt.Sprintf("%d copies of each request arrive at once", stormCopies),
		customer: func(ctx context.Context, in *intent) int {
			var attempts atomic.Int64
			var wg sync.WaitGroup
			for range stormCopies {
				wg.Go(func() {
					attempts.Add(int64(in.pay(ctx, "delay="+stormDelay.String()).attempts))
				})
			}
			wg.Wait()
			return int(attempts.Load())
		},
	},
	{
		name:   "double-clicked refund",
		refund: true,
		story:  fmt.Sprintf("after paying, the customer clicks Refund (%s) twice", money(refundAmount, currency)),
		customer: func(ctx context.Context, in *intent) int {
			paid := in.pay(ctx, "")
			var p struct {
				ID json.RawMessage `json:"id"`
			}
			if paid.status != http.StatusCreated || json.Unmarshal(paid.body, &p) != nil {
				return paid.attempts
			}
			refund := map[string]any{"payment_id": p.ID, "amount": refundAmount, "reason": "requested_by_customer"}
			key := newIdempotencyKey()
			var attempts atomic.Int64
			var wg sync.WaitGroup
			for click := range 2 {
				wg.Go(func() {
					if sleep(ctx, time.Duration(click)*pressStagger) != nil {
						return
					}
					out := in.c.post(ctx, "/v1/refunds", key, "", refund)
					in.log.Debug("refund request ended", "key", idem.Key(key), "attempts", out.attempts, "status", out.status, "err", out.err)
					attempts.Add(int64(out.attempts))
				})
			}
			wg.Wait()
			return paid.attempts + int(attempts.Load())
		},
	},
	{
		name:  "transient failure",
		story: "the first attempt fails before commit (503 + Retry-After); the client retries",
		customer: func(ctx context.Context, in *intent) int {
			return in.pay(ctx, "fail-before-commit").attempts
		},
	},
}

// play runs one scenario: opens an account per customer, lets all customers
// play at once, then reads back what the service did.
func play(ctx context.Context, l *lab, mode Mode, sc scenario, o *Options, p *printer) (Row, error) {
	c := l.client
	p.scenarioStarts(sc)
	start := time.Now()

	accounts := make([]*account, o.Customers)
	for i := range accounts {
		a := new(account)
		// The key makes the setup safe to retry, and is required where the
		// service insists on one for every POST.
		if err := c.call(ctx, http.MethodPost, "/v1/accounts", newIdempotencyKey(),
			map[string]any{"balance": openingBalance, "currency": currency}, http.StatusCreated, a); err != nil {
			return Row{}, fmt.Errorf("opening an account: %w", err)
		}
		if a.Balance != openingBalance {
			return Row{}, fmt.Errorf("opened an account with balance %d, asked for %d", a.Balance, openingBalance)
		}
		accounts[i] = a
	}

	// Every customer starts behind one gate, so the scenario's requests
	// overlap the way they would in a busy service.
	gate := make(chan struct{})
	var attempts atomic.Int64
	var wg sync.WaitGroup
	for i, a := range accounts {
		in := &intent{c: c, key: newIdempotencyKey(), log: o.Logger.With("run", string(mode), "scenario", sc.name), body: paymentRequest{
			AccountID:   a.ID,
			Amount:      paymentAmount,
			Currency:    currency,
			Description: fmt.Sprintf("demo: %s, customer %d", sc.name, i+1),
		}}
		wg.Go(func() {
			select {
			case <-gate:
			case <-ctx.Done():
				return
			}
			attempts.Add(int64(sc.customer(ctx, in)))
			p.customerDone()
		})
	}
	close(gate)
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return Row{}, err
	}

	owed := int64(paymentAmount)
	if sc.refund {
		owed -= refundAmount
	}
	row := Row{
		Mode: mode, Scenario: sc.name, Customers: o.Customers, Attempts: int(attempts.Load()),
		ShouldBe: int64(o.Customers) * owed, Currency: currency,
	}
	for _, a := range accounts {
		var now account
		if err := c.call(ctx, http.MethodGet, a.path(), "", nil, http.StatusOK, &now); err != nil {
			return Row{}, fmt.Errorf("reading an account back: %w", err)
		}
		var list paymentList
		if err := c.call(ctx, http.MethodGet, a.path()+"/payments", "", nil, http.StatusOK, &list); err != nil {
			return Row{}, fmt.Errorf("listing an account's payments: %w", err)
		}
		var id string
		if err := json.Unmarshal(a.ID, &id); err != nil {
			return Row{}, fmt.Errorf("reading an account's id: %w", err)
		}
		charges, err := l.net.Charges(ctx, id)
		if err != nil {
			return Row{}, fmt.Errorf("reading the card network's charges: %w", err)
		}
		row.Charges += len(charges)
		taken := openingBalance - now.Balance
		row.Payments += len(list.Data)
		row.Taken += taken
		row.Overcharged += max(0, taken-owed)
		row.Missing += max(0, owed-taken)
		if len(list.Data) == 1 && len(charges) == 1 && taken == owed {
			row.ChargedOnce++
		}
		if sc.refund {
			// The API lists no refunds per account; the balance tells: each
			// refund gave refundAmount back.
			row.Refunds += int((int64(len(list.Data))*paymentAmount - taken) / refundAmount)
		}
	}
	row.Elapsed = time.Since(start)
	o.Logger.Debug("scenario played", "run", string(mode), "scenario", sc.name,
		"attempts", row.Attempts, "payments", row.Payments, "taken", row.Taken, "verdict", row.Verdict())
	p.scenarioDone(row)
	return row, nil
}
