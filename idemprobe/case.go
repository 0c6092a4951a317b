package idemprobe

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
)

// AnyEffect, as Case.Effect, leaves the effect counter unchecked.
const AnyEffect = -1

// Case is a check written as data: requests sent in order (Steps), what
// each answer must be (Step.Want), and how much the effect counter must
// have grown by the end (Effect). A rule specific to an API is a few
// lines:
//
//	idemprobe.Case{
//		Name:   "refund-replayed",
//		Title:  "a refund sent twice is refunded once",
//		Source: "our API guide, Refunds",
//		Steps: []idemprobe.Step{
//			{Name: "first", Body: `{"payment":"pay_1","amount":{{n}}}`, Want: idemprobe.Want{Status: []int{201}}},
//			{Name: "retry", Body: `{"payment":"pay_1","amount":{{n}}}`, Want: idemprobe.Want{Same: "first", Replayed: true}},
//		},
//		Effect: 1,
//	}
//
// Each step is one request of the Config's Method, body and headers (or
// the step's own), under a key: the steps of a case share one fresh key
// unless they name others (Step.Key), and each key has its operation, whose
// {{n}} its steps' bodies repeat. A case passes when every answer is what
// its step wants and the effect grew by Effect; it fails naming the steps
// that got something else; it could not finish when a request got no
// answer or the budget ran out; and it is not applicable when it needs an
// option the Config lacks (a Step that is Slow, Fault or AsOther) or when a
// step's NotApplicable says so. Its requests and answers are its evidence,
// as for every check.
type Case struct {
	// Name is the case's stable name, the subtest's and the report's:
	// lowercase letters, digits and single hyphens. Required, and unique
	// among the checks.
	Name string
	// Title says in one line what must hold. Defaults to Name.
	Title string
	// Source is where the rule comes from, as the report cites it (a
	// section of the draft, a page of the API's guide). Defaults to none.
	Source string
	// Steps are the requests, sent in order. At least one.
	Steps []Step
	// Effect is how much the effect counter (Config.CountURL) must have
	// grown from before the first step to after the last: 1 for an
	// operation that runs once however often it is sent, 0 for refusals
	// only. AnyEffect leaves it unchecked; without Config.CountURL it is
	// not checked either.
	Effect int
	// Pass is the reason the report gives when the case passes. Defaults
	// to each step's answer in turn.
	Pass string
}

// Step is one request of a Case, and what its answer must be.
type Step struct {
	// Name is how later steps refer to this one (Want.Same, Want.Other)
	// and how the report names it. Defaults to "step N", N counting
	// from 1.
	Name string
	// About says what the request is, for the report ("without a key");
	// defaults to Name.
	About string

	// Key names the step's key: steps with the same Key carry the same
	// fresh key (Config.NewKey), made for this run of the case, and send
	// the same operation. Defaults to "", the case's own key.
	Key string
	// NoKey sends the request without a key header.
	NoKey bool
	// RawKey is sent as the key header's value instead of the key, with
	// every {{key}} in it replaced by the key: `"{{key}}"` sends it as a
	// structured-field string, strings.Repeat("k", 300) one too long.
	RawKey string

	// Body is the step's body, a template like Config.Body ({{n}} is the
	// counter of the step's operation). Defaults to Config.Body.
	Body string
	// OtherBody sends the key's other body: another than its first
	// request's, made as check 3 makes it (the next {{n}}, else one field
	// more). Without a body to vary the case is not applicable.
	OtherBody bool
	// Method is the step's method. Defaults to Config.Method.
	Method string
	// Header is sent on top of Config.Header, replacing a header of the
	// same name. A name that is not a token, or a value with a line break
	// or another control character but a tab, makes the Config invalid.
	Header http.Header
	// AsOther sends the step under Config.OtherHeader, the other
	// credential; Slow with Config.SlowHeader, which holds it in flight;
	// Fault with Config.FaultHeader, which makes it fail with a 5xx. The
	// case is not applicable without the option a step needs.
	AsOther, Slow, Fault bool

	// Copies sends this many copies of the request at once. Each answer is
	// judged by Want, and those that succeed must all be the same: copies
	// are duplicates of each other. Defaults to 1; at most
	// Config.MaxRequests.
	Copies int
	// Background sends the next step while this one is in flight: once
	// this one is written and Config.HeadStart has passed. Give it Slow, so
	// that it is still running by then; if it is answered within the head
	// start, the case cannot finish. The step after next waits for its
	// answer.
	Background bool
	// HangUp closes the connection as soon as the answer starts to arrive,
	// without reading it, as a client whose network failed would: the
	// request ran, and its answer is lost. Its Want is not judged.
	HangUp bool

	// Want is what the answer must be. Its zero value wants any 2xx.
	Want Want
	// NotApplicable, when set, makes a 2xx answer to this step mean the
	// case does not apply, for this reason (a rule that holds only where
	// the endpoint enforces it: one that runs a request without a key does
	// not require keys).
	NotApplicable string
}

