package torture

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/idem-go/idem/cmd/idem/internal/localserver"
	"github.com/idem-go/idem/cmd/idem/internal/startwatch"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConfigRefusesBadInput(t *testing.T) {
	t.Parallel()
	for name, c := range map[string]*Config{
		"nil":               nil,
		"no executable":     {},
		"negative payments": {Executable: "idem", Payments: -1},
		"every answer lost": {Executable: "idem", DropRate: 1},
		"negative timeout":  {Executable: "idem", Timeout: -1},
		"mysql":             {Executable: "idem", DB: "mysql://x"},
		"keys not redis":    {Executable: "idem", Keys: "memcached://x"},
		// Only a server the run started itself is ever restarted.
		"restarts of a shared store": {Executable: "idem", DB: "postgres://u@h/db", Keys: "redis://h/0", RestartStoresEvery: time.Second},
		"restarts on SQLite":         {Executable: "idem", RestartStoresEvery: time.Second},
		"negative restarts":          {Executable: "idem", DB: Private, RestartStoresEvery: -time.Second},
	} {
		if rep, err := Run(t.Context(), c); err == nil || rep != nil {
			t.Errorf("%s: Run = %v, %v; want an error", name, rep, err)
		}
	}
}

func TestConfigDefaults(t *testing.T) {
	t.Parallel()
	c, err := (&Config{Executable: "idem", DropRate: -1, KillEvery: -1}).withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if c.Payments != DefaultPayments || c.Dups != DefaultDups || c.Replicas != DefaultReplicas ||
		c.DropRate != 0 || c.KillEvery != -1 || c.Timeout != DefaultTimeout || c.Seed == 0 {
		t.Errorf("defaults: %+v", c)
	}
}

// TestFaultProxy checks that a dropped answer is one the replica gave: the
// effect happened, and the client saw nothing.
func TestFaultProxy(t *testing.T) {
	t.Parallel()
	var served atomic.Int64
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served.Add(1)
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("Idem-Seen-Key", r.Header.Get("Idempotency-Key"))
		w.WriteHeader(http.StatusCreated)
		w.Write(b)
	}))
	defer upstream.Close()
	var drop atomic.Bool
	p, err := newFaultProxy(func(string) bool { return drop.Load() })
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	send := func() (*http.Response, string, error) {
		// As the run sends them: with a strings.Reader, net/http would
		// resend the dropped request by itself, on a kept-alive connection.
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, p.url()+"/v1/payments", oneShot([]byte(`{"a":1}`)))
		req.ContentLength = 7
		req.Header.Set("Idempotency-Key", "k1")
		resp, err := client.Do(req)
		if err != nil {
			return nil, "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b), nil
	}

	if resp, _, err := send(); err != nil || resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("with no replica: %v, %v; want 502", resp, err)
	}
	p.setUpstream(upstream.URL)
	resp, body, err := send()
	if err != nil || resp.StatusCode != http.StatusCreated || body != `{"a":1}` || resp.Header.Get("Idem-Seen-Key") != "k1" {
		t.Fatalf("forwarded: %v %q %v", resp, body, err)
	}
	drop.Store(true)
	if resp, _, err := send(); err == nil {
		t.Fatalf("dropped: got an answer %d", resp.StatusCode)
	}
	if served.Load() != 2 || p.dropped.Load() != 1 || p.forwarded.Load() != 2 {
		t.Errorf("replica served %d, proxy forwarded %d and dropped %d; want 2, 2, 1", served.Load(), p.forwarded.Load(), p.dropped.Load())
	}
}

// A fault proxy tells its replica of each try asking for a crash after
// its charge it forwards, before sending it, and that the replica answered
// it once it did: a replica that dies holding such a try dies of the
// run's order, and one that answered it did not.
func TestFaultProxyTellsTheCrashTries(t *testing.T) {
	t.Parallel()
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Idem-Seen") == "die" {
			// Dies holding the try: no answer.
			if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
				conn.Close()
			}
			return
		}
		w.WriteHeader(http.StatusPaymentRequired)
	}))
	defer upstream.Close()
	p, err := newFaultProxy(func(string) bool { return false })
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	rp := &replica{lives: 1, base: upstream.URL}
	p.onCrashTry(rp.crashTry)
	p.setUpstream(upstream.URL)
	send := func(fault, seen string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, p.url()+"/v1/payments", oneShot([]byte(`{}`)))
		req.ContentLength = 2
		if fault != "" {
			req.Header.Set("Idem-Fault", fault)
		}
		req.Header.Set("Idem-Seen", seen)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	send("", "die")
	send(faultCrashAfterCharge, "answer")
	if rp.crashAsked() {
		t.Fatalf("a replica that died holding no crash try, or answered the one it got: asked for a crash; want not")
	}
	send(faultCrashAfterCharge, "die")
	if !rp.crashAsked() {
		t.Fatalf("a replica that died holding a try asking for a crash after its charge: not asked for it; want asked")
	}
	rp.lives++ // started again
	if rp.crashAsked() {
		t.Errorf("the replica started again after the crash: asked for a crash; want its new life not")
	}
}

func TestCheckLoopback(t *testing.T) {
	t.Parallel()
	for base, ok := range map[string]bool{
		"http://127.0.0.1:8080": true,
		"http://[::1]:8080":     true,
		"http://localhost:1":    true,
		"http://10.0.0.1:8080":  false,
		"http://example.com:80": false,
	} {
		if err := checkLoopback(base); (err == nil) != ok {
			t.Errorf("checkLoopback(%s) = %v", base, err)
		}
	}
}

// The store proxy finds COMMIT's answer in PostgreSQL's protocol, and only
// it: not another command's, not a COMMIT inside a longer tag.
func TestAnswersCommit(t *testing.T) {
	t.Parallel()
	commandComplete := func(tag string) []byte {
		b := []byte{'C', 0, 0, 0, byte(4 + len(tag) + 1)}
		return append(append(b, tag...), 0)
	}
	ready := []byte{'Z', 0, 0, 0, 5, 'I'}
	for name, tc := range map[string]struct {
		chunk []byte
		want  bool
	}{
		"commit":             {append(commandComplete("COMMIT"), ready...), true},
		"after an update":    {append(append(commandComplete("UPDATE 1"), commandComplete("COMMIT")...), ready...), true},
		"insert":             {append(commandComplete("INSERT 0 1"), ready...), false},
		"rollback":           {append(commandComplete("ROLLBACK"), ready...), false},
		"commit in a string": {[]byte("D\x00\x00\x00\x10COMMIT"), false},
	} {
		if got, _ := answersCommit(nil, tc.chunk); got != tc.want {
			t.Errorf("%s: answersCommit = %v, want %v", name, got, tc.want)
		}
		// The same bytes in two reads, split anywhere: the answer is
		// found in the read that completes it, and only there.
		end := bytes.Index(tc.chunk, commandComplete("COMMIT")) + len(commandComplete("COMMIT"))
		for cut := range len(tc.chunk) + 1 {
			first, tail := answersCommit(nil, tc.chunk[:cut])
			second, _ := answersCommit(tail, tc.chunk[cut:])
			if first != (tc.want && cut >= end) || second != (tc.want && cut < end) {
				t.Errorf("%s split after %d bytes: found in the first read %v, in the second %v; want it in the read that completes it (%v)", name, cut, first, second, tc.want)
			}
		}
	}
}

