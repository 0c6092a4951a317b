package console

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/keyed"
)

// KeyActions is what the console acts through on an execution stopped at
// a recovery point. keyed.Completer (idemhttp.Completer) implements it:
// its errors for a key that is not in flight at a point, or that a live
// execution holds, leave the key as it was.
type KeyActions interface {
	// ResumeKey runs one completer round for the key now. finished
	// reports that it ended (its answer kept, or released having done
	// nothing); otherwise err says why not. With dryRun it only checks.
	ResumeKey(ctx context.Context, scope idem.Scope, key idem.Key, dryRun bool) (finished bool, err error)
	// Settle completes the key with answer as its kept answer, atomically
	// against an execution finishing it at the same moment. With dryRun
	// it only checks.
	Settle(ctx context.Context, scope idem.Scope, key idem.Key, answer idem.Response, dryRun bool) (idem.Record, error)
	// Failures counts the key's failed resumes, with the last error.
	Failures(scope idem.Scope, key idem.Key) ResumeFailures
	// UnknownKeys names the keys whose last resume failed, which the
	// completer may hold under that resume's lease (the store's Abandoned
	// does not list them then).
	UnknownKeys() []idem.Ref
}

// ResumeFailures counts the failed resumes of a key whose outcome is
// unknown, with the last error.
type ResumeFailures = keyed.ResumeFailures

// Actions on an execution stopped at a recovery point, as KeyEvent.Action
// names them.
const (
	ActionResume       = "resume"
	ActionSettleFailed = "settle-failed"
	ActionSettleAnswer = "settle-answer"
)

// KeyEvent is one operator's action on a key stopped at a recovery point:
// who, when, what, why, and what came of it.
type KeyEvent struct {
	Scope  idem.Scope
	Key    idem.Key
	At     time.Time
	Actor  string
	Action string // ActionResume, ActionSettleFailed, ActionSettleAnswer
	Reason string
	// Result is what came of it: "finished", "settled (status 409)", or
	// the error of a resume that failed.
	Result string
}

// KeyHistory keeps the operators' actions on keys stopped at a recovery
// point, kept apart from the keys (a settled key's record is purged in
// time; its history is not).
type KeyHistory interface {
	AddKeyEvent(ctx context.Context, ev KeyEvent) error
	// KeyEvents returns the key's events, oldest first.
	KeyEvents(ctx context.Context, scope idem.Scope, key idem.Key) ([]KeyEvent, error)
}

// NewMemoryKeyHistory returns a KeyHistory kept in memory, for tests and
// for a console whose history may be lost with the process.
func NewMemoryKeyHistory() KeyHistory { return &memoryHistory{} }

type memoryHistory struct {
	mu  sync.Mutex
	evs []KeyEvent
}

func (m *memoryHistory) AddKeyEvent(_ context.Context, ev KeyEvent) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.evs = append(m.evs, ev)
	return nil
}

func (m *memoryHistory) KeyEvents(_ context.Context, scope idem.Scope, key idem.Key) ([]KeyEvent, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []KeyEvent
	for _, ev := range m.evs {
		if ev.Scope == scope && ev.Key == key {
			out = append(out, ev)
		}
	}
	return out, nil
}

// MaxReason is the most characters an operator's reason for an action on
// a key may hold (the console's form and idem keys settle alike).
const MaxReason = 500

// SettledHeader is set on every answer kept by a settle, so that the
// client's retry can tell it from the service's own: "failed" or
// "answer".
const SettledHeader = "Idem-Settled-By-Operator"

// FailedAnswer is the answer a settle as failed keeps: 409, a problem
// document saying that an operator settled the request as failed, and
// that a new attempt needs a new key. It names neither the operator nor
// the reason: those are the history's.
func FailedAnswer() idem.Response {
	body, _ := json.Marshal(map[string]any{
		"type":   "about:blank",
		"title":  "Settled as failed by an operator",
		"status": http.StatusConflict,
		"detail": "The outcome of this request could not be learned; an operator checked that nothing was done and settled it as failed. Send it again under a new idempotency key.",
	})
	return idem.Response{Status: http.StatusConflict, Body: body,
		Header: http.Header{"Content-Type": {"application/problem+json"}, SettledHeader: {"failed"}}}
}

