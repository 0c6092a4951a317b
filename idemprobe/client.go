package idemprobe

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync"
	"syscall"
	"time"
)

// setUpClient makes the HTTP client every request goes through, but the
// one whose answer is lost on purpose, which has a connection of its own.
func (p *prober) setUpClient() {
	cfg := &p.cfg
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
		MaxIdleConnsPerHost: max(cfg.Concurrency, cfg.HistoryClients),
		ForceAttemptHTTP2:   false,
	}
	p.client = &http.Client{
		Transport: p.transport,
		// A redirect is an answer to report, not to follow.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// requireLoopback resolves host and refuses it unless every address it
// names is a loopback address.
func requireLoopback(ctx context.Context, host string) error {
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

// describeError says when the probe's own timeout cut a request short,
// which Go reports only as a deadline exceeded.
func describeError(ctx context.Context, err error) string {
	if ctx.Err() != nil && errors.Is(err, context.DeadlineExceeded) {
		return "the probe's timeout ran out"
	}
	return err.Error()
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