// Want is what an answer must be; every field given must hold.
type Want struct {
	// Status lists the statuses accepted, each exact (422) or a class (4
	// for any 4xx). Defaults to any 2xx, or, with Same, to that step's
	// status.
	Status []int
	// Same names an earlier step whose answer this one must be again: the
	// same status, body (compared as JSON when both are) and id.
	Same string
	// Other names an earlier step whose answer this one must not be: not
	// the same id, not marked as a replay, and, when neither has an id,
	// not the same status and body. Status still applies: a second
	// execution passes, and a refusal too where Status accepts it
	// (Status: []int{2, 4}); with Status left to its default, a refusal
	// is not the 2xx wanted.
	Other string
	// Replayed wants the answer marked as a replay (Config.ReplayHeader:
	// true).
	Replayed bool
	// Header lists headers the answer must carry.
	Header []string
	// Conflict wants what a duplicate sent while a request under its key is
	// in flight may get: 409, or, unless Config.Strict, the in-flight
	// request's answer once it waited for it. The step must follow a
	// Background step under the same key, or have Copies (then the
	// requests in flight are its own copies, and whether one arrived
	// before another finished cannot be told, so Strict does not apply).
	// It decides the status: Status and Same are not given with it.
	Conflict bool
}

var caseName = regexp.MustCompile(`^[a-z0-9]+(-[a-z0-9]+)*$`)

// caseCheck makes c a row of the table: numbered number, needing the
// options its steps need, and run by runCase. It returns why c cannot be
// run, if it cannot.
func caseCheck(number int, c Case) (check, error) {
	c.Steps = append([]Step(nil), c.Steps...) // the caller's slice may change under a run
	if err := c.validate(); err != nil {
		return check{}, fmt.Errorf("case %q: %w", c.Name, err)
	}
	title := c.Title
	if title == "" {
		title = c.Name
	}
	return check{
		number: number, name: c.Name, title: title, source: c.Source,
		requires: c.requires,
		run:      func(ctx context.Context, p *prober, chk *Check) error { return p.runCase(ctx, &c, chk) },
	}, nil
}

