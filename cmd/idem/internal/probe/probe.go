package probe

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
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
	// ErrBaseline: the first request, with a fresh key, did not succeed, so
	// no check could be told apart from a request that is simply refused.
	ErrBaseline = errors.New("the endpoint did not accept the probe's request")
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

	// MaxRequests bounds the requests sent in all, count reads included.
	// Defaults to 200.
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

// Check numbers, as issue 12 numbers them: the missing and the malformed
// key are both check 4. checkOrder is the order of the report.
const (
	checkConcurrent   = 1
	checkSequential   = 2
	checkMismatch     = 3
	checkMissingKey   = 4
	checkMalformedKey = -4 // shown as 4, after the missing key
	checkLostResponse = 5
	checkCredentials  = 6
	checkTransient    = 7
	checkInFlight     = 8
)

var checkOrder = []int{checkConcurrent, checkSequential, checkMismatch, checkMissingKey, checkMalformedKey,
	checkLostResponse, checkCredentials, checkTransient, checkInFlight}

// Where each check comes from.
const (
	sourceDraft  = "draft-ietf-httpapi-idempotency-key-header"
	sourceStripe = "Stripe's idempotent requests"
	sourceIdem   = "idem's contract"
)

var checkInfo = map[int]struct{ name, title, source string }{
	checkConcurrent:   {"concurrent-duplicates", "concurrent duplicates run once", sourceDraft + " (Error Scenarios: 409 for a request in progress); " + sourceStripe},
	checkSequential:   {"sequential-replay", "sequential duplicates are replayed", sourceDraft + " (the first response is returned again); " + sourceStripe + " (Idempotent-Replayed: true)"},
	checkMismatch:     {"key-reuse-refused", "a key reused with another body is refused (422)", sourceDraft + " (Error Scenarios)"},
	checkMissingKey:   {"missing-key-refused", "a missing key is refused (400)", sourceDraft + " (Error Scenarios)"},
	checkMalformedKey: {"malformed-key-refused", "a malformed key is refused (400)", sourceDraft + " (the key is a structured-field string); " + sourceStripe + " (keys of at most 255 characters)"},
	checkLostResponse: {"lost-response", "a retry after a lost response gets the first execution's answer", sourceStripe + " (retry with the same key after a network error)"},
	checkCredentials:  {"no-credentials-replayed", "replays carry no Set-Cookie", sourceIdem + " (a replay goes to whoever presents the key)"},
	checkTransient:    {"5xx-not-kept", "a 5xx is not kept: the retry runs again", sourceIdem + " (transient failures keep nothing; Stripe instead replays 500s)"},
	checkInFlight:     {"in-flight-duplicate", "a duplicate in flight waits or gets 409 + Retry-After", sourceDraft + " (Error Scenarios: 409 for a request in progress)"},
}

const (
	defaultConcurrency = 8
	defaultMaxRequests = 200
	defaultTimeout     = 60 * time.Second
	defaultHeadStart   = 200 * time.Millisecond
	// malformedKeyLen is longer than the 255 characters Stripe and idem
	// accept.
	malformedKeyLen = 300
)

// prober is one run of the checks.
type prober struct {
	cfg       Config
	target    *url.URL
	client    *http.Client
	transport *http.Transport
	dialer    *net.Dialer
	fault     [2]string // name, value; empty name: none
	slow      [2]string
	secret    map[string]bool
	sent      atomic.Int64
	ops       atomic.Int64
	// replays are the answers marked or seen as replays, in any check, for
	// check 6. Only Run's goroutine appends.
	replays []*Answer
}

