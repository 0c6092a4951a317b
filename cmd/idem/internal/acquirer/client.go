package acquirer

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
)

// ClientConfig configures NewClient.
type ClientConfig struct {
	// URL is the acquirer's base URL ("http://127.0.0.1:8090"). Required.
	URL string
	// APIKey is sent as the bearer key, when set.
	APIKey string
	// Transport makes each attempt. Defaults to http.DefaultTransport.
	Transport http.RoundTripper
	// Policy bounds and spaces the retries of a charge or refund whose
	// outcome is unknown or transient (idemhttp.RoundTripper's). Defaults
	// to 4 attempts, 100ms base, 2s cap, full jitter.
	Policy idem.RetryPolicy
	// Timeout bounds one call, its retries included. Defaults to 10s.
	Timeout time.Duration
}

// Client calls an acquirer. Charges and refunds go through
// idemhttp.RoundTripper with the caller's key, so an attempt whose answer
// was lost is retried with that key and the acquirer answers it with the
// charge it made, never a second one.
type Client struct {
	base    string
	apiKey  string
	http    *http.Client
	timeout time.Duration
}

// NewClient returns a Client of the acquirer at cfg.URL.
func NewClient(cfg ClientConfig) (*Client, error) {
	u, err := url.Parse(cfg.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("acquirer URL %q: want http://HOST:PORT or https://HOST:PORT", cfg.URL)
	}
	if cfg.Policy.MaxAttempts == 0 {
		cfg.Policy.MaxAttempts = 4
	}
	if cfg.Policy.Base == 0 {
		cfg.Policy.Base = 100 * time.Millisecond
	}
	if cfg.Policy.Cap == 0 {
		cfg.Policy.Cap = 2 * time.Second
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 10 * time.Second
	}
	return &Client{
		base:    strings.TrimRight(cfg.URL, "/"),
		apiKey:  cfg.APIKey,
		http:    &http.Client{Transport: &idemhttp.RoundTripper{Base: cfg.Transport, Policy: cfg.Policy}},
		timeout: cfg.Timeout,
	}, nil
}

// ErrDeclined is matched by the error of a charge the network declined:
// deterministic, so a retry with the same key is declined again.
var ErrDeclined = errors.New("acquirer: the card was declined")

// ErrUnavailable is matched by the error of a call whose outcome is
// unknown or transient after its retries (5xx, a lost connection, a
// timeout): a later call with the same key finds out what happened and
// makes the charge at most once.
var ErrUnavailable = errors.New("acquirer: unavailable")

// Error is the acquirer's refusal: its status and problem.
type Error struct {
	Status int
	Type   string
	Detail string
}

func (e *Error) Error() string {
	return fmt.Sprintf("acquirer: %d %s: %s", e.Status, strings.TrimPrefix(e.Type, ProblemTypePrefix), e.Detail)
}

// Is makes a 402 match ErrDeclined and a 5xx ErrUnavailable.
func (e *Error) Is(target error) bool {
	switch target {
	case ErrDeclined:
		return e.Status == http.StatusPaymentRequired
	case ErrUnavailable:
		return e.Status >= 500 || e.Status == http.StatusConflict || e.Status == http.StatusTooManyRequests
	}
	return false
}

// Charge charges req at the acquirer under key: every call with the same
// key and request makes one charge, and returns it.
func (c *Client) Charge(ctx context.Context, key string, req ChargeRequest) (Charge, error) {
	var ch Charge
	err := c.post(ctx, key, "/v1/charges", req, &ch)
	return ch, err
}

// Refund refunds amount of the charge (all that is not refunded yet when
// amount is 0) under key.
func (c *Client) Refund(ctx context.Context, key, chargeID string, amount int64) (Refund, error) {
	body := map[string]any{}
	if amount != 0 {
		body["amount"] = amount
	}
	var rf Refund
	err := c.post(ctx, key, "/v1/charges/"+url.PathEscape(chargeID)+"/refunds", body, &rf)
	return rf, err
}

// Charges returns every charge, or a reference's when reference is not
// empty, in the order they were made.
func (c *Client) Charges(ctx context.Context, reference string) ([]Charge, error) {
	return c.list(ctx, url.Values{"reference": {reference}})
}