// A fault the run orders happens on a connection still in its grace, where
// no rate ever reaches: a reset on the next chunk, a cut on the next
// COMMIT's answer (and on no other answer).
func TestStoreProxyForcedFaults(t *testing.T) {
	t.Parallel()
	// The store: answers each read with a PostgreSQL CommandComplete, for
	// COMMIT when the client sent "commit", for INSERT otherwise.
	ln := listenLoopback(t, func(c net.Conn) {
		buf := make([]byte, 64)
		for {
			n, err := c.Read(buf)
			if err != nil {
				return
			}
			tag := "INSERT 0 1"
			if string(buf[:n]) == "commit" {
				tag = "COMMIT"
			}
			c.Write(append(append([]byte{'C', 0, 0, 0, byte(4 + len(tag) + 1)}, tag...), 0))
		}
	})
	p, err := newStoreProxy(ln.Addr().String(), StoreFaults{ResetRate: 1e-9, CommitCutRate: 1e-9}, true, newLockedRand(1))
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	p.armed.Store(true)

	dial := func() net.Conn {
		c, err := net.Dial("tcp", p.addr())
		if err != nil {
			t.Fatal(err)
		}
		c.SetDeadline(time.Now().Add(10 * time.Second))
		return c
	}
	// roundTrip reports whether msg got its answer.
	roundTrip := func(c net.Conn, msg string) bool {
		if _, err := c.Write([]byte(msg)); err != nil {
			return false
		}
		_, err := c.Read(make([]byte, 64))
		return err == nil
	}
	stop := make(chan struct{})
	defer close(stop)

	c := dial()
	defer c.Close()
	if !roundTrip(c, "insert") || !roundTrip(c, "commit") {
		t.Fatal("a young connection met a fault nobody ordered")
	}
	done := make(chan struct{})
	go func() { p.force(false, nil, stop); close(done) }()
	for p.resets.Load() == 0 && roundTrip(c, "insert") {
	}
	<-done
	if p.resets.Load() != 1 || roundTrip(c, "insert") {
		t.Fatalf("after an ordered reset: %d resets, and the connection still answers", p.resets.Load())
	}

	c = dial()
	defer c.Close()
	done = make(chan struct{})
	placed := make(chan struct{})
	var carried bool
	go func() { carried = p.force(true, func() { close(placed) }, stop); close(done) }()
	<-placed
	if !p.forceCut.Load() {
		t.Fatal("a COMMIT cut said to stand before its order did")
	}
	if !roundTrip(c, "insert") || !roundTrip(c, "insert") || p.cuts.Load() != 0 {
		t.Fatalf("an ordered cut fell on an answer other than COMMIT's (%d cuts)", p.cuts.Load())
	}
	if roundTrip(c, "commit") {
		t.Fatal("COMMIT's answer came through an ordered cut")
	}
	<-done
	if !carried {
		t.Error("the ordered cut, carried out, is reported withdrawn")
	}
	if p.cuts.Load() != 1 || p.resets.Load() != 1 {
		t.Errorf("%d cuts and %d resets; want 1 of each", p.cuts.Load(), p.resets.Load())
	}

	// An order withdrawn at stop leaves nothing behind.
	early := make(chan struct{})
	close(early)
	if p.force(true, nil, early) || p.forceCut.Load() {
		t.Error("a COMMIT cut withdrawn at stop is reported carried out, or still stands")
	}
	p.force(false, nil, early) // resets a connection still open at once, if any
	if p.forceReset.Load() {
		t.Error("an order outlived its stop")
	}
}

