package idemprobe

import (
	"context"
	"errors"
	"net/http"
	"time"
)

// Sentinel errors Run returns, wrapped with the details.
var (
	// ErrInvalidConfig: the Config cannot be probed with (a malformed URL
	// or header, a negative limit). Nothing was sent.
	ErrInvalidConfig = errors.New("invalid probe configuration")
	// ErrRemote: the target is not on this machine and AllowRemote is not
	// set. Nothing was sent.
	ErrRemote = errors.New("target is not a loopback address")
	// ErrBudget: a check needed more requests than MaxRequests leaves.
	ErrBudget = errors.New("the request budget is spent")
)

// Config says what to probe and within which limits. The zero value of
// every field but URL (or Handler) means its default.
type Config struct {
	// URL is the endpoint probed: an absolute http:// or https:// URL, or,
	// with Handler, a path on it ("/v1/payments", a query allowed). Required
	// without Handler; with it, defaults to "/".
	URL string

	// Handler, when set, is the endpoint's handler (a router, a handler
	// wrapped in a middleware), which the probe serves in-process for the
	// length of its run: on an HTTP server on loopback, closed when Run
	// returns, so that the checks that hang up a connection or overlap
	// requests meet it as they would a real server. URL, CountURL and the
	// URL of Revoke are then paths on it. Run waits for the handler's
	// requests to end, those the probe hung up on included, within
	// Timeout; a handler still running then is left running (its
	// connections closed), so that Run returns. Defaults to none: URL is
	// probed.
	Handler http.Handler

	// Method is the request's method. Defaults to POST.
	Method string

	// Body is the request body, a template: every {{n}} in it is replaced
	// by a counter, one value per logical operation (a duplicate repeats its
	// operation's value), for APIs that refuse two operations with the
	// same content. The counter starts at 1. Defaults to no body.
	Body string

	// Header is sent with every request (credentials, Content-Type).
	// Content-Type defaults to application/json when Body starts with '{'
	// or '['. Defaults to none.
	Header http.Header

	// KeyHeader names the idempotency key's header. Defaults to
	// Idempotency-Key.
	KeyHeader string

	// SecretHeaders name request headers, besides Authorization,
	// Proxy-Authorization and Cookie (always hidden), whose values the
	// report never shows. Defaults to none.
	SecretHeaders []string

	// CountURL, when set, is read with GET before and after each check to
	// count the effect: a JSON list, an object whose "data" is a list, or a
	// number. Defaults to none: executions are told from the answers alone
	// (a top-level "id" in a JSON body, or Location).
	CountURL string

	// FaultHeader, "Name: value", makes the endpoint fail with a 5xx and
	// no effect; it enables check 7. Defaults to none (check 7 is not
	// applicable).
	FaultHeader string

	// SlowHeader, "Name: value", makes the endpoint take long enough that a
	// duplicate arrives while the first is in flight; it enables check 8.
	// Defaults to none (check 8 is not applicable).
	SlowHeader string

	// HeadStart is how long check 8 lets the slow request run before its
	// duplicate leaves, so that the slow one has claimed its key by then.
	// It must be well under what SlowHeader holds the request. Defaults to
	// 200ms.
	HeadStart time.Duration

	// Concurrency is how many duplicates check 1 sends at once. Defaults
	// to 8.
	Concurrency int

	// OtherHeader, "Name: value", is a second credential (another tenant's):
	// it enables check 9, which sends a key the first credential used
	// under this one instead. Defaults to none (check 9 is not applicable).
	OtherHeader string

	// RevocableHeader, "Name: value", is a credential the probe may revoke
	// with Revoke; with both, check 10 uses a key under it, revokes it and
	// sends the key again. Defaults to none (check 10 is not applicable).
	RevocableHeader string

	// Revoke, "METHOD URL", is the request that revokes the credential it
	// is sent with (RevocableHeader). The probe cannot revoke a credential
	// by itself, so the endpoint's owner names how. Defaults to none.
	Revoke string

	// TTL is how long the endpoint says it keeps a key; with it, check 11
	// waits that long after a key's answer and sends the key again, which
	// must then run anew or be refused, not be replayed. Defaults to none
	// (check 11 is not applicable). Keep it short: the probe waits it out.
	TTL time.Duration

	// History is how many operations check 12 sends, from HistoryClients
	// concurrent clients under HistoryKeys keys, with duplicates, lost
	// connections and mismatched bodies, before Porcupine checks the
	// history. Defaults to 0 (check 12 is not applicable).
	History int

	// HistoryKeys is how many keys check 12's operations share. Defaults
	// to History/4, at least 1, so that each key is sent about four times.
	HistoryKeys int

	// HistoryClients is how many clients send check 12's operations at
	// once. Defaults to 8.
	HistoryClients int

	// HistorySeed seeds the choices of check 12 (which operation is a
	// duplicate, lost, mismatched), so that a failure can be sent again.
	// Defaults to one drawn at random, which the report names.
	HistorySeed uint64

	// HistoryDir is where check 12 saves Porcupine's visualisation of a
	// history that is not linearizable. Defaults to os.TempDir().
	HistoryDir string

	// MaxRequests bounds the requests sent in all, count reads included.
	// Defaults to 200, plus History and its two count reads.
	MaxRequests int

	// Timeout bounds the whole probe. Defaults to 60s.
	Timeout time.Duration

	// AllowRemote lets the probe reach a host that is not loopback
	// (127.0.0.0/8, ::1, localhost). Defaults to false: such a URL is
	// refused with ErrRemote, and every connection is checked again when
	// it is dialled, so a name that resolves elsewhere later is refused too.
	AllowRemote bool

	// NewKey makes a fresh idempotency key. Defaults to "probe-" and 24
	// random hex characters.
	NewKey func() string

	// ReplayHeader names the response header that marks a replay when its
	// value is "true": the checks note it, and a replay marked by it is
	// told apart from a second execution even without an id. The draft
	// names none; idem, Stripe and many others send Idempotent-Replayed,
	// some Idempotency-Replayed. Defaults to Idempotent-Replayed.
	ReplayHeader string

	// Strict holds a duplicate sent while the first request under its key
	// is in flight to the draft's words (draft-ietf-httpapi-idempotency-key-header-07
	// §2.6 Idempotency Enforcement, §2.7 Error Handling): it must be
	// answered 409 while the first runs. Without it, the probe also accepts
	// a duplicate that waits for the first's answer and gets it, as idem's
	// middleware does within its InflightWait. It applies where the probe
	// knows the first is in flight: check 8 and a Step whose Want says
	// Conflict after a Background step. Defaults to false.
	Strict bool

	// Cases are checks of the API's own, written as data (see Case); a
	// few lines each. They run after every check but 6, 7 and 12 (which
	// then also judge the replays and 5xx the cases met), are reported
	// after check 12, numbered from 13 on, and each is a subtest of Test.
	// DraftCases returns the IETF draft's core behaviours in this form.
	// Defaults to none.
	Cases []Case
}