// OperatorAnswer is the answer a settle with an answer keeps: status and
// body as the operator gave them, the body's type, and SettledHeader. A
// body of type application/json must be one JSON value; a type with a
// control character (a line break, a tab, NUL) is refused.
func OperatorAnswer(status int, contentType, body string) (idem.Response, error) {
	contentType = strings.TrimSpace(contentType)
	if contentType == "" {
		contentType = "application/json"
	}
	switch {
	case status < 200 || status > 599:
		return idem.Response{}, &idem.ArgumentError{Field: "status", Reason: fmt.Sprintf("%d is not a final HTTP status (200 to 599)", status)}
	case strings.ContainsFunc(contentType, func(r rune) bool { return r < 0x20 || r == 0x7f }):
		// It is sent as a header to the client's retry.
		return idem.Response{}, &idem.ArgumentError{Field: "content type", Reason: fmt.Sprintf("%q holds a control character", contentType)}
	case strings.HasSuffix(strings.ToLower(strings.SplitN(contentType, ";", 2)[0]), "json") && !json.Valid([]byte(body)):
		return idem.Response{}, &idem.ArgumentError{Field: "body", Reason: "is not one JSON value, as " + contentType + " says it is"}
	}
	return idem.Response{Status: status, Body: []byte(body),
		Header: http.Header{"Content-Type": {contentType}, SettledHeader: {"answer"}}}, nil
}

// SettleResult is what the key's history says of a settle of answer that
// ended in err (KeyEvent.Result), and whether an entry is due. A settle
// that succeeded is "settled (status N)". One refused for the key's state
// or its arguments changed nothing: no entry. Any other error (the store
// failed while completing the key, say) leaves the settle's result
// unknown, since the answer may have been kept all the same: the entry
// says so, so that the history never lacks a settle that took effect.
func SettleResult(answer idem.Response, err error) (result string, record bool) {
	switch {
	case err == nil:
		return fmt.Sprintf("settled (status %d)", answer.Status), true
	case errors.Is(err, keyed.ErrNotStopped), errors.Is(err, keyed.ErrBeingFinished), errors.Is(err, keyed.ErrOtherPoint),
		errors.Is(err, idem.ErrNotFound), errors.Is(err, idem.ErrInvalidArgument):
		return "", false
	}
	return fmt.Sprintf("result unknown (settle with status %d): %v", answer.Status, err), true
}

// --- pages ---

type outcomePage struct {
	Scope, Key string
	Found      bool
	Record     idem.Record
	Row        *stoppedRow
	Events     []KeyEvent
	Problem    string
	Done       string
	CanAct     bool
	Now        time.Time
}

var outcomeDone = map[string]string{
	"resumed":        "Resumed: the execution was finished, and its answer kept for the client's retry.",
	"resume-failed":  "The resume failed: the outcome is still unknown. The history has the error.",
	"settled-failed": "Settled as failed: the client's retry gets an answer saying so.",
	"settled-answer": "Settled with your answer: the client's retry gets it, marked as settled by an operator.",
}

var actionTitles = map[string]string{
	ActionResume:       "Resume now",
	ActionSettleFailed: "Settle as failed",
	ActionSettleAnswer: "Settle with an answer",
}

func (c *Console) outcomeURL(scope, key string) string {
	return c.cfg.Prefix + "/outcomes/key?" + url.Values{"scope": {scope}, "key": {key}}.Encode()
}