// The replicas' PostgreSQL pools are bounded, unless the URL bounds them.
func TestBoundPool(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"postgres://u@h:5432/test?sslmode=disable": "postgres://u@h:5432/test?pool_max_conns=8&sslmode=disable",
		"postgres://u:p@h/test":                    "postgres://u:p@h/test?pool_max_conns=8",
		"postgres://u@h/test?pool_max_conns=3":     "postgres://u@h/test?pool_max_conns=3",
	} {
		if got, err := boundPool(in); err != nil || got != want {
			t.Errorf("boundPool(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := boundPool("postgres://u:secret@h:bad port/test"); err == nil || strings.Contains(err.Error(), "secret") {
		t.Errorf("a URL that does not parse: %v; want an error without its password", err)
	}
}

// TestWatchProgress: the load's timeout bounds the time without a logical
// payment completing, not the run's length. A load that keeps completing
// payments goes on far past the timeout; one that stops is ended, with
// errStalled, once the timeout has passed since its last.
func TestWatchProgress(t *testing.T) {
	t.Parallel()
	start := time.Unix(1_000_000, 0)
	var now, last atomic.Int64 // UnixNano
	now.Store(start.UnixNano())
	last.Store(start.UnixNano())
	ctx, abort := context.WithCancelCause(t.Context())
	defer abort(nil)
	tick := make(chan time.Time)
	done := make(chan struct{})
	go func() {
		defer close(done)
		watchProgress(ctx, tick, 10*time.Second, func() time.Time { return time.Unix(0, now.Load()) },
			func() time.Time { return time.Unix(0, last.Load()) }, nil, abort)
	}()
	// step moves the clock to at and ticks; it returns once the watcher
	// has judged the clock at at: a second tick is taken only then. The
	// watcher reads the clock after each tick, so it may judge the second
	// tick only once the clock has moved on; hence a watcher that ended may
	// have ended on the previous step's second tick.
	step := func(at time.Time) {
		now.Store(at.UnixNano())
		for range 2 {
			select {
			case tick <- at:
			case <-done:
				return
			}
		}
	}
	// A payment completes every 9s for 15 minutes: never 10s without one.
	for i := 1; i <= 100; i++ {
		at := start.Add(time.Duration(i) * 9 * time.Second)
		step(at)
		last.Store(at.UnixNano())
	}
	if err := context.Cause(ctx); err != nil {
		t.Fatalf("a load completing a payment every 9s ended after %s: %v", time.Duration(now.Load()-start.UnixNano()), err)
	}
	// Then none: 10s after the last is still in time, past it is not.
	stalledFrom := now.Load()
	step(time.Unix(0, stalledFrom+int64(10*time.Second)))
	if err := context.Cause(ctx); err != nil {
		t.Fatalf("ended at exactly the timeout after the last payment: %v", err)
	}
	step(time.Unix(0, stalledFrom+int64(10*time.Second+time.Millisecond)))
	<-done
	if err := context.Cause(ctx); !errors.Is(err, errStalled) {
		t.Fatalf("10.001s without a payment completing: cause %v, want %v", err, errStalled)
	}
}

// A logical payment whose attempts the end of the load cut off is not
// done: the progress line counts only those that got their answers (or,
// abandoned, whose client gave up), not those the run stopped waiting for.
func TestCutOffPaymentNotCountedDone(t *testing.T) {
	t.Parallel()
	ln := listenLoopback(t, nil)
	r := &run{cfg: Config{Dups: 2}, rng: newLockedRand(1), client: &http.Client{}, proxies: []*faultProxy{{ln: ln}}}
	ctx, cancel := context.WithCancel(t.Context())
	cancel() // the load is over
	r.pay(ctx, &logical{key: "k1"})
	r.pay(ctx, &logical{key: "k2", abandoned: true})
	if n := r.completed.Load(); n != 0 {
		t.Errorf("%d logical payments counted done, their attempts cut off by the end of the load; want 0", n)
	}
}

// A completer's resume that failed, its outcome unknown (here its lease
// could not be renewed on a starved machine), is the key's last holder
// letting it go: the completers' bound counts from it, for that payment's
// key alone, and only when it came before the key was finished.
func TestFinishDeadlineCountsFromAFailedResume(t *testing.T) {
	died := time.Date(2026, 12, 6, 20, 53, 11, 0, time.UTC)
	up := &replica{ups: []upSpan{{from: died.Add(-time.Minute)}}}
	r := &run{cfg: Config{KeyLease: 3 * time.Second}, replicas: []*replica{up}}
	failedAt := died.Add(6 * time.Second)
	r.completerLine(0, 1, `time=`+failedAt.Format(time.RFC3339Nano)+` level=ERROR msg="completer: outcome unknown; the key stays in flight and is tried again after its lease" scope=torture key=hmac:3ff9ef7ad27f7759 method=completer path=charging error="payments: payment pay_luisrjuan3eqgzlooglvtx36k4 is not finished yet: the attempt answered 503" lease=3s`)
	r.completerLine(0, 1, `time=`+failedAt.Format(time.RFC3339Nano)+` level=WARN msg="completer: finishing an abandoned execution" scope=torture key=hmac:3ff9ef7ad27f7759 method=completer path=charging`)
	done := died.Add(12 * time.Second)

	late := func(ids ...string) bool {
		d, ok := r.finishDeadline(lastHolderGone(died, r.failedResumesOf(ids), done))
		if !ok {
			t.Fatal("no replica up: want the one up all along")
		}
		return done.After(d)
	}
	if !late() || !late("pay_other") {
		t.Errorf("finished %s after its holder died, no failed resume of it: want late (bound %s)", done.Sub(died), r.finishBound())
	}
	if late("pay_luisrjuan3eqgzlooglvtx36k4") {
		t.Errorf("finished %s after a completer's resume of it failed: want within the bound %s of it", done.Sub(failedAt), r.finishBound())
	}
	if got := lastHolderGone(died, r.failedResumesOf([]string{"pay_luisrjuan3eqgzlooglvtx36k4"}), failedAt.Add(-time.Millisecond)); !got.Equal(died) {
		t.Errorf("a failure after the key was finished moved its last holder's end to %s; want the death %s", got, died)
	}
	if n := len(r.failedResumes); n != 1 {
		t.Errorf("%d payments with failed resumes noted; want 1 (the warning is not one)", n)
	}
}

// A replica SIGKILLed while its completer was resuming a key logs nothing
// more: the resume's start (payments' warning) and the replica's death
// make it a failed resume at the death, from which the key's bound counts;
// a resume seen to fail before the death still counts from its failure,
// and a resume on another payment or another life moves nothing.
func TestFinishDeadlineCountsFromAResumeCutOffByDeath(t *testing.T) {
	died := time.Date(2026, 12, 6, 20, 53, 11, 0, time.UTC)
	up := &replica{ups: []upSpan{{from: died.Add(-time.Minute)}}}
	r := &run{cfg: Config{KeyLease: 3 * time.Second}, replicas: []*replica{up, up}}
	started := func(replica, n int, at time.Time, payment, digest string) {
		r.completerLine(replica, n, `time=`+at.Format(time.RFC3339Nano)+` level=WARN msg="payments: finishing a payment from its recovery point" payment=`+payment+` key=`+digest)
	}
	// pay_cut: begun by replica 0's first life at died+5s, which is killed
	// at died+6s.
	started(0, 1, died.Add(5*time.Second), "pay_cut", "hmac:00000000000000a1")
	// pay_failed: begun and seen to fail (its answer not kept) at
	// died+2s on the same life; it is not counted again at the death.
	started(0, 1, died.Add(time.Second), "pay_failed", "hmac:00000000000000b2")
	r.completerLine(0, 1, `time=`+died.Add(2*time.Second).Format(time.RFC3339Nano)+` level=ERROR msg="completer: finished, but could not keep the answer; tried again after the lease" scope=torture key=hmac:00000000000000b2 method=completer path=charging error="keeping the answer: store down"`)
	// pay_alive: begun on replica 1, which lives on.
	started(1, 1, died.Add(5*time.Second), "pay_alive", "hmac:00000000000000c3")
	// The same digest on replica 1's life means nothing to replica 0's.
	r.completerExit(1, 2, died.Add(6*time.Second))
	r.completerExit(0, 1, died.Add(6*time.Second))
	done := died.Add(12 * time.Second)

	late := func(id string) bool {
		d, ok := r.finishDeadline(lastHolderGone(died, r.failedResumesOf([]string{id}), done))
		if !ok {
			t.Fatal("no replica up: want the one up all along")
		}
		return done.After(d)
	}
	if late("pay_cut") {
		t.Errorf("finished %s after the replica resuming it died: want within the bound %s of the death", done.Sub(died.Add(6*time.Second)), r.finishBound())
	}
	if !late("pay_failed") {
		t.Errorf("finished %s after its resume failed, the replica dying later: want late, counted from the failure (bound %s)", done.Sub(died.Add(2*time.Second)), r.finishBound())
	}
	if !late("pay_alive") {
		t.Errorf("finished %s after its holder died, its resume's replica alive: want late (bound %s)", done.Sub(died), r.finishBound())
	}
	if got := r.failedResumesOf([]string{"pay_cut"}); len(got) != 1 || !got[0].Equal(died.Add(6*time.Second)) {
		t.Errorf("failed resumes of pay_cut %v; want one, at the death", got)
	}
	// The report counts which kind each payment's bound counted from.
	r.countFrom([]string{"pay_cut"}, "", lastHolderGone(died, r.failedResumesOf([]string{"pay_cut"}), done))
	r.countFrom([]string{"pay_failed"}, "", lastHolderGone(died, r.failedResumesOf([]string{"pay_failed"}), done))
	if r.fromCutOff != 1 || r.fromFailed != 1 {
		t.Errorf("bounds from a cut-off resume %d, from a failed one %d; want 1 each", r.fromCutOff, r.fromFailed)
	}
}

// A run with kills and store restarts meets them whatever its speed: the
// first kill, a restart of each private store and two restarts at least,
// each at a payment of the first half drawn from the seed, the same for
// the same seed.
func TestScheduleFaultsKillsAndRestarts(t *testing.T) {
	t.Parallel()
	pg, redis := &localserver.Server{}, &localserver.Server{}
	draw := func(seed uint64, servers ...*localserver.Server) []scheduledFault {
		r := &run{cfg: Config{KillEvery: time.Hour, RestartStoresEvery: time.Hour, Progress: io.Discard},
			rng: newLockedRand(seed), servers: servers, replicas: make([]*replica, 3)}
		for range 40 {
			r.payments = append(r.payments, &logical{})
		}
		r.scheduleFaults()
		return r.scheduled
	}
	for seed := uint64(1); seed <= 50; seed++ {
		for _, servers := range [][]*localserver.Server{{pg, redis}, {redis}} {
			got := draw(seed, servers...)
			kills, restarts := 0, map[*localserver.Server]int{}
			for _, sf := range got {
				if sf.at < 0 || sf.at >= 20 || !sf.chaos() {
					t.Errorf("seed %d: %s at payment %d of 40; want a kill or a restart in the first half", seed, sf.kind, sf.at)
				}
				switch sf.kind {
				case "kill":
					kills++
				case "restart":
					restarts[sf.server]++
				}
			}
			total := 0
			for _, s := range servers {
				if restarts[s] == 0 {
					t.Errorf("seed %d, %d servers: a private store is never restarted", seed, len(servers))
				}
				total += restarts[s]
			}
			if kills != 1 || total < 2 {
				t.Errorf("seed %d, %d servers: %d kills, %d restarts; want 1 and at least 2", seed, len(servers), kills, total)
			}
			if again := draw(seed, servers...); !slices.Equal(again, got) {
				t.Errorf("seed %d: drawn %v, then %v", seed, got, again)
			}
		}
	}
	if got := draw(1); len(got) != 1 {
		t.Errorf("no private store: %d faults scheduled; want the kill alone", len(got))
	}
}

// A kill that finds its replica already down (crashed by itself, its exit
// seen) killed nothing: it says so, and leaves the crash's exit as it was,
// so that the run counts a crash and no kill.
func TestKillOfACrashedReplicaKillsNothing(t *testing.T) {
	t.Parallel()
	start := func(name string, args ...string) *replica {
		cmd := exec.Command(name, args...)
		if err := cmd.Start(); err != nil {
			t.Skipf("skipping: %v", err)
		}
		rp := &replica{cmd: cmd, done: make(chan struct{})}
		go func() {
			err := cmd.Wait()
			rp.mu.Lock()
			rp.exit = err
			rp.mu.Unlock()
			close(rp.done)
		}()
		return rp
	}
	crashed := start("false")
	<-crashed.done
	if crashed.kill() {
		t.Errorf("kill of a replica that had exited says it killed it")
	}
	if byRun, exit := crashed.ended(); byRun || exit == nil {
		t.Errorf("a crashed replica, after a kill: by the run %v, exit %v; want its own exit", byRun, exit)
	}
	live := start("sleep", "60")
	if !live.kill() {
		t.Errorf("kill of a live replica says it killed nothing")
	}
	if byRun, _ := live.ended(); !byRun {
		t.Errorf("a killed replica: not ended by the run")
	}
}

// A replica that ends by itself is a crash only when it SIGKILLed itself
// in a run whose faults make it do so (a crash after a charge, an
// abandoned try): any other end (an exit status, as a fatal error or a
// panic gives, another signal, or a SIGKILL with no crash fault) is a
// violation with its last lines, never counted among the crashes.
func TestReplicaThatEndsByItselfIsAViolation(t *testing.T) {
	t.Parallel()
	ended := func(script string, asked, answered bool) *replica {
		cmd := exec.Command("sh", "-c", script)
		rp := &replica{n: 1, killed: false, tail: []string{"panic: the last line"}, lives: 1, base: "http://127.0.0.1:1"}
		if asked {
			// A fault proxy forwarded it a try asking for a crash after
			// its charge.
			ended := rp.crashTry(rp.base)
			if answered {
				ended(true)
			}
		}
		rp.exit = cmd.Run()
		return rp
	}
	for _, tc := range []struct {
		name     string
		script   string
		crashes  bool // the run's faults crash replicas
		asked    bool // a try asking it for a crash was forwarded to it
		answered bool // and it answered that try
		crash    bool // counted a crash, not a violation
	}{
		{"a crash fault's SIGKILL", "kill -KILL $$", true, true, false, true},
		{"exit status 2", "exit 2", true, true, false, false},
		{"exit status 0", "exit 0", true, true, false, false},
		{"SIGTERM", "kill -TERM $$", true, true, false, false},
		{"a SIGKILL in a run with no crash fault", "kill -KILL $$", false, false, false, false},
		// The OOM killer's, or another process's: the run asked this
		// replica for no crash.
		{"a SIGKILL no try asked for", "kill -KILL $$", true, false, false, false},
		{"a SIGKILL after the try asking for a crash was answered", "kill -KILL $$", true, true, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &run{}
			if tc.crashes {
				r.cfg.CrashAfterCharge = 0.05
			}
			r.selfExit(ended(tc.script, tc.asked, tc.answered))
			crashes, exits := r.crashes.Load(), len(r.unexpectedExits)
			if tc.crash && (crashes != 1 || exits != 0) || !tc.crash && (crashes != 0 || exits != 1) {
				t.Fatalf("crashes %d, unexpected exits %d %q; want a crash %v", crashes, exits, r.unexpectedExits, tc.crash)
			}
			if !tc.crash && !strings.Contains(r.unexpectedExits[0], "replica 1 ") || !tc.crash && !strings.Contains(r.unexpectedExits[0], "panic: the last line") {
				t.Errorf("the violation %q does not name the replica and its last lines", r.unexpectedExits[0])
			}
		})
	}
}