// Run probes cfg.URL and returns the report card. An error means the probe
// could not start (ErrInvalidConfig, ErrRemote) or the endpoint did not
// accept even the first request (ErrBaseline); a check that cannot finish
// (the budget or the timeout spent, the connection refused) is reported as
// an error in its line instead.
func Run(ctx context.Context, cfg *Config) (*Report, error) {
	p, err := newProber(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer p.transport.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()

	start := time.Now()
	rep := &Report{Method: p.cfg.Method, URL: p.target.Redacted()}
	var results []Check

	// Check 2 runs first: its first request is the baseline that every
	// other check needs to mean anything.
	seq, baseline := p.sequential(ctx)
	if baseline != nil {
		return nil, baseline
	}
	results = append(results, seq.Check)
	results = append(results, p.concurrent(ctx))
	results = append(results, p.mismatch(ctx, seq))
	results = append(results, p.missingKey(ctx))
	results = append(results, p.malformedKey(ctx))
	results = append(results, p.lostResponse(ctx))
	results = append(results, p.transient(ctx))
	results = append(results, p.inFlight(ctx))
	// Check 6 reads the replays the other checks received.
	results = append(results, p.credentials())

	for _, id := range checkOrder {
		for _, c := range results {
			if c.Number != id {
				continue
			}
			info := checkInfo[id]
			c.Number = max(id, -id)
			c.Name, c.Title, c.Source = info.name, info.title, info.source
			rep.Checks = append(rep.Checks, c)
		}
	}
	rep.Requests = int(p.sent.Load())
	rep.Elapsed = time.Since(start)
	return rep, nil
}

func newProber(ctx context.Context, c *Config) (*prober, error) {
	cfg := *c
	if cfg.Method == "" {
		cfg.Method = http.MethodPost
	}
	if cfg.KeyHeader == "" {
		cfg.KeyHeader = "Idempotency-Key"
	}
	if cfg.Concurrency == 0 {
		cfg.Concurrency = defaultConcurrency
	}
	if cfg.MaxRequests == 0 {
		cfg.MaxRequests = defaultMaxRequests
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = defaultTimeout
	}
	if cfg.HeadStart == 0 {
		cfg.HeadStart = defaultHeadStart
	}
	if cfg.NewKey == nil {
		cfg.NewKey = randomKey
	}
	switch {
	case cfg.Concurrency < 2:
		return nil, fmt.Errorf("%w: the concurrency must be at least 2, got %d", ErrInvalidConfig, cfg.Concurrency)
	case cfg.MaxRequests < 0:
		return nil, fmt.Errorf("%w: the request budget must be positive, got %d", ErrInvalidConfig, cfg.MaxRequests)
	case cfg.HeadStart < 0:
		return nil, fmt.Errorf("%w: the head start must be positive, got %s", ErrInvalidConfig, cfg.HeadStart)
	case cfg.Timeout < 0:
		return nil, fmt.Errorf("%w: the timeout must be positive, got %s", ErrInvalidConfig, cfg.Timeout)
	}
	target, err := parseTarget("URL", cfg.URL)
	if err != nil {
		return nil, err
	}
	urls := []*url.URL{target}
	if cfg.CountURL != "" {
		cu, err := parseTarget("count URL", cfg.CountURL)
		if err != nil {
			return nil, err
		}
		urls = append(urls, cu)
	}
	p := &prober{cfg: cfg, target: target, secret: map[string]bool{
		"Authorization": true, "Proxy-Authorization": true, "Cookie": true,
	}}
	for _, h := range cfg.SecretHeaders {
		p.secret[http.CanonicalHeaderKey(strings.TrimSpace(h))] = true
	}
	for _, f := range []struct {
		flag string
		v    string
		dst  *[2]string
	}{{"fault header", cfg.FaultHeader, &p.fault}, {"slow header", cfg.SlowHeader, &p.slow}} {
		if f.v == "" {
			continue
		}
		name, value, err := ParseHeader(f.v)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrInvalidConfig, f.flag, err)
		}
		*f.dst = [2]string{name, value}
	}
	if !cfg.AllowRemote {
		for _, u := range urls {
			if err := checkLoopback(ctx, u.Hostname()); err != nil {
				return nil, err
			}
		}
	}
	p.dialer = &net.Dialer{Timeout: 10 * time.Second}
	if !cfg.AllowRemote {
		// Checked again at dial time: a name may resolve elsewhere by then.
		p.dialer.Control = func(_, address string, _ syscall.RawConn) error {
			host, _, err := net.SplitHostPort(address)
			if err != nil {
				return err
			}
			if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
				return fmt.Errorf("dialling %s: %w", address, ErrRemote)
			}
			return nil
		}
	}
	p.transport = &http.Transport{
		DialContext:         p.dialer.DialContext,
		MaxIdleConnsPerHost: cfg.Concurrency,
		ForceAttemptHTTP2:   false,
	}
	p.client = &http.Client{
		Transport: p.transport,
		// A redirect is an answer to report, not to follow.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	return p, nil
}

func parseTarget(what, raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("%w: the %s does not parse: %w", ErrInvalidConfig, what, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("%w: the %s %q must start with http:// or https://", ErrInvalidConfig, what, u.Redacted())
	}
	if u.Hostname() == "" {
		return nil, fmt.Errorf("%w: the %s %q has no host", ErrInvalidConfig, what, u.Redacted())
	}
	return u, nil
}

