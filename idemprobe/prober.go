package idemprobe

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

const (
	defaultConcurrency = 8
	defaultMaxRequests = 200
	defaultTimeout     = 60 * time.Second
	defaultHeadStart   = 200 * time.Millisecond
	// defaultHistoryClients is how many clients check 12 runs at once.
	defaultHistoryClients = 8
	// defaultReplayHeader marks a replay, as idem's middleware and Stripe
	// send it.
	defaultReplayHeader = "Idempotent-Replayed"
)

// prober is one run of the checks: the configuration with its defaults,
// the HTTP client, the request budget, and what a check leaves for the
// checks that read it.
type prober struct {
	cfg Config
	// table is every check of this run, the Config's cases included, in
	// the report's order; order is the order they run in.
	table     []check
	order     []int
	server    *http.Server  // serving Config.Handler, or nil
	served    chan struct{} // closed when server's Serve has returned
	target    *url.URL
	client    *http.Client
	transport *http.Transport
	dialer    *net.Dialer
	fault     [2]string // name, value; empty name: none
	slow      [2]string
	other     [2]string // OtherHeader
	revocable [2]string // RevocableHeader
	revoke    *url.URL  // Revoke's URL, and its method
	revokeBy  string
	secret    map[string]bool
	sent      atomic.Int64
	ops       atomic.Int64

	// completed is the operation check 2 completed with its key, which
	// check 3 sends again with another body.
	completed completedOperation
	// replays are the answers marked or seen as replays, in any check, for
	// check 6. Only Run's goroutine appends.
	replays []*Answer
	// baselineFailed says that the endpoint accepted none of the baseline's
	// attempts: the checks that need a request it accepts do not run.
	baselineFailed bool
	// failures are the 5xx answers met on the way, in any check but when
	// the probe caused them with FaultHeader, one per key, for check 7 to
	// judge by a retry with the key. failuresMu guards it, since check 1
	// sends at once.
	failuresMu sync.Mutex
	failures   []*metFailure
}

// metFailure is a 5xx met on the way, with what the probe needs to retry
// it; then the retry with its key, and what a fresh key got meanwhile, if
// one was sent to tell a key's stuck failure from the endpoint's.
type metFailure struct {
	key    string
	op     operation
	failed Exchange
	retry  *Exchange
	fresh  *Exchange
}

// noteFailure keeps ex, sent with key, if it is a 5xx and the first met
// under that key.
func (p *prober) noteFailure(key string, op operation, ex Exchange) {
	if ex.Response == nil || ex.Response.Status < 500 || key == "" {
		return
	}
	p.failuresMu.Lock()
	defer p.failuresMu.Unlock()
	for _, f := range p.failures {
		if f.key == key {
			return
		}
	}
	p.failures = append(p.failures, &metFailure{key: key, op: op, failed: ex})
}

// failureOf is the failure met under key, or nil.
func (p *prober) failureOf(key string) *metFailure {
	p.failuresMu.Lock()
	defer p.failuresMu.Unlock()
	for _, f := range p.failures {
		if f.key == key {
			return f
		}
	}
	return nil
}

// completedOperation is an operation that ran and was answered under key.
type completedOperation struct {
	key    string
	op     operation
	answer *Answer
}

