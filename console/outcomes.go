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
// execution holds, leave the key as it was. keyed.Completers implements it
// for a service with several faces on one store (idemhttp's and
// idemgrpc's): each key is acted on by its own face's Completer, which
// keeps the answer in the form that face's retries read.
type KeyActions interface {
	// ResumeKey runs one completer round for the key now. finished
	// reports that it ended (its answer kept, or released having done
	// nothing); otherwise err says why not. With dryRun it only checks.
	ResumeKey(ctx context.Context, scope idem.Scope, key idem.Key, dryRun bool) (finished bool, err error)
	// Settle completes the key with answer as its kept answer, atomically
	// against an execution finishing it at the same moment. With dryRun
	// it only checks.
	Settle(ctx context.Context, scope idem.Scope, key idem.Key, answer idem.Response, dryRun bool) (idem.Record, error)
	// SettleRecorded is Settle with the settle recorded by record: in
	// the transaction that completes the key where the store has one
	// (see keyed.SettleRecord), so that the key's history never lacks a
	// settle that took effect nor holds one that did not.
	SettleRecorded(ctx context.Context, scope idem.Scope, key idem.Key, answer idem.Response, record keyed.SettleRecord) (idem.Record, error)
	// ResumeRecorded is ResumeKey, not a dry run, with a resume that
	// finishes the key recorded by record: a completion in the
	// transaction that completes the key where the store has one (see
	// keyed.ResumeRecord), so that the key's history never lacks a resume
	// that took effect nor holds one that did not.
	ResumeRecorded(ctx context.Context, scope idem.Scope, key idem.Key, record keyed.ResumeRecord) (finished bool, err error)
	// Failures counts the key's failed resumes, with the last error.
	Failures(scope idem.Scope, key idem.Key) ResumeFailures
	// UnknownKeys names the keys whose last resume failed, which the
	// completer may hold under that resume's lease, and those it holds
	// after a give-back that failed (the store's Abandoned does not list
	// them then).
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
	// ID is the history's: it grows with each entry it keeps, so that a
	// page of the history can say where the next one starts. Set by
	// KeyHistory.KeyEvents; AddKeyEvent ignores it.
	ID     int64
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
	// AddKeyEvent records ev. When ctx carries a transaction of the
	// database the history is kept in (a settle's or a resume's, see
	// keyed.SettleRecord and keyed.ResumeRecord), it writes in that
	// transaction, so that the entry commits with the action or not at
	// all. (NewMemoryKeyHistory's cannot, and says what follows.)
	AddKeyEvent(ctx context.Context, ev KeyEvent) error
	// KeyEvents returns a page of the key's events, newest first: at
	// most q.Limit of them, older than the event q.Before names when it
	// is not zero.
	KeyEvents(ctx context.Context, scope idem.Scope, key idem.Key, q KeyEventsQuery) ([]KeyEvent, error)
}

// KeyEventsQuery selects a page of a key's history (KeyHistory.KeyEvents).
type KeyEventsQuery struct {
	// Before, when not zero, is the ID of an event: only older ones are
	// returned (the page after the one that ended with it).
	Before int64
	// Limit is the most events returned. Defaults to
	// DefaultKeyEventsLimit; at most MaxKeyEventsLimit.
	Limit int
}

// The sizes of a page of a key's history.
const (
	DefaultKeyEventsLimit = 50
	MaxKeyEventsLimit     = 1000
)

// Normalize returns q with its defaults applied, or an error matching
// idem.ErrInvalidArgument for a negative field or a Limit over
// MaxKeyEventsLimit. KeyHistory implementations call it.
func (q KeyEventsQuery) Normalize() (KeyEventsQuery, error) {
	switch {
	case q.Before < 0:
		return q, &idem.ArgumentError{Field: "KeyEventsQuery.Before", Reason: "must not be negative"}
	case q.Limit < 0 || q.Limit > MaxKeyEventsLimit:
		return q, &idem.ArgumentError{Field: "KeyEventsQuery.Limit", Reason: fmt.Sprintf("must be 0 to %d", MaxKeyEventsLimit)}
	case q.Limit == 0:
		q.Limit = DefaultKeyEventsLimit
	}
	return q, nil
}

