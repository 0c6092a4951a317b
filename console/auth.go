package console

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"net/http"
	"strings"
	"sync"
	"time"

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
			scheme, token, _ := strings.Cut(h, " ")
			if strings.EqualFold(scheme, "Bearer") {
				op, ok = c.operatorFor(strings.TrimSpace(token))
			}
			if !ok {
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
// login form cannot be made to redirect elsewhere.
func (c *Console) localNext(next string) string {
	if strings.HasPrefix(next, c.cfg.Prefix+"/") && !strings.HasPrefix(next, "//") && !strings.ContainsAny(next, "\\\r\n") {
		return next
	}
	return c.cfg.Prefix + "/"
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
	op, ok := c.operatorFor(strings.TrimSpace(r.PostFormValue("token")))
	if !ok {
		c.cfg.Logger.Warn("console: login refused: unknown token", "remote", r.RemoteAddr)
		c.render(w, r, http.StatusUnauthorized, "login", &loginPage{Error: "That token is not an operator's.", Next: next})
		return
	}
	id, exp := c.sessions.open(op)
	http.SetCookie(w, &http.Cookie{
		Name: cookieName, Value: id, Path: c.cfg.Prefix + "/", Expires: exp,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil,
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
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil,
	})
	http.Redirect(w, r, c.cfg.Prefix+"/login", http.StatusSeeOther)
}