// newProber fills in c's defaults and refuses, before anything is sent, a
// Config that cannot be probed with or a target that is not loopback;
// then it starts serving Config.Handler, if there is one.
func newProber(ctx context.Context, c *Config) (*prober, error) {
	if c == nil {
		return nil, fmt.Errorf("%w: no Config", ErrInvalidConfig)
	}
	cfg := *c
	if cfg.Method == "" {
		cfg.Method = http.MethodPost
	}
	if cfg.KeyHeader == "" {
		cfg.KeyHeader = "Idempotency-Key"
	}
	if cfg.ReplayHeader == "" {
		cfg.ReplayHeader = defaultReplayHeader
	}
	if cfg.Concurrency == 0 {
		cfg.Concurrency = defaultConcurrency
	}
	if cfg.MaxRequests == 0 {
		// The history's requests (and its two count reads) come on top of
		// the other checks', so that asking for one starves none of them.
		cfg.MaxRequests = defaultMaxRequests
		if cfg.History > 0 {
			cfg.MaxRequests += cfg.History + 2
		}
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
	if cfg.HistoryKeys == 0 {
		cfg.HistoryKeys = max(cfg.History/4, 1)
	}
	if cfg.HistoryClients == 0 {
		cfg.HistoryClients = defaultHistoryClients
	}
	if cfg.HistorySeed == 0 {
		var b [8]byte
		_, _ = rand.Read(b[:]) // never fails (crypto/rand)
		cfg.HistorySeed = binary.LittleEndian.Uint64(b[:]) | 1
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
	case cfg.TTL < 0:
		return nil, fmt.Errorf("%w: the TTL must be positive, got %s", ErrInvalidConfig, cfg.TTL)
	case cfg.TTL > 0 && cfg.TTL+expiryGrace(cfg.TTL) >= cfg.Timeout:
		// Check 11 waits the TTL out: it must fit in the probe's time.
		return nil, fmt.Errorf("%w: a TTL of %s and its grace of %s do not fit in the timeout of %s",
			ErrInvalidConfig, cfg.TTL, expiryGrace(cfg.TTL), cfg.Timeout)
	case cfg.History < 0 || cfg.HistoryKeys < 1 || cfg.HistoryClients < 1:
		return nil, fmt.Errorf("%w: the history needs a positive length, keys and clients, got %d, %d and %d",
			ErrInvalidConfig, cfg.History, cfg.HistoryKeys, cfg.HistoryClients)
	case (cfg.RevocableHeader == "") != (cfg.Revoke == ""):
		return nil, fmt.Errorf("%w: a revocable credential and the request that revokes it go together", ErrInvalidConfig)
	}
	for _, h := range [][2]string{{"key header", cfg.KeyHeader}, {"replay header", cfg.ReplayHeader}} {
		if !validHeaderName(h[1]) {
			return nil, fmt.Errorf("%w: the %s %q is not a header name", ErrInvalidConfig, h[0], h[1])
		}
	}
	cfg.ReplayHeader = http.CanonicalHeaderKey(cfg.ReplayHeader)
	// With a Handler the URLs are paths on it, made absolute once it is
	// served; without one they are absolute already.
	parse := parseTarget
	if cfg.Handler != nil {
		parse = parsePath
		if cfg.URL == "" {
			cfg.URL = "/"
		}
	}
	target, err := parse("URL", cfg.URL)
	if err != nil {
		return nil, err
	}
	urls := []*url.URL{target}
	var count *url.URL
	if cfg.CountURL != "" {
		if count, err = parse("count URL", cfg.CountURL); err != nil {
			return nil, err
		}
		urls = append(urls, count)
	}
	var revoke *url.URL
	revokeBy := ""
	if cfg.Revoke != "" {
		method, raw, ok := strings.Cut(strings.TrimSpace(cfg.Revoke), " ")
		if !ok || method == "" || strings.ToUpper(method) != method {
			return nil, fmt.Errorf("%w: the revoke request %q is not of the form 'METHOD URL'", ErrInvalidConfig, cfg.Revoke)
		}
		if revoke, err = parse("revoke URL", strings.TrimSpace(raw)); err != nil {
			return nil, err
		}
		revokeBy = method
		urls = append(urls, revoke)
	}
	p := &prober{cfg: cfg, target: target, revoke: revoke, revokeBy: revokeBy, secret: map[string]bool{
		"Authorization": true, "Proxy-Authorization": true, "Cookie": true,
	}}
	for _, h := range cfg.SecretHeaders {
		p.secret[http.CanonicalHeaderKey(strings.TrimSpace(h))] = true
	}
	for _, f := range []struct {
		flag string
		v    string
		dst  *[2]string
	}{
		{"fault header", cfg.FaultHeader, &p.fault}, {"slow header", cfg.SlowHeader, &p.slow},
		{"other credential", cfg.OtherHeader, &p.other}, {"revocable credential", cfg.RevocableHeader, &p.revocable},
	} {
		if f.v == "" {
			continue
		}
		name, value, err := ParseHeader(f.v)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %w", ErrInvalidConfig, f.flag, err)
		}
		*f.dst = [2]string{name, value}
	}
	// The other credentials are shown as little as the main one.
	for _, h := range [][2]string{p.other, p.revocable} {
		if h[0] != "" {
			p.secret[h[0]] = true
		}
	}
	if p.table, p.order, err = checkTable(cfg.Cases); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	for _, c := range cfg.Cases {
		for i, s := range c.Steps {
			if s.Copies > cfg.MaxRequests {
				// Not built to be refused by the budget: a step's copies
				// are made before they are sent.
				return nil, fmt.Errorf("%w: case %q: step %d: Copies %d exceed the request budget of %d",
					ErrInvalidConfig, c.Name, i+1, s.Copies, cfg.MaxRequests)
			}
		}
	}
	if cfg.Handler != nil {
		// Served on loopback, by construction. Not on an httptest.Server,
		// whose Close waits for every handler however long it runs: a
		// handler that never returns would keep Run past its Timeout.
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("serving the handler: %w", err)
		}
		p.server = &http.Server{Handler: cfg.Handler}
		p.served = make(chan struct{})
		go func() {
			defer close(p.served)
			_ = p.server.Serve(ln) // ErrServerClosed once close begins
		}()
		for _, u := range urls {
			u.Scheme, u.Host = "http", ln.Addr().String()
		}
		if count != nil {
			p.cfg.CountURL = count.String()
		}
	} else if !cfg.AllowRemote {
		for _, u := range urls {
			if err := requireLoopback(ctx, u.Hostname()); err != nil {
				return nil, err
			}
		}
	}
	p.setUpClient()
	return p, nil
}

// close ends what the probe started: its idle connections, and the
// server of Config.Handler, once the handlers it runs have returned (a
// request whose answer the probe lost on purpose may still be running)
// or ctx, the probe's own time, has ended. A handler still running then
// is left to end by itself: its connection is closed, and Run returns.
func (p *prober) close(ctx context.Context) {
	p.transport.CloseIdleConnections()
	if p.server == nil {
		return
	}
	if err := p.server.Shutdown(ctx); err != nil {
		_ = p.server.Close()
	}
	<-p.served
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

// parsePath parses a URL that is a path on Config.Handler.
func parsePath(what, raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("%w: the %s does not parse: %w", ErrInvalidConfig, what, err)
	}
	if u.Scheme != "" || u.Host != "" || !strings.HasPrefix(u.Path, "/") {
		return nil, fmt.Errorf("%w: with a Handler, the %s %q must be a path on it, starting with /", ErrInvalidConfig, what, u.Redacted())
	}
	return u, nil
}

// validHeaderName reports whether name is an HTTP header name (a token).
func validHeaderName(name string) bool {
	if name == "" {
		return false
	}
	for _, r := range name {
		if r > 0x7e || r <= ' ' || strings.ContainsRune(`"(),/:;<=>?@[\]{}`, r) {
			return false
		}
	}
	return true
}

// validHeaderValue reports whether v can be sent as a header's value: no
// control character but a tab.
func validHeaderValue(v string) bool {
	for _, r := range v {
		if (r < ' ' && r != '\t') || r == 0x7f {
			return false
		}
	}
	return true
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
