package console

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/deadletter"
)

// maxFormBytes bounds a form's body: an edited payload, a reason, the IDs
// of a bulk action.
const maxFormBytes = 4 << 20

func (c *Console) routes() http.Handler {
	p := c.cfg.Prefix
	open := http.NewServeMux()
	open.Handle("GET "+p+"/static/", http.StripPrefix(p, http.FileServerFS(assets)))
	open.HandleFunc("GET "+p+"/login", c.loginForm)
	open.HandleFunc("POST "+p+"/login", c.login)
	open.HandleFunc("POST "+p+"/logout", c.logout)

	authed := http.NewServeMux()
	authed.HandleFunc("GET "+p+"/{$}", c.overview)
	authed.HandleFunc("GET "+p+"/letters", c.list)
	authed.HandleFunc("GET "+p+"/letters/{id}", c.show)
	authed.HandleFunc("GET "+p+"/letters/{id}/edit", c.editForm)
	authed.HandleFunc("POST "+p+"/letters/{id}/edit", c.edit)
	authed.HandleFunc("POST "+p+"/letters/{id}/redrive", c.redrive)
	authed.HandleFunc("POST "+p+"/letters/{id}/discard", c.discard)
	authed.HandleFunc("GET "+p+"/outcomes", c.outcomes)
	authed.HandleFunc("GET "+p+"/outcomes/key", c.outcome)
	authed.HandleFunc("GET "+p+"/outcomes/act", c.confirm)
	authed.HandleFunc("POST "+p+"/outcomes/act", c.act)
	authed.HandleFunc("GET "+p+"/bulk", c.bulkPreview)
	authed.HandleFunc("POST "+p+"/bulk", c.bulk)
	authed.HandleFunc(p+"/", func(w http.ResponseWriter, r *http.Request) {
		c.fail(w, r, http.StatusNotFound, "Not found", "There is no such page in the console.")
	})
	open.Handle(p+"/", c.authenticate(authed))

	// Every state-changing request, the login form's included, must come
	// from the console's own pages.
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.cfg.Logger.Warn("console: cross-origin request refused", "method", r.Method, "path", r.URL.Path, "origin", r.Header.Get("Origin"))
		c.fail(w, r, http.StatusForbidden, "Cross-site request refused",
			"This request came from another site. Actions are taken only from the console's own pages.")
	}))
	return securityHeaders(cop.Handler(http.MaxBytesHandler(open, maxFormBytes)))
}

// securityHeaders: the pages run no script and are never framed; they show
// payloads, which must not linger in caches.
func securityHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
		h.Set("X-Frame-Options", "DENY")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "same-origin")
		h.Set("Cache-Control", "no-store")
		next.ServeHTTP(w, r)
	})
}

// view is what the layout renders around a page.
type view struct {
	Title    string
	Prefix   string
	Operator string
	Nav      string
	Page     any
}

var titles = map[string]string{
	"login": "Log in", "overview": "Overview", "list": "Dead letters", "letter": "Dead letter",
	"edit": "Edit and re-drive", "bulk": "Bulk action", "error": "Error",
	"outcomes": "Unknown outcomes", "outcome": "Execution stopped at a recovery point", "confirm": "Confirm",
}