// A scheduled reset does not wait for traffic: it resets a connection open
// through the proxy at once, an idle one too (a replica's pooled
// connection), so a run whose load ends, or waits, before the store's next
// chunk still meets it. Here no byte passes after the order, and the run
// has already said stop.
func TestScheduledResetMeetsAnIdleConnection(t *testing.T) {
	t.Parallel()
	ln := listenLoopback(t, func(c net.Conn) { io.Copy(c, c) })
	p, err := newStoreProxy(ln.Addr().String(), StoreFaults{ResetRate: 1e-9}, false, newLockedRand(1))
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	p.armed.Store(true)
	c, err := net.Dial("tcp", p.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, make([]byte, 1)); err != nil {
		t.Fatalf("the connection does not echo before the reset: %v", err)
	}
	stop := make(chan struct{})
	close(stop)
	if !p.force(false, nil, stop) {
		t.Error("the reset of the open connection is reported withdrawn")
	}
	if n := p.resets.Load(); n != 1 {
		t.Fatalf("%d resets after a scheduled reset with a connection open and idle; want 1, at once", n)
	}
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Error("the connection still reads after the scheduled reset")
	}
}

// The last quarter of the load waits for every scheduled fault: a kill, a
// store restart, a reset or an outage until it has happened, and it goes
// on while an order stands that only the load's traffic carries out (a
// COMMIT's cut), whose COMMIT the payments handed out meanwhile make.
func TestLoadWaitsForTheScheduledFaults(t *testing.T) {
	t.Parallel()
	g := newFaultGate(3)
	_, killed := g.fault("a kill")
	cutStands, cut := g.fault("a cut")
	_, outage := g.fault("an outage")
	step := func(what string, change func(), want bool) {
		t.Helper()
		_, changed := g.open()
		change()
		select {
		case <-changed:
		default:
			t.Fatalf("after %s: the gate's change is not told", what)
		}
		if open, _ := g.open(); open != want {
			t.Fatalf("after %s: the last quarter may go on %v, want %v", what, open, want)
		}
	}
	if open, _ := g.open(); open {
		t.Fatal("the last quarter goes on before any scheduled fault happened")
	}
	step("the cut's order stands", cutStands, true)
	step("the kill", killed, true)
	step("the cut", cut, false)
	step("the outage", outage, true)
}

// A scheduled COMMIT cut that met no COMMIT before the load ended (its
// order withdrawn at stop) is the run's error, naming the fault and the
// seed, not a run that silently met no cut.
func TestScheduledCutThatNeverCameIsAnError(t *testing.T) {
	t.Parallel()
	ln := listenLoopback(t, nil)
	faults := StoreFaults{CommitCutRate: 1e-9}
	p, err := newStoreProxy(ln.Addr().String(), faults, true, newLockedRand(1))
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	p.armed.Store(true)
	r := &run{cfg: Config{Seed: 4242, StoreFaults: &faults}}
	stop := make(chan struct{})
	close(stop)
	err = r.force(t.Context(), scheduledFault{at: 6, kind: "commit cut", store: p}, stop, nil)
	if err == nil || !strings.Contains(err.Error(), "seed 4242") || !strings.Contains(err.Error(), "payment 7") {
		t.Fatalf("a scheduled COMMIT cut withdrawn with no COMMIT met: %v; want an error naming payment 7 and seed 4242", err)
	}
	if p.forceCut.Load() || p.cuts.Load() != 0 {
		t.Errorf("the withdrawn order: still standing %v, %d cuts", p.forceCut.Load(), p.cuts.Load())
	}
}

// A run that drops answers drops at least one whatever its rate and its
// luck: the first answer of a payment drawn from the seed (every
// attempt's answer passes a fault proxy, and there is at least one
// attempt per payment), then the others at DropRate.
func TestScheduledLostResponse(t *testing.T) {
	t.Parallel()
	for seed := uint64(1); seed <= 20; seed++ {
		r := &run{cfg: Config{DropRate: 1e-300, Progress: io.Discard}, rng: newLockedRand(seed)}
		for i := range 10 {
			r.payments = append(r.payments, &logical{key: fmt.Sprint("k", i)})
		}
		r.scheduleFaults()
		var dropped []int
		for range 2 {
			for n, lp := range r.payments {
				if r.dropNow(lp.key) {
					dropped = append(dropped, n+1)
				}
			}
		}
		if len(dropped) != 1 {
			t.Fatalf("seed %d: answers dropped among two for each of the 10 payments %v; want exactly one, drawn from the seed", seed, dropped)
		}
	}
	r := &run{cfg: Config{DropRate: 0, Progress: io.Discard}, rng: newLockedRand(1)}
	r.payments = []*logical{{key: "k"}}
	r.scheduleFaults()
	if r.dropNow("k") {
		t.Error("a run with no DropRate dropped an answer")
	}
}