// MemoryKeyHistoryCap is the most entries a history NewMemoryKeyHistory
// returns keeps, over every key: past it, the oldest entry is dropped for
// each new one.
const MemoryKeyHistoryCap = 10000

// NewMemoryKeyHistory returns a KeyHistory kept in memory, for tests and
// demonstrations. What it does not promise:
//
//   - Durability: it is lost with the process, so it is no audit history.
//     A service keeps its history in a database (in idem's lab, the key
//     store's: payments.KeyHistory, KeyHistoryPostgres).
//   - Completeness: it keeps at most MemoryKeyHistoryCap entries, over
//     every key, and drops the oldest first, silently: a key's page then
//     shows fewer entries than were written.
//   - Transactions: it shares none with any key store. SettleAndRecord and
//     ResumeAndRecord know it, and record an action in it as they do on a
//     store without transactions (Redis, memory), even beside one that has
//     them (SQLite, PostgreSQL): an entry saying the action is under way
//     before the key changes, then one saying how it ended, so that an
//     action rolled back with its transaction is never recorded as taken.
//     Written by other means in a store's transaction, an entry stands
//     whatever becomes of that transaction.
func NewMemoryKeyHistory() KeyHistory { return &memoryHistory{} }

type memoryHistory struct {
	mu     sync.Mutex
	evs    []KeyEvent // oldest first
	lastID int64
}

func (m *memoryHistory) AddKeyEvent(_ context.Context, ev KeyEvent) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lastID++
	ev.ID = m.lastID
	if len(m.evs) >= MemoryKeyHistoryCap {
		// Moved down rather than resliced, so that the array stays at
		// the cap.
		n := copy(m.evs, m.evs[len(m.evs)-MemoryKeyHistoryCap+1:])
		m.evs = m.evs[:n]
	}
	m.evs = append(m.evs, ev)
	return nil
}

func (m *memoryHistory) KeyEvents(_ context.Context, scope idem.Scope, key idem.Key, q KeyEventsQuery) ([]KeyEvent, error) {
	q, err := q.Normalize()
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []KeyEvent
	for i := len(m.evs) - 1; i >= 0 && len(out) < q.Limit; i-- {
		ev := m.evs[i]
		if ev.Scope == scope && ev.Key == key && (q.Before == 0 || ev.ID < q.Before) {
			out = append(out, ev)
		}
	}
	return out, nil
}

