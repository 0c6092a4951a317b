package console

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/idem-go/idem"
)

// cookieName is the session cookie's name.
const cookieName = "idem_console"

// sessions are the logins, kept in memory: a restart logs everybody out,
// which is the safe way to fail. A session's cookie holds a random ID; the
// map holds only its digest, so the map itself holds nothing to log in
// with.
type sessions struct {
	clock idem.Clock
	ttl   time.Duration

	mu   sync.Mutex
	byID map[[sha256.Size]byte]session
}

type session struct {
	operator string
	expires  time.Time
}

func newSessions(clock idem.Clock, ttl time.Duration) *sessions {
	return &sessions{clock: clock, ttl: ttl, byID: map[[sha256.Size]byte]session{}}
}

// open starts a session for operator and returns its ID.
func (s *sessions) open(operator string) (string, time.Time) {
	id := rand.Text() + rand.Text()
	now := s.clock.Now()
	exp := now.Add(s.ttl)
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, v := range s.byID {
		if !now.Before(v.expires) {
			delete(s.byID, k)
		}
	}
	s.byID[sha256.Sum256([]byte(id))] = session{operator: operator, expires: exp}
	return id, exp
}

// lookup returns the operator of the live session id.
func (s *sessions) lookup(id string) (string, bool) {
	k := sha256.Sum256([]byte(id))
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.byID[k]
	if !ok {
		return "", false
	}
	if !s.clock.Now().Before(v.expires) {
		delete(s.byID, k)
		return "", false
	}
	return v.operator, true
}

func (s *sessions) close(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.byID, sha256.Sum256([]byte(id)))
}

type operatorKeyCtx struct{}

// operatorOf is the operator a request was authenticated as.
func operatorOf(ctx context.Context) string {
	op, _ := ctx.Value(operatorKeyCtx{}).(string)
	return op
}

// authenticate lets through requests of an operator: a bearer token, or a
// session cookie. A request with an Authorization header is judged by it
// alone. Others get 401 and the login form, which brings them back to
// the page they asked for.
func (c *Console) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		op, ok := "", false
		if h := r.Header.Get("Authorization"); h != "" {
			if c.refuseTooMany(w, r, c.nextFor(r)) {
				return
			}
			scheme, token, _ := strings.Cut(h, " ")
			if strings.EqualFold(scheme, "Bearer") {
				op, ok = c.operatorFor(strings.TrimSpace(token))
			}
			if !ok {
				c.limiter.fail(addrOf(r))
				w.Header().Set("WWW-Authenticate", `Bearer realm="idem console"`)
				c.render(w, r, http.StatusUnauthorized, "login", &loginPage{Error: "That token is not an operator's.", Next: c.nextFor(r)})
				return
			}
		} else if ck, err := r.Cookie(cookieName); err == nil {
			op, ok = c.sessions.lookup(ck.Value)
		}
		if !ok {
			w.Header().Set("WWW-Authenticate", `Bearer realm="idem console"`)
			c.render(w, r, http.StatusUnauthorized, "login", &loginPage{Next: c.nextFor(r)})
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), operatorKeyCtx{}, op)))
	})
}

// nextFor is where a login should lead back to: the page asked for, when
// it was a page (not a form's POST).
func (c *Console) nextFor(r *http.Request) string {
	if r.Method == http.MethodGet {
		return r.URL.RequestURI()
	}
	return c.cfg.Prefix + "/"
}

// localNext keeps next when it is a path of the console, so that the
// login form cannot be made to redirect elsewhere. It is parsed, not
// matched: a scheme, a host, user information or an opaque part is
// refused, and so is a path that, once decoded, holds a control
// character, a space or a backslash, or begins with two slashes (browsers
// drop tabs and newlines and read a backslash as a slash, so
// "/%09/evil.example" or "/\evil.example" would lead off the site). What
// it returns is the parsed path and query written anew.
func (c *Console) localNext(next string) string {
	home := c.cfg.Prefix + "/"
	u, err := url.Parse(next)
	if err != nil || u.Scheme != "" || u.Host != "" || u.User != nil || u.Opaque != "" || !strings.HasPrefix(next, "/") {
		return home
	}
	bad := func(s string) bool {
		return strings.IndexFunc(s, func(r rune) bool { return r < 0x21 || r == 0x7f || r == '\\' || unicode.IsSpace(r) }) >= 0
	}
	if bad(u.Path) || bad(next) || strings.HasPrefix(u.Path, "//") || !strings.HasPrefix(u.Path, home) {
		return home
	}
	out := (&url.URL{Path: u.Path, RawQuery: u.RawQuery}).String()
	if !strings.HasPrefix(out, home) || strings.HasPrefix(out, "//") {
		return home
	}
	return out
}

type loginPage struct {
	Error string
	Next  string
}

func (c *Console) loginForm(w http.ResponseWriter, r *http.Request) {
	if ck, err := r.Cookie(cookieName); err == nil {
		if _, ok := c.sessions.lookup(ck.Value); ok {
			http.Redirect(w, r, c.localNext(r.URL.Query().Get("next")), http.StatusSeeOther)
			return
		}
	}
	c.render(w, r, http.StatusOK, "login", &loginPage{Next: c.localNext(r.URL.Query().Get("next"))})
}

