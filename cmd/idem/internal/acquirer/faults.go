package acquirer

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/idem-go/idem/idemhttp"
)

// HeaderFault is the request header that asks the acquirer for injected
// faults when Config.Faults is on, as the payment service's does: a
// comma-separated list of
//
//	delay=<Go duration>   hold the request that long before its transaction begins
//	fail-before-commit    fail after the writes, before the commit: 503, nothing made
//	drop-after-commit     make the charge or refund, then close the connection without an answer
//
// Config.FaultRate adds the same refusals and dropped answers at random.
const HeaderFault = "Idem-Fault"

// maxFaultDelay bounds delay=.
const maxFaultDelay = time.Minute

type faults struct {
	delay            time.Duration
	failBeforeCommit bool
	dropAfterCommit  bool
}

func parseFaults(v string) (faults, error) {
	var f faults
	for item := range strings.SplitSeq(v, ",") {
		name, arg, hasArg := strings.Cut(strings.TrimSpace(item), "=")
		switch {
		case name == "":
		case name == "fail-before-commit" && !hasArg:
			f.failBeforeCommit = true
		case name == "drop-after-commit" && !hasArg:
			f.dropAfterCommit = true
		case name == "delay" && hasArg:
			d, err := time.ParseDuration(arg)
			if err != nil || d < 0 || d > maxFaultDelay {
				return faults{}, fmt.Errorf("fault %q: want a duration from 0 to %s", item, maxFaultDelay)
			}
			f.delay = d
		default:
			return faults{}, fmt.Errorf("unknown fault %q (known: delay=<duration>, fail-before-commit, drop-after-commit)", item)
		}
	}
	return f, nil
}

type faultsKey struct{}

func faultsFrom(ctx context.Context) faults {
	f, _ := ctx.Value(faultsKey{}).(faults)
	return f
}

// errInjected is the failure fail-before-commit makes.
var errInjected = errors.New("injected fault fail-before-commit")

func failBeforeCommit(r *http.Request) error {
	if faultsFrom(r.Context()).failBeforeCommit {
		return errInjected
	}
	return nil
}

func sleepFault(r *http.Request) error {
	d := faultsFrom(r.Context()).delay
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-r.Context().Done():
		return fmt.Errorf("injected delay interrupted: %w", r.Context().Err())
	}
}

// draw returns the next random number of the faults.
func (s *Server) draw() float64 {
	s.randMu.Lock()
	defer s.randMu.Unlock()
	return s.rand()
}

// injectFaults reads the fault header and draws the random faults of a
// charge or refund. It wraps the idempotency middleware from outside, so a
// dropped answer is dropped after the middleware committed the write and
// the key's answer: the caller's retry with the same key gets that answer
// replayed.
func (s *Server) injectFaults(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f, err := parseFaults(r.Header.Get(HeaderFault))
		if err != nil {
			writeProblem(w, http.StatusBadRequest, "invalid-fault", err.Error())
			return
		}
		if s.faultRate > 0 {
			switch x := s.draw(); {
			case x < s.faultRate/2:
				s.logger.InfoContext(r.Context(), "acquirer: random fault: refusing with 503", "path", r.URL.Path)
				writeProblem(w, http.StatusServiceUnavailable, "unavailable", "injected random fault: try again")
				return
			case x < s.faultRate:
				f.dropAfterCommit = true
			}
		}
		r = r.WithContext(context.WithValue(r.Context(), faultsKey{}, f))
		if !f.dropAfterCommit {
			next.ServeHTTP(w, r)
			return
		}
		held := httptest.NewRecorder()
		next.ServeHTTP(held, r)
		s.logger.InfoContext(r.Context(), "acquirer: dropping the answer after the commit",
			"path", r.URL.Path, "status", held.Code, "replayed", held.Header().Get(idemhttp.HeaderReplayed) == "true")
		// net/http closes the connection without an answer and without
		// logging a stack trace for this value.
		panic(http.ErrAbortHandler)
	})
}
