package bench

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
)

// Options configures Run. The zero value of every field means its default;
// a store whose URL is empty is not measured.
type Options struct {
	// PostgresURL is the PostgreSQL to measure, e.g.
	// postgres://postgres@127.0.0.1:5432/test. A schema of its own is
	// created and dropped.
	PostgresURL string
	// RedisURL is the Redis to measure, e.g. redis://127.0.0.1:6379/0. Its
	// keys live under a prefix of their own and are deleted afterwards.
	RedisURL string
	// Requests is the number of requests per side and round of first
	// executions. Defaults to 2000.
	Requests int
	// ReplayRequests is the number of requests per side and round of
	// replays. Defaults to ten times Requests: a replay takes a tenth of a
	// first execution's time or less, and a round of a few dozen
	// milliseconds measures the machine's pauses more than the replays.
	ReplayRequests int
	// Rounds is how many times the sides alternate, in turned order (A B,
	// B A, ...); the median round counts. Defaults to 5.
	Rounds int
	// Concurrency is the number of requests in flight. Defaults to 8.
	Concurrency int
	// SlowHandler is how long the handler of the "slow" case waits before
	// its writes (a validation, a call to another service): each round of
	// that case is Concurrency first executions at once, on both sides,
	// and its figure is the round's wall time, which a store that let one
	// request's wait hold up the others' writes would multiply by up to
	// Concurrency. Measured on PostgreSQL and SQLite. Defaults to 100ms;
	// negative skips the case.
	SlowHandler time.Duration
	// SQLite measures SQLite too, on a file in a temporary directory. With
	// neither URL, SQLite alone is measured whatever it says.
	SQLite bool
	// Sealed measures the middleware with keys and answers kept out of the
	// store's plain sight: Config.KeySecret and Config.BodyKeys set, so
	// each key is sealed (an HMAC) and each kept body encrypted (AES-GCM).
	// Its RESULT lines are named idem-http-sealed-<store>-<case>. Defaults
	// to false.
	Sealed bool
	// StoreReplays measures the middleware with idemhttp's
	// Config.MemoryReplayFor off, so that every replay reads the store
	// rather than the answer this process kept in memory after the
	// completion. Its RESULT lines are named
	// idem-http-storereplays-<store>-<case>. Defaults to false.
	StoreReplays bool
	// GRPC measures idemgrpc's interceptor too, on SQLite and PostgreSQL,
	// against a hand-written interceptor (see grpc.go). Its RESULT lines
	// are idem-grpc-<store>-<case> and minimum-grpc-<store>-<case>
	// (idem-grpc-storereplays-… with StoreReplays; Sealed applies to HTTP
	// alone). Defaults to false.
	GRPC bool
	// Side, when "middleware" or "minimum", measures that side alone (for
	// a CPU profile of it); the comparisons then have no ratio. Defaults
	// to both.
	Side string
	// Out receives progress. Defaults to io.Discard.
	Out io.Writer
	// Results receives every round's figures as lines
	// RESULT,<name>,<metric>,<value>,<unit>: idem-http-<store>-<case> and
	// minimum-http-<store>-<case>, metrics req_per_s and p99_ms. Defaults to
	// io.Discard.
	Results io.Writer
}

// Result is one side's figures: the median round.
type Result struct {
	Requests  int
	Elapsed   time.Duration
	PerSecond float64
	P50, P99  time.Duration
	// CPUPerRequest is the CPU time this process spent per request
	// (user and system, every goroutine's, the runtime's included): the
	// client's share of the work, the server's excluded. On a machine whose
	// cores the server shares, it tells whether a gap in the rate is the
	// client's work or the server's.
	CPUPerRequest time.Duration
	// MachineCPUPerRequest is the whole machine's busy CPU time per
	// request (Linux's /proc/stat; zero elsewhere): with the server on the
	// same machine, the client's work and the server's together.
	MachineCPUPerRequest time.Duration
	roundRates           []float64
}

// Comparison is the middleware against the hand-written minimum for one
// store and case.
type Comparison struct {
	Protocol   string // "http" or "grpc"
	Store      string // "redis", "postgres" or "sqlite"
	Case       string // "first", "replay" or "slow"
	Middleware Result
	Minimum    Result
	// Ratio is the median of the rounds' ratios, each the middleware's
	// rate over the minimum's in the same round (the two ran back to
	// back). Middleware and Minimum are each side's median round.
	Ratio float64
}