// validate refuses a case that cannot be run as written, before anything
// is sent.
func (c *Case) validate() error {
	switch {
	case !caseName.MatchString(c.Name):
		return errors.New("the name must be lowercase letters and digits joined by single hyphens")
	case len(c.Steps) == 0:
		return errors.New("no steps")
	case c.Effect < AnyEffect:
		return fmt.Errorf("Effect %d: want a count of at least 0, or AnyEffect", c.Effect)
	}
	seen := map[string]int{}
	for i := range c.Steps {
		s := &c.Steps[i]
		if s.Name == "" {
			s.Name = "step " + strconv.Itoa(i+1)
		}
		if _, dup := seen[s.Name]; dup {
			return fmt.Errorf("two steps are named %q", s.Name)
		}
		bad := func(format string, args ...any) error {
			return fmt.Errorf("step %q: %s", s.Name, fmt.Sprintf(format, args...))
		}
		w := &s.Want
		switch {
		case s.Copies < 0:
			return bad("Copies %d is negative", s.Copies)
		case s.Copies > 1 && (s.HangUp || s.Background):
			return bad("copies cannot hang up or be sent in the background")
		case s.HangUp && s.Background:
			return bad("a step that hangs up cannot be sent in the background")
		case s.HangUp && !w.zero():
			return bad("a step that hangs up has no answer to want")
		case s.Background && i == len(c.Steps)-1:
			return bad("the last step has no next step to send while it is in flight")
		case s.NoKey && s.RawKey != "":
			return bad("NoKey and RawKey contradict each other")
		case s.OtherBody && s.Body != "":
			return bad("OtherBody varies the key's body: it is not given with Body")
		case w.Conflict && (len(w.Status) > 0 || w.Same != ""):
			return bad("Conflict decides the status: Status and Same are not given with it")
		case w.Conflict && s.Copies < 2 && !(i > 0 && c.Steps[i-1].Background && c.Steps[i-1].Key == s.Key):
			return bad("Conflict needs a duplicate in flight: a Background step just before it under the same key, or Copies")
		}
		for _, st := range w.Status {
			if !(st >= 1 && st <= 5) && !(st >= 100 && st <= 599) {
				return bad("status %d is neither a status (100 to 599) nor a class (1 to 5)", st)
			}
		}
		for _, h := range w.Header {
			if !validHeaderName(h) {
				return bad("%q is not a header name", h)
			}
		}
		// What the HTTP client would refuse only when the step is sent,
		// the earlier steps sent by then: refused before anything is.
		for name, vs := range s.Header {
			if !validHeaderName(name) {
				return bad("%q is not a header name", name)
			}
			for _, v := range vs {
				if !validHeaderValue(v) {
					return bad("the value of %s has a line break or a control character", name)
				}
			}
		}
		if s.Method != "" && !validHeaderName(s.Method) {
			return bad("method %q is not a method (a token)", s.Method)
		}
		if !validHeaderValue(s.RawKey) {
			return bad("RawKey has a line break or a control character other than a tab")
		}
		for _, ref := range []string{w.Same, w.Other} {
			if ref == "" {
				continue
			}
			j, ok := seen[ref]
			switch {
			case !ok:
				return bad("it refers to %q, which is not an earlier step", ref)
			case c.Steps[j].HangUp:
				return bad("it refers to %q, which hangs up and has no answer", ref)
			}
		}
		seen[s.Name] = i
	}
	return nil
}

func (w *Want) zero() bool {
	return len(w.Status) == 0 && w.Same == "" && w.Other == "" && !w.Replayed && len(w.Header) == 0 && !w.Conflict
}

// requires says which option the case needs and the Config lacks.
func (c *Case) requires(p *prober) string {
	for _, s := range c.Steps {
		for _, need := range []struct {
			on    bool
			check func(*prober) string
		}{{s.Slow, needsSlowHeader}, {s.Fault, needsFaultHeader}, {s.AsOther, needsOtherHeader}} {
			if need.on {
				if reason := need.check(p); reason != "" {
					return reason
				}
			}
		}
	}
	return ""
}

// needsFaultHeader makes a case that makes the endpoint fail not
// applicable without Config.FaultHeader.
func needsFaultHeader(p *prober) string {
	if p.fault[0] == "" {
		return "no --fault-header given to make the endpoint fail"
	}
	return ""
}

// stepRun is what a step sent and got.
type stepRun struct {
	exs []Exchange
	// answered closes when every answer is in (at once, but for a
	// Background step).
	answered chan struct{}
}

// caseRun is one run of a case: the keys and operations its labels stand
// for.
type caseRun struct {
	keys   map[string]string
	ops    map[string]operation
	others map[string]operation
}