// readKey reads and checks the scope and key a request names.
func readKey(v url.Values) (idem.Scope, idem.Key, error) {
	scope, key := v.Get("scope"), v.Get("key")
	k, err := idem.ParseKey(key)
	if err != nil {
		return "", "", err
	}
	if len(scope) > 1000 || strings.ContainsFunc(scope, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		return "", "", &idem.ArgumentError{Field: "scope", Reason: "must be at most 1000 bytes without control characters"}
	}
	return idem.Scope(scope), k, nil
}

// outcome shows one key: its record, what its point says, its failed
// resumes, its history and, while it is stopped, the actions.
func (c *Console) outcome(w http.ResponseWriter, r *http.Request) {
	if c.cfg.Recoveries == nil {
		c.fail(w, r, http.StatusNotFound, "Not found", "This console is not given a key store with recovery points.")
		return
	}
	scope, key, err := readKey(r.URL.Query())
	if err != nil {
		c.fail(w, r, http.StatusBadRequest, "Refused", err.Error())
		return
	}
	now := c.cfg.Clock.Now()
	page := &outcomePage{Scope: string(scope), Key: string(key), Now: now, Done: outcomeDone[r.URL.Query().Get("done")]}
	rec, err := c.cfg.Recoveries.Get(r.Context(), scope, key)
	switch {
	case errors.Is(err, idem.ErrNotFound):
	case err != nil:
		c.failAction(w, r, "", err)
		return
	default:
		page.Found, page.Record = true, rec
		if rec.State == idem.StateInFlight && !rec.Recovery.IsZero() {
			row := c.row(r.Context(), rec, now)
			page.Row = &row
			page.CanAct = c.cfg.Actions != nil && !row.Held
		}
	}
	if c.cfg.KeyHistory != nil {
		if page.Events, err = c.cfg.KeyHistory.KeyEvents(r.Context(), scope, key); err != nil {
			page.Problem = "The history could not be read: " + err.Error()
		}
	}
	status := http.StatusOK
	if !page.Found && len(page.Events) == 0 {
		status = http.StatusNotFound
	}
	c.render(w, r, status, "outcome", page)
}

type confirmPage struct {
	Scope, Key  string
	Action      string
	Title       string
	Row         stoppedRow
	Reason      string
	Status      string
	ContentType string
	Body        string
	Problem     string
	Failed      idem.Response
}

// confirm shows what an action will do and asks for the reason: the
// action is taken only from this page's form.
func (c *Console) confirm(w http.ResponseWriter, r *http.Request) {
	c.confirmWith(w, r, r.URL.Query(), "", http.StatusOK)
}

func (c *Console) confirmWith(w http.ResponseWriter, r *http.Request, v url.Values, problem string, status int) {
	scope, key, action, ok := c.actionArgs(w, r, v)
	if !ok {
		return
	}
	// A dry run: it says now, not after the reason is typed, that the key
	// cannot be acted on.
	var err error
	if action == ActionResume {
		_, err = c.cfg.Actions.ResumeKey(r.Context(), scope, key, true)
	} else {
		_, err = c.cfg.Actions.Settle(r.Context(), scope, key, idem.Response{}, true)
	}
	if err != nil {
		c.refuseKey(w, r, scope, key, err)
		return
	}
	rec, err := c.cfg.Recoveries.Get(r.Context(), scope, key)
	if err != nil {
		c.refuseKey(w, r, scope, key, err)
		return
	}
	page := &confirmPage{Scope: string(scope), Key: string(key), Action: action, Title: actionTitles[action],
		Row: c.row(r.Context(), rec, c.cfg.Clock.Now()), Reason: v.Get("reason"), Status: v.Get("status"),
		ContentType: v.Get("content_type"), Body: v.Get("body"), Problem: problem, Failed: FailedAnswer()}
	if page.Status == "" {
		page.Status = "200"
	}
	if page.ContentType == "" {
		page.ContentType = "application/json"
	}
	c.render(w, r, status, "confirm", page)
}