// A run with a card network and a crash rate meets at least one crash
// after a charge whatever its rate draws: from a payment of the first
// half drawn from the seed, a crash is owed, and the first tries of the
// payments whose clients stay carry it, one at a time, each giving it back
// when its answer comes (refused before the charge, or a replay, it
// crashed nothing), until a replica's crash is counted. One that never
// came by the load's end is the run's error, naming the seed.
func TestScheduledCrashAfterCharge(t *testing.T) {
	t.Parallel()
	newRun := func(seed uint64) (*run, scheduledFault) {
		t.Helper()
		r := &run{cfg: Config{Acquirer: Private, CrashAfterCharge: 1e-300, Seed: seed, Progress: io.Discard}, rng: newLockedRand(seed)}
		for range 10 {
			r.payments = append(r.payments, &logical{})
		}
		r.scheduleFaults()
		for _, sf := range r.scheduled {
			if sf.kind == "crash after charge" {
				if sf.at >= 5 {
					t.Fatalf("seed %d: a crash after a charge owed from payment %d; want one of the first half (5)", seed, sf.at+1)
				}
				return r, sf
			}
		}
		t.Fatalf("seed %d: scheduled %+v; want a crash after a charge at a payment drawn from the seed", seed, r.scheduled)
		return nil, scheduledFault{}
	}
	for seed := uint64(1); seed <= 20; seed++ {
		newRun(seed)
	}
	r, sf := newRun(4242)
	stays, gaveUp := &logical{}, &logical{abandoned: true}
	if f, _ := r.firstTryFault(stays); f != "" {
		t.Fatalf("before its payment, a first try asked for %q; want nothing (the rate never draws)", f)
	}
	stop := make(chan struct{})
	placed := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- r.force(t.Context(), sf, stop, func() { close(placed) }) }()
	<-placed
	f1, carries1 := r.firstTryFault(stays)
	f2, carries2 := r.firstTryFault(stays)
	if f1 != faultCrashAfterCharge || !carries1 || f2 != "" || carries2 {
		t.Fatalf("the owed crash: the first try asked %q (carrying it %v), a try meanwhile %q (%v); want the first alone to carry it", f1, carries1, f2, carries2)
	}
	if f, carries := r.firstTryFault(gaveUp); f != faultCrashAfterCharge || carries {
		t.Fatalf("an abandoned payment's try asked %q (carrying the owed crash %v); want a crash, the order left to the others", f, carries)
	}
	r.crashTryEnded(carries1) // answered: it crashed nothing
	if f, carries := r.firstTryFault(stays); f != faultCrashAfterCharge || !carries {
		t.Fatalf("after a try that crashed nothing, the next first try asked %q (carrying it %v); want it to carry the owed crash", f, carries)
	}
	select {
	case err := <-done:
		t.Fatalf("the owed crash ended (%v) before any crash was counted", err)
	default:
	}
	r.countCrash()
	if err := <-done; err != nil {
		t.Fatalf("the owed crash, come: %v", err)
	}
	r.crashTryEnded(true)
	if f, carries := r.firstTryFault(stays); f != "" || carries {
		t.Errorf("once the crash came, a first try asked %q (carrying %v); want nothing", f, carries)
	}
	if err := r.scheduledCrashCame(); err != nil {
		t.Errorf("a run whose owed crash came: %v", err)
	}

	// Withdrawn at the load's end with no crash counted: the run's error.
	r, sf = newRun(4242)
	if err := r.scheduledCrashCame(); err != nil {
		t.Fatalf("a run that never reached its owed crash's payment: %v; want none (the load's own error says why)", err)
	}
	early := make(chan struct{})
	close(early)
	if err := r.force(t.Context(), sf, early, nil); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("payment %d", sf.at+1)
	if err := r.scheduledCrashCame(); err == nil || !strings.Contains(err.Error(), "seed 4242") || !strings.Contains(err.Error(), want) {
		t.Fatalf("an owed crash withdrawn at the load's end with none counted: %v; want an error naming %s and seed 4242", err, want)
	}
	if f, _ := r.firstTryFault(stays); f != "" {
		t.Errorf("the withdrawn order still makes a first try ask for %q", f)
	}
	r.countCrash() // a replica found down after the load, counted then
	if err := r.scheduledCrashCame(); err != nil {
		t.Errorf("a crash counted once the load was over (reviveExited): %v; want none", err)
	}
}

// A run with Abandon has at least one abandoned payment whatever its rate
// draws: one of the first half, drawn from the seed, whose client gives up
// after its one try, and the load's last quarter waits for that try. One
// that never came by the load's end is the run's error, naming the seed.
func TestScheduledAbandonedClient(t *testing.T) {
	t.Parallel()
	newRun := func(seed uint64) (*run, scheduledFault) {
		t.Helper()
		r := &run{cfg: Config{Acquirer: Private, Abandon: 1e-300, Payments: 10, DropRate: 0.1, Seed: seed, Progress: io.Discard},
			rng: newLockedRand(seed), accounts: []string{"acct_1"}}
		r.plan()
		r.scheduleFaults()
		var abandoned []int
		for i, lp := range r.payments {
			if lp.abandoned {
				abandoned = append(abandoned, i+1)
			}
		}
		if len(abandoned) != 1 || abandoned[0] > 5 {
			t.Fatalf("seed %d: abandoned payments %v; want exactly one, of the first half (5), drawn from the seed", seed, abandoned)
		}
		if lp := r.payments[r.lossAt]; r.lossKey != lp.key || lp.abandoned || !lp.losesAnswer {
			t.Fatalf("seed %d: the lost response at payment %d (%q, abandoned %v); want a payment whose client stays", seed, r.lossAt+1, r.lossKey, lp.abandoned)
		}
		for _, sf := range r.scheduled {
			if sf.kind == "abandon" && sf.at+1 == abandoned[0] && sf.payment == r.payments[sf.at] {
				return r, sf
			}
		}
		t.Fatalf("seed %d: scheduled %+v; want the abandoned client at payment %d", seed, r.scheduled, abandoned[0])
		return nil, scheduledFault{}
	}
	for seed := uint64(1); seed <= 20; seed++ {
		newRun(seed)
	}
	replica := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "down", http.StatusServiceUnavailable)
	}))
	defer replica.Close()
	r, sf := newRun(4242)
	r.client, r.proxies = replica.Client(), []*faultProxy{{ln: replica.Listener}}
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- r.force(t.Context(), sf, stop, nil) }()
	select {
	case err := <-done:
		t.Fatalf("the scheduled abandoned client let the last quarter go (%v) before its try", err)
	default:
	}
	r.pay(t.Context(), sf.payment)
	if err := <-done; err != nil {
		t.Fatalf("the abandoned client's try ended: %v", err)
	}
	if sf.payment.gaveUpAt.IsZero() {
		t.Error("the scheduled abandoned client did not give up after its try's 503")
	}

	r, sf = newRun(4242)
	early := make(chan struct{})
	close(early)
	want := fmt.Sprintf("payment %d", sf.at+1)
	if err := r.force(t.Context(), sf, early, nil); err == nil || !strings.Contains(err.Error(), "seed 4242") || !strings.Contains(err.Error(), want) {
		t.Fatalf("the load ended before the scheduled abandoned client's try: %v; want an error naming %s and seed 4242", err, want)
	}
}