// checkLoopback resolves host and refuses it unless every address it
// names is a loopback address.
func checkLoopback(ctx context.Context, host string) error {
	if strings.EqualFold(host, "localhost") || strings.HasSuffix(strings.ToLower(host), ".localhost") {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil {
		if ip.IsLoopback() {
			return nil
		}
		return fmt.Errorf("%w: %s", ErrRemote, host)
	}
	addrs, err := net.DefaultResolver.LookupIPAddr(ctx, host)
	if err != nil {
		return fmt.Errorf("%w: resolving %s: %w", ErrRemote, host, err)
	}
	for _, a := range addrs {
		if !a.IP.IsLoopback() {
			return fmt.Errorf("%w: %s resolves to %s", ErrRemote, host, a.IP)
		}
	}
	return nil
}

// ParseHeader parses "Name: value", as curl's -H takes it.
func ParseHeader(s string) (name, value string, err error) {
	name, value, ok := strings.Cut(s, ":")
	name = strings.TrimSpace(name)
	if !ok || name == "" || strings.ContainsAny(name, " \t\r\n") {
		return "", "", fmt.Errorf("header %q is not of the form 'Name: value'", redactHeaderLine(s))
	}
	return http.CanonicalHeaderKey(name), strings.TrimSpace(value), nil
}

// redactHeaderLine shows a malformed header's name only, in case its value
// is a secret.
func redactHeaderLine(s string) string {
	if name, _, ok := strings.Cut(s, ":"); ok {
		return name + ": xxxxx"
	}
	if len(s) > 16 {
		return s[:16] + "…"
	}
	return s
}

func randomKey() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return "probe-" + hex.EncodeToString(b)
}

// --- operations and requests ---

// operation is one logical operation: its duplicates send the same body.
type operation struct {
	n    int64
	body string
}

func (p *prober) newOperation() operation {
	n := p.ops.Add(1)
	return operation{n: n, body: strings.ReplaceAll(p.cfg.Body, "{{n}}", strconv.FormatInt(n, 10))}
}

// variant is a different body for the same key: the next counter value
// where the template has one, else the body with one field or byte more.
// ok is false when there is no body to vary.
func (p *prober) variant(op operation) (operation, bool) {
	if strings.Contains(p.cfg.Body, "{{n}}") {
		return p.newOperation(), true
	}
	b := strings.TrimSpace(op.body)
	switch {
	case b == "":
		return operation{}, false
	case strings.HasPrefix(b, "{"):
		inner := strings.TrimSpace(b[1:])
		if strings.HasPrefix(inner, "}") {
			return operation{n: op.n, body: `{"idem_probe_variant":1}`}, true
		}
		return operation{n: op.n, body: `{"idem_probe_variant":1,` + inner}, true
	default:
		return operation{n: op.n, body: op.body + "\n"}, true
	}
}

// reserve takes n requests from the budget, all or none.
func (p *prober) reserve(n int) error {
	if p.sent.Add(int64(n)) > int64(p.cfg.MaxRequests) {
		p.sent.Add(-int64(n))
		return fmt.Errorf("%w: %d more requests would exceed the %d allowed", ErrBudget, n, p.cfg.MaxRequests)
	}
	return nil
}

// newRequest builds a request of op with key (none when noKey) and extra
// headers.
func (p *prober) newRequest(ctx context.Context, op operation, key string, noKey bool, extra ...[2]string) (*http.Request, error) {
	var body io.Reader
	if op.body != "" {
		body = strings.NewReader(op.body)
	}
	req, err := http.NewRequestWithContext(ctx, p.cfg.Method, p.target.String(), body)
	if err != nil {
		return nil, fmt.Errorf("building the request: %w", err)
	}
	for name, vs := range p.cfg.Header {
		for _, v := range vs {
			req.Header.Add(name, v)
		}
	}
	if req.Header.Get("Content-Type") == "" {
		if b := strings.TrimSpace(op.body); strings.HasPrefix(b, "{") || strings.HasPrefix(b, "[") {
			req.Header.Set("Content-Type", "application/json")
		}
	}
	if !noKey {
		req.Header.Set(p.cfg.KeyHeader, key)
	}
	for _, h := range extra {
		if h[0] != "" {
			req.Header.Set(h[0], h[1])
		}
	}
	return req, nil
}