// writesApart reports that history never writes in the transaction its
// context carries (the memory history), so that an entry written in a
// store's transaction would stand even if that transaction rolled back.
func writesApart(history KeyHistory) bool {
	_, ok := history.(*memoryHistory)
	return ok
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
// control character (a line break, a tab, NUL) is refused, and so is a
// status that asks the client to retry (a 5xx, 408, 425, 429), which its
// retries would get replayed for as long as the key lives.
func OperatorAnswer(status int, contentType, body string) (idem.Response, error) {
	contentType = strings.TrimSpace(contentType)
	if contentType == "" {
		contentType = "application/json"
	}
	switch {
	case status < 200 || status > 599:
		return idem.Response{}, &idem.ArgumentError{Field: "status", Reason: fmt.Sprintf("%d is not a final HTTP status (200 to 599)", status)}
	case status >= 500 || status == http.StatusRequestTimeout || status == http.StatusTooEarly || status == http.StatusTooManyRequests:
		// The client retries on these, and each retry would get the kept
		// answer replayed, for as long as the key lives: a face keeps no
		// such answer from a handler either (idemhttp.DefaultKeep).
		return idem.Response{}, &idem.ArgumentError{Field: "status", Reason: fmt.Sprintf("%d asks the client to retry, and its retries would get it replayed for as long as the key lives; settle with a 2xx, 3xx or 4xx", status)}
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
// or its arguments, or whose record failed (keyed.ErrNotRecorded), changed
// nothing: no entry. Any other error (the store
// failed while completing the key, say) leaves the settle's result
// unknown, since the answer may have been kept all the same: the entry
// says so, so that the history never lacks a settle that took effect.
func SettleResult(answer idem.Response, err error) (result string, record bool) {
	switch {
	case err == nil:
		return fmt.Sprintf("settled (status %d)", answer.Status), true
	case errors.Is(err, keyed.ErrNotStopped), errors.Is(err, keyed.ErrBeingFinished), errors.Is(err, keyed.ErrOtherPoint),
		errors.Is(err, idem.ErrNotFound), errors.Is(err, idem.ErrInvalidArgument), errors.Is(err, keyed.ErrNotRecorded):
		return "", false
	}
	return fmt.Sprintf("result unknown (settle with status %d): %v", answer.Status, err), true
}

// SettleAndRecord settles ev's key with answer through actions and
// records it in history as ev, its At and Result filled in: where the
// store shares a transaction with the history (SQLite, PostgreSQL: the
// history in the key store's database), in the settle's own transaction,
// so that neither can be kept without the other; elsewhere, first an entry
// saying the settle is under way, then one with its result, so that a
// crash between them leaves an entry saying the result is unknown, never a
// settle without one (see keyed.SettleRecord).
//
// settled reports that the key was settled; err then says that its
// result could not be added to the history (the entry saying it was under
// way stands). Otherwise err says why not: a refusal for the key's state
// or arguments, or keyed.ErrNotRecorded, having changed nothing; or a
// failure that leaves the settle's result unknown, which an entry then
// says (SettleResult). The entries written after the settle are written
// even once ctx has ended.
func SettleAndRecord(ctx context.Context, actions KeyActions, history KeyHistory, clock idem.Clock, ev KeyEvent, answer idem.Response) (settled bool, err error) {
	result, _ := SettleResult(answer, nil)
	var inTx, underWay bool
	_, err = actions.SettleRecorded(ctx, ev.Scope, ev.Key, answer, func(rctx context.Context, tx bool) error {
		e := ev
		tx = tx && !writesApart(history)
		e.At, inTx, underWay = clock.Now(), tx, !tx
		e.Result = result
		if !tx {
			e.Result = fmt.Sprintf("under way (settle with status %d): with no later entry, its result is unknown", answer.Status)
		}
		return history.AddKeyEvent(rctx, e)
	})
	if err == nil && inTx {
		return true, nil
	}
	if err == nil {
		if herr := addAfter(ctx, history, ev, clock, result); herr != nil {
			return true, fmt.Errorf("its result could not be added to the key's history: %w", herr)
		}
		return true, nil
	}
	r, record := SettleResult(answer, err)
	if !record && underWay && !errors.Is(err, keyed.ErrNotRecorded) {
		// Refused after the entry saying it was under way: say so.
		r, record = notTaken(err), true
	}
	if record {
		// The answer may have been kept: the history says so.
		if herr := addAfter(ctx, history, ev, clock, r); herr != nil {
			err = errors.Join(err, fmt.Errorf("its entry in the key's history could not be written: %w", herr))
		}
	}
	return false, err
}

// Results of a resume in the key's history (KeyEvent.Result).
const (
	resumeFinished  = "finished"
	resumeReleased  = "finished: the key was released (nothing was done outside); the client's retry runs the request anew"
	resumeUnderWay  = "under way (resume): with no later entry, its result is unknown"
	resumeReleasing = "under way (resume, releasing the key: nothing was done outside): with no later entry, its result is unknown"
)

// notTaken is the result of an action refused, having changed nothing,
// after an entry said it was under way.
func notTaken(err error) string { return "not taken, nothing was changed: " + err.Error() }

// historyError is an error writing an action's entry after the action
// was taken or failed.
type historyError struct{ error }

func (e historyError) Unwrap() error { return e.error }

// ResumeAndRecord resumes ev's key through actions (one completer round
// for it, now) and records it in history as ev, its At and Result filled
// in. A resume that finishes the key and keeps its answer is recorded,
// where the store shares a transaction with the history (SQLite,
// PostgreSQL: the history in the key store's database), in the very
// transaction that completes the key, so that neither can be kept without
// the other. Elsewhere, and for a resume that releases the key (it found
// that nothing was done outside: no store's release shares a
// transaction), first an entry saying the resume is under way, then one
// with its result, so that a crash between them leaves an entry saying
// the result is unknown, never a resumed key without one (see
// keyed.ResumeRecord). A resume that fails leaves the key as it was, and
// its failure is recorded after it.
//
// finished reports that the key was finished; err then says that its
// result could not be added to the history (the entry saying it was under
// way stands). Otherwise err says why not: a refusal for the key's state
// (keyed.ErrNotStopped, ErrBeingFinished, ErrOtherPoint) or
// keyed.ErrNotRecorded, having changed nothing in the store, with no
// entry; or the resume's failure, recorded ("failed: ...", or "result
// unknown (resume): ..." when keyed.ErrResultUnknown says the key may have
// been finished all the same), joined with
// the history's error when that entry could not be written. The entries
// written after the resume are written even once ctx has ended.
func ResumeAndRecord(ctx context.Context, actions KeyActions, history KeyHistory, clock idem.Clock, ev KeyEvent) (finished bool, err error) {
	var inTx, released, underWay bool
	finished, err = actions.ResumeRecorded(ctx, ev.Scope, ev.Key, func(rctx context.Context, tx bool, end keyed.ResumeEnd) error {
		e := ev
		tx = tx && !writesApart(history)
		e.At, inTx, released, underWay = clock.Now(), tx, end.Released, !tx
		switch {
		case tx:
			e.Result = resumeFinished
		case end.Released:
			e.Result = resumeReleasing
		default:
			e.Result = resumeUnderWay
		}
		return history.AddKeyEvent(rctx, e)
	})
	switch {
	case finished && inTx:
		return true, nil
	case finished:
		result := resumeFinished
		if released {
			result = resumeReleased
		}
		if herr := addAfter(ctx, history, ev, clock, result); herr != nil {
			return true, historyError{fmt.Errorf("its result could not be added to the key's history: %w", herr)}
		}
		return true, nil
	case errors.Is(err, keyed.ErrNotRecorded):
		return false, err
	case errors.Is(err, keyed.ErrNotStopped), errors.Is(err, keyed.ErrBeingFinished), errors.Is(err, keyed.ErrOtherPoint),
		errors.Is(err, idem.ErrInvalidArgument):
		if underWay {
			// Refused after the entry saying it was under way: say so.
			if herr := addAfter(ctx, history, ev, clock, notTaken(err)); herr != nil {
				err = errors.Join(err, historyError{fmt.Errorf("its entry in the key's history could not be written: %w", herr)})
			}
		}
		return false, err
	}
	if err == nil {
		err = errors.New("not finished")
	}
	result := "failed: " + err.Error()
	if errors.Is(err, keyed.ErrResultUnknown) {
		// The key may have been finished: never say it failed.
		result = "result unknown (resume): " + err.Error()
	}
	if herr := addAfter(ctx, history, ev, clock, result); herr != nil {
		err = errors.Join(err, historyError{fmt.Errorf("its entry in the key's history could not be written: %w", herr)})
	}
	return false, err
}

// notRecordedAfter reports that err, from ResumeAndRecord or SettleAndRecord,
// says an entry could not be written in the key's history after the
// action was taken or failed (not keyed.ErrNotRecorded, which says the
// action was not taken).
func notRecordedAfter(err error) bool {
	var he historyError
	return errors.As(err, &he)
}

// addAfter records ev with result, once the action was taken: with a
// context its caller's end does not end (a browser giving up the
// request, a Ctrl-C), bounded by historyWriteTimeout.
func addAfter(ctx context.Context, history KeyHistory, ev KeyEvent, clock idem.Clock, result string) error {
	hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), historyWriteTimeout)
	defer cancel()
	ev.At, ev.Result = clock.Now(), result
	return history.AddKeyEvent(hctx, ev)
}

// --- pages ---

type outcomePage struct {
	Scope, Key string
	Found      bool
	Record     idem.Record
	Row        *stoppedRow
	Events     []KeyEvent // newest first
	// Older links to the page of older events, Latest to the newest
	// ones; empty when there are none, or this is that page.
	Older, Latest string
	Problem       string
	Done          string
	CanAct        bool
	Now           time.Time
}

var outcomeDone = map[string]string{
	"resumed":        "Resumed: the execution was finished, and its answer kept for the client's retry.",
	"resume-failed":  "The resume failed: the outcome is still unknown. The history has the error.",
	"resume-unknown": "The resume's last write to the store got no answer: the key may have been finished all the same. The history has the error; the key's state above says what it holds now.",
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
		c.historyPage(r, page, scope, key)
	}
	status := http.StatusOK
	if !page.Found && len(page.Events) == 0 {
		status = http.StatusNotFound
	}
	c.render(w, r, status, "outcome", page)
}