// actionArgs checks a request's key and action; false when it answered.
func (c *Console) actionArgs(w http.ResponseWriter, r *http.Request, v url.Values) (idem.Scope, idem.Key, string, bool) {
	if c.cfg.Recoveries == nil || c.cfg.Actions == nil {
		c.fail(w, r, http.StatusNotFound, "Not found", "This console is not given a completer to act on executions stopped at a recovery point.")
		return "", "", "", false
	}
	scope, key, err := readKey(v)
	if err != nil {
		c.fail(w, r, http.StatusBadRequest, "Refused", err.Error()+". Nothing was changed.")
		return "", "", "", false
	}
	action := v.Get("action")
	if _, ok := actionTitles[action]; !ok {
		c.fail(w, r, http.StatusBadRequest, "Refused", fmt.Sprintf("Action %q: want resume, settle-failed or settle-answer. Nothing was changed.", action))
		return "", "", "", false
	}
	return scope, key, action, true
}

// refuseKey answers an action refused for the key's state (or the store's
// failure), having changed nothing.
func (c *Console) refuseKey(w http.ResponseWriter, r *http.Request, scope idem.Scope, key idem.Key, err error) {
	back := c.outcomeURL(string(scope), string(key))
	var status int
	var heading string
	switch {
	case errors.Is(err, idem.ErrNotFound):
		status, heading = http.StatusNotFound, "No such key"
	case errors.Is(err, idem.ErrInvalidArgument):
		status, heading = http.StatusBadRequest, "Refused"
	case errors.Is(err, keyed.ErrNotStopped), errors.Is(err, keyed.ErrBeingFinished):
		status, heading = http.StatusConflict, "This key cannot be acted on now"
	case errors.Is(err, keyed.ErrOtherPoint):
		// Stopped by another face (the gRPC one): its answer must be kept
		// in that face's form, which this console's completer cannot.
		status, heading = http.StatusConflict, "This key was stopped by another face of the service"
	default:
		c.cfg.Logger.Error("console: action on a key failed", "operator", operatorOf(r.Context()), "err", err)
		c.render(w, r, http.StatusInternalServerError, "error", &errorPage{Heading: "The action failed",
			Message: "The service could not complete it; the log says why.", Details: errorLines(err), Back: back})
		return
	}
	c.render(w, r, status, "error", &errorPage{Heading: heading, Message: "Nothing was changed.", Details: errorLines(err), Back: back})
}

// historyWriteTimeout bounds the writing of an action's entry in the
// key's history, which goes on when the request is given up.
const historyWriteTimeout = 30 * time.Second