// send makes one request of op with key and returns the exchange.
func (p *prober) send(ctx context.Context, op operation, key string, noKey bool, extra ...[2]string) Exchange {
	req, err := p.newRequest(ctx, op, key, noKey, extra...)
	if err != nil {
		return Exchange{Error: err.Error()}
	}
	ex := Exchange{Request: p.describeRequest(req, op.body)}
	if err := p.reserve(1); err != nil {
		ex.Error = err.Error()
		return ex
	}
	p.do(req, &ex, nil)
	return ex
}

// do sends req and fills ex's answer or error; wrote, if not nil, is
// closed once the whole request is written.
func (p *prober) do(req *http.Request, ex *Exchange, wrote chan<- struct{}) {
	if wrote != nil {
		var once sync.Once
		req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
			WroteRequest: func(httptrace.WroteRequestInfo) { once.Do(func() { close(wrote) }) },
		}))
		defer once.Do(func() { close(wrote) })
	}
	resp, err := p.client.Do(req)
	if err != nil {
		ex.Error = describeError(req.Context(), err)
		return
	}
	defer resp.Body.Close()
	// The whole body is kept (to compare answers), up to a bound.
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		ex.Error = "reading the answer: " + describeError(req.Context(), err)
		return
	}
	ex.Response = p.describeResponse(resp, b)
}

func describeError(ctx context.Context, err error) string {
	if ctx.Err() != nil && errors.Is(err, context.DeadlineExceeded) {
		return "the probe's timeout ran out"
	}
	return err.Error()
}

// --- counting the effect ---

// count reads the effect's count, and the exchange that did.
func (p *prober) count(ctx context.Context) (int64, Exchange, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.cfg.CountURL, nil)
	if err != nil {
		return 0, Exchange{}, fmt.Errorf("building the count request: %w", err)
	}
	for name, vs := range p.cfg.Header {
		if http.CanonicalHeaderKey(name) == "Content-Type" {
			continue
		}
		for _, v := range vs {
			req.Header.Add(name, v)
		}
	}
	ex := Exchange{Request: p.describeRequest(req, "")}
	if err := p.reserve(1); err != nil {
		return 0, ex, err
	}
	p.do(req, &ex, nil)
	if ex.Error != "" {
		return 0, ex, fmt.Errorf("reading the count: %s", ex.Error)
	}
	if ex.Response.Status != http.StatusOK {
		return 0, ex, fmt.Errorf("reading the count: status %d, want 200", ex.Response.Status)
	}
	n, err := parseCount(ex.Response.body)
	if err != nil {
		return 0, ex, fmt.Errorf("reading the count: %w", err)
	}
	ex.Note = fmt.Sprintf("count: %d", n)
	return n, ex, nil
}

// parseCount reads a JSON list, an object with a "data" list, or a number.
func parseCount(b []byte) (int64, error) {
	var v any
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	if err := d.Decode(&v); err != nil {
		return 0, fmt.Errorf("the answer is not JSON: %w", err)
	}
	switch v := v.(type) {
	case []any:
		return int64(len(v)), nil
	case json.Number:
		n, err := v.Int64()
		if err != nil {
			return 0, fmt.Errorf("the count %s is not an integer", v)
		}
		return n, nil
	case map[string]any:
		if l, ok := v["data"].([]any); ok {
			return int64(len(l)), nil
		}
	}
	return 0, errors.New(`the answer is neither a list, an object with a "data" list, nor a number`)
}

// counter counts the effect around one check; with no CountURL it does
// nothing.
type counter struct {
	p      *prober
	before int64
	err    error
}

func (p *prober) startCount(ctx context.Context, c *Check) *counter {
	k := &counter{p: p}
	if p.cfg.CountURL == "" {
		return k
	}
	n, ex, err := p.count(ctx)
	c.Evidence = append(c.Evidence, ex)
	k.before, k.err = n, err
	return k
}

// delta returns how much the effect grew; ok is false without a CountURL.
func (k *counter) delta(ctx context.Context, c *Check) (d int64, ok bool, err error) {
	if k.p.cfg.CountURL == "" {
		return 0, false, nil
	}
	if k.err != nil {
		return 0, false, k.err
	}
	n, ex, err := k.p.count(ctx)
	c.Evidence = append(c.Evidence, ex)
	if err != nil {
		return 0, false, err
	}
	return n - k.before, true, nil
}

// --- the checks ---

// sequentialResult is check 2 and what later checks reuse of it.
type sequentialResult struct {
	Check
	key   string
	op    operation
	first *Answer
}