// With an acquirer, a crash rate and Abandon, the run meets an abandoned
// payment whose one try reached its charge and whose replica died before
// answering, so that only a completer can finish it: the scheduled
// abandoned payment's try carries that order first, and while no
// abandoned try has carried it out, the next payment handed out carries
// it, abandoned in turn (a try refused before its charge, or answered,
// leaves nothing for a completer). The last quarter waits for the
// scheduled payment's try, then goes on while the order stands for the
// load's traffic; a load that ended without it is the run's error naming
// the payment and the seed.
func TestScheduledAbandonedCrashAfterCharge(t *testing.T) {
	t.Parallel()
	// byShare, when not 0, is a payment of the second half the share
	// abandons.
	newRun := func(seed uint64, byShare int) (*run, scheduledFault) {
		t.Helper()
		r := &run{cfg: Config{Acquirer: Private, Abandon: 1e-300, CrashAfterCharge: 1e-300, Payments: 10, Seed: seed, Progress: io.Discard},
			rng: newLockedRand(seed), accounts: []string{"acct_1"}}
		r.plan()
		if byShare > 0 {
			r.payments[byShare].abandoned = true
		}
		r.scheduleFaults()
		for _, sf := range r.scheduled {
			if sf.kind == "abandon" {
				if sf.at >= 5 || sf.payment != r.payments[sf.at] || !sf.payment.abandoned {
					t.Fatalf("seed %d: the abandoned client scheduled at payment %d; want one of the first half (5), abandoned", seed, sf.at+1)
				}
				return r, sf
			}
		}
		t.Fatalf("seed %d: scheduled %+v; want an abandoned client at a payment drawn from the seed", seed, r.scheduled)
		return nil, scheduledFault{}
	}
	for seed := uint64(1); seed <= 20; seed++ {
		newRun(seed, 0)
	}
	// The replica refuses a try before its charge (503) until dies, then
	// dies holding it: its fault proxy answers that it gave no answer, the
	// network holding the charge.
	var dies atomic.Bool
	replica := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if !dies.Load() {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		http.Error(w, proxyNoAnswer+": EOF", http.StatusBadGateway)
	}))
	defer replica.Close()
	r, sf := newRun(4242, 0)
	r.client, r.proxies = replica.Client(), []*faultProxy{{ln: replica.Listener}}
	r.charged = func(context.Context, *logical) (bool, error) { return dies.Load(), nil }
	stop := make(chan struct{})
	stands := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- r.force(t.Context(), sf, stop, func() { close(stands) }) }()
	r.pay(t.Context(), sf.payment)
	select {
	case <-stands:
	case err := <-done:
		t.Fatalf("the scheduled abandoned client's try was refused before its charge, and the order ended (%v); want it to stand for the next payment", err)
	}
	next := r.payments[sf.at+1]
	if next.abandoned {
		t.Fatalf("payment %d abandoned before it was handed out; want the share (1e-300) to draw none", sf.at+2)
	}
	dies.Store(true)
	r.pay(t.Context(), next)
	if !next.abandoned || next.gaveUpAt.IsZero() {
		t.Fatalf("the payment handed out while the order stood: abandoned %v, gave up at %v; want its client to give up after its one try", next.abandoned, next.gaveUpAt)
	}
	if err := <-done; err != nil {
		t.Fatalf("an abandoned try charged, its replica dead before answering: %v", err)
	}
	if later := r.payments[sf.at+2]; r.carryAbandon(later) || later.abandoned {
		t.Errorf("once an abandoned try had crashed after its charge, payment %d was made to carry the order again", sf.at+3)
	}

	// While a payment the share abandoned is still to come, it carries
	// the order given back, and the payments handed out before it stay.
	r, sf = newRun(4242, 9)
	r.client, r.proxies = replica.Client(), []*faultProxy{{ln: replica.Listener}}
	r.charged = func(context.Context, *logical) (bool, error) { return false, nil }
	r.pay(t.Context(), sf.payment) // no charge: the order is given back
	if stays := r.payments[sf.at+1]; r.carryAbandon(stays) || stays.abandoned {
		t.Errorf("payment %d, whose client stays, was made to carry the order while payment 10, which the share abandoned, was still to come", sf.at+2)
	}
	if !r.carryAbandon(r.payments[9]) {
		t.Error("payment 10, which the share abandoned, handed out while the order was free, did not carry it")
	}

	// Withdrawn at the load's end before any abandoned try crashed after
	// its charge: the run's error.
	r, sf = newRun(4242, 0)
	early := make(chan struct{})
	close(early)
	want := fmt.Sprintf("payment %d", sf.at+1)
	if err := r.force(t.Context(), sf, early, nil); err == nil || !strings.Contains(err.Error(), "seed 4242") || !strings.Contains(err.Error(), want) {
		t.Fatalf("the load ended before an abandoned try crashed its replica after the charge: %v; want an error naming %s and seed 4242", err, want)
	}
}

// A load that stalls while its last quarter waits for scheduled faults
// says which: the watchdog's cause names each one ordered and not yet
// happened (and whether its order stands, for the load's traffic to carry
// out), not only that no payment completed. It names none that happened.
func TestStallNamesTheFaultsAwaited(t *testing.T) {
	t.Parallel()
	start := time.Unix(1_000_000, 0)
	stall := func(g *faultGate) error {
		ctx, abort := context.WithCancelCause(t.Context())
		defer abort(nil)
		tick := make(chan time.Time, 1)
		tick <- start.Add(2 * time.Second)
		watchProgress(ctx, tick, time.Second, func() time.Time { return start.Add(2 * time.Second) }, func() time.Time { return start }, g.stillAwaited, abort)
		return context.Cause(ctx)
	}
	g := newFaultGate(3)
	_, killed := g.fault("a SIGKILL of replica 1 at payment 4")
	cutStands, _ := g.fault("a store commit cut at payment 7")
	g.fault("a restart of the private postgres at payment 2")
	killed()
	cutStands()
	cause := stall(g)
	if !errors.Is(cause, errStalled) {
		t.Fatalf("the stall's cause %v; want it to be errStalled", cause)
	}
	for _, want := range []string{
		"a store commit cut at payment 7 (its order standing, for the load's traffic to carry out)",
		"a restart of the private postgres at payment 2",
	} {
		if !strings.Contains(cause.Error(), want) {
			t.Errorf("the stall's cause %q does not name the fault still awaited, %q", cause, want)
		}
	}
	if strings.Contains(cause.Error(), "replica 1") {
		t.Errorf("the stall's cause %q names the kill, which happened", cause)
	}
	if cause := stall(newFaultGate(0)); !errors.Is(cause, errStalled) || !strings.Contains(cause.Error(), "no scheduled fault awaited") {
		t.Errorf("a stall with no scheduled fault awaited: cause %q; want errStalled saying none is awaited", cause)
	}
}

// listenLoopback listens on a loopback port until the test ends, and
// serves each connection it accepts with serve, which the connection is
// closed after; with a nil serve it accepts none.
func listenLoopback(t *testing.T, serve func(net.Conn)) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	if serve == nil {
		return ln
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				serve(c)
			}()
		}
	}()
	return ln
}

// A replica that a try asking for a crash after its charge killed, and
// whose exit is observed only once the load is over, is counted before
// the verdict: the verdict waits on that process's exit instead of
// failing a run whose owed crash came.
func TestCrashObservedAfterTheLoadIsCounted(t *testing.T) {
	t.Parallel()
	// How a process that SIGKILLed itself ends.
	killed := exec.Command("sh", "-c", "kill -9 $$").Run()
	if err := unexpectedExit(killed, true); err != nil {
		t.Skipf("no SIGKILLed process here: %v", err)
	}
	proxy, err := newFaultProxy(func(string) bool { return false })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.close)
	rp := &replica{n: 0, exe: "sh", args: []string{"-c", `echo "` + listeningPrefix + `http://127.0.0.1:1" >&2; exec sleep 600`}}
	t.Cleanup(func() { rp.kill() })
	done := make(chan struct{}) // its process died; its reaping not yet seen
	rp.done = done
	r := &run{cfg: Config{Acquirer: Private, CrashAfterCharge: 1e-300, Seed: 7, Progress: io.Discard},
		replicas: []*replica{rp}, proxies: []*faultProxy{proxy}}
	r.placeCrash(0)
	// The try carrying the crash, forwarded to it, got no answer from the
	// replica.
	rp.lives, rp.base = 1, "http://127.0.0.1:1"
	rp.crashTry(rp.base)(false)
	r.crashTryUnanswered(0)
	r.exitAwaited = func() {
		rp.mu.Lock()
		rp.exit = killed
		rp.mu.Unlock()
		close(done)
	}
	if err := r.reviveExited(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := r.scheduledCrashCame(); err != nil {
		t.Fatalf("a crash whose exit was observed after the load: %v; want it counted", err)
	}
	if rp.baseURL() == "" {
		t.Errorf("the crashed replica was not started again")
	}
}

