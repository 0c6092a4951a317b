package payments

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"strings"
	"time"

	"github.com/idem-go/idem/idemhttp"
)

// HeaderFault is the request header that asks for injected faults when
// Config.Faults is on. Its value is a comma-separated list of:
//
//	delay=<Go duration>   hold the request in flight that long before its transaction begins
//	fail-before-commit    fail transiently after the writes, before the commit: 503, rolled back
//	drop-after-commit     let the work commit, then close the connection without an answer
//	crash-after-commit    let the work commit, then kill the process (Config.Crash) before it answers
//	crash-after-charge    with Config.Acquirer: kill the process after the card network charged, before the local commit
//	drop-charge-answer    with Config.Acquirer: the network charges, and its first answer is lost on the way back
//
// crash-after-commit fires at the last moment a real crash could leave the
// most behind, which depends on where the idempotency key lives:
//
//   - Same transaction (the default: keys in the service's own database):
//     the work and the key's completion commit together, so the fault fires
//     after that commit, outside the idempotency middleware, before the
//     answer is written. A retry is a plain replay.
//   - Two stores (Config.Keys): the handler's writes commit on their own and
//     the middleware completes the key afterwards, so the fault fires inside
//     the handler right after its own commit: the payment is made and the key
//     is still in flight. A retry waits for the lease to end, takes the key
//     over and finds the payment through its unique constraint.
//   - Unsafe mode (no keys at all): inside the handler, right after its own
//     commit, as with two stores.
//
// It fires only when the work ran and succeeded (a 2xx answer that is not a
// replay); a refusal or a replay commits nothing worth crashing after.
const HeaderFault = "Idem-Fault"

// maxFaultDelay bounds delay= so a typo cannot hold a request (and its key)
// longer than the middleware's default lease.
const maxFaultDelay = time.Minute

// faults are the faults one request asked for.
type faults struct {
	delay            time.Duration
	failBeforeCommit bool
	dropAfterCommit  bool
	crashAfterCommit bool
	crashAfterCharge bool
	dropChargeAnswer bool
}

func (f faults) any() bool {
	return f.delay > 0 || f.failBeforeCommit || f.dropAfterCommit || f.crashAfterCommit || f.crashAfterCharge || f.dropChargeAnswer
}

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
		case name == "crash-after-commit" && !hasArg:
			f.crashAfterCommit = true
		case name == "crash-after-charge" && !hasArg:
			f.crashAfterCharge = true
		case name == "drop-charge-answer" && !hasArg:
			f.dropChargeAnswer = true
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
			return faults{}, fmt.Errorf("unknown fault %q (known: delay=<duration>, fail-before-commit, drop-after-commit, crash-after-commit, crash-after-charge, drop-charge-answer)", item)
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

// injectDelay sleeps for the requested delay, as a handler that calls
// another service before it writes would. It runs in the handler, under the
// key's claim and before the write's transaction begins, so a delayed
// request holds its idempotency key but not SQLite's single writer (on
// SQLite the middleware claims the key with a write of its own and begins
// the handler's transaction at its first write: see idem.SerialWriter),
// and delayed requests of different keys overlap. With PostgreSQL the
// delayed request holds its pool connection and its key's advisory lock,
// no lock another key needs.
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

// afterCommit implements drop-after-commit, and crash-after-commit where
// the key completes with the work (see HeaderFault). It must wrap the
// idempotency middleware from outside: in the same-transaction form the
// middleware commits the work and the stored answer before it writes the
// response, so by the time the inner handler returns everything is durable.
// Only then is the answer thrown away and the connection closed (the lost
// acknowledgement), or the process killed.
func (s *Service) afterCommit(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f := faultsFrom(r.Context())
		crash := f.crashAfterCommit && !s.crashInHandler
		if !f.dropAfterCommit && !crash {
			next.ServeHTTP(w, r)
			return
		}
		held := &heldResponse{header: http.Header{}}
		next.ServeHTTP(held, r)
		// A replay committed nothing now: there is nothing to crash after.
		if crash && held.status >= 200 && held.status < 300 && held.header.Get(idemhttp.HeaderReplayed) != "true" {
			s.crash(r, "the work and its idempotency key committed; the answer was not sent")
		}
		if f.dropAfterCommit {
			s.logger.InfoContext(r.Context(), "payments: dropping the connection after the work committed",
				"method", r.Method, "path", r.URL.Path, "status", held.status)
			// net/http closes the connection without writing anything and
			// without logging a stack trace for this value.
			panic(http.ErrAbortHandler)
		}
		held.sendTo(w)
	})
}

// crashAfterOwnCommit implements crash-after-commit in the two-store form:
// the handler calls it right after its own writes committed, before the
// middleware completes the key in the other store.
func (s *Service) crashAfterOwnCommit(r *http.Request) {
	if s.crashInHandler && faultsFrom(r.Context()).crashAfterCommit {
		s.crash(r, "the work committed; the idempotency key is not completed")
	}
}

// crash kills the process with Config.Crash. An injected Crash that
// returns still leaves the client without an answer, as a dead process
// would, and keeps a two-store key in flight: the middleware releases
// nothing after http.ErrAbortHandler.
func (s *Service) crash(r *http.Request, state string) {
	s.logger.WarnContext(r.Context(), "payments: crash-after-commit: killing the process",
		"method", r.Method, "path", r.URL.Path, "state", state)
	s.crashFn()
	panic(http.ErrAbortHandler)
}

// heldResponse keeps an answer until the after-commit faults decide its
// fate.
type heldResponse struct {
	header http.Header
	status int
	body   []byte
}

func (h *heldResponse) Header() http.Header { return h.header }

func (h *heldResponse) WriteHeader(status int) {
	if h.status == 0 {
		h.status = status
	}
}

func (h *heldResponse) Write(p []byte) (int, error) {
	h.WriteHeader(http.StatusOK)
	h.body = append(h.body, p...)
	return len(p), nil
}

func (h *heldResponse) sendTo(w http.ResponseWriter) {
	maps.Copy(w.Header(), h.header)
	if h.status == 0 {
		h.status = http.StatusOK
	}
	w.WriteHeader(h.status)
	_, _ = w.Write(h.body)
}