func (p *prober) sequential(ctx context.Context) (sequentialResult, error) {
	r := sequentialResult{Check: Check{Number: checkSequential}, key: p.cfg.NewKey(), op: p.newOperation()}
	c := &r.Check
	k := p.startCount(ctx, c)
	first := p.send(ctx, r.op, r.key, false)
	c.Evidence = append(c.Evidence, first)
	if first.Error != "" {
		return r, fmt.Errorf("%w: %s %s: %s", ErrBaseline, p.cfg.Method, p.target.Redacted(), first.Error)
	}
	if !first.Response.success() {
		return r, fmt.Errorf("%w: %s %s with a fresh key answered %s: %s; the probe needs a request that succeeds",
			ErrBaseline, p.cfg.Method, p.target.Redacted(), first.Response.statusText(), first.Response.Body)
	}
	r.first = first.Response
	second := p.send(ctx, r.op, r.key, false)
	c.Evidence = append(c.Evidence, second)
	if second.Error != "" {
		c.errorf("the duplicate got no answer: %s", second.Error)
		return r, nil
	}
	d, counted, err := k.delta(ctx, c)
	if err != nil {
		c.errorf("%s", err)
		return r, nil
	}
	a, b := first.Response, second.Response
	if b.ID != "" && b.ID == a.ID {
		p.replays = append(p.replays, b)
	} else {
		p.noteReplay(b)
	}
	switch {
	case b.ID != "" && a.ID != "" && b.ID != a.ID:
		c.failf("the duplicate ran again: the first answer names %s, the duplicate %s", a.ID, b.ID)
	case counted && d != 1:
		c.failf("the effect grew by %d for one operation sent twice", d)
	case b.Status != a.Status:
		c.failf("the duplicate answered %s, the first %s", b.statusText(), a.statusText())
	case !sameBody(a.body, b.body):
		c.failf("the duplicate's body differs from the first's")
	case !counted && a.ID == "" && !b.replayed():
		c.passf("both answered %s with the same body (no id, Location or count tells whether it ran twice)", a.statusText())
	default:
		c.passf("the duplicate got the first answer again (%s%s)%s", a.statusText(), idNote(a), replayedNote(b))
	}
	return r, nil
}

func (p *prober) concurrent(ctx context.Context) Check {
	c := Check{Number: checkConcurrent}
	n := p.cfg.Concurrency
	key, op := p.cfg.NewKey(), p.newOperation()
	k := p.startCount(ctx, &c)
	reqs := make([]*http.Request, n)
	exs := make([]Exchange, n)
	for i := range reqs {
		req, err := p.newRequest(ctx, op, key, false)
		if err != nil {
			c.errorf("%s", err)
			return c
		}
		reqs[i], exs[i].Request = req, p.describeRequest(req, op.body)
	}
	if err := p.reserve(n); err != nil {
		c.errorf("%s", err)
		return c
	}
	// Every request waits at the gate so they leave together.
	gate := make(chan struct{})
	var wg sync.WaitGroup
	for i := range reqs {
		wg.Go(func() {
			<-gate
			p.do(reqs[i], &exs[i], nil)
		})
	}
	close(gate)
	wg.Wait()
	c.Evidence = append(c.Evidence, exs...)
	d, counted, err := k.delta(ctx, &c)
	if err != nil {
		c.errorf("%s", err)
		return c
	}
	var ok []*Answer
	ids := map[string]bool{}
	conflicts := 0
	for _, ex := range exs {
		switch {
		case ex.Error != "":
			c.errorf("a request got no answer: %s", ex.Error)
			return c
		case ex.Response.success():
			ok = append(ok, ex.Response)
			if ex.Response.ID != "" {
				ids[ex.Response.ID] = true
			}
		case ex.Response.Status == http.StatusConflict:
			conflicts++
		default:
			c.failf("a duplicate answered %s, neither the first answer nor 409", ex.Response.statusText())
			return c
		}
	}
	for _, a := range ok {
		p.noteReplay(a)
	}
	conflictNote := ""
	if conflicts > 0 {
		conflictNote = fmt.Sprintf("; %d got 409 while the first ran", conflicts)
	}
	switch {
	case len(ids) > 1:
		c.failf("%d requests with one key ran %d times: the answers name %d different ids", n, len(ids), len(ids))
	case counted && d != 1:
		c.failf("%d requests with one key made the effect grow by %d", n, d)
	case len(ok) == 0:
		c.failf("none of %d requests succeeded (%d got 409)", n, conflicts)
	case !allSame(ok):
		c.failf("the %d successful answers differ in status or body", len(ok))
	default:
		c.passf("%d at once ran once: %d answered %s%s%s", n, len(ok), ok[0].statusText(), idNote(ok[0]), conflictNote)
	}
	return c
}

