package payments

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// HeaderFault is the request header that asks for injected faults when
// Config.Faults is on. Its value is a comma-separated list of:
//
//	delay=<Go duration>   hold the request in flight that long before its transaction begins
//	fail-before-commit    fail transiently after the writes, before the commit: 503, rolled back
//	drop-after-commit     let the work commit, then close the connection without an answer
const HeaderFault = "Idem-Fault"

// maxFaultDelay bounds delay= so a typo cannot hold a request (and its key)
// longer than the middleware's default lease.
const maxFaultDelay = time.Minute

// faults are the faults one request asked for.
type faults struct {
	delay            time.Duration
	failBeforeCommit bool
	dropAfterCommit  bool
}

func (f faults) any() bool { return f.delay > 0 || f.failBeforeCommit || f.dropAfterCommit }

// errInjectedFault is what fail-before-commit makes the transaction return.
var errInjectedFault = fmt.Errorf("injected fault fail-before-commit: %w", ErrTransient)

// parseFaults parses the value of the Idem-Fault header. Unknown faults are
// errors, so a misspelt fault is noticed instead of silently ignored.
func parseFaults(v string) (faults, error) {
	var f faults
	for item := range strings.SplitSeq(v, ",") {
		item = strings.TrimSpace(item)
		name, arg, hasArg := strings.Cut(item, "=")
		name = strings.TrimSpace(name)
		switch {
		case item == "":
			continue
		case name == "fail-before-commit" && !hasArg:
			f.failBeforeCommit = true
		case name == "drop-after-commit" && !hasArg:
			f.dropAfterCommit = true
		case name == "delay" && hasArg:
			d, err := time.ParseDuration(strings.TrimSpace(arg))
			if err != nil {
				return faults{}, fmt.Errorf("fault %q: %w", item, err)
			}
			if d < 0 || d > maxFaultDelay {
				return faults{}, fmt.Errorf("fault %q: the delay must be between 0 and %s", item, maxFaultDelay)
			}
			f.delay = d
		default:
			return faults{}, fmt.Errorf("unknown fault %q (known: delay=<duration>, fail-before-commit, drop-after-commit)", item)
		}
	}
	return f, nil
}

type faultsKey struct{}

func withFaults(ctx context.Context, f faults) context.Context {
	return context.WithValue(ctx, faultsKey{}, f)
}

func faultsFrom(ctx context.Context) faults {
	f, _ := ctx.Value(faultsKey{}).(faults)
	return f
}

// injectBeforeCommit is called by storage inside a write's transaction,
// after the writes: with fail-before-commit it fails, so the transaction
// (and, under the middleware, the key's claim) is rolled back.
func injectBeforeCommit(ctx context.Context) error {
	if faultsFrom(ctx).failBeforeCommit {
		return errInjectedFault
	}
	return nil
}

// injectDelay sleeps for the requested delay. It runs before the write's
// transaction begins, so a delayed request holds its idempotency key but not
// SQLite's single writer, and delayed requests overlap.
func injectDelay(ctx context.Context) error {
	d := faultsFrom(ctx).delay
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("injected delay interrupted: %w", errors.Join(ctx.Err(), ErrTransient))
	}
}

// faultParser reads the Idem-Fault header into the request context. It runs
// outside the idempotency middleware, so a malformed header is refused
// before any key is claimed.
func (s *Service) faultParser(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v := r.Header.Get(HeaderFault)
		if v == "" {
			next.ServeHTTP(w, r)
			return
		}
		f, err := parseFaults(v)
		if err != nil {
			writeProblem(w, http.StatusBadRequest, "invalid-fault", "Invalid fault", err.Error(), nil)
			return
		}
		if f.any() {
			s.logger.InfoContext(r.Context(), "payments: injecting faults",
				"method", r.Method, "path", r.URL.Path, "faults", v)
		}
		next.ServeHTTP(w, r.WithContext(withFaults(r.Context(), f)))
	})
}

// dropAfterCommit implements drop-after-commit. It must wrap the
// idempotency middleware from outside: the middleware commits the work and
// the stored answer before it writes the response, so by the time the inner
// handler returns everything is durable, and only then is the answer thrown
// away and the connection closed: the lost acknowledgement.
func (s *Service) dropAfterCommit(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !faultsFrom(r.Context()).dropAfterCommit {
			next.ServeHTTP(w, r)
			return
		}
		sink := &discardWriter{header: http.Header{}}
		next.ServeHTTP(sink, r)
		s.logger.InfoContext(r.Context(), "payments: dropping the connection after the work committed",
			"method", r.Method, "path", r.URL.Path, "status", sink.status)
		// net/http closes the connection without writing anything and
		// without logging a stack trace for this value.
		panic(http.ErrAbortHandler)
	})
}

// discardWriter is the response the client never receives.
type discardWriter struct {
	header http.Header
	status int
}

func (d *discardWriter) Header() http.Header { return d.header }

func (d *discardWriter) WriteHeader(status int) {
	if d.status == 0 {
		d.status = status
	}
}

func (d *discardWriter) Write(p []byte) (int, error) {
	d.WriteHeader(http.StatusOK)
	return len(p), nil
}