// Run probes cfg's endpoint and returns the report card. An error means
// the probe could not start (ErrInvalidConfig, ErrRemote): nothing was
// sent. A check that cannot finish (the budget or the timeout spent, the
// connection refused) is reported as an error in its line instead; so is
// an endpoint that accepts none of the probe's requests, which leaves the
// checks that need one not run (Report.Outcome is OutcomeNotRun) but still
// judges what the failures showed (a 5xx kept and replayed fails check 7).
func Run(ctx context.Context, cfg *Config) (*Report, error) {
	return run(ctx, cfg, nil)
}

// run is Run; each, when not nil, makes every check: it is given the
// check's row and its Check to fill in, and must call do, which runs the
// check and sets its verdict, or leave the Check's status empty (Test
// calls do inside a subtest, which go test -run may not select).
func run(ctx context.Context, cfg *Config, each func(row *check, c *Check, do func())) (*Report, error) {
	p, err := newProber(ctx, cfg)
	if err != nil {
		return nil, err
	}
	table, order := p.table, p.order
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	defer p.close(ctx) // before cancel: the handlers have what is left of the timeout

	start := time.Now()
	// The report lists the checks in the table's order, whatever order they
	// ran in.
	results := make([]Check, len(table))
	for _, i := range order {
		row, c := &table[i], &results[i]
		*c = Check{Number: row.number, Name: row.name, Title: row.title, Source: row.source}
		do := func() { p.makeCheck(ctx, row, c) }
		if each == nil {
			do()
			continue
		}
		each(row, c, do)
		if c.Status == "" {
			c.notRun("not selected to run")
		}
	}
	return &Report{
		Method:   p.cfg.Method,
		URL:      p.target.Redacted(),
		Requests: int(p.sent.Load()),
		Elapsed:  time.Since(start),
		Checks:   results,
	}, nil
}

// makeCheck runs row's check, unless it cannot apply, and sets c's
// verdict.
func (p *prober) makeCheck(ctx context.Context, row *check, c *Check) {
	if p.baselineFailed && !row.judgesFailures {
		// Against an endpoint that accepted nothing, a check would only
		// repeat the baseline's refusal.
		c.notRun("the endpoint accepted none of the probe's requests (see sequential-replay)")
		return
	}
	if row.requires != nil {
		if reason := row.requires(p); reason != "" {
			c.notApplicable(reason)
			return
		}
	}
	if err := row.run(ctx, p, c); err != nil {
		c.errorf("%s", err)
	}
	if c.Status == "" {
		// A verdict forgotten on some path must not read as a pass.
		c.errorf("the check ended without a verdict")
	}
}
