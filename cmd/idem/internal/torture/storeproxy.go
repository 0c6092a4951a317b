package torture

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// StoreFaults are the faults a run puts between the replicas and their
// stores (PostgreSQL, and Redis with Config.Keys): a TCP proxy in front of
// each store, on a loopback port of its own, through which every replica
// connects. It never touches the stores themselves.
type StoreFaults struct {
	// Latency delays each chunk of bytes, either way, by a random time up
	// to it. Defaults to 0: none.
	Latency time.Duration
	// ResetRate is the chance that a chunk, either way, is not passed on
	// and both sides of its connection are reset instead; with it, the
	// run resets at least one connection, at a payment drawn from the
	// seed. Defaults to 0.
	ResetRate float64
	// CommitCutRate is the chance that PostgreSQL's answer to a COMMIT,
	// which it has carried out, is not passed on and the connection reset
	// instead: the ambiguous commit, after which the replica cannot tell
	// whether its transaction committed; with it, the run cuts at least
	// one, at a payment drawn from the seed. Defaults to 0.
	CommitCutRate float64
	// OutageEvery is the time between two outages of a random store: for
	// OutageFor, every connection to it is reset and every new one refused,
	// as while a server restarts or a network partition lasts; the store
	// itself keeps its data. No replica is restarted during an outage.
	// The first outage comes at a payment drawn from the seed, so a run
	// meets at least one however short it is. Defaults to 0: none.
	OutageEvery time.Duration
	// OutageFor is how long an outage lasts. Defaults to 1s when
	// OutageEvery is set.
	OutageFor time.Duration
}

func (f *StoreFaults) any() bool {
	return f != nil && (f.Latency > 0 || f.ResetRate > 0 || f.CommitCutRate > 0 || f.OutageEvery > 0)
}

// faultGrace is how long a new connection to a store goes without faults:
// long enough for a restarted replica to migrate and prepare on the
// connections it opens at start, even on a loaded machine (in CI, beside
// other tortures, a start took more than half a second, and a reset in
// its migrations made it exit), and short beside a run, whose replicas
// keep their connections.
const faultGrace = 3 * time.Second

// storeProxy forwards TCP connections to one store, with faults.
type storeProxy struct {
	ln     net.Listener
	target string
	faults StoreFaults
	// commits: cut COMMIT's answers (PostgreSQL's wire protocol only).
	commits bool
	rng     *lockedRand

	wg    sync.WaitGroup
	mu    sync.Mutex
	conns map[net.Conn]struct{}

	// armed turns the faults on; until then, and for a connection's first
	// faultGrace, bytes pass untouched, so that replicas start (migrate,
	// load their statements) and the run tests the service, not its
	// start-up.
	armed atomic.Bool

	// down refuses connections: an outage is on.
	down atomic.Bool

	// forceReset and forceCut are faults a run has ordered (see force):
	// the next chunk, or the next COMMIT's answer, is faulted whatever the
	// rates and the connection's grace; forced is told when one is carried
	// out (one order at a time: the run's chaos lock keeps them apart).
	forceReset, forceCut atomic.Bool
	forced               chan struct{}

	resets  atomic.Int64 // connections reset
	outages atomic.Int64 // outages begun
	cuts    atomic.Int64 // connections cut instead of passing COMMIT's answer on
}

func newStoreProxy(target string, faults StoreFaults, commits bool, rng *lockedRand) (*storeProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("store proxy: %w", err)
	}
	p := &storeProxy{ln: ln, target: target, faults: faults, commits: commits, rng: rng, conns: map[net.Conn]struct{}{}, forced: make(chan struct{}, 1)}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// addr is where replicas connect.
func (p *storeProxy) addr() string { return p.ln.Addr().String() }

func (p *storeProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if p.down.Load() {
			reset(c)
			continue
		}
		s, err := net.DialTimeout("tcp", p.target, 5*time.Second)
		if err != nil {
			c.Close()
			continue
		}
		if !p.track(c, s) {
			return
		}
		p.wg.Add(2)
		var once sync.Once
		done := func() {
			once.Do(func() { p.untrack(c, s) })
		}
		opened := time.Now()
		go func() { defer p.wg.Done(); defer done(); p.pipe(s, c, true, c, s, opened) }()
		go func() { defer p.wg.Done(); defer done(); p.pipe(c, s, false, c, s, opened) }()
	}
}

// pipe copies src to dst, one chunk at a time, with the faults; toStore
// says which way it goes. client and store are the connection's two sides.
func (p *storeProxy) pipe(dst, src net.Conn, toStore bool, client, store net.Conn, opened time.Time) {
	buf := make([]byte, 32<<10)
	var tail []byte // the end of the last chunk from the store (answersCommit)
	for {
		n, err := src.Read(buf)
		young := time.Since(opened) < faultGrace
		if n > 0 && (!p.armed.Load() || young && !p.forceReset.Load() && !p.forceCut.Load()) {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		} else if n > 0 {
			chunk := buf[:n]
			if p.faults.Latency > 0 && !young {
				time.Sleep(time.Duration(p.rng.Int64N(int64(p.faults.Latency) + 1)))
			}
			forced := p.forceReset.CompareAndSwap(true, false)
			if forced || !young && p.faults.ResetRate > 0 && p.rng.Float64() < p.faults.ResetRate {
				p.resets.Add(1)
				reset(client)
				reset(store)
				if forced {
					p.forced <- struct{}{}
				}
				return
			}
			var commit bool
			if !toStore && p.commits {
				commit, tail = answersCommit(tail, chunk)
			}
			if commit {
				forced := p.forceCut.CompareAndSwap(true, false)
				if forced || !young && p.faults.CommitCutRate > 0 && p.rng.Float64() < p.faults.CommitCutRate {
					// The database has committed and says so; the
					// replica never hears it.
					p.cuts.Add(1)
					reset(client)
					reset(store)
					if forced {
						p.forced <- struct{}{}
					}
					return
				}
			}
			if _, werr := dst.Write(chunk); werr != nil {
				return
			}
		}
		if err != nil {
			if err != io.EOF {
				reset(dst)
			} else if tc, ok := dst.(*net.TCPConn); ok {
				_ = tc.CloseWrite()
			}
			return
		}
	}
}