// runCase sends c's steps, then judges their answers and the effect.
func (p *prober) runCase(ctx context.Context, c *Case, chk *Check) error {
	r := &caseRun{keys: map[string]string{}, ops: map[string]operation{}, others: map[string]operation{}}
	var k *counter
	if c.Effect != AnyEffect {
		k = p.startCount(ctx, chk)
	}
	runs := make([]*stepRun, len(c.Steps))
	// record adds the evidence of the steps sent, in their order, once
	// every answer is in.
	record := func() {
		for _, sr := range runs {
			if sr != nil {
				<-sr.answered
				chk.record(sr.exs...)
			}
		}
	}
	var pending *stepRun // a Background step the next step overlaps
	for i := range c.Steps {
		s := &c.Steps[i]
		sr, stop := p.sendStep(ctx, c, s, r, chk)
		runs[i] = sr
		if stop {
			record()
			return nil
		}
		if pending != nil {
			<-pending.answered
			pending = nil
		}
		if s.Background {
			pending = sr
			if early := p.holdBackground(ctx, sr); early {
				record()
				chk.errorf("%s was answered (%s) within the head start of %s: nothing held it in flight (give it Slow, and Config.SlowHeader)",
					s.label(), answerOrError(sr.exs[0]), p.cfg.HeadStart)
				return nil
			}
		}
	}
	record()
	var d int64
	counted := false
	if k != nil {
		var err error
		if d, counted, err = k.delta(ctx, chk); err != nil {
			chk.errorf("%s", err)
			return nil
		}
	}
	for i := range c.Steps {
		s := &c.Steps[i]
		for _, ex := range runs[i].exs {
			if ex.Error != "" && !s.HangUp {
				if len(c.Steps) == 1 && s.Copies < 2 {
					chk.errorf("no answer: %s", ex.Error)
				} else {
					chk.errorf("%s: no answer: %s", s.label(), ex.Error)
				}
				return nil
			}
		}
	}
	for i := range c.Steps {
		s := &c.Steps[i]
		for _, ex := range runs[i].exs {
			if s.NotApplicable != "" && ex.Response != nil && ex.Response.success() {
				chk.notApplicable(fmt.Sprintf("%s: it answered %s", s.NotApplicable, ex.Response.statusText()))
				return nil
			}
		}
	}
	var failures, passes []string
	for i := range c.Steps {
		s := &c.Steps[i]
		if s.HangUp {
			passes = append(passes, s.label()+": hung up")
			continue
		}
		answers := make([]*Answer, len(runs[i].exs))
		for j, ex := range runs[i].exs {
			answers[j] = ex.Response
			p.noteReplay(ex.Response)
		}
		var inflight *Answer
		if i > 0 && c.Steps[i-1].Background {
			inflight = runs[i-1].exs[0].Response
		}
		if why := p.judgeStep(c, s, answers, runs, inflight); why != "" {
			failures = append(failures, why)
		} else {
			passes = append(passes, s.label()+": "+summarize(answers))
		}
	}
	if counted && c.Effect != AnyEffect && d != int64(c.Effect) {
		failures = append(failures, fmt.Sprintf("the effect grew by %d, want %d", d, c.Effect))
	}
	switch {
	case len(failures) > 0:
		chk.failf("%s", strings.Join(failures, "; "))
	case c.Pass != "":
		chk.passf("%s", c.Pass)
	default:
		switch {
		case counted && c.Effect != AnyEffect && d == 0:
			passes = append(passes, "the effect did not grow")
		case counted && c.Effect != AnyEffect:
			passes = append(passes, fmt.Sprintf("the effect grew by %d", d))
		}
		chk.passf("%s", strings.Join(passes, "; "))
	}
	return nil
}

func (s *Step) label() string {
	if s.About != "" {
		return s.About
	}
	return s.Name
}

