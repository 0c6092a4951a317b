package idemgrpc

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
)

// observation is an observed call's state: PhaseRequest's context, and
// what its phases report (see Config.Observer). A call is observed only
// when the Interceptor has an Observer; otherwise none is made.
type observation struct {
	ctx     context.Context
	e       idemhttp.Event
	start   time.Time
	outcome idemhttp.Outcome
	status  int
	mark    time.Time
	phases  [idemhttp.PhaseReplay + 1]struct {
		ctx   context.Context
		start time.Time
	}
}

// observe begins PhaseRequest of c and returns the function that ends it.
func (c *call) observe() func() {
	// The Event's Request is the call as the HTTP/2 request it is, so
	// that an observer written for idemhttp names it sensibly.
	r := &http.Request{Method: http.MethodPost, URL: &url.URL{Path: c.method}, Proto: "HTTP/2.0", ProtoMajor: 2,
		Header: http.Header{"Content-Type": {"application/grpc"}}, RequestURI: c.method}
	r = r.WithContext(c.ctx)
	o := &observation{e: idemhttp.Event{Phase: idemhttp.PhaseRequest, Request: r, Store: c.i.storeName}, start: time.Now()}
	o.ctx = c.i.obs.Begin(c.ctx, o.e)
	c.obs, c.ctx = o, o.ctx
	return func() {
		e := o.e
		e.Phase, e.Duration, e.Outcome, e.Status = idemhttp.PhaseRequest, time.Since(o.start), o.outcome, o.status
		c.i.obs.End(o.ctx, e)
	}
}

// noteKey records the call's scope and key, once read.
func (c *call) noteKey(scope idem.Scope, key idem.Key) {
	if c.obs != nil {
		c.obs.e.Scope, c.obs.e.Key = scope, key
	}
}

// begin starts phase p and returns its context: ctx when the call is not
// observed or p has begun already.
func (c *call) begin(ctx context.Context, p idemhttp.Phase) context.Context {
	o := c.obs
	if o == nil || o.phases[p].ctx != nil {
		return ctx
	}
	e := o.e
	e.Phase = p
	pctx := c.i.obs.Begin(ctx, e)
	o.phases[p].ctx, o.phases[p].start = pctx, time.Now()
	return pctx
}

// end ends phase p, if it has begun, with what e carries.
func (c *call) end(p idemhttp.Phase, e idemhttp.Event) {
	o := c.obs
	if o == nil || o.phases[p].ctx == nil {
		return
	}
	ph := &o.phases[p]
	e.Phase, e.Request, e.Store, e.Scope, e.Key = p, o.e.Request, o.e.Store, o.e.Scope, o.e.Key
	e.Duration = time.Since(ph.start)
	if e.Status != 0 {
		o.status = e.Status
	}
	pctx := ph.ctx
	ph.ctx = nil
	c.i.obs.End(pctx, e)
}

func (c *call) markStore() {
	if c.obs != nil {
		c.obs.mark = time.Now()
	}
}

func (c *call) storeSince(op idemhttp.StoreOp, err error) {
	if c.obs != nil && !c.obs.mark.IsZero() {
		c.i.obs.Store(c.ctx, op, time.Since(c.obs.mark), err)
	}
}

// tally counts an outcome and records it as the call's.
func (c *call) tally(o idemhttp.Outcome) {
	c.i.count(o)
	if c.obs != nil {
		c.obs.outcome = o
	}
}

func failureErr(failure string) error {
	if failure == "" {
		return nil
	}
	return errors.New("handler " + failure)
}