func (c *Console) render(w http.ResponseWriter, r *http.Request, status int, page string, data any) {
	t := c.pages[page]
	v := view{Title: titles[page], Prefix: c.cfg.Prefix, Operator: operatorOf(r.Context()), Nav: page, Page: data}
	var b bytes.Buffer
	if err := t.ExecuteTemplate(&b, "layout", v); err != nil {
		c.cfg.Logger.Error("console: rendering a page failed", "page", page, "err", err)
		http.Error(w, "the page could not be rendered", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	w.Write(b.Bytes()) //nolint:errcheck // the client went away
}

type errorPage struct {
	Heading, Message string
	Details          []string
	Back             string
}

func (c *Console) fail(w http.ResponseWriter, r *http.Request, status int, heading, msg string, details ...string) {
	c.render(w, r, status, "error", &errorPage{Heading: heading, Message: msg, Details: details, Back: c.cfg.Prefix + "/letters"})
}

// failAction answers an action the service refused or could not do.
func (c *Console) failAction(w http.ResponseWriter, r *http.Request, id string, err error) {
	switch {
	case errors.Is(err, idem.ErrNotFound):
		c.fail(w, r, http.StatusNotFound, "No such letter", fmt.Sprintf("There is no dead letter %q.", id))
	case errors.Is(err, idem.ErrInvalidTransition):
		msg := "Another operator acted on it first; nothing was changed."
		if dl, serr := c.cfg.Letters.Show(r.Context(), id); serr == nil && len(dl.History) > 0 {
			ev := dl.History[len(dl.History)-1]
			msg = fmt.Sprintf("It was already %s by %s at %s", ev.Action, ev.Actor, stamp(ev.At))
			if ev.Reason != "" {
				msg += fmt.Sprintf(" (%q)", ev.Reason)
			}
			msg += "; nothing was changed."
		}
		c.render(w, r, http.StatusConflict, "error", &errorPage{Heading: "This letter is no longer dead", Message: msg,
			Details: errorLines(err), Back: c.letterURL(id)})
	case errors.Is(err, idem.ErrInvalidArgument):
		c.render(w, r, http.StatusBadRequest, "error", &errorPage{Heading: "Refused", Message: "Nothing was changed.",
			Details: errorLines(err), Back: c.letterURL(id)})
	default:
		c.cfg.Logger.Error("console: action failed", "letter", id, "operator", operatorOf(r.Context()), "err", err)
		c.render(w, r, http.StatusInternalServerError, "error", &errorPage{Heading: "The action failed",
			Message: "The service could not complete it; the log says why.", Details: errorLines(err), Back: c.letterURL(id)})
	}
}

// errorLines splits a joined error into one line per failure.
func errorLines(err error) []string {
	var out []string
	for line := range strings.SplitSeq(err.Error(), "\n") {
		if line = strings.TrimSpace(line); line != "" {
			out = append(out, line)
		}
	}
	return out
}

func (c *Console) letterURL(id string) string {
	return c.cfg.Prefix + "/letters/" + url.PathEscape(id)
}

// --- overview ---

type statRow struct {
	Consumer string
	Count    int
	Oldest   time.Time
}

type overviewPage struct {
	Now       time.Time
	Window    time.Duration
	Letters   []statRow
	Insights  bool
	Overview  Overview
	Problem   string
	DeadTotal int
	// Recoveries: the console shows executions stopped at a point;
	// Unknown and Finishing count them.
	Recoveries         bool
	Unknown, Finishing int
}

func (c *Console) overview(w http.ResponseWriter, r *http.Request) {
	dead, err := c.cfg.Letters.List(r.Context(), idem.DeadLetterFilter{State: idem.LetterDead})
	if err != nil {
		c.failAction(w, r, "", err)
		return
	}
	page := &overviewPage{Now: c.cfg.Clock.Now(), Window: c.cfg.OutcomesWindow, Letters: stats(dead), DeadTotal: len(dead)}
	if c.cfg.Insights != nil {
		page.Insights = true
		ov, err := c.cfg.Insights.Overview(r.Context(), page.Now.Add(-c.cfg.OutcomesWindow))
		if err != nil {
			c.cfg.Logger.Warn("console: reading the overview failed", "err", err)
			page.Problem = "The consumers' outcomes and the backlogs could not be read: " + err.Error()
		}
		page.Overview = ov
	}
	if c.cfg.Recoveries != nil {
		page.Recoveries = true
		rows, err := c.stopped(r.Context(), page.Now)
		if err != nil {
			c.cfg.Logger.Warn("console: reading the executions stopped at a recovery point failed", "err", err)
			page.Problem = "The executions stopped at a recovery point could not be read: " + err.Error()
		}
		for _, row := range rows {
			if row.Unknown {
				page.Unknown++
			} else {
				page.Finishing++
			}
		}
	}
	c.render(w, r, http.StatusOK, "overview", page)
}

// --- unknown outcomes ---

// stoppedRow is an execution stopped at a recovery point, as the page
// shows it.
type stoppedRow struct {
	Scope, Key, Point string
	SavedAt           time.Time // when the point was saved
	Since             time.Time // when its holder's lease ended
	Unknown           bool      // past the completion bound
	Held              bool      // a live execution holds it now
	Fields            []PointField
	Problem           string // ShowPoint's error
	Failures          ResumeFailures
}

// Link is the row's page.
func (r stoppedRow) Link(prefix string) string {
	return prefix + "/outcomes/key?" + url.Values{"scope": {r.Scope}, "key": {r.Key}}.Encode()
}

type outcomesPage struct {
	Now   time.Time
	Bound time.Duration
	Rows  []stoppedRow
}

// stopped lists the executions stopped at a recovery point, oldest first.
func (c *Console) stopped(ctx context.Context, now time.Time) ([]stoppedRow, error) {
	recs, err := c.cfg.Recoveries.Abandoned(ctx, c.cfg.MaxBulk)
	if err != nil {
		return nil, err
	}
	rows := make([]stoppedRow, 0, len(recs))
	listed := map[idem.Ref]bool{}
	for _, rec := range recs {
		rows = append(rows, c.row(ctx, rec, now))
		listed[idem.Ref{Scope: rec.Scope, Key: rec.Key}] = true
	}
	if c.cfg.Actions == nil {
		return rows, nil
	}
	// Those the completer holds after a failed resume or give-back.
	held := c.cfg.Actions.UnknownKeys()
	slices.SortFunc(held, func(a, b idem.Ref) int {
		return cmp.Or(cmp.Compare(a.Scope, b.Scope), cmp.Compare(a.Key, b.Key))
	})
	for _, ref := range held {
		if listed[idem.Ref{Scope: ref.Scope, Key: ref.Key}] || len(rows) >= c.cfg.MaxBulk {
			continue
		}
		rec, err := c.cfg.Recoveries.Get(ctx, ref.Scope, ref.Key)
		if errors.Is(err, idem.ErrNotFound) {
			continue
		}
		if err != nil {
			return rows, err
		}
		if rec.State == idem.StateInFlight && !rec.Recovery.IsZero() {
			rows = append(rows, c.row(ctx, rec, now))
		}
	}
	return rows, nil
}

func (c *Console) outcomes(w http.ResponseWriter, r *http.Request) {
	if c.cfg.Recoveries == nil {
		c.fail(w, r, http.StatusNotFound, "Not found", "This console is not given a key store with recovery points.")
		return
	}
	now := c.cfg.Clock.Now()
	rows, err := c.stopped(r.Context(), now)
	if err != nil {
		c.failAction(w, r, "", err)
		return
	}
	c.render(w, r, http.StatusOK, "outcomes", &outcomesPage{Now: now, Bound: c.cfg.CompletionBound, Rows: rows})
}

// stats counts dls per consumer, with the first failure of the oldest.
func stats(dls []idem.DeadLetter) []statRow {
	by := map[string]*statRow{}
	for _, dl := range dls {
		s := by[dl.Consumer]
		if s == nil {
			s = &statRow{Consumer: dl.Consumer, Oldest: dl.FirstFailedAt}
			by[dl.Consumer] = s
		}
		s.Count++
		if dl.FirstFailedAt.Before(s.Oldest) {
			s.Oldest = dl.FirstFailedAt
		}
	}
	out := make([]statRow, 0, len(by))
	for _, s := range by {
		out = append(out, *s)
	}
	slices.SortFunc(out, func(a, b statRow) int { return cmp.Compare(a.Consumer, b.Consumer) })
	return out
}

// --- the list ---

// listQuery is the list's filter as the form sends it.
type listQuery struct {
	Consumer, Class, State, Since, Q, After string
}

// Values encodes q, without its cursor, for links.
func (q listQuery) Values() url.Values {
	v := url.Values{}
	for _, kv := range [][2]string{{"consumer", q.Consumer}, {"class", q.Class}, {"state", q.State}, {"since", q.Since}, {"q", q.Q}} {
		if kv[1] != "" {
			v.Set(kv[0], kv[1])
		}
	}
	return v
}

// Encode is Values as a query string.
func (q listQuery) Encode() string { return q.Values().Encode() }

func readQuery(r *http.Request) listQuery {
	v := r.URL.Query()
	return listQuery{Consumer: strings.TrimSpace(v.Get("consumer")), Class: v.Get("class"), State: v.Get("state"),
		Since: strings.TrimSpace(v.Get("since")), Q: strings.TrimSpace(v.Get("q")), After: v.Get("after")}
}

// filter checks q and returns the store's filter for it. State "" means
// dead; "all" means every state.
func (q listQuery) filter(now time.Time) (idem.DeadLetterFilter, error) {
	f := idem.DeadLetterFilter{Consumer: q.Consumer}
	switch q.Class {
	case "":
	case string(idem.DeadPermanent), string(idem.DeadExhausted):
		f.Class = idem.DeadLetterClass(q.Class)
	default:
		return f, fmt.Errorf("class %q: want permanent or exhausted", q.Class)
	}
	switch q.State {
	case "", string(idem.LetterDead):
		f.State = idem.LetterDead
	case "all":
	case string(idem.LetterRedriven), string(idem.LetterDiscarded):
		f.State = idem.LetterState(q.State)
	default:
		return f, fmt.Errorf("state %q: want dead, redriven, discarded or all", q.State)
	}
	if q.Since != "" {
		if d, err := time.ParseDuration(q.Since); err == nil && d >= 0 {
			f.Since = now.Add(-d)
		} else if t, err := time.Parse(time.RFC3339Nano, q.Since); err == nil {
			f.Since = t
		} else {
			return f, fmt.Errorf("since %q: want a duration back from now (1h, 30m) or an RFC 3339 time", q.Since)
		}
	}
	return f, nil
}

// match keeps the letters whose last error holds q's text, ignoring case.
func (q listQuery) match(dls []idem.DeadLetter) []idem.DeadLetter {
	if q.Q == "" {
		return dls
	}
	needle := strings.ToLower(q.Q)
	out := dls[:0:0]
	for _, dl := range dls {
		if strings.Contains(strings.ToLower(dl.LastError()), needle) {
			out = append(out, dl)
		}
	}
	return out
}

// selectLetters returns the letters q selects, most recent failure first.
// The store filters by consumer, class, state and time; the text search
// and the paging are done here, over what it returned.
func (c *Console) selectLetters(r *http.Request, q listQuery) ([]idem.DeadLetter, error) {
	f, err := q.filter(c.cfg.Clock.Now())
	if err != nil {
		return nil, &idem.ArgumentError{Field: "filter", Reason: err.Error()}
	}
	dls, err := c.cfg.Letters.List(r.Context(), f)
	if err != nil {
		return nil, err
	}
	return q.match(dls), nil
}

type listPage struct {
	Query     listQuery
	Problem   string
	Letters   []idem.DeadLetter
	Total     int
	Stats     []statRow
	Consumers []string
	Parked    map[string]int
	Next      string
	First     bool
	Now       time.Time
}

func (c *Console) list(w http.ResponseWriter, r *http.Request) {
	q := readQuery(r)
	page := &listPage{Query: q, First: q.After == "", Now: c.cfg.Clock.Now()}
	dead, err := c.cfg.Letters.List(r.Context(), idem.DeadLetterFilter{State: idem.LetterDead})
	if err != nil {
		c.failAction(w, r, "", err)
		return
	}
	page.Stats = stats(dead)
	for _, s := range page.Stats {
		page.Consumers = append(page.Consumers, s.Consumer)
	}
	if q.Consumer != "" && !slices.Contains(page.Consumers, q.Consumer) {
		page.Consumers = append(page.Consumers, q.Consumer)
	}
	status := http.StatusOK
	dls, err := c.selectLetters(r, q)
	switch {
	case errors.Is(err, idem.ErrInvalidArgument):
		page.Problem, status = err.Error(), http.StatusBadRequest
	case err != nil:
		c.failAction(w, r, "", err)
		return
	}
	page.Total = len(dls)
	start := 0
	if q.After != "" {
		start = c.after(r, dls, q.After)
	}
	end := min(start+c.cfg.PageSize, len(dls))
	page.Letters = dls[start:end]
	if end < len(dls) && end > start {
		v := q.Values()
		v.Set("after", dls[end-1].ID)
		page.Next = c.cfg.Prefix + "/letters?" + v.Encode()
	}
	if c.cfg.Insights != nil {
		if page.Parked, err = c.cfg.Insights.ParkedCounts(r.Context()); err != nil {
			c.cfg.Logger.Warn("console: reading parked counts failed", "err", err)
		}
	}
	c.render(w, r, status, "list", page)
}

// after returns where the page after the letter id starts in dls. A
// cursor no longer in the list (it changed state) is placed by its last
// failure: the page starts at the first letter that failed before it.
func (c *Console) after(r *http.Request, dls []idem.DeadLetter, id string) int {
	for i, dl := range dls {
		if dl.ID == id {
			return i + 1
		}
	}
	cur, err := c.cfg.Letters.Show(r.Context(), id)
	if err != nil {
		return len(dls)
	}
	for i, dl := range dls {
		if dl.LastFailedAt.Before(cur.LastFailedAt) {
			return i
		}
	}
	return len(dls)
}

// --- one letter ---

type letterPage struct {
	Letter     idem.DeadLetter
	Payload    payloadView
	Headers    [][2]string
	Done       string
	Parked     []parkedView
	ParkedNote string
	HeldBehind string
	Processed  *processedView
	Editable   bool
	Now        time.Time
}

type parkedView struct {
	Message idem.Message
	Payload payloadView
}

type processedView struct {
	Done bool
	At   time.Time
	Note string
}

// doneMessages are the notes shown after an action: fixed texts, so the
// query string cannot put words on the page.
var doneMessages = map[string]string{
	"redriven":  "Re-driven: the message is on the outbox, and the messages parked behind it follow it.",
	"edited":    "Edited and re-driven: the edited message is on the outbox, and the messages parked behind it follow it.",
	"discarded": "Discarded. The letter is kept, with your reason in its history.",
}

func (c *Console) letter(w http.ResponseWriter, r *http.Request) (idem.DeadLetter, bool) {
	id := r.PathValue("id")
	dl, err := c.cfg.Letters.Show(r.Context(), id)
	if err != nil {
		c.failAction(w, r, id, err)
		return idem.DeadLetter{}, false
	}
	return dl, true
}

func (c *Console) show(w http.ResponseWriter, r *http.Request) {
	dl, ok := c.letter(w, r)
	if !ok {
		return
	}
	page := &letterPage{Letter: dl, Payload: viewPayload(dl.Message.Payload), Headers: sortedHeaders(dl.Message.Headers),
		Done: doneMessages[r.URL.Query().Get("done")], Editable: editable(dl.Message.Payload), Now: c.cfg.Clock.Now()}
	switch dl.State {
	case idem.LetterDead:
		// A dry run of a re-drive: it lists the parked messages, in their
		// order, reading them in a transaction it rolls back.
		res, err := c.cfg.Letters.Redrive(r.Context(), []string{dl.ID}, &deadletter.RedriveOptions{Actor: operatorOf(r.Context()), DryRun: true})
		switch {
		case err != nil:
			page.ParkedNote = "The parked messages could not be read: " + err.Error()
		case len(res) == 1 && res[0].HeldBehind != "":
			page.HeldBehind = res[0].HeldBehind
		case len(res) == 1:
			for _, m := range res[0].Released {
				// The dry run names them as they would be re-published;
				// show the ID they arrived with.
				m.ID, _ = deadletter.DedupKey(m)
				page.Parked = append(page.Parked, parkedView{Message: m, Payload: viewPayload(m.Payload)})
			}
		}
	case idem.LetterRedriven:
		if c.cfg.Insights != nil {
			at, done, err := c.cfg.Insights.Processed(r.Context(), dl.Consumer, dl.Message)
			page.Processed = &processedView{Done: done, At: at}
			if err != nil {
				page.Processed.Note = err.Error()
			}
		}
	}
	c.render(w, r, http.StatusOK, "letter", page)
}

func sortedHeaders(h map[string]string) [][2]string {
	out := make([][2]string, 0, len(h))
	for k, v := range h {
		out = append(out, [2]string{k, v})
	}
	slices.SortFunc(out, func(a, b [2]string) int { return cmp.Compare(a[0], b[0]) })
	return out
}

func (c *Console) redrive(w http.ResponseWriter, r *http.Request) {
	id, op := r.PathValue("id"), operatorOf(r.Context())
	_, err := c.cfg.Letters.Redrive(r.Context(), []string{id}, &deadletter.RedriveOptions{Actor: op, Reason: strings.TrimSpace(r.PostFormValue("reason"))})
	if err != nil {
		c.failAction(w, r, id, err)
		return
	}
	c.cfg.Logger.Info("console: letter redriven", "letter", id, "operator", op)
	http.Redirect(w, r, c.letterURL(id)+"?done=redriven", http.StatusSeeOther)
}

func (c *Console) discard(w http.ResponseWriter, r *http.Request) {
	id, op := r.PathValue("id"), operatorOf(r.Context())
	reason := strings.TrimSpace(r.PostFormValue("reason"))
	if reason == "" {
		c.render(w, r, http.StatusBadRequest, "error", &errorPage{Heading: "A reason is required",
			Message: "Say why the message is given up: the reason is kept in the letter's history. Nothing was changed.", Back: c.letterURL(id)})
		return
	}
	if _, err := c.cfg.Letters.Discard(r.Context(), []string{id}, op, reason); err != nil {
		c.failAction(w, r, id, err)
		return
	}
	c.cfg.Logger.Info("console: letter discarded", "letter", id, "operator", op)
	http.Redirect(w, r, c.letterURL(id)+"?done=discarded", http.StatusSeeOther)
}

// --- edit and re-drive ---

type editPage struct {
	Letter  idem.DeadLetter
	Text    string
	Reason  string
	Problem string
	JSON    bool
}

func (c *Console) editForm(w http.ResponseWriter, r *http.Request) {
	dl, ok := c.letter(w, r)
	if !ok {
		return
	}
	if dl.State != idem.LetterDead {
		c.failAction(w, r, dl.ID, fmt.Errorf("letter %q is %s, not dead: %w", dl.ID, dl.State, idem.ErrInvalidTransition))
		return
	}
	if !editable(dl.Message.Payload) {
		c.render(w, r, http.StatusBadRequest, "error", &errorPage{Heading: "This payload cannot be edited here",
			Message: "It is binary, not text; edit it with 'idem dlq edit " + dl.ID + " --payload-file FILE'.", Back: c.letterURL(dl.ID)})
		return
	}
	c.render(w, r, http.StatusOK, "edit", &editPage{Letter: dl, Text: EditableText(dl.Message.Payload), JSON: wantsJSON(dl.Message)})
}

func (c *Console) edit(w http.ResponseWriter, r *http.Request) {
	dl, ok := c.letter(w, r)
	if !ok {
		return
	}
	op := operatorOf(r.Context())
	text := strings.ReplaceAll(r.PostFormValue("payload"), "\r\n", "\n")
	reason := strings.TrimSpace(r.PostFormValue("reason"))
	payload, err := EditedPayload(dl, []byte(text))
	if err != nil {
		c.render(w, r, http.StatusBadRequest, "edit", &editPage{Letter: dl, Text: text, Reason: reason, JSON: wantsJSON(dl.Message),
			Problem: "Refused: " + err.Error() + ". Nothing was changed."})
		return
	}
	_, err = c.cfg.Letters.Redrive(r.Context(), []string{dl.ID}, &deadletter.RedriveOptions{Actor: op, Reason: reason, Payload: payload})
	if err != nil {
		c.failAction(w, r, dl.ID, err)
		return
	}
	c.cfg.Logger.Info("console: letter edited and redriven", "letter", dl.ID, "operator", op)
	http.Redirect(w, r, c.letterURL(dl.ID)+"?done=edited", http.StatusSeeOther)
}

// --- bulk ---

type bulkPage struct {
	Action  string
	Query   listQuery
	Results []deadletter.Result
	Matched int
	Capped  bool
	Problem string
	Done    bool
	Reason  string
}

// bulkQuery reads a bulk action's filter: only dead letters can be acted
// on.
func bulkQuery(r *http.Request) (string, listQuery, error) {
	q := readQuery(r)
	q.After = ""
	action := r.URL.Query().Get("action")
	if action != "redrive" && action != "discard" {
		return "", q, fmt.Errorf("action %q: want redrive or discard", action)
	}
	if q.State != "" && q.State != string(idem.LetterDead) {
		return "", q, fmt.Errorf("only dead letters can be re-driven or discarded, not %s ones", q.State)
	}
	q.State = ""
	return action, q, nil
}

// bulkPreview shows exactly which letters a bulk action would take, and
// for each the messages it would release, with a form that confirms those
// letters and no others.
func (c *Console) bulkPreview(w http.ResponseWriter, r *http.Request) {
	action, q, err := bulkQuery(r)
	if err != nil {
		c.fail(w, r, http.StatusBadRequest, "Refused", err.Error())
		return
	}
	dls, err := c.selectLetters(r, q)
	if err != nil {
		if errors.Is(err, idem.ErrInvalidArgument) {
			c.fail(w, r, http.StatusBadRequest, "Refused", err.Error())
			return
		}
		c.failAction(w, r, "", err)
		return
	}
	page := &bulkPage{Action: action, Query: q, Matched: len(dls)}
	// Oldest first, as RedriveMatching re-drives, so that letters of one
	// key go back in the order they failed.
	slices.SortStableFunc(dls, func(a, b idem.DeadLetter) int { return a.FirstFailedAt.Compare(b.FirstFailedAt) })
	if len(dls) > c.cfg.MaxBulk {
		dls, page.Capped = dls[:c.cfg.MaxBulk], true
	}
	if len(dls) > 0 {
		ids := make([]string, len(dls))
		for i, dl := range dls {
			ids[i] = dl.ID
		}
		res, err := c.cfg.Letters.Redrive(r.Context(), ids, &deadletter.RedriveOptions{Actor: operatorOf(r.Context()), DryRun: true})
		if err != nil {
			page.Problem = err.Error()
		}
		page.Results = res
	}
	c.render(w, r, http.StatusOK, "bulk", page)
}

func (c *Console) bulk(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		c.fail(w, r, http.StatusBadRequest, "Refused", "The form could not be read: "+err.Error())
		return
	}
	op, action := operatorOf(r.Context()), r.PostForm.Get("action")
	ids := r.PostForm["id"]
	reason := strings.TrimSpace(r.PostForm.Get("reason"))
	switch {
	case action != "redrive" && action != "discard":
		c.fail(w, r, http.StatusBadRequest, "Refused", fmt.Sprintf("Action %q: want redrive or discard. Nothing was changed.", action))
		return
	case len(ids) == 0:
		c.fail(w, r, http.StatusBadRequest, "Refused", "No letters were named. Nothing was changed.")
		return
	case len(ids) > c.cfg.MaxBulk:
		c.fail(w, r, http.StatusBadRequest, "Refused", fmt.Sprintf("%d letters named; one action takes at most %d. Nothing was changed.", len(ids), c.cfg.MaxBulk))
		return
	case action == "discard" && reason == "":
		c.fail(w, r, http.StatusBadRequest, "A reason is required",
			"Say why the messages are given up: the reason is kept in each letter's history. Nothing was changed.")
		return
	}
	var res []deadletter.Result
	var err error
	if action == "redrive" {
		res, err = c.cfg.Letters.Redrive(r.Context(), ids, &deadletter.RedriveOptions{Actor: op, Reason: reason})
	} else {
		res, err = c.cfg.Letters.Discard(r.Context(), ids, op, reason)
	}
	if len(res) > 0 {
		c.cfg.Logger.Info("console: bulk action", "action", action, "letters", len(res), "operator", op)
	}
	if err != nil && len(res) == 0 {
		c.failAction(w, r, "", err)
		return
	}
	page := &bulkPage{Action: action, Results: res, Matched: len(ids), Done: true, Reason: reason}
	if err != nil {
		page.Problem = err.Error()
	}
	c.render(w, r, http.StatusOK, "bulk", page)
}