// sendStep sends s and returns what it sent; stop says the case cannot
// go on (its verdict is set).
func (p *prober) sendStep(ctx context.Context, c *Case, s *Step, r *caseRun, chk *Check) (sr *stepRun, stop bool) {
	sr = &stepRun{answered: make(chan struct{})}
	op, ok := r.operation(p, s)
	if !ok {
		close(sr.answered)
		chk.notApplicable("the request has no body to vary")
		return sr, true
	}
	key, noKey := "", s.NoKey
	if !noKey {
		key = s.RawKey
		if key == "" {
			key = r.key(p, s.Key)
		} else if strings.Contains(key, "{{key}}") {
			key = strings.ReplaceAll(key, "{{key}}", r.key(p, s.Key))
		}
	}
	var extra [][2]string
	for _, o := range []struct {
		on bool
		h  [2]string
	}{{s.AsOther, p.other}, {s.Slow, p.slow}, {s.Fault, p.fault}} {
		if o.on {
			extra = append(extra, o.h)
		}
	}
	// A 5xx met on the way is kept for check 7 only from a request it can
	// send again as it was.
	plain := len(extra) == 0 && !noKey && s.Method == "" && len(s.Header) == 0
	n := max(s.Copies, 1)
	reqs := make([]*http.Request, n)
	sr.exs = make([]Exchange, n)
	for i := range reqs {
		req, err := p.newRequest(ctx, op, key, noKey, extra...)
		if err != nil {
			close(sr.answered)
			chk.errorf("%s: %s", s.label(), err)
			return sr, true
		}
		if s.Method != "" {
			req.Method = s.Method
		}
		for name, vs := range s.Header {
			req.Header[http.CanonicalHeaderKey(name)] = vs
		}
		reqs[i], sr.exs[i].Request = req, p.describeRequest(req, op.body)
	}
	if err := p.reserve(n); err != nil {
		close(sr.answered)
		sr.exs = sr.exs[:1]
		sr.exs[0].Error = err.Error()
		if n == 1 && len(c.Steps) == 1 {
			chk.errorf("no answer: %s", err)
		} else {
			chk.errorf("%s: %s", s.label(), err)
		}
		return sr, true
	}
	switch {
	case s.HangUp:
		defer close(sr.answered)
		if err := p.sendAndHangUp(ctx, reqs[0]); err != nil {
			sr.exs[0].Error = err.Error()
			chk.errorf("%s: the request whose answer is lost: %s", s.label(), err)
			return sr, true
		}
		sr.exs[0].Note = "answer not read: the connection was closed on purpose as it began to arrive"
		return sr, false
	case s.Background:
		wrote := make(chan struct{})
		go func() {
			defer close(sr.answered)
			p.do(reqs[0], &sr.exs[0], wrote)
			if plain {
				p.noteFailure(key, op, sr.exs[0])
			}
		}()
		<-wrote
		return sr, false
	}
	defer close(sr.answered)
	// Copies wait at a gate, so that they leave together.
	gate := make(chan struct{})
	var wg sync.WaitGroup
	for i := range reqs {
		wg.Go(func() {
			<-gate
			p.do(reqs[i], &sr.exs[i], nil)
		})
	}
	close(gate)
	wg.Wait()
	if plain {
		for _, ex := range sr.exs {
			p.noteFailure(key, op, ex)
		}
	}
	return sr, false
}

// holdBackground lets a Background step run for Config.HeadStart once it
// is written; early says it was answered by then.
func (p *prober) holdBackground(ctx context.Context, sr *stepRun) (early bool) {
	t := time.NewTimer(p.cfg.HeadStart)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
	select {
	case <-sr.answered:
		return true
	default:
		return false
	}
}

// key is the key of label in this run of the case, made at its first use.
func (r *caseRun) key(p *prober, label string) string {
	k, ok := r.keys[label]
	if !ok {
		k = p.cfg.NewKey()
		r.keys[label] = k
	}
	return k
}

// operation is what s sends: its key's operation, or that operation's
// other body, with s's own body when it has one; ok is false when the
// other body is wanted and there is none.
func (r *caseRun) operation(p *prober, s *Step) (operation, bool) {
	op, seen := r.ops[s.Key]
	if !seen {
		op = p.newOperation()
		r.ops[s.Key] = op
	}
	switch {
	case s.OtherBody:
		other, made := r.others[s.Key]
		if !made {
			var ok bool
			if other, ok = p.variant(op); !ok {
				return operation{}, false
			}
			r.others[s.Key] = other
		}
		return other, true
	case s.Body != "":
		return operation{n: op.n, body: strings.ReplaceAll(s.Body, "{{n}}", strconv.FormatInt(op.n, 10))}, true
	}
	return op, true
}