func (p *prober) mismatch(ctx context.Context, seq sequentialResult) Check {
	c := Check{Number: checkMismatch}
	other, ok := p.variant(seq.op)
	if !ok {
		c.notApplicable("the request has no body to vary")
		return c
	}
	k := p.startCount(ctx, &c)
	ex := p.send(ctx, other, seq.key, false)
	c.Evidence = append(c.Evidence, ex)
	if ex.Error != "" {
		c.errorf("no answer: %s", ex.Error)
		return c
	}
	d, counted, err := k.delta(ctx, &c)
	if err != nil {
		c.errorf("%s", err)
		return c
	}
	a := ex.Response
	switch {
	case counted && d != 0:
		c.failf("the key of a completed request, sent with another body, ran again (the effect grew by %d)", d)
	case a.Status == http.StatusUnprocessableEntity:
		c.passf("answered 422 to the key of a completed request with another body")
	case a.success() && seq.first != nil && a.ID != "" && a.ID == seq.first.ID:
		c.failf("answered %s with the first request's answer: the body was not compared", a.statusText())
	case a.success():
		c.failf("answered %s: the other body ran under the same key", a.statusText())
	default:
		c.failf("answered %s, want 422", a.statusText())
	}
	return c
}

func (p *prober) missingKey(ctx context.Context) Check {
	c := Check{Number: checkMissingKey}
	k := p.startCount(ctx, &c)
	ex := p.send(ctx, p.newOperation(), "", true)
	c.Evidence = append(c.Evidence, ex)
	if ex.Error != "" {
		c.errorf("no answer: %s", ex.Error)
		return c
	}
	d, counted, err := k.delta(ctx, &c)
	if err != nil {
		c.errorf("%s", err)
		return c
	}
	switch a := ex.Response; {
	case a.success():
		c.notApplicable(fmt.Sprintf("the endpoint does not require keys: it answered %s without one", a.statusText()))
	case a.Status != http.StatusBadRequest:
		c.failf("answered %s without a key, want 400", a.statusText())
	case counted && d != 0:
		c.failf("answered 400 but the effect grew by %d", d)
	default:
		c.passf("answered 400 without a key")
	}
	return c
}

func (p *prober) malformedKey(ctx context.Context) Check {
	c := Check{Number: checkMalformedKey}
	k := p.startCount(ctx, &c)
	keys := []struct{ what, key string }{
		{fmt.Sprintf("%d characters", malformedKeyLen), strings.Repeat("k", malformedKeyLen)},
		{"a control character (tab)", "probe\t" + p.cfg.NewKey()},
	}
	var wrong []string
	for _, mk := range keys {
		ex := p.send(ctx, p.newOperation(), mk.key, false)
		c.Evidence = append(c.Evidence, ex)
		if ex.Error != "" {
			c.errorf("no answer: %s", ex.Error)
			return c
		}
		if ex.Response.Status != http.StatusBadRequest {
			wrong = append(wrong, fmt.Sprintf("a key of %s got %s", mk.what, ex.Response.statusText()))
		}
	}
	d, counted, err := k.delta(ctx, &c)
	if err != nil {
		c.errorf("%s", err)
		return c
	}
	switch {
	case len(wrong) > 0:
		c.failf("%s, want 400", strings.Join(wrong, "; "))
	case counted && d != 0:
		c.failf("answered 400 but the effect grew by %d", d)
	default:
		c.passf("a key of %d characters and one with a tab both got 400", malformedKeyLen)
	}
	return c
}