// act takes an action confirmed on the confirmation page.
func (c *Console) act(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		c.fail(w, r, http.StatusBadRequest, "Refused", "The form could not be read: "+err.Error())
		return
	}
	v := r.PostForm
	scope, key, action, ok := c.actionArgs(w, r, v)
	if !ok {
		return
	}
	op := operatorOf(r.Context())
	reason := strings.TrimSpace(v.Get("reason"))
	if reason == "" {
		c.confirmWith(w, r, v, "A reason is required: it is kept in the key's history. Nothing was changed.", http.StatusBadRequest)
		return
	}
	if utf8.RuneCountInString(reason) > MaxReason {
		c.confirmWith(w, r, v, fmt.Sprintf("A reason is at most %d characters. Nothing was changed.", MaxReason), http.StatusBadRequest)
		return
	}
	if v.Get("confirm") != "yes" {
		c.confirmWith(w, r, v, "Confirm the action by ticking the box. Nothing was changed.", http.StatusBadRequest)
		return
	}
	ev := KeyEvent{Scope: scope, Key: key, Actor: op, Action: action, Reason: reason}
	var done string
	switch action {
	case ActionResume:
		finished, err := c.cfg.Actions.ResumeKey(r.Context(), scope, key, false)
		switch {
		case finished:
			ev.Result, done = "finished", "resumed"
		case errors.Is(err, keyed.ErrNotStopped), errors.Is(err, keyed.ErrBeingFinished), errors.Is(err, keyed.ErrOtherPoint):
			c.refuseKey(w, r, scope, key, err)
			return
		case err != nil:
			ev.Result, done = "failed: "+err.Error(), "resume-failed"
		default:
			ev.Result, done = "not finished", "resume-failed"
		}
	default:
		answer := FailedAnswer()
		if action == ActionSettleAnswer {
			status, err := strconv.Atoi(strings.TrimSpace(v.Get("status")))
			if err != nil {
				status = 0
			}
			answer, err = OperatorAnswer(status, v.Get("content_type"), strings.ReplaceAll(v.Get("body"), "\r\n", "\n"))
			if err != nil {
				c.confirmWith(w, r, v, "Refused: "+err.Error()+". Nothing was changed.", http.StatusBadRequest)
				return
			}
		}
		_, err := c.cfg.Actions.Settle(r.Context(), scope, key, answer, false)
		if result, record := SettleResult(answer, err); err != nil {
			if record {
				// The answer may have been kept: the history says so.
				ev.At, ev.Result = c.cfg.Clock.Now(), result
				hctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), historyWriteTimeout)
				if herr := c.cfg.KeyHistory.AddKeyEvent(hctx, ev); herr != nil {
					err = errors.Join(err, fmt.Errorf("its entry in the key's history could not be written: %w", herr))
				}
				cancel()
			}
			c.refuseKey(w, r, scope, key, err)
			return
		}
		ev.Result, _ = SettleResult(answer, nil)
		done = map[string]string{ActionSettleFailed: "settled-failed", ActionSettleAnswer: "settled-answer"}[action]
	}
	ev.At = c.cfg.Clock.Now()
	// The action was taken: its entry is written even when the browser
	// has given up the request meanwhile (its context cancelled).
	hctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), historyWriteTimeout)
	defer cancel()
	if err := c.cfg.KeyHistory.AddKeyEvent(hctx, ev); err != nil {
		c.cfg.Logger.Error("console: the action was taken but its history could not be written", "action", action, "operator", op, "err", err)
		c.render(w, r, http.StatusInternalServerError, "error", &errorPage{Heading: "Done, but not recorded",
			Message: "The action was taken (" + ev.Result + "), but its entry in the key's history could not be written.",
			Details: errorLines(err), Back: c.outcomeURL(string(scope), string(key))})
		return
	}
	c.cfg.Logger.Info("console: action on a key stopped at a recovery point", "action", action, "operator", op, "result", ev.Result)
	http.Redirect(w, r, c.outcomeURL(string(scope), string(key))+"&done="+done, http.StatusSeeOther)
}

// row is rec as the pages show it.
func (c *Console) row(ctx context.Context, rec idem.Record, now time.Time) stoppedRow {
	row := stoppedRow{Scope: string(rec.Scope), Key: string(rec.Key), Point: rec.Recovery.Name, SavedAt: rec.Recovery.SavedAt,
		Since: rec.LeaseExpiresAt, Unknown: now.Sub(rec.LeaseExpiresAt) > c.cfg.CompletionBound,
		Held: rec.LeaseExpiresAt.After(now)}
	if c.cfg.ShowPoint != nil {
		fields, err := c.cfg.ShowPoint(ctx, rec)
		if err != nil {
			row.Problem = err.Error()
		}
		row.Fields = fields
	} else {
		row.Fields = []PointField{{Name: "point", Value: rec.Recovery.Name}, {Name: "data", Value: fmt.Sprintf("%d bytes", len(rec.Recovery.Data))}}
	}
	if c.cfg.Actions != nil {
		row.Failures = c.cfg.Actions.Failures(rec.Scope, rec.Key)
		// A failed resume means the completer could not learn the
		// outcome: it is unknown, whatever the bound says; and the lease
		// that resume took is the completer's own, which its actions use.
		row.Unknown = row.Unknown || row.Failures.Count > 0
		row.Held = row.Held && !row.Failures.Holding
	}
	return row
}