// ChargesSince returns the charges made at or after since (every charge
// when since is zero), in the order they were made. The network filters
// them: the charges before since are not sent. It holds them all: a
// reader of a long history pages through them with EachChargePage.
func (c *Client) ChargesSince(ctx context.Context, since time.Time) ([]Charge, error) {
	var all []Charge
	err := c.EachChargePage(ctx, since, MaxListLimit, func(page []Charge) error {
		all = append(all, page...)
		return nil
	})
	return all, err
}

// EachChargePage calls fn with each page of at most limit charges made at
// or after since (every charge when since is zero), in the order they were
// made, and stops at the first error fn returns. A page is read only after
// fn returned from the one before, and fn may keep none of it: however
// long the history, what the client holds is one page. limit is clamped
// to 1..MaxListLimit.
func (c *Client) EachChargePage(ctx context.Context, since time.Time, limit int, fn func(page []Charge) error) error {
	q := url.Values{}
	if !since.IsZero() {
		q.Set("created_gte", since.UTC().Format(time.RFC3339Nano))
	}
	return c.pages(ctx, q, min(max(limit, 1), MaxListLimit), fn)
}

// ChargeByID returns the charge id names, and false when the network has
// no such charge.
func (c *Client) ChargeByID(ctx context.Context, id string) (Charge, bool, error) {
	var ch Charge
	err := c.do(ctx, http.MethodGet, "/v1/charges/"+url.PathEscape(id), "", nil, &ch)
	var e *Error
	if errors.As(err, &e) && e.Status == http.StatusNotFound {
		return Charge{}, false, nil
	}
	if err != nil {
		return Charge{}, false, err
	}
	return ch, true, nil
}

// Ping checks that the acquirer answers and takes the client's API key,
// reading one charge of its list (which it may not have).
func (c *Client) Ping(ctx context.Context) error {
	var page ChargeList
	return c.do(ctx, http.MethodGet, "/v1/charges?limit=1", "", nil, &page)
}

// list reads every page of GET /v1/charges with the filters of q.
func (c *Client) list(ctx context.Context, filters url.Values) ([]Charge, error) {
	var all []Charge
	err := c.pages(ctx, filters, MaxListLimit, func(page []Charge) error {
		all = append(all, page...)
		return nil
	})
	return all, err
}

// pages reads GET /v1/charges with the filters of q, limit charges a page,
// and hands each page to fn before it reads the next.
func (c *Client) pages(ctx context.Context, filters url.Values, limit int, fn func([]Charge) error) error {
	after := ""
	for {
		q := url.Values{"limit": {fmt.Sprint(limit)}}
		for k, v := range filters {
			if len(v) > 0 && v[0] != "" {
				q.Set(k, v[0])
			}
		}
		if after != "" {
			q.Set("starting_after", after)
		}
		var page ChargeList
		if err := c.do(ctx, http.MethodGet, "/v1/charges?"+q.Encode(), "", nil, &page); err != nil {
			return err
		}
		if len(page.Data) == 0 {
			return nil
		}
		after = page.Data[len(page.Data)-1].ID
		if err := fn(page.Data); err != nil {
			return err
		}
		if !page.HasMore {
			return nil
		}
	}
}

func (c *Client) post(ctx context.Context, key, path string, body, out any) error {
	if key == "" {
		return errors.New("acquirer: a charge or refund needs an idempotency key")
	}
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	return c.do(ctx, http.MethodPost, path, key, b, out)
}

func (c *Client) do(ctx context.Context, method, path, key string, body []byte, out any) error {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set(idemhttp.HeaderKey, key)
	}
	if c.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.apiKey)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("%w: %s %s: %v", ErrUnavailable, method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("%w: %s %s: reading the answer: %v", ErrUnavailable, method, path, err)
	}
	if resp.StatusCode >= 300 {
		e := &Error{Status: resp.StatusCode}
		var p struct {
			Type   string `json:"type"`
			Detail string `json:"detail"`
		}
		if json.Unmarshal(data, &p) == nil {
			e.Type, e.Detail = p.Type, p.Detail
		}
		return e
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("%w: %s %s: the answer is not the JSON expected: %v", ErrUnavailable, method, path, err)
	}
	return nil
}
