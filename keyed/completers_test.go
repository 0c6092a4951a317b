package keyed_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/keyed"
)

// Completers acts on each key by the Completer of its point, whose
// settles keep the operator's answer in that face's form
// (CompleterConfig.SettleAnswer) and whose resumes run that face's
// Resume; a key at a point none names, and an answer a face cannot keep,
// are refused, changing nothing.
func TestCompletersActByTheKeysFace(t *testing.T) {
	t.Parallel()
	clock := idemmem.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	store := idemmem.NewStore(&idemmem.Config{Clock: clock})
	var resumed []string
	face := func(point string, settle func(idem.Response) (idem.Response, error)) *keyed.Completer {
		t.Helper()
		eng, err := keyed.New(&keyed.Config{Store: store, SeparateTx: true, Clock: clock, Timers: clock, Lease: 12 * time.Second, TTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		comp, err := eng.NewCompleter(&keyed.CompleterConfig{Points: []string{point}, SettleAnswer: settle,
			Resume: func(ctx context.Context, ex keyed.Execution) (idem.Response, error) {
				resumed = append(resumed, point+":"+string(ex.Key))
				return idem.Response{Status: 201, Header: http.Header{"Form": {point}}}, nil
			}})
		if err != nil {
			t.Fatal(err)
		}
		return comp
	}
	errNoSuchForm := errors.New("no such answer on this face")
	cs := keyed.Completers{
		face("a", nil),
		face("b", func(answer idem.Response) (idem.Response, error) {
			if answer.Status == 299 {
				return idem.Response{}, errNoSuchForm
			}
			return idem.Response{Status: answer.Status, Header: http.Header{"Form": {"b"}}, Body: answer.Body}, nil
		}),
	}
	for _, k := range []struct{ key, point string }{{"ka", "a"}, {"kb", "b"}, {"kb-299", "b"}, {"kb-resume", "b"}, {"kb-recorded", "b"}, {"kc", "c"}} {
		abandonAt(t, store, idem.Key(k.key), k.point)
	}
	answer := idem.Response{Status: 409, Header: http.Header{"Content-Type": {"application/problem+json"}}, Body: []byte(`{"title":"settled"}`)}
	for key, form := range map[idem.Key]string{"ka": "", "kb": "b"} {
		if _, err := cs.SettleRecorded(t.Context(), "", key, answer, func(context.Context, bool) error { return nil }); err != nil {
			t.Fatalf("settling %s: %v", key, err)
		}
		rec, err := store.Get(t.Context(), "", key)
		if err != nil || rec.State != idem.StateCompleted || rec.Response == nil || rec.Response.Status != 409 || rec.Response.Header.Get("Form") != form {
			t.Fatalf("%s after the settle: %+v, %v; want 409 kept in face %q's form", key, rec.Response, err, form)
		}
	}
	unchanged := func(key idem.Key, point string) {
		t.Helper()
		if rec, err := store.Get(t.Context(), "", key); err != nil || rec.State != idem.StateInFlight || rec.Recovery.Name != point || rec.LeaseExpiresAt.After(clock.Now()) {
			t.Fatalf("%s: %v at %q, %v; want it left in flight at its point", key, rec.State, rec.Recovery.Name, err)
		}
	}
	// A dry run refuses what the settle would.
	for _, dry := range []bool{true, false} {
		_, err := cs.Settle(t.Context(), "", "kb-299", idem.Response{Status: 299}, dry)
		if !errors.Is(err, idem.ErrInvalidArgument) || !errors.Is(err, errNoSuchForm) {
			t.Fatalf("settling with an answer face b cannot keep (dry run %v): %v; want ErrInvalidArgument wrapping the face's reason", dry, err)
		}
		unchanged("kb-299", "b")
	}
	for _, dry := range []bool{true, false} {
		if _, err := cs.Settle(t.Context(), "", "kc", answer, dry); !errors.Is(err, keyed.ErrOtherPoint) {
			t.Fatalf("settling a key at a point no completer names (dry run %v): %v; want ErrOtherPoint", dry, err)
		}
		if _, err := cs.ResumeKey(t.Context(), "", "kc", dry); !errors.Is(err, keyed.ErrOtherPoint) {
			t.Fatalf("resuming a key at a point no completer names (dry run %v): %v; want ErrOtherPoint", dry, err)
		}
	}
	unchanged("kc", "c")
	if finished, err := cs.ResumeKey(t.Context(), "", "kb-resume", false); !finished || err != nil || len(resumed) != 1 || resumed[0] != "b:kb-resume" {
		t.Fatalf("resuming kb-resume: %v, %v, resumed %v; want face b's Resume", finished, err, resumed)
	}
	recorded := false
	if finished, err := cs.ResumeRecorded(t.Context(), "", "kb-recorded", func(context.Context, bool, keyed.ResumeEnd) error { recorded = true; return nil }); !finished || err != nil ||
		!recorded || len(resumed) != 2 || resumed[1] != "b:kb-recorded" {
		t.Fatalf("resuming kb-recorded with its record: %v, %v, recorded %v, resumed %v; want face b's Resume, recorded", finished, err, recorded, resumed)
	}
	if _, err := cs.Settle(t.Context(), "", "nope", answer, true); !errors.Is(err, keyed.ErrNotStopped) || !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("settling an unknown key: %v; want ErrNotStopped and ErrNotFound", err)
	}
	if _, err := cs.Settle(t.Context(), "", "ka", answer, true); !errors.Is(err, keyed.ErrNotStopped) {
		t.Fatalf("settling a settled key: %v; want ErrNotStopped", err)
	}
	if _, err := (keyed.Completers{}).Settle(t.Context(), "", "ka", answer, true); !errors.Is(err, idem.ErrInvalidArgument) {
		t.Fatalf("no Completers: %v; want ErrInvalidArgument", err)
	}
}

// Completers.Failures and Completers.LetGo reach the Completer of the
// key's face, wherever it stands among them: a failed resume by face b's
// Completer (the second) is what Failures reports for the key, and LetGo
// ends the lease that resume holds the key under, so that the key can be
// taken on at once; face a's Completer, which never saw the key, neither
// hides b's failures nor stops LetGo before b's.
func TestCompletersFailuresAndLetGoReachTheKeysFace(t *testing.T) {
	t.Parallel()
	clock := idemmem.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	store := idemmem.NewStore(&idemmem.Config{Clock: clock})
	down := errors.New("the card network does not answer")
	face := func(point string) *keyed.Completer {
		t.Helper()
		eng, err := keyed.New(&keyed.Config{Store: store, SeparateTx: true, Clock: clock, Timers: clock, Lease: 12 * time.Second, TTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		comp, err := eng.NewCompleter(&keyed.CompleterConfig{Points: []string{point},
			Resume: func(context.Context, keyed.Execution) (idem.Response, error) { return idem.Response{}, down }})
		if err != nil {
			t.Fatal(err)
		}
		return comp
	}
	cs := keyed.Completers{face("a"), face("b")}
	abandonAt(t, store, "kb", "b")
	if finished, err := cs.ResumeKey(t.Context(), "", "kb", false); finished || !errors.Is(err, down) {
		t.Fatalf("resuming kb: %v, %v; want face b's Resume's error", finished, err)
	}
	if f := cs.Failures("", "kb"); f.Count != 1 || !f.Holding || !strings.Contains(f.LastError, down.Error()) {
		t.Fatalf("Failures of kb after its failed resume: %+v; want face b's count of 1, holding the key", f)
	}
	if rec, err := store.Get(t.Context(), "", "kb"); err != nil || !rec.LeaseExpiresAt.After(clock.Now()) {
		t.Fatalf("kb after its failed resume: lease until %v, %v; want it held under the resume's lease", rec.LeaseExpiresAt, err)
	}
	if err := cs.LetGo(t.Context(), "", "kb"); err != nil {
		t.Fatalf("LetGo of kb: %v", err)
	}
	if f := cs.Failures("", "kb"); f.Count != 1 || f.Holding {
		t.Fatalf("Failures of kb after LetGo: %+v; want its count, no longer holding it", f)
	}
	if rec, err := store.Get(t.Context(), "", "kb"); err != nil || rec.State != idem.StateInFlight || rec.Recovery.Name != "b" || rec.LeaseExpiresAt.After(clock.Now()) {
		t.Fatalf("kb after LetGo: %v at %q, lease until %v, %v; want it in flight at its point, its lease ended", rec.State, rec.Recovery.Name, rec.LeaseExpiresAt, err)
	}
	if f := cs.Failures("", "never"); f != (keyed.ResumeFailures{}) {
		t.Fatalf("Failures of a key no completer resumed: %+v; want none", f)
	}
}

// Completers.LetGo lets go of the key at every Completer that holds it,
// and returns their errors joined: one whose store refuses the Yield does
// not keep the next from giving its own lease back.
func TestCompletersLetGoReachesEveryCompleter(t *testing.T) {
	t.Parallel()
	clock := idemmem.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	mem := idemmem.NewStore(&idemmem.Config{Clock: clock})
	refusing := &yieldRefused{Store: mem}
	down := errors.New("the card network does not answer")
	completer := func(store idem.Store) *keyed.Completer {
		t.Helper()
		eng, err := keyed.New(&keyed.Config{Store: store, SeparateTx: true, Clock: clock, Timers: clock, Lease: 12 * time.Second, TTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		comp, err := eng.NewCompleter(&keyed.CompleterConfig{
			Resume: func(context.Context, keyed.Execution) (idem.Response, error) { return idem.Response{}, down }})
		if err != nil {
			t.Fatal(err)
		}
		return comp
	}
	first, second := completer(refusing), completer(mem)
	abandon(t, mem, "k")
	// Both resume the key and fail, the second once the first's lease
	// ended: each then says it holds the key.
	if _, err := first.ResumeKey(t.Context(), "", "k", false); !errors.Is(err, down) {
		t.Fatalf("the first resume: %v; want its Resume's error", err)
	}
	clock.Advance(13 * time.Second)
	if _, err := second.ResumeKey(t.Context(), "", "k", false); !errors.Is(err, down) {
		t.Fatalf("the second resume: %v; want its Resume's error", err)
	}
	refusing.fail.Store(true)
	err := keyed.Completers{first, second}.LetGo(t.Context(), "", "k")
	if !errors.Is(err, errStoreDown) {
		t.Fatalf("LetGo with the first completer's Yield refused: %v; want that error", err)
	}
	if f := second.Failures("", "k"); f.Holding {
		t.Fatalf("the second completer after LetGo: %+v; want it no longer holding the key", f)
	}
	if rec, err := mem.Get(t.Context(), "", "k"); err != nil || rec.State != idem.StateInFlight || rec.LeaseExpiresAt.After(clock.Now()) {
		t.Fatalf("the key after LetGo: %v, lease until %v, %v; want it in flight, its lease ended", rec.State, rec.LeaseExpiresAt, err)
	}
}