// judgeStep says how the answers to s differ from what it wants, or ""
// when they do not. runs are every step's, for the steps s refers to;
// inflight is the answer of the Background step before s, if any.
func (p *prober) judgeStep(c *Case, s *Step, answers []*Answer, runs []*stepRun, inflight *Answer) string {
	ref := func(name string) *Answer {
		for i := range c.Steps {
			if c.Steps[i].Name == name {
				return runs[i].exs[0].Response
			}
		}
		return nil
	}
	w := &s.Want
	var ok []*Answer
	for _, a := range answers {
		if why := p.judgeAnswer(w, a, ref, inflight); why != "" {
			return fmt.Sprintf("%s: answered %s%s%s, want %s", s.label(), a.statusText(), idNote(a), replayedNote(a), why)
		}
		if a.success() {
			ok = append(ok, a)
		}
	}
	if len(ok) > 1 {
		ids := map[string]bool{}
		for _, a := range ok {
			if a.ID != "" {
				ids[a.ID] = true
			}
		}
		switch {
		case len(ids) > 1:
			return fmt.Sprintf("%s: %d copies with one key ran %d times: the answers name %d different ids", s.label(), len(answers), len(ids), len(ids))
		case !allSame(ok):
			return fmt.Sprintf("%s: the %d successful answers to its copies differ in status or body", s.label(), len(ok))
		}
	}
	return ""
}

// judgeAnswer says what a lacks of w, or "".
func (p *prober) judgeAnswer(w *Want, a *Answer, ref func(string) *Answer, inflight *Answer) string {
	if w.Conflict {
		switch {
		case a.Status == http.StatusConflict:
		case inflight == nil && a.success():
			// Among copies, the one that ran or a replay of it: allSame
			// tells them apart.
		case inflight != nil && sameAnswer(a, inflight) && p.cfg.Strict:
			return fmt.Sprintf("409 while the first is in flight, not its answer after waiting for it (%s%s): Strict holds a duplicate in flight to the draft's 409",
				inflight.statusText(), idNote(inflight))
		case inflight != nil && sameAnswer(a, inflight):
			// The first's answer itself, not merely one marked as a
			// replay: a duplicate that ran again may be marked too.
		case p.cfg.Strict || inflight == nil:
			return "409 for a duplicate in flight"
		default:
			return fmt.Sprintf("409 for a duplicate in flight, or the first's answer once it waited for it (%s%s)", inflight.statusText(), idNote(inflight))
		}
	}
	switch {
	case len(w.Status) > 0 && !statusIn(a.Status, w.Status):
		return statusList(w.Status)
	case len(w.Status) == 0 && w.Same == "" && !w.Conflict && !a.success():
		return "a 2xx"
	}
	if w.Same != "" {
		if b := ref(w.Same); !sameAnswer(a, b) {
			return fmt.Sprintf("the answer of %s again (%s%s)", w.Same, b.statusText(), idNote(b))
		}
	}
	if w.Other != "" {
		b := ref(w.Other)
		if (a.ID != "" && a.ID == b.ID) || a.replayed() || (a.ID == "" && b.ID == "" && a.Status == b.Status && sameBody(a.body, b.body)) {
			return fmt.Sprintf("another answer than %s's (%s%s)", w.Other, b.statusText(), idNote(b))
		}
	}
	if w.Replayed && !a.replayed() {
		return fmt.Sprintf("it marked as a replay (%s: true)", p.cfg.ReplayHeader)
	}
	for _, h := range w.Header {
		if a.header.Get(h) == "" {
			return "a " + http.CanonicalHeaderKey(h) + " header"
		}
	}
	return ""
}

func statusIn(status int, want []int) bool {
	for _, w := range want {
		if w == status || (w <= 5 && status/100 == w) {
			return true
		}
	}
	return false
}

func statusList(want []int) string {
	s := make([]string, len(want))
	for i, w := range want {
		if w <= 5 {
			s[i] = fmt.Sprintf("%dxx", w)
		} else {
			s[i] = strconv.Itoa(w)
		}
	}
	return strings.Join(s, " or ")
}

// summarize says what answers were, for a reason: one answer as it is,
// copies by how many got each.
func summarize(as []*Answer) string {
	if len(as) == 1 {
		return as[0].statusText() + idNote(as[0]) + replayedNote(as[0])
	}
	var order []string
	count := map[string]int{}
	for _, a := range as {
		s := a.statusText() + idNote(a)
		if count[s] == 0 {
			order = append(order, s)
		}
		count[s]++
	}
	parts := make([]string, len(order))
	for i, s := range order {
		parts[i] = fmt.Sprintf("%d answered %s", count[s], s)
	}
	return strings.Join(parts, ", ")
}