// A load that stalled is a violation the report gives: the scheduled
// faults withdrawn at its end are given in it, beside the stall, and are
// not the run's error, which would come back from Run in place of the
// report and hide the stall. A replica or store that did not come back
// stays the run's error.
func TestStalledLoadKeepsItsReport(t *testing.T) {
	t.Parallel()
	withdrawn := errors.New("torture: the abandoned client scheduled at payment 3 sent its try, and the load's end cut it off (seed 9)")
	stall := (&stalled{awaited: []string{"a client that gives up after one try at payment 3"}}).Error()
	r := &run{stall: stall}
	if err := r.loadError(nil, withdrawn); err != nil {
		t.Fatalf("a stalled load's withdrawn fault: the run's error %q; want none, the stall in the report", err)
	}
	if !strings.Contains(r.stall, stall) || !strings.Contains(r.stall, withdrawn.Error()) {
		t.Errorf("the stall the report gives: %q; want the stall and the withdrawn fault", r.stall)
	}
	down := errors.New("torture: restarting after a kill: replica 0 did not come back")
	if err := r.loadError(down, withdrawn); !errors.Is(err, down) {
		t.Errorf("a stalled load whose replica did not come back: %v; want that error", err)
	}
	r = &run{}
	if err := r.loadError(nil, withdrawn); !errors.Is(err, withdrawn) {
		t.Errorf("a load that did not stall, its scheduled fault withdrawn: %v; want the fault's error", err)
	}
}

// The scheduled abandoned client whose try was sent and then cut off by
// the load's end is named so: it sent its try, which never ended.
func TestAbandonedTryCutOffIsNamed(t *testing.T) {
	t.Parallel()
	got, release := make(chan struct{}), make(chan struct{})
	replica := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		close(got)
		<-release
	}))
	defer replica.Close()
	defer close(release)
	r := &run{cfg: Config{Acquirer: Private, Abandon: 1e-300, Payments: 4, Seed: 9, Progress: io.Discard},
		rng: newLockedRand(9), accounts: []string{"acct_1"}}
	r.plan()
	r.scheduleFaults()
	var sf scheduledFault
	for _, f := range r.scheduled {
		if f.kind == "abandon" {
			sf = f
		}
	}
	if sf.payment == nil {
		t.Fatalf("scheduled %+v; want an abandoned client", r.scheduled)
	}
	r.client, r.proxies = replica.Client(), []*faultProxy{{ln: replica.Listener}}
	ctx, cut := context.WithCancel(t.Context())
	paid := make(chan struct{})
	go func() { defer close(paid); r.pay(ctx, sf.payment) }()
	<-got
	cut() // the load's end, the try in flight
	<-paid
	stop := make(chan struct{})
	close(stop)
	err := r.force(t.Context(), sf, stop, nil)
	if err == nil || strings.Contains(err.Error(), "never sent") || !strings.Contains(err.Error(), "cut it off") || !strings.Contains(err.Error(), "seed 9") {
		t.Fatalf("the abandoned client's try cut off by the load's end: %v; want an error saying it was sent and cut off, naming seed 9", err)
	}
}

// A load that stalled while its owed crash after a charge had not come
// keeps its report too: the stall is the violation it gives, naming the
// owed crash still awaited, and the crash that never came is not the
// run's error, which would come back from Run in place of the report. A
// load that did not stall still fails with it.
func TestStalledLoadWithItsOwedCrashKeepsItsReport(t *testing.T) {
	t.Parallel()
	stall := (&stalled{awaited: []string{"a crash after a charge owed at payment 3"}}).Error()
	r := &run{cfg: Config{Seed: 9}, stall: stall}
	r.placeCrash(2)
	if err := r.scheduledCrashCame(); err != nil {
		t.Fatalf("a stalled load's owed crash: the run's error %q; want none, the stall in the report", err)
	}
	if !strings.Contains(r.stall, stall) || !strings.Contains(r.stall, "owed from payment 3 never came") || !strings.Contains(r.stall, "seed 9") {
		t.Errorf("the stall the report gives: %q; want the stall and the owed crash that never came", r.stall)
	}
	r = &run{cfg: Config{Seed: 9}}
	r.placeCrash(2)
	if err := r.scheduledCrashCame(); err == nil || !strings.Contains(err.Error(), "seed 9") {
		t.Errorf("a load that did not stall, its owed crash never come: %v; want the run's error naming seed 9", err)
	}
}

// The scheduled lost response comes whatever the load makes of the share
// abandoned: with one attempt per payment (Dups 1), the payments made
// abandoned during the load to carry the abandoned crash's order
// (carryAbandon) answer nothing, and a lost response drawn among the
// answers of the payments whose clients stayed before the load could be
// numbered past every answer the load gets. Here every abandoned try dies
// before its charge, so each payment handed out after the scheduled
// abandoned one is made abandoned in turn.
func TestScheduledLostResponseWithPaymentsMadeAbandoned(t *testing.T) {
	t.Parallel()
	replica := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Header.Get("Idem-Fault") == faultCrashAfterCharge {
			// Died before the charge: no answer.
			if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
				conn.Close()
			}
			return
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"id":"pay_1"}`)
	}))
	defer replica.Close()
	for seed := uint64(1); seed <= 10; seed++ {
		r := &run{cfg: Config{Acquirer: Private, Abandon: 1e-300, CrashAfterCharge: 1e-300, DropRate: 1e-300, Dups: 1, Payments: 6, Seed: seed, Progress: io.Discard},
			rng: newLockedRand(seed), accounts: []string{"acct_1"}, client: replica.Client(),
			charged: func(context.Context, *logical) (bool, error) { return false, nil }}
		r.plan()
		r.scheduleFaults()
		p, err := newFaultProxy(r.dropNow)
		if err != nil {
			t.Fatal(err)
		}
		p.setUpstream(replica.URL)
		r.proxies = []*faultProxy{p}
		for _, lp := range r.payments {
			r.pay(t.Context(), lp)
		}
		p.close()
		abandoned := 0
		for _, lp := range r.payments {
			if lp.abandoned {
				abandoned++
			}
		}
		if n := p.dropped.Load(); n != 1 {
			t.Errorf("seed %d: %d answers dropped, %d of 6 payments abandoned; want the scheduled lost response, exactly one", seed, n, abandoned)
		}
	}
}

// A load that stalled asks every replica for its goroutines' stacks: each
// gets a SIGQUIT, its stacks land in the replicas' log under its name, and
// its end, the run's own doing, is neither a crash nor a violation.
func TestStalledLoadKeepsTheReplicasStacks(t *testing.T) {
	t.Parallel()
	// A stand-in for idem serve: it says where it listens, and answers a
	// SIGQUIT as a Go program does, with stacks on stderr and exit 2.
	script := `trap 'echo "goroutine 1 [select]:" >&2; echo "main.stuck()" >&2; exit 2' QUIT