// lostResponse sends a request on a connection of its own, waits until the
// answer starts to arrive (so the work was done) and closes the connection
// without reading it, as a client whose network failed would; then it
// retries with the same key.
func (p *prober) lostResponse(ctx context.Context) Check {
	c := Check{Number: checkLostResponse}
	key, op := p.cfg.NewKey(), p.newOperation()
	k := p.startCount(ctx, &c)
	req, err := p.newRequest(ctx, op, key, false)
	if err != nil {
		c.errorf("%s", err)
		return c
	}
	lost := Exchange{Request: p.describeRequest(req, op.body)}
	if err := p.reserve(1); err != nil {
		c.errorf("%s", err)
		return c
	}
	if err := p.sendAndHangUp(ctx, req); err != nil {
		lost.Error = err.Error()
		c.Evidence = append(c.Evidence, lost)
		c.errorf("the request whose answer is lost: %s", err)
		return c
	}
	lost.Note = "answer not read: the connection was closed on purpose as it began to arrive"
	c.Evidence = append(c.Evidence, lost)
	retry := p.send(ctx, op, key, false)
	c.Evidence = append(c.Evidence, retry)
	if retry.Error != "" {
		c.errorf("the retry got no answer: %s", retry.Error)
		return c
	}
	d, counted, err := k.delta(ctx, &c)
	if err != nil {
		c.errorf("%s", err)
		return c
	}
	a := retry.Response
	p.noteReplay(a)
	switch {
	case counted && d != 1:
		c.failf("the lost request and its retry made the effect grow by %d", d)
	case !a.success():
		c.failf("the retry answered %s", a.statusText())
	case counted:
		c.passf("the retry answered %s%s and the effect grew once%s", a.statusText(), idNote(a), replayedNote(a))
	case a.replayed():
		c.passf("the retry got the first execution's answer (%s%s, Idempotent-Replayed: true)", a.statusText(), idNote(a))
	default:
		c.notApplicable("cannot tell from outside whether the retry ran again: it is not marked Idempotent-Replayed; give --count")
	}
	return c
}

// sendAndHangUp writes req on a new connection and closes it as soon as
// the first byte of the answer arrives, without reading the answer.
func (p *prober) sendAndHangUp(ctx context.Context, req *http.Request) error {
	host := p.target.Host
	if p.target.Port() == "" {
		host = net.JoinHostPort(p.target.Hostname(), map[string]string{"http": "80", "https": "443"}[p.target.Scheme])
	}
	conn, err := p.dialer.DialContext(ctx, "tcp", host)
	if err != nil {
		return fmt.Errorf("dialling: %w", err)
	}
	if p.target.Scheme == "https" {
		conn = tls.Client(conn, &tls.Config{ServerName: p.target.Hostname()})
	}
	defer conn.Close()
	if deadline, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(deadline)
	}
	req.Header.Set("Connection", "close")
	if err := req.Write(conn); err != nil {
		return fmt.Errorf("writing the request: %w", err)
	}
	var one [1]byte
	if _, err := io.ReadFull(conn, one[:]); err != nil {
		return fmt.Errorf("waiting for the answer to start: %w", err)
	}
	return nil
}

func (p *prober) transient(ctx context.Context) Check {
	c := Check{Number: checkTransient}
	if p.fault[0] == "" {
		c.notApplicable("no --fault-header given to make the endpoint fail")
		return c
	}
	key, op := p.cfg.NewKey(), p.newOperation()
	k := p.startCount(ctx, &c)
	failed := p.send(ctx, op, key, false, p.fault)
	c.Evidence = append(c.Evidence, failed)
	if failed.Error != "" {
		c.errorf("the failing request got no answer: %s", failed.Error)
		return c
	}
	if failed.Response.Status < 500 {
		c.errorf("the fault header did not make the endpoint fail: it answered %s, want a 5xx", failed.Response.statusText())
		return c
	}
	retry := p.send(ctx, op, key, false)
	c.Evidence = append(c.Evidence, retry)
	if retry.Error != "" {
		c.errorf("the retry got no answer: %s", retry.Error)
		return c
	}
	d, counted, err := k.delta(ctx, &c)
	if err != nil {
		c.errorf("%s", err)
		return c
	}
	a := retry.Response
	switch {
	case a.Status >= 500 && (a.replayed() || sameBody(a.body, failed.Response.body)):
		c.failf("the retry got the %s replayed: a transient failure was kept", failed.Response.statusText())
	case !a.success():
		c.failf("the retry answered %s, want it to run again and succeed", a.statusText())
	case a.replayed():
		c.failf("the retry answered %s marked Idempotent-Replayed after a %s", a.statusText(), failed.Response.statusText())
	case counted && d != 1:
		c.failf("the failure and its retry made the effect grow by %d, want 1", d)
	default:
		c.passf("after %s the retry ran again and answered %s%s", failed.Response.statusText(), a.statusText(), idNote(a))
	}
	return c
}