// commitComplete is PostgreSQL's CommandComplete message for a COMMIT:
// 'C', its length, the tag "COMMIT".
var commitComplete = []byte("C\x00\x00\x00\x0bCOMMIT\x00")

// answersCommit reports whether a chunk of PostgreSQL's wire protocol
// from the server completes a COMMIT's answer (commitComplete), one that
// began in the chunk before it too, whose end is tail. It returns the end
// to pass with the next chunk: a message split across two reads is not
// passed over.
func answersCommit(tail, chunk []byte) (bool, []byte) {
	seen := append(tail, chunk...)
	found := bytes.Contains(seen, commitComplete)
	keep := min(len(seen), len(commitComplete)-1)
	return found, append([]byte(nil), seen[len(seen)-keep:]...)
}

// reset closes c at once, with a TCP reset rather than an orderly close.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

// force orders a fault of its own, whatever the rates and the grace (see
// run.forceFaults): a reset (cut false) of a connection open through the
// proxy at once, idle or not, or, with none open, of the next chunk
// either way; or the next COMMIT's answer cut (cut true). It calls
// standing (when not nil) once such an order stands, before any traffic
// can carry it out, and returns whether the fault was carried out: once
// it is, or at stop, with the order withdrawn (false) unless it was
// carried out as stop came.
func (p *storeProxy) force(cut bool, standing func(), stop <-chan struct{}) bool {
	if !cut && p.resetOpen() {
		return true
	}
	order := &p.forceReset
	if cut {
		order = &p.forceCut
	}
	order.Store(true)
	if standing != nil {
		standing()
	}
	select {
	case <-p.forced:
		return true
	case <-stop:
		if !order.CompareAndSwap(true, false) {
			<-p.forced // carried out as stop came
			return true
		}
		return false
	}
}

// resetOpen resets one connection open through the proxy, if there is
// one (its other side follows, as its pipes end): a reset that needs no
// traffic, as a replica's idle pooled connection meets one.
func (p *storeProxy) resetOpen() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		p.resets.Add(1)
		reset(c)
		return true
	}
	return false
}

func (p *storeProxy) track(c ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conns == nil {
		for _, x := range c {
			x.Close()
		}
		return false
	}
	for _, x := range c {
		p.conns[x] = struct{}{}
	}
	return true
}

func (p *storeProxy) untrack(c ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, x := range c {
		x.Close()
		delete(p.conns, x)
	}
}

// outage resets every connection and refuses new ones for d.
func (p *storeProxy) outage(d time.Duration, stop <-chan struct{}) {
	p.outages.Add(1)
	p.down.Store(true)
	p.mu.Lock()
	for c := range p.conns {
		reset(c)
	}
	p.mu.Unlock()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-stop:
	}
	p.down.Store(false)
}

// close stops accepting, closes every connection and waits for the copies.
func (p *storeProxy) close() error {
	err := p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
	return err
}

// throughProxy returns rawURL with its host and port replaced by addr,
// and, with plain, TLS turned off (sslmode=disable): the proxy finds
// COMMIT's answer only in PostgreSQL's plain protocol, and carries it on
// loopback alone.
func throughProxy(rawURL, addr string, plain bool) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", err
	}
	u.Host = addr
	if plain {
		q := u.Query()
		q.Set("sslmode", "disable")
		u.RawQuery = q.Encode()
	}
	return u.String(), nil
}

// replicaPoolConns bounds each replica's PostgreSQL pool. idem serve's
// default (16 on a small machine) times three replicas, a LISTEN
// connection each and the connections a killed replica left to end, made
// two PostgreSQL tortures side by side ask a shared server for more than
// its 100 connections ("sorry, too many clients already").
const replicaPoolConns = 8

// boundPool returns the PostgreSQL URL rawURL with pool_max_conns set to
// replicaPoolConns, unless it sets one.
func boundPool(rawURL string) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		// url.Parse's error quotes the URL, which may hold a password.
		return "", errors.New("the database's URL does not parse")
	}
	q := u.Query()
	if q.Get("pool_max_conns") != "" {
		return rawURL, nil
	}
	q.Set("pool_max_conns", strconv.Itoa(replicaPoolConns))
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// targetOf returns the host:port rawURL connects to, with def the port
// when it names none.
func targetOf(rawURL, defPort string) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", err
	}
	host, port := u.Hostname(), u.Port()
	if host == "" {
		host = "127.0.0.1"
	}
	if port == "" {
		port = defPort
	}
	return net.JoinHostPort(host, port), nil
}
