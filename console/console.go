package console

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/deadletter"
)

// Defaults of Config.
const (
	DefaultPrefix     = "/console"
	DefaultSessionTTL = 12 * time.Hour
	DefaultPageSize   = 50
	DefaultMaxBulk    = 1000
	// DefaultOutcomesWindow is how far back the overview counts the
	// consumers' outcomes.
	DefaultOutcomesWindow = time.Hour
	// DefaultCompletionBound is how long after its lease ended an
	// execution stopped at a recovery point is still shown as being
	// finished: the completer's bound with idemhttp's defaults (a round
	// and a resume past the lease), with room to spare.
	DefaultCompletionBound = 30 * time.Second
)

// ErrNoOperators is returned by New when no operator is configured: a
// console nobody may use, or that anybody may, is a mistake either way.
var ErrNoOperators = errors.New("console: no operators configured")

// Operator is a person who may use the console. Name is recorded as the
// actor of everything they do; Token is their secret.
type Operator struct {
	Name  string
	Token string
}

// ParseOperators parses "alice:TOKEN,bob:TOKEN2". Names and tokens must be
// non-empty and without white space, names and tokens unique. Errors never
// quote a token.
func ParseOperators(s string) ([]Operator, error) {
	var ops []Operator
	names, tokens := map[string]bool{}, map[string]bool{}
	for i, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, token, ok := strings.Cut(item, ":")
		switch {
		case !ok:
			return nil, fmt.Errorf("operator %d: want NAME:TOKEN", i+1)
		case name == "" || strings.ContainsFunc(name, isSpace):
			return nil, fmt.Errorf("operator %d: the name is empty or holds white space", i+1)
		case token == "" || strings.ContainsFunc(token, isSpace):
			return nil, fmt.Errorf("operator %q: the token is empty or holds white space", name)
		case names[name]:
			return nil, fmt.Errorf("operator %q is given twice", name)
		case tokens[token]:
			return nil, fmt.Errorf("operator %q has the token of another operator", name)
		}
		names[name], tokens[token] = true, true
		ops = append(ops, Operator{Name: name, Token: token})
	}
	if len(ops) == 0 {
		return nil, fmt.Errorf("%w: want NAME:TOKEN pairs, comma-separated", ErrNoOperators)
	}
	return ops, nil
}

func isSpace(r rune) bool { return r == ' ' || r == '\t' || r == '\n' || r == '\r' }

// Config configures a Console. Letters and Operators are required.
type Config struct {
	// Letters is the dead-letter service the console acts through.
	// Required.
	Letters *deadletter.Service
	// Operators may use the console; at least one is required. They are
	// not the service's API keys: tenants never reach the console.
	Operators []Operator
	// Insights adds what the letters alone do not tell: the messages
	// parked per letter, whether a re-driven letter was processed, the
	// consumers' outcomes and the backlogs. Defaults to none: the pages
	// show the letters only.
	Insights Insights
	// Recoveries is the key store whose executions stopped at a recovery
	// point the "Unknown outcomes" page shows: being finished within
	// CompletionBound of their holder's lease end, unknown past it.
	// Defaults to none: no such page.
	Recoveries idem.Recoverer
	// ShowPoint says what a recovery point means in a person's words
	// (for a payment: its amount, account and tenant), as fields the
	// page shows as text. Defaults to the point's name and data size.
	ShowPoint func(ctx context.Context, rec idem.Record) ([]PointField, error)
	// Actions lets operators act on those executions: resume now, settle
	// as failed, settle with an answer. The service's completer
	// (idemhttp.Completer) is one. Defaults to none: the pages only show
	// them. Requires Recoveries and KeyHistory.
	Actions KeyActions
	// KeyHistory keeps who did what to which key, when and why. Required
	// with Actions.
	KeyHistory KeyHistory
	// CompletionBound is how long after its lease ended an execution at a
	// recovery point is being finished (by a completer or a retry) rather
	// than unknown. Defaults to DefaultCompletionBound.
	CompletionBound time.Duration
	// Prefix is the path the console is mounted under, without a trailing
	// slash. Defaults to DefaultPrefix ("/console").
	Prefix string
	// PublicHTTPS says that browsers reach the console over https, through
	// a proxy that terminates TLS in front of it: the session cookie is
	// then marked Secure, so that a browser never sends it over plain
	// http. (A header such as X-Forwarded-Proto is not trusted for it:
	// any client can send one.) Defaults to false: the cookie is Secure
	// only when this process itself serves TLS.
	PublicHTTPS bool
	// SessionTTL is how long a login lasts. Defaults to DefaultSessionTTL.
	SessionTTL time.Duration
	// PageSize is how many letters a page of the list shows. Defaults to
	// DefaultPageSize.
	PageSize int
	// MaxBulk bounds how many letters one bulk action takes; a preview
	// says when more matched. Defaults to DefaultMaxBulk.
	MaxBulk int
	// OutcomesWindow is how far back the overview counts outcomes.
	// Defaults to DefaultOutcomesWindow (an hour).
	OutcomesWindow time.Duration
	// Clock dates sessions and ages. Defaults to idem.SystemClock.
	Clock idem.Clock
	// Logger receives a record of every action, never a token, a payload
	// or a reason. Defaults to discarding.
	Logger *slog.Logger
}