func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	next := c.localNext(r.PostFormValue("next"))
	if c.refuseTooMany(w, r, next) {
		return
	}
	op, ok := c.operatorFor(strings.TrimSpace(r.PostFormValue("token")))
	if !ok {
		c.limiter.fail(addrOf(r))
		c.cfg.Logger.Warn("console: login refused: unknown token", "remote", r.RemoteAddr)
		c.render(w, r, http.StatusUnauthorized, "login", &loginPage{Error: "That token is not an operator's.", Next: next})
		return
	}
	id, exp := c.sessions.open(op)
	http.SetCookie(w, &http.Cookie{
		Name: cookieName, Value: id, Path: c.cfg.Prefix + "/", Expires: exp,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: c.secure(r),
	})
	c.cfg.Logger.Info("console: operator logged in", "operator", op)
	http.Redirect(w, r, next, http.StatusSeeOther)
}

func (c *Console) logout(w http.ResponseWriter, r *http.Request) {
	if ck, err := r.Cookie(cookieName); err == nil {
		if op, ok := c.sessions.lookup(ck.Value); ok {
			c.cfg.Logger.Info("console: operator logged out", "operator", op)
		}
		c.sessions.close(ck.Value)
	}
	http.SetCookie(w, &http.Cookie{
		Name: cookieName, Value: "", Path: c.cfg.Prefix + "/", MaxAge: -1,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: c.secure(r),
	})
	http.Redirect(w, r, c.cfg.Prefix+"/login", http.StatusSeeOther)
}

// secure reports whether the session cookie is marked Secure: when this
// process terminates TLS, or when Config.PublicHTTPS says that the
// console's public address is https (a proxy terminates TLS in front).
func (c *Console) secure(r *http.Request) bool { return r.TLS != nil || c.cfg.PublicHTTPS }

// Login attempts are limited per address and for the console as a whole.
// LoginFailures failed ones from one address (an IPv6 address counts by
// its /64, which one client commonly holds whole) within LoginWindow, and
// that address is refused (429, Retry-After), the right token included,
// until the oldest of them is LoginWindow old. LoginFailuresTotal failed
// ones from all addresses together within LoginWindow, and every login by
// token, from any address, is refused the same way until the window has
// passed: a guesser spread over many addresses gets no more tries than
// that, whichever operator's token it is after. A token names its
// operator, and a wrong one names none, so a per-operator count could
// only be kept by asking for the operator's name, which an attacker would
// also choose; the total bounds the guesses at every operator's token at
// once. Sessions already open go on meanwhile. A token of 128 bits cannot
// be guessed at that pace; the limits keep a weak one, or a flood of
// guesses, from being tried at the speed of the network.
const (
	LoginFailures      = 5
	LoginFailuresTotal = 20
	LoginWindow        = time.Minute
)

// loginLimiter counts the failed logins of each address, and of all.
type loginLimiter struct {
	clock idem.Clock
	mu    sync.Mutex
	fails map[string][]time.Time
	// all are the times of the latest failed logins of every address, at
	// most LoginFailuresTotal of them, oldest first.
	all []time.Time
}

func newLoginLimiter(clock idem.Clock) *loginLimiter {
	return &loginLimiter{clock: clock, fails: map[string][]time.Time{}}
}

// addrOf is the address a request came from, without its port, as the
// login limit counts it: an IPv6 address by its /64.
func addrOf(r *http.Request) string {
	host := r.RemoteAddr
	if h, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		host = h
	}
	if ip, err := netip.ParseAddr(host); err == nil && ip.Is6() && !ip.Is4In6() {
		if p, err := ip.Prefix(64); err == nil {
			return p.String()
		}
	}
	return host
}

// wait returns how long addr must wait before it may try again, and
// whether it is the total of failures that holds it back; 0 when it may
// try now.
func (l *loginLimiter) wait(addr string) (time.Duration, bool) {
	now := l.clock.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	var total time.Duration
	if len(l.all) >= LoginFailuresTotal {
		total = l.all[len(l.all)-LoginFailuresTotal].Add(LoginWindow).Sub(now)
	}
	recent := l.fails[addr][:0]
	for _, t := range l.fails[addr] {
		if now.Sub(t) < LoginWindow {
			recent = append(recent, t)
		}
	}
	var own time.Duration
	if len(recent) == 0 {
		delete(l.fails, addr)
	} else {
		l.fails[addr] = recent
		if len(recent) >= LoginFailures {
			own = recent[len(recent)-LoginFailures].Add(LoginWindow).Sub(now)
		}
	}
	if total > 0 && total >= own {
		return total, true
	}
	return max(own, 0), false
}

// fail counts a failed login of addr.
func (l *loginLimiter) fail(addr string) {
	now := l.clock.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.fails) > 100_000 {
		// A flood from many addresses: forget the oldest state rather
		// than grow without bound (each address is limited again at once).
		clear(l.fails)
	}
	l.fails[addr] = append(l.fails[addr], now)
	l.all = append(l.all, now)
	if len(l.all) > LoginFailuresTotal {
		l.all = slices.Delete(l.all, 0, len(l.all)-LoginFailuresTotal)
	}
}

// refuseTooMany answers 429 when r's address has failed too often, and
// reports whether it did.
func (c *Console) refuseTooMany(w http.ResponseWriter, r *http.Request, next string) bool {
	d, total := c.limiter.wait(addrOf(r))
	if d <= 0 {
		return false
	}
	secs := int((d + time.Second - 1) / time.Second)
	whose := "from your address"
	if total {
		whose = "to this console"
		c.cfg.Logger.Warn("console: login refused: too many failed attempts from all addresses", "remote", addrOf(r))
	} else {
		c.cfg.Logger.Warn("console: login refused: too many failed attempts", "remote", addrOf(r))
	}
	w.Header().Set("Retry-After", strconv.Itoa(secs))
	c.render(w, r, http.StatusTooManyRequests, "login", &loginPage{Error: fmt.Sprintf("Too many failed logins %s: try again in %d seconds.", whose, secs), Next: next})
	return true
}