// side is one thing being measured: do serves request i of a round.
type side struct {
	name  string
	setup func(ctx context.Context, round int) error
	do    func(ctx context.Context, round, i int) error
}

// Run measures every store that has a URL and returns the comparisons.
func Run(ctx context.Context, opts *Options) ([]Comparison, error) {
	o := Options{}
	if opts != nil {
		o = *opts
	}
	if o.Requests <= 0 {
		o.Requests = 2000
	}
	if o.ReplayRequests <= 0 {
		o.ReplayRequests = 10 * o.Requests
	}
	if o.Rounds <= 0 {
		o.Rounds = 5
	}
	if o.Concurrency <= 0 {
		o.Concurrency = 8
	}
	if o.SlowHandler == 0 {
		o.SlowHandler = 100 * time.Millisecond
	}
	if o.Out == nil {
		o.Out = io.Discard
	}
	if o.Results == nil {
		o.Results = io.Discard
	}
	if o.PostgresURL == "" && o.RedisURL == "" {
		o.SQLite = true
	}
	var out []Comparison
	if o.RedisURL != "" {
		cs, err := runRedis(ctx, &o)
		if err != nil {
			return out, err
		}
		out = append(out, cs...)
	}
	if o.PostgresURL != "" {
		cs, err := runPostgres(ctx, &o)
		if err != nil {
			return out, err
		}
		out = append(out, cs...)
	}
	if o.SQLite {
		cs, err := runSQLite(ctx, &o)
		if err != nil {
			return out, err
		}
		out = append(out, cs...)
	}
	return out, nil
}

// middlewareConfig is the middleware every store is measured with.
func (o *Options) middlewareConfig(store idem.Store) *idemhttp.Config {
	c := &idemhttp.Config{SharedScope: true, Store: store, TTL: benchTTL}
	if o.Sealed {
		// Fixed secrets: a benchmark's keys protect nothing.
		c.KeySecret = []byte("idem bench key secret, not secret")
		c.BodyKeys = []idemhttp.BodyKey{{ID: "bench", Key: []byte("idem bench body key, 32 bytes...")}}
	}
	if o.StoreReplays {
		c.MemoryReplayFor = -1
	}
	return c
}

// compare alternates rounds of the middleware and the minimum.
func compare(ctx context.Context, o *Options, store, kase string, mw, min side) (Comparison, error) {
	return compareProto(ctx, o, "http", store, kase, mw, min)
}

// compareProto is compare for protocol's middleware ("http", "grpc").
func compareProto(ctx context.Context, o *Options, protocol, store, kase string, mw, min side) (Comparison, error) {
	n := o.Requests
	switch kase {
	case "replay":
		n = o.ReplayRequests
	case "slow":
		n = o.Concurrency // one round: that many first executions at once
	}
	fmt.Fprintf(o.Out, "%s %s %s: %d rounds of %d requests, %d in flight\n", protocol, store, kase, o.Rounds, n, o.Concurrency)
	var mwRounds, minRounds []Result
	for r := 0; r < o.Rounds; r++ {
		type turn struct {
			side side
			dst  *[]Result
		}
		// The order turns every round (A B, B A, ...): a side that ran
		// second each time would meet a warmer cache, or a longer WAL,
		// every time.
		turns := []turn{{min, &minRounds}, {mw, &mwRounds}}
		if r%2 == 1 {
			turns[0], turns[1] = turns[1], turns[0]
		}
		for _, s := range turns {
			if o.Side != "" && o.Side != s.side.name {
				continue // measured alone: see Options.Side
			}
			if s.side.setup != nil {
				if err := s.side.setup(ctx, r); err != nil {
					return Comparison{}, fmt.Errorf("%s %s %s: setup: %w", store, kase, s.side.name, err)
				}
			}
			res, err := measure(ctx, o, n, r, s.side)
			if err != nil {
				return Comparison{}, fmt.Errorf("%s %s %s: %w", store, kase, s.side.name, err)
			}
			fmt.Fprintf(o.Out, "  round %d %-10s %8.0f req/s  p50 %-9s p99 %-9s cpu %s/req, machine %s/req\n", r+1, s.side.name, res.PerSecond, round(res.P50), round(res.P99), round(res.CPUPerRequest), round(res.MachineCPUPerRequest))
			name := "idem-" + protocol + "-"
			if o.Sealed && protocol == "http" {
				name += "sealed-"
			}
			if o.StoreReplays {
				name += "storereplays-"
			}
			name += resultStore(store) + "-" + kase
			if s.side.name == "minimum" {
				name = "minimum-" + protocol + "-" + resultStore(store) + "-" + kase
			}
			fmt.Fprintf(o.Results, "RESULT,%s,req_per_s,%.1f,req/s\n", name, res.PerSecond)
			fmt.Fprintf(o.Results, "RESULT,%s,p99_ms,%.3f,ms\n", name, float64(res.P99.Microseconds())/1000)
			fmt.Fprintf(o.Results, "RESULT,%s,cpu_us_per_req,%.1f,us\n", name, float64(res.CPUPerRequest.Nanoseconds())/1000)
			if kase == "slow" {
				fmt.Fprintf(o.Results, "RESULT,%s,round_ms,%.1f,ms\n", name, float64(res.Elapsed.Microseconds())/1000)
			}
			*s.dst = append(*s.dst, res)
		}
	}
	c := Comparison{Protocol: protocol, Store: store, Case: kase}
	if len(mwRounds) > 0 {
		c.Middleware = median(mwRounds)
	}
	if len(minRounds) > 0 {
		c.Minimum = median(minRounds)
	}
	if len(mwRounds) > 0 && len(minRounds) > 0 {
		c.Ratio = pairedRatio(mwRounds, minRounds)
	}
	return c, nil
}

