package idemhttp

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/keyed"
)

func (m *Middleware) serve(next http.Handler, w http.ResponseWriter, r *http.Request) {
	values := r.Header.Values(HeaderKey)
	if len(values) == 0 { // (with Config.Optional, Handler let it through)
		m.reject(r.Context(), w, "", "", http.StatusBadRequest, ProblemKeyMissing, "Idempotency key missing",
			"This request must carry an Idempotency-Key header: a unique value (a UUID, say) per intended operation, reused only to retry it.")
		return
	}
	if len(values) > 1 {
		m.reject(r.Context(), w, "", "", http.StatusBadRequest, ProblemKeyInvalid, "Invalid idempotency key",
			"Send exactly one Idempotency-Key header.")
		return
	}
	key, err := idem.ParseKey(values[0])
	if err != nil {
		var ke *idem.KeyError
		detail := err.Error()
		if errors.As(err, &ke) {
			detail = "The Idempotency-Key header is " + ke.Reason + "; it must be 1 to 255 visible ASCII characters, bare or as a quoted string."
		}
		m.reject(r.Context(), w, "", "", http.StatusBadRequest, ProblemKeyInvalid, "Invalid idempotency key", detail)
		return
	}
	var scope idem.Scope
	if m.cfg.Scope != nil {
		if scope, err = m.cfg.Scope(r); err != nil {
			m.rejectScope(w, r, key, err)
			return
		}
		if scope == "" && !m.cfg.SharedScope {
			m.rejectEmptyScope(w, r, key)
			return
		}
	}
	body, tooLarge, err := readBody(r, m.cfg.MaxBodyBytes)
	switch {
	case tooLarge:
		m.reject(r.Context(), w, scope, key, http.StatusRequestEntityTooLarge, ProblemBodyTooLarge, "Request body too large",
			fmt.Sprintf("The request body exceeds %d bytes.", m.cfg.MaxBodyBytes))
		return
	case err != nil:
		// The error names the connection's addresses (read tcp
		// 10.0.0.5:8443->…: i/o timeout): the log's business, not the
		// client's.
		m.log.LogAttrs(r.Context(), slog.LevelWarn, "request body unreadable: request refused", slog.Any("scope", scope),
			slog.String("key", idem.KeyDigest(scope, m.eng.SealKey(scope, key))), slog.String("method", r.Method),
			slog.String("path", r.URL.Path), slog.String("error", err.Error()))
		m.reject(r.Context(), w, scope, key, http.StatusBadRequest, ProblemBodyUnreadable, "Request body unreadable",
			"The request body could not be read completely; send it again with the same Idempotency-Key.")
		return
	}
	x := &exchange{m: m, next: next, w: w}
	x.body.Reset(body)
	r.Body = &x.body
	x.r = r
	fp := idem.NewFingerprint(r.Method, r.URL.EscapedPath(), r.URL.RawQuery, r.Header.Get("Content-Type"), body)
	m.eng.Serve(r.Context(), keyed.Request{Scope: scope, Key: key, Fingerprint: fp, Method: r.Method, Path: r.URL.Path}, x)
	if x.abort {
		// The handler cut the connection: so is it cut, now that the
		// engine has settled the key.
		panic(http.ErrAbortHandler)
	}
}
