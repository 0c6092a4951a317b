package probe

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
// every field but URL means its default.
type Config struct {
	// URL is the endpoint probed. Required.
	URL string

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
}

// Run probes cfg.URL and returns the report card. An error means the probe
// could not start (ErrInvalidConfig, ErrRemote): nothing was sent. A check
// that cannot finish (the budget or the timeout spent, the connection
// refused) is reported as an error in its line instead; so is an endpoint
// that accepts none of the probe's requests, which leaves the checks that
// need one not run (Report.Outcome is OutcomeNotRun) but still judges what the
// failures showed (a 5xx kept and replayed fails check 7).
func Run(ctx context.Context, cfg *Config) (*Report, error) {
	p, err := newProber(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer p.transport.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()

	start := time.Now()
	// The report lists the checks in the table's order, whatever order they
	// ran in.
	results := make([]Check, len(checks))
	for _, i := range checkRunOrder {
		row, c := &checks[i], &results[i]
		*c = Check{Number: row.number, Name: row.name, Title: row.title, Source: row.source}
		if p.baselineFailed && !row.judgesFailures {
			// Against an endpoint that accepted nothing, a check would only
			// repeat the baseline's refusal.
			c.notRun("the endpoint accepted none of the probe's requests (see sequential-replay)")
			continue
		}
		if row.requires != nil {
			if reason := row.requires(p); reason != "" {
				c.notApplicable(reason)
				continue
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
	return &Report{
		Method:   p.cfg.Method,
		URL:      p.target.Redacted(),
		Requests: int(p.sent.Load()),
		Elapsed:  time.Since(start),
		Checks:   results,
	}, nil
}