// pairedRatio is the median, over the rounds, of the middleware's rate
// over the minimum's in the same round. Each pair ran back to back, so a
// slowdown of the shared machine that lasts a few seconds moves one pair's
// ratio, not the median; the ratio of the two sides' median rounds would
// compare rounds run a minute apart.
func pairedRatio(mw, min []Result) float64 {
	ratios := make([]float64, len(mw))
	for i := range mw {
		ratios[i] = mw[i].PerSecond / min[i].PerSecond
	}
	slices.Sort(ratios)
	if n := len(ratios); n%2 == 0 {
		return (ratios[n/2-1] + ratios[n/2]) / 2
	}
	return ratios[len(ratios)/2]
}

// resultStore is a store's name in RESULT lines.
func resultStore(store string) string {
	if store == "postgres" {
		return "pg"
	}
	return store
}

// measure serves n requests of s in round, o.Concurrency at a time.
func measure(ctx context.Context, o *Options, n, round int, s side) (Result, error) {
	lat := make([]time.Duration, n)
	var next atomic.Int64
	var firstErr error
	var errOnce sync.Once
	var wg sync.WaitGroup
	cpu0, mcpu0 := processCPU(), machineCPU()
	start := time.Now()
	// Labelled so that a CPU profile (--cpuprofile) tells the sides apart:
	// go tool pprof -tagfocus side=middleware.
	labels := pprof.Labels("side", s.name)
	for w := 0; w < o.Concurrency; w++ {
		wg.Go(func() {
			pprof.SetGoroutineLabels(pprof.WithLabels(ctx, labels))
			for {
				i := int(next.Add(1)) - 1
				if i >= n || ctx.Err() != nil {
					return
				}
				t0 := time.Now()
				if err := s.do(ctx, round, i); err != nil {
					errOnce.Do(func() { firstErr = err })
					return
				}
				lat[i] = time.Since(t0)
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	cpu, mcpu := processCPU()-cpu0, machineCPU()-mcpu0
	if firstErr != nil {
		return Result{}, firstErr
	}
	if err := ctx.Err(); err != nil {
		return Result{}, err
	}
	slices.Sort(lat)
	return Result{
		Requests:  n,
		Elapsed:   elapsed,
		PerSecond: float64(n) / elapsed.Seconds(),
		P50:       lat[len(lat)/2],
		P99:       lat[len(lat)*99/100],

		CPUPerRequest:        cpu / time.Duration(n),
		MachineCPUPerRequest: mcpu / time.Duration(n),
	}, nil
}

func median(rs []Result) Result {
	s := slices.Clone(rs)
	slices.SortFunc(s, func(a, b Result) int {
		switch {
		case a.PerSecond < b.PerSecond:
			return -1
		case a.PerSecond > b.PerSecond:
			return 1
		}
		return 0
	})
	m := s[len(s)/2]
	for _, r := range rs {
		m.roundRates = append(m.roundRates, r.PerSecond)
	}
	return m
}

func round(d time.Duration) time.Duration {
	switch {
	case d > time.Millisecond:
		return d.Round(10 * time.Microsecond)
	default:
		return d.Round(time.Microsecond)
	}
}

// Print writes the comparisons as a table.
func Print(w io.Writer, cs []Comparison) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "protocol\tstore\tcase\tmiddleware req/s\tp50\tp99\tcpu/req\tminimum req/s\tp50\tp99\tcpu/req\tratio\t")
	side := func(r Result) string {
		if r.PerSecond == 0 {
			return "-\t-\t-\t-"
		}
		return fmt.Sprintf("%.0f\t%s\t%s\t%s", r.PerSecond, round(r.P50), round(r.P99), round(r.CPUPerRequest))
	}
	for _, c := range cs {
		ratio := "-"
		if c.Ratio > 0 {
			ratio = fmt.Sprintf("%.2fx", c.Ratio)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t\n", cmp.Or(c.Protocol, "http"), c.Store, c.Case, side(c.Middleware), side(c.Minimum), ratio)
	}
	tw.Flush()
}

// serve runs one request through h in-process and checks the status.
func serve(h http.Handler, key, body string, want int) error {
	req := httptest.NewRequest(http.MethodPost, "/v1/payments", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(idemhttp.HeaderKey, key)
	rr := httptest.NewRecorder()
	h.ServeHTTP(rr, req)
	if rr.Code != want {
		return fmt.Errorf("status %d, want %d: %s", rr.Code, want, rr.Body.String())
	}
	return nil
}

// answer is the trivial handler's response, written by both sides.
const answer = `{"id":"pay_bench","status":"succeeded"}`

func writeAnswer(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	io.WriteString(w, answer)
}

func randomID() string {
	var b [6]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// paymentBody is what both sides of the PostgreSQL and SQLite measurements
// are sent.
const paymentBody = `{"account_id":"acct_1","amount":1,"currency":"KRW"}`

// servePayment serves one payment through h in-process, its account in the
// request's context, and checks that it was created.
func servePayment(ctx context.Context, h http.Handler, key string, acct int) error {
	return serveSlowPayment(ctx, h, key, acct, 0)
}

// serveSlowPayment is servePayment for a handler that waits wait before
// its writes (see waitBeforeWrites).
func serveSlowPayment(ctx context.Context, h http.Handler, key string, acct int, wait time.Duration) error {
	ctx = context.WithValue(ctx, accountKey{}, acct)
	if wait > 0 {
		ctx = context.WithValue(ctx, waitKey{}, wait)
	}
	req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/v1/payments", strings.NewReader(paymentBody))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(idemhttp.HeaderKey, key)
	rr := httptest.NewRecorder()
	h.ServeHTTP(rr, req)
	if rr.Code != http.StatusCreated {
		return fmt.Errorf("status %d: %s", rr.Code, rr.Body.String())
	}
	return nil
}

type waitKey struct{}

// waitBeforeWrites is what a handler of the "slow" case does before its
// transaction: it waits as long as serveSlowPayment asked, as a handler
// that calls another service first would.
func waitBeforeWrites(ctx context.Context) {
	if d, _ := ctx.Value(waitKey{}).(time.Duration); d > 0 {
		time.Sleep(d)
	}
}

// slowSides are the two sides of the "slow" case: each round, o.Concurrency
// first executions at once, each handler waiting o.SlowHandler before its
// writes.
func slowSides(o *Options, accounts int, mw, min http.Handler) (side, side) {
	serve := func(h http.Handler, prefix string) func(ctx context.Context, round, i int) error {
		return func(ctx context.Context, round, i int) error {
			return serveSlowPayment(ctx, h, fmt.Sprintf("%s-%d-%d", prefix, round, i), i%accounts, o.SlowHandler)
		}
	}
	return side{name: "middleware", do: serve(mw, "slow")}, side{name: "minimum", do: serve(min, "min-slow")}
}
