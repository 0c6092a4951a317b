package torture

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// maxBody bounds the bodies the proxy holds in memory; the payment API's
// are far smaller.
const maxBody = 1 << 20

// faultProxy stands in front of one replica, on a listener of its own that
// outlives the replica's restarts. It forwards every request, and for those
// drop picks, waits for the replica's answer and then closes the client's
// connection without passing it on: the lost response of the story, after
// the effect has happened.
type faultProxy struct {
	ln        net.Listener
	srv       *http.Server
	transport *http.Transport
	drop      func(key string) bool

	mu       sync.Mutex
	upstream string // the replica's base URL; "" while it is down
	// crashTry, when set, is told of each try asking for a crash after
	// its charge forwarded upstream (replica.crashTry), and returns what
	// to call once the try ended, saying whether the replica answered it.
	crashTry func(upstream string) (ended func(answered bool))

	forwarded atomic.Int64 // requests the replica answered
	dropped   atomic.Int64 // answers not passed on
}

// newFaultProxy listens on a loopback port of its own and serves until
// close.
func newFaultProxy(drop func(key string) bool) (*faultProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("fault proxy: %w", err)
	}
	p := &faultProxy{
		ln:   ln,
		drop: drop,
		transport: &http.Transport{
			MaxIdleConnsPerHost: 256,
			IdleConnTimeout:     30 * time.Second,
			// The replica's answer is bounded by its own request timeout;
			// this only catches one that hangs for good.
			ResponseHeaderTimeout: time.Minute,
		},
	}
	p.srv = &http.Server{Handler: p, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = p.srv.Serve(ln) }()
	return p, nil
}

// url is where clients reach the proxy.
func (p *faultProxy) url() string { return "http://" + p.ln.Addr().String() }

// onCrashTry sets what the proxy tells of each try asking for a crash
// after its charge it forwards (faultProxy.crashTry).
func (p *faultProxy) onCrashTry(f func(upstream string) (ended func(answered bool))) {
	p.mu.Lock()
	p.crashTry = f
	p.mu.Unlock()
}

// setUpstream points the proxy at the replica's new base URL, or at
// nothing ("") while it is down.
func (p *faultProxy) setUpstream(base string) {
	p.mu.Lock()
	p.upstream = base
	p.mu.Unlock()
	if base == "" {
		// Connections to the dead process are of no further use.
		p.transport.CloseIdleConnections()
	}
}

func (p *faultProxy) close() {
	_ = p.srv.Close()
	p.transport.CloseIdleConnections()
}

func (p *faultProxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.mu.Lock()
	upstream, crashTry := p.upstream, p.crashTry
	p.mu.Unlock()
	if upstream == "" {
		http.Error(w, "fault proxy: the replica is down", http.StatusBadGateway)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody))
	if err != nil {
		http.Error(w, "fault proxy: reading the request: "+err.Error(), http.StatusBadRequest)
		return
	}
	out, err := http.NewRequestWithContext(r.Context(), r.Method, upstream+r.URL.RequestURI(), oneShot(body))
	if err != nil {
		http.Error(w, "fault proxy: "+err.Error(), http.StatusBadGateway)
		return
	}
	out.ContentLength = int64(len(body))
	out.Header = r.Header.Clone()
	out.Header.Del("Connection")
	ended := func(bool) {}
	if crashTry != nil && r.Header.Get("Idem-Fault") == faultCrashAfterCharge {
		// Before it is sent: the replica may die of it before answering.
		ended = crashTry(upstream)
	}
	resp, err := p.transport.RoundTrip(out)
	if err != nil {
		ended(false)
		http.Error(w, proxyNoAnswer+": "+err.Error(), http.StatusBadGateway)
		return
	}
	ended(true)
	answer, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	resp.Body.Close()
	if err != nil {
		http.Error(w, "fault proxy: reading the replica's answer: "+err.Error(), http.StatusBadGateway)
		return
	}
	p.forwarded.Add(1)
	if p.drop(r.Header.Get("Idempotency-Key")) {
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			p.dropped.Add(1)
			conn.Close()
			return
		}
	}
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(answer)
}

// proxyNoAnswer starts the 502 a fault proxy answers when its replica
// gave no answer (it died holding the request, say).
const proxyNoAnswer = "fault proxy: the replica did not answer"

// oneShot is a request body that net/http cannot replay by itself. Requests
// with an Idempotency-Key count as replayable to its Transport, which then
// resends them on its own when a kept-alive connection fails; with this
// body every attempt is one request on the wire, counted and retried by the
// run alone.
func oneShot(b []byte) io.Reader { return struct{ io.Reader }{bytes.NewReader(b)} }