func (p *prober) inFlight(ctx context.Context) Check {
	c := Check{Number: checkInFlight}
	if p.slow[0] == "" {
		c.notApplicable("no --slow-header given to hold a request in flight")
		return c
	}
	key, op := p.cfg.NewKey(), p.newOperation()
	k := p.startCount(ctx, &c)
	slowReq, err := p.newRequest(ctx, op, key, false, p.slow)
	if err != nil {
		c.errorf("%s", err)
		return c
	}
	dupReq, err := p.newRequest(ctx, op, key, false)
	if err != nil {
		c.errorf("%s", err)
		return c
	}
	exs := []Exchange{{Request: p.describeRequest(slowReq, op.body)}, {Request: p.describeRequest(dupReq, op.body)}}
	if err := p.reserve(2); err != nil {
		c.errorf("%s", err)
		return c
	}
	wrote := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.do(slowReq, &exs[0], wrote)
	}()
	// The duplicate leaves once the slow request is on the wire and has
	// had its head start to claim the key.
	<-wrote
	headStart := time.NewTimer(p.cfg.HeadStart)
	select {
	case <-headStart.C:
	case <-ctx.Done():
	}
	headStart.Stop()
	select {
	case <-done:
		c.Evidence = append(c.Evidence, exs[0])
		c.errorf("the slow request was answered (%s) within the head start of %s: the slow header did not hold it in flight",
			answerOrError(exs[0]), p.cfg.HeadStart)
		return c
	default:
	}
	p.do(dupReq, &exs[1], nil)
	<-done
	c.Evidence = append(c.Evidence, exs...)
	d, counted, err := k.delta(ctx, &c)
	if err != nil {
		c.errorf("%s", err)
		return c
	}
	for _, ex := range exs {
		if ex.Error != "" {
			c.errorf("no answer: %s", ex.Error)
			return c
		}
	}
	first, dup := exs[0].Response, exs[1].Response
	p.noteReplay(first)
	p.noteReplay(dup)
	switch {
	case first.ID != "" && dup.ID != "" && first.ID != dup.ID:
		c.failf("the duplicate ran while the first was in flight: the answers name %s and %s", first.ID, dup.ID)
	case counted && d != 1:
		c.failf("the slow request and its duplicate made the effect grow by %d", d)
	case dup.Status == http.StatusConflict && dup.Header["Retry-After"] == "":
		c.failf("the duplicate got 409 without Retry-After")
	case dup.Status == http.StatusConflict:
		c.passf("the duplicate got 409 with Retry-After: %s while the first ran", dup.Header["Retry-After"])
	case !first.success() || !dup.success():
		c.failf("the slow request answered %s and its duplicate %s", first.statusText(), dup.statusText())
	case dup.Status != first.Status || !sameBody(first.body, dup.body):
		c.failf("the duplicate's answer (%s) differs from the first's (%s)", dup.statusText(), first.statusText())
	default:
		c.passf("the duplicate waited and got the first's answer (%s%s)", dup.statusText(), idNote(dup))
	}
	return c
}

func answerOrError(ex Exchange) string {
	if ex.Response != nil {
		return ex.Response.statusText()
	}
	return ex.Error
}

// noteReplay keeps a for check 6 if it is marked as a replay.
func (p *prober) noteReplay(a *Answer) {
	if a != nil && a.replayed() {
		p.replays = append(p.replays, a)
	}
}

func (p *prober) credentials() Check {
	c := Check{Number: checkCredentials}
	if len(p.replays) == 0 {
		c.notApplicable("no replay was seen to inspect")
		return c
	}
	for _, a := range p.replays {
		if v := a.Header["Set-Cookie"]; v != "" {
			c.failf("a replay carries Set-Cookie (%s): another client's credentials go to whoever presents the key", v)
			c.Evidence = append(c.Evidence, Exchange{Response: a})
			return c
		}
	}
	c.passf("none of %d replays carries Set-Cookie", len(p.replays))
	return c
}

// --- comparing answers ---

// sameBody compares two bodies as JSON when both are, else byte for byte.
func sameBody(a, b []byte) bool {
	if bytes.Equal(a, b) {
		return true
	}
	var va, vb any
	if json.Unmarshal(a, &va) != nil || json.Unmarshal(b, &vb) != nil {
		return false
	}
	ca, _ := json.Marshal(va)
	cb, _ := json.Marshal(vb)
	return bytes.Equal(ca, cb)
}

func allSame(as []*Answer) bool {
	for _, a := range as[1:] {
		if a.Status != as[0].Status || !sameBody(a.body, as[0].body) {
			return false
		}
	}
	return true
}

func idNote(a *Answer) string {
	if a.ID == "" {
		return ""
	}
	return ", " + a.ID
}

func replayedNote(a *Answer) string {
	if a.replayed() {
		return ", Idempotent-Replayed: true"
	}
	return ""
}