// historyPageSize is how many of a key's events a page shows.
const historyPageSize = 50

// historyPage reads the page of the key's history the request names (its
// before parameter) into page.
func (c *Console) historyPage(r *http.Request, page *outcomePage, scope idem.Scope, key idem.Key) {
	var before int64
	if b := r.URL.Query().Get("before"); b != "" {
		n, err := strconv.ParseInt(b, 10, 64)
		if err != nil || n <= 0 {
			page.Problem = fmt.Sprintf("The history could not be read: before=%q is not an entry's number.", b)
			return
		}
		before = n
		page.Latest = c.outcomeURL(string(scope), string(key)) + "#history"
	}
	// One more than shown says whether there are older ones.
	evs, err := c.cfg.KeyHistory.KeyEvents(r.Context(), scope, key, KeyEventsQuery{Before: before, Limit: historyPageSize + 1})
	if err != nil {
		page.Problem = "The history could not be read: " + err.Error()
		return
	}
	if len(evs) > historyPageSize {
		evs = evs[:historyPageSize]
		page.Older = c.outcomeURL(string(scope), string(key)) + "&before=" + strconv.FormatInt(evs[len(evs)-1].ID, 10) + "#history"
	}
	page.Events = evs
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
	switch action {
	case ActionResume:
		_, err = c.cfg.Actions.ResumeKey(r.Context(), scope, key, true)
	case ActionSettleFailed:
		// Its answer is known: the key's face must be able to keep it.
		_, err = c.cfg.Actions.Settle(r.Context(), scope, key, FailedAnswer(), true)
	default:
		// The answer is not typed yet: the key alone.
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
		// A console served apart from the service (idem console) has no
		// completer: say where the actions are.
		c.fail(w, r, http.StatusNotFound, "Not found", "This console is not given the service's completer, which alone acts on executions stopped at a recovery point: "+
			"act from the console the service serves itself, or from a terminal (in idem's lab: idem serve --console; idem keys resume, idem keys settle). Nothing was changed.")
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
		// Stopped by a face whose completer this console was not given
		// (the gRPC one of a service started without it): its answer must
		// be kept in that face's form, which no completer here can.
		status, heading = http.StatusConflict, "This key was stopped by a face of the service this console does not act for"
	case errors.Is(err, keyed.ErrNotRecorded):
		// A settle is taken only with its entry in the history.
		c.cfg.Logger.Error("console: a settle was not taken: its history could not be written", "operator", operatorOf(r.Context()), "err", err)
		status, heading = http.StatusInternalServerError, "Not settled: its entry in the key's history could not be written"
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
	if action == ActionResume {
		c.resumeAct(w, r, ev)
		return
	}
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
	settled, err := SettleAndRecord(r.Context(), c.cfg.Actions, c.cfg.KeyHistory, c.cfg.Clock, ev, answer)
	if settled && err != nil {
		c.cfg.Logger.Error("console: the key was settled but its result could not be added to its history", "action", action, "operator", op, "err", err)
		c.render(w, r, http.StatusInternalServerError, "error", &errorPage{Heading: "Done, but not fully recorded",
			Message: "The key was settled, but its result could not be added to the key's history (an entry says the settle was under way).",
			Details: errorLines(err), Back: c.outcomeURL(string(scope), string(key))})
		return
	}
	if err != nil {
		c.refuseKey(w, r, scope, key, err)
		return
	}
	done := map[string]string{ActionSettleFailed: "settled-failed", ActionSettleAnswer: "settled-answer"}[action]
	result, _ := SettleResult(answer, nil)
	c.cfg.Logger.Info("console: action on a key stopped at a recovery point", "action", action, "operator", op, "result", result)
	http.Redirect(w, r, c.outcomeURL(string(scope), string(key))+"&done="+done, http.StatusSeeOther)
}

// resumeAct takes a confirmed resume of ev's key.
func (c *Console) resumeAct(w http.ResponseWriter, r *http.Request, ev KeyEvent) {
	scope, key, action, op := ev.Scope, ev.Key, ev.Action, ev.Actor
	finished, err := ResumeAndRecord(r.Context(), c.cfg.Actions, c.cfg.KeyHistory, c.cfg.Clock, ev)
	switch {
	case finished && err != nil:
		c.cfg.Logger.Error("console: the key was resumed but its result could not be added to its history", "action", action, "operator", op, "err", err)
		c.render(w, r, http.StatusInternalServerError, "error", &errorPage{Heading: "Done, but not fully recorded",
			Message: "The key was resumed and finished, but its result could not be added to the key's history (an entry says the resume was under way).",
			Details: errorLines(err), Back: c.outcomeURL(string(scope), string(key))})
		return
	case finished:
		c.cfg.Logger.Info("console: action on a key stopped at a recovery point", "action", action, "operator", op, "result", resumeFinished)
		http.Redirect(w, r, c.outcomeURL(string(scope), string(key))+"&done=resumed", http.StatusSeeOther)
		return
	case errors.Is(err, keyed.ErrNotRecorded):
		c.cfg.Logger.Error("console: a resume was not taken: its history could not be written", "operator", op, "err", err)
		c.render(w, r, http.StatusInternalServerError, "error", &errorPage{Heading: "Not resumed: its entry in the key's history could not be written",
			Message: "Nothing was changed: the key is in flight at its point, as it was. What the resume did outside (a charge found or made under the key's own charge key) stands, and the next resume finds it.",
			Details: errorLines(err), Back: c.outcomeURL(string(scope), string(key))})
		return
	case errors.Is(err, keyed.ErrNotStopped), errors.Is(err, keyed.ErrBeingFinished), errors.Is(err, keyed.ErrOtherPoint):
		c.refuseKey(w, r, scope, key, err)
		return
	case notRecordedAfter(err):
		c.cfg.Logger.Error("console: the resume failed and its history could not be written", "action", action, "operator", op, "err", err)
		msg := "The resume failed (the outcome is still unknown), and its entry in the key's history could not be written."
		if errors.Is(err, keyed.ErrResultUnknown) {
			msg = "The resume's last write to the store got no answer, so the key may have been finished all the same (its state above says what it holds now), and its entry in the key's history could not be written."
		}
		c.render(w, r, http.StatusInternalServerError, "error", &errorPage{Heading: "Done, but not recorded",
			Message: msg,
			Details: errorLines(err), Back: c.outcomeURL(string(scope), string(key))})
		return
	}
	if errors.Is(err, keyed.ErrResultUnknown) {
		c.cfg.Logger.Warn("console: action on a key stopped at a recovery point", "action", action, "operator", op, "result", "result unknown: "+err.Error())
		http.Redirect(w, r, c.outcomeURL(string(scope), string(key))+"&done=resume-unknown", http.StatusSeeOther)
		return
	}
	c.cfg.Logger.Info("console: action on a key stopped at a recovery point", "action", action, "operator", op, "result", "failed: "+err.Error())
	http.Redirect(w, r, c.outcomeURL(string(scope), string(key))+"&done=resume-failed", http.StatusSeeOther)
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