// MinTokenLen is the shortest operator token New accepts: 22 characters,
// 128 bits when they are random base64 (32 hex characters, from openssl
// rand -hex 16, are better still). An operator acts on every tenant's dead
// letters; a token short enough to guess, even at the pace LoginFailures
// allows, is refused.
const MinTokenLen = 22

// Console is the operators' web console. The zero Console is not usable;
// call New.
type Console struct {
	cfg       Config
	operators []operatorKey
	sessions  *sessions
	limiter   *loginLimiter
	pages     map[string]*template.Template
	handler   http.Handler
}

// operatorKey is an operator with their token's digest, which is what
// requests are compared with.
type operatorKey struct {
	name string
	sum  [sha256.Size]byte
}

//go:embed templates/*.html static/*
var assets embed.FS

// New returns a Console for cfg. Returns an error matching ErrNoOperators
// without operators, and one matching idem.ErrInvalidArgument for any
// other bad field.
func New(cfg *Config) (*Console, error) {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.Letters == nil {
		return nil, &idem.ArgumentError{Field: "console.Config.Letters", Reason: "must not be nil"}
	}
	if len(c.Operators) == 0 {
		return nil, fmt.Errorf("%w: set console.Config.Operators", ErrNoOperators)
	}
	c.Prefix = strings.TrimSuffix(c.Prefix, "/")
	if c.Prefix == "" && cfg != nil && cfg.Prefix != "/" {
		c.Prefix = DefaultPrefix
	}
	switch {
	case c.Prefix != "" && (!strings.HasPrefix(c.Prefix, "/") || strings.ContainsAny(c.Prefix, "{}?# ")):
		return nil, &idem.ArgumentError{Field: "console.Config.Prefix", Reason: "must be a path such as /console"}
	case c.SessionTTL < 0, c.PageSize < 0, c.MaxBulk < 0, c.OutcomesWindow < 0:
		return nil, &idem.ArgumentError{Field: "console.Config", Reason: "SessionTTL, PageSize, MaxBulk and OutcomesWindow must not be negative"}
	}
	if c.SessionTTL == 0 {
		c.SessionTTL = DefaultSessionTTL
	}
	if c.PageSize == 0 {
		c.PageSize = DefaultPageSize
	}
	if c.MaxBulk == 0 {
		c.MaxBulk = DefaultMaxBulk
	}
	if c.OutcomesWindow == 0 {
		c.OutcomesWindow = DefaultOutcomesWindow
	}
	if c.CompletionBound < 0 {
		return nil, &idem.ArgumentError{Field: "console.Config.CompletionBound", Reason: "must not be negative"}
	}
	if c.Actions != nil && (c.Recoveries == nil || c.KeyHistory == nil) {
		return nil, &idem.ArgumentError{Field: "console.Config.Actions", Reason: "needs Recoveries and KeyHistory"}
	}
	if c.CompletionBound == 0 {
		c.CompletionBound = DefaultCompletionBound
	}
	if c.Clock == nil {
		c.Clock = idem.SystemClock{}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	con := &Console{cfg: c, sessions: newSessions(c.Clock, c.SessionTTL), limiter: newLoginLimiter(c.Clock)}
	seen := map[string]bool{}
	for i, op := range c.Operators {
		switch {
		case strings.TrimSpace(op.Name) == "":
			return nil, &idem.ArgumentError{Field: fmt.Sprintf("console.Config.Operators[%d].Name", i), Reason: "must not be empty"}
		case strings.TrimSpace(op.Token) == "":
			return nil, &idem.ArgumentError{Field: fmt.Sprintf("console.Config.Operators[%d].Token", i), Reason: "must not be empty"}
		case len(op.Token) < MinTokenLen:
			return nil, &idem.ArgumentError{Field: fmt.Sprintf("console.Config.Operators[%d].Token", i),
				Reason: fmt.Sprintf("is %d characters; at least %d are needed, random (128 bits: openssl rand -hex 16)", len(op.Token), MinTokenLen)}
		case seen[op.Token]:
			return nil, &idem.ArgumentError{Field: fmt.Sprintf("console.Config.Operators[%d].Token", i), Reason: "is another operator's token"}
		}
		seen[op.Token] = true
		con.operators = append(con.operators, operatorKey{name: op.Name, sum: sha256.Sum256([]byte(op.Token))})
	}
	pages, err := parsePages()
	if err != nil {
		return nil, err
	}
	con.pages = pages
	con.handler = con.routes()
	return con, nil
}

// Handler returns the console's HTTP handler. It serves paths under
// Config.Prefix and expects them unstripped: mount it with
// mux.Handle(prefix+"/", c.Handler()).
func (c *Console) Handler() http.Handler { return c.handler }

// parsePages parses each page with the layout it shares.
func parsePages() (map[string]*template.Template, error) {
	names, err := fs.Glob(assets, "templates/*.html")
	if err != nil {
		return nil, err
	}
	pages := map[string]*template.Template{}
	for _, n := range names {
		base := strings.TrimSuffix(strings.TrimPrefix(n, "templates/"), ".html")
		if base == "layout" {
			continue
		}
		t, err := template.New(base).Funcs(funcs).ParseFS(assets, "templates/layout.html", n)
		if err != nil {
			return nil, fmt.Errorf("console: template %s: %w", n, err)
		}
		pages[base] = t
	}
	return pages, nil
}

// operatorFor returns the operator whose token is token. Every operator's
// digest is compared, in constant time, so the time taken says nothing of
// which one nearly matched.
func (c *Console) operatorFor(token string) (string, bool) {
	sum := sha256.Sum256([]byte(token))
	name, found := "", 0
	for _, op := range c.operators {
		if subtle.ConstantTimeCompare(sum[:], op.sum[:]) == 1 {
			name, found = op.name, 1
		}
	}
	return name, found == 1
}

// Insights is what a service can tell the console beyond its dead
// letters. payments.ConsoleInsights implements it for the payment service.
type Insights interface {
	// ParkedCounts returns, per dead letter that holds its key back, how
	// many messages of the key are parked behind it.
	ParkedCounts(ctx context.Context) (map[string]int, error)
	// Processed reports whether consumer has processed m (a re-driven
	// letter's message, as it was first published) and when. ok is false,
	// with a nil error, when it has not or cannot tell.
	Processed(ctx context.Context, consumer string, m idem.Message) (at time.Time, ok bool, err error)
	// Overview returns the consumers' outcomes since since and the
	// backlogs that should stay near empty.
	Overview(ctx context.Context, since time.Time) (Overview, error)
}

// PointField is one thing a recovery point says, named for a person.
type PointField struct {
	Name, Value string
}

// Overview is a service's health as the console's first page shows it.
type Overview struct {
	// Consumers are the outcomes per consumer over the window asked for.
	Consumers []ConsumerOutcomes
	// Backlogs are what waits: the outbox, the settlement.
	Backlogs []Backlog
}

// ConsumerOutcomes counts what became of one consumer's messages over a
// window.
type ConsumerOutcomes struct {
	Consumer string
	// Processed counts messages applied.
	Processed int
	// Failing counts messages with a failed attempt in the window that are
	// still being retried.
	Failing int
	// DeadLettered, Redriven and Discarded count the letters that entered
	// each state in the window.
	DeadLettered, Redriven, Discarded int
}

// Backlog is something waiting that should not wait long.
type Backlog struct {
	// Name says what waits, for a person: "outbox", "settlement".
	Name string
	// Help says what the count and the age mean.
	Help  string
	Count int
	// Oldest is when the oldest waiting item was made; zero when none
	// waits. Its age is the backlog's lag.
	Oldest time.Time
}