echo "` + listeningPrefix + `http://127.0.0.1:1" >&2
while :; do sleep 0.05; done`
	var log bytes.Buffer
	lw := &lineWriter{w: &log}
	r := &run{replicaLog: lw}
	r.cfg.Progress = io.Discard
	for i := range 2 {
		rp := &replica{n: i, exe: "sh", args: []string{"-c", script}, log: lw}
		if err := rp.start(t.Context()); err != nil {
			t.Skipf("skipping: %v", err)
		}
		t.Cleanup(func() { rp.kill() })
		r.replicas = append(r.replicas, rp)
	}
	r.quitForStacks()
	for _, rp := range r.replicas {
		select {
		case <-rp.exited():
		default:
			t.Fatalf("%s still runs after quitForStacks", rp.name())
		}
		r.selfExit(rp)
	}
	lw.mu.Lock()
	text := log.String()
	lw.mu.Unlock()
	for _, want := range []string{"replica 0: goroutine 1 [select]:", "replica 1: main.stuck()"} {
		if !strings.Contains(text, want) {
			t.Errorf("the replicas' log lacks %q:\n%s", want, text)
		}
	}
	if crashes, exits := r.crashes.Load(), len(r.unexpectedExits); crashes != 0 || exits != 0 {
		t.Errorf("the replicas quit for their stacks count as %d crashes and %d unexpected exits %q; want none", crashes, exits, r.unexpectedExits)
	}
	if r.replicas[0].quit() {
		t.Errorf("quit of a replica that had exited says it met a live one")
	}
}

// An abandoned try carrying the order of a crash after its charge whose
// replica answered it (the key completed, nothing left for a completer)
// did not carry the order out, even when its fault proxy dropped that
// answer at random: the client saw no answer, but its replica did not
// die. The order stands for the next payment handed out.
func TestAbandonedTryWhoseAnswerWasDroppedDidNotCrash(t *testing.T) {
	t.Parallel()
	replica := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"id":"pay_1"}`)
	}))
	defer replica.Close()
	r := &run{cfg: Config{Acquirer: Private, Abandon: 1e-300, CrashAfterCharge: 1e-300, Payments: 10, Seed: 4242, Progress: io.Discard},
		rng: newLockedRand(4242), accounts: []string{"acct_1"}, client: replica.Client(),
		charged: func(context.Context, *logical) (bool, error) { return true, nil }}
	r.plan()
	r.scheduleFaults()
	var sf scheduledFault
	for _, f := range r.scheduled {
		if f.kind == "abandon" {
			sf = f
		}
	}
	if sf.payment == nil || !sf.crash {
		t.Fatalf("scheduled %+v; want an abandoned client carrying the crash after its charge", r.scheduled)
	}
	p, err := newFaultProxy(func(string) bool { return true }) // every answer dropped
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	p.setUpstream(replica.URL)
	r.proxies = []*faultProxy{p}
	stop := make(chan struct{})
	stands := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- r.force(t.Context(), sf, stop, func() { close(stands) }) }()
	r.pay(t.Context(), sf.payment)
	if p.dropped.Load() != 1 {
		t.Fatalf("answers dropped: %d; want the abandoned try's", p.dropped.Load())
	}
	select {
	case <-stands:
	case err := <-done:
		t.Fatalf("an abandoned try whose replica answered, its answer dropped, ended the order (%v); want it to stand for the next payment", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the order neither stood nor ended within 30s")
	}
	close(stop)
	if err := <-done; err == nil {
		t.Error("the load ended with no abandoned try that crashed its replica after the charge: no error; want one")
	}
}

// A try asking for a crash after its charge that got no answer without
// its replica dying of it (the fault proxy's header timeout, the client
// gone) asked for nothing more: a SIGKILL of that process long after (the
// OOM killer's) is a violation, not the crash the run ordered. One that
// comes as the try got no answer is that crash.
func TestCrashTryOutlivedIsNoOrder(t *testing.T) {
	t.Parallel()
	killed := exec.Command("sh", "-c", "kill -KILL $$").Run()
	if err := unexpectedExit(killed, true); err != nil {
		t.Skipf("no SIGKILLed process here: %v", err)
	}
	for _, tc := range []struct {
		name  string
		after time.Duration // from the try's end to the process's exit
		crash bool
	}{
		{"a SIGKILL as the try got no answer", 0, true},
		{"a SIGKILL long after the try got no answer", time.Hour, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rp := &replica{n: 1, lives: 1, base: "http://127.0.0.1:1", tail: []string{"the last line"}}
			rp.crashTry(rp.base)(false) // forwarded; the proxy's round trip failed
			end := time.Now()
			rp.mu.Lock()
			rp.exit, rp.ups = killed, []upSpan{{from: end.Add(-time.Minute), to: end.Add(tc.after)}}
			rp.mu.Unlock()
			r := &run{}
			r.cfg.CrashAfterCharge = 0.05
			r.selfExit(rp)
			if crashes, exits := r.crashes.Load(), len(r.unexpectedExits); tc.crash && (crashes != 1 || exits != 0) || !tc.crash && (crashes != 0 || exits != 1) {
				t.Fatalf("crashes %d, unexpected exits %d %q; want a crash %v", crashes, exits, r.unexpectedExits, tc.crash)
			}
		})
	}
}

// A replica that does not say it is ready in time is asked for its
// goroutines' stacks (SIGQUIT) before it is killed: they land in the
// replicas' log under its name, naming what its start waited for, and the
// error says where they are, after what it had written before.
func TestReplicaNotReadyKeepsItsStacks(t *testing.T) {
	t.Parallel()
	// It waits without working, as a start blocked on a lock or a
	// connection does.
	script := `trap 'kill $!; echo "goroutine 1 [IO wait]:" >&2; echo "main.connect()" >&2; exit 2' QUIT
echo "starting" >&2
sleep 600 2>/dev/null &
wait`
	var log bytes.Buffer
	lw := &lineWriter{w: &log}
	rp := &replica{n: 1, exe: "sh", args: []string{"-c", script}, log: lw, startWait: 300 * time.Millisecond}
	t.Cleanup(func() { rp.kill() })
	err := rp.start(t.Context())
	if err == nil {
		t.Fatal("a replica that never said it was ready started")
	}
	select {
	case <-rp.exited():
	default:
		t.Fatalf("replica 1 still runs after its start failed")
	}
	lw.mu.Lock()
	text := log.String()
	lw.mu.Unlock()
	for _, want := range []string{"replica 1: goroutine 1 [IO wait]:", "replica 1: main.connect()"} {
		if !strings.Contains(text, want) {
			t.Errorf("the replicas' log lacks %q:\n%s", want, text)
		}
	}
	msg := err.Error()
	for _, want := range []string{"replica 1 did not say it was ready", "300ms", "starting", "SIGQUIT", "the replicas' log"} {
		if !strings.Contains(msg, want) {
			t.Errorf("the error %q lacks %q", msg, want)
		}
	}
	if strings.Contains(msg, "main.connect()") {
		t.Errorf("the error %q repeats the stacks the log keeps", msg)
	}
}

// A replica's start is bounded by its progress, not by the wall clock: on
// a loaded machine a start that keeps working (using CPU time) may take
// longer than the bound, and still starts; one that waits without working
// is ended at the bound (TestReplicaNotReadyKeepsItsStacks).
func TestReplicaStartWaitsWhileItWorks(t *testing.T) {
	t.Parallel()
	if _, ok := startwatch.CPUTime(os.Getpid()); !ok {
		t.Skip("skipping: no reading of a process's CPU time here")
	}
	// It works for 1.5s, three times its start's bound, before it says it
	// is ready: it reads the clock (/proc/uptime, in hundredths of a
	// second) with the shell's builtins alone, so the work is its own.
	script := `now() { read up _ </proc/uptime; t=${up%.*}${up#*.}; }
now; end=$((t + 150))
while [ $t -lt $end ]; do now; done
echo "` + listeningPrefix + `http://127.0.0.1:1" >&2
exec sleep 600`
	rp := &replica{n: 0, exe: "sh", args: []string{"-c", script}, startWait: 500 * time.Millisecond}
	t.Cleanup(func() { rp.kill() })
	if err := rp.start(t.Context()); err != nil {
		t.Fatalf("a replica that kept working did not start: %v", err)
	}
}
