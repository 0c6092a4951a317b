package consoletest_test

import (
	"context"
	crand "crypto/rand"
	"errors"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/payments"
	"github.com/idem-go/idem/console"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/idemsqlite"
	"github.com/idem-go/idem/idemtest"
	"github.com/idem-go/idem/keyed"
)

// settleWorld is a key store with executions stopped at a recovery point,
// and completers over it as replicas of a service have them.
type settleWorld struct {
	t     *testing.T
	store idem.Recoverer
	clock idem.Clock
	// The store's database: one of them.
	sqlite *idemsqlite.DB
	pg     *idempg.DB
	// stop leaves key in flight at a recovery point, its holder's lease
	// ended.
	stop func(key idem.Key)
}

const settleScope = idem.Scope("acme")

func sqliteSettleWorld(t *testing.T) *settleWorld {
	clock := idemmem.NewClock(time.Date(2026, 1, 1, 9, 0, 0, 0, time.UTC))
	db, err := idemsqlite.Open(filepath.Join(t.TempDir(), "keys.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	store, err := idemsqlite.NewStore(t.Context(), db, &idemsqlite.StoreConfig{Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	w := &settleWorld{t: t, store: store, clock: clock, sqlite: db}
	w.stop = func(key idem.Key) {
		w.claimWithPoint(key, time.Second)
		clock.Advance(2 * time.Second)
	}
	return w
}

func postgresSettleWorld(t *testing.T) *settleWorld {
	url := idemtest.RequireService(t, "PostgreSQL", "IDEM_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
	schema := "consoletest_" + strings.ToLower(crand.Text()[:16])
	t.Cleanup(func() {
		// The test's context is already cancelled when cleanups run.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Errorf("dropping schema %s: %v", schema, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`); err != nil {
			t.Errorf("dropping schema %s: %v", schema, err)
		}
	})
	clock := idemmem.NewClock(time.Date(2026, 1, 1, 9, 0, 0, 0, time.UTC))
	db, err := idempg.Open(t.Context(), url, &idempg.Config{Schema: schema, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	store, err := idempg.NewStore(t.Context(), db)
	if err != nil {
		t.Fatal(err)
	}
	w := &settleWorld{t: t, store: store, clock: clock, pg: db}
	w.stop = func(key idem.Key) {
		w.claimWithPoint(key, time.Second)
		clock.Advance(2 * time.Second)
	}
	return w
}

// onEveryDatabase runs test as parallel subtests, on a settleWorld of
// SQLite and one of PostgreSQL.
func onEveryDatabase(t *testing.T, test func(t *testing.T, sw *settleWorld)) {
	t.Helper()
	for name, mk := range map[string]func(*testing.T) *settleWorld{"sqlite": sqliteSettleWorld, "postgres": postgresSettleWorld} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			test(t, mk(t))
		})
	}
}

// keyHistory returns the history of the operators' actions kept in the
// store's database, as the service keeps it.
func (w *settleWorld) keyHistory() console.KeyHistory {
	w.t.Helper()
	ctx := w.t.Context()
	var h console.KeyHistory
	var err error
	if w.pg != nil {
		if err = payments.MigratePostgres(ctx, w.pg); err == nil {
			h, err = payments.KeyHistoryPostgres(w.pg)
		}
	} else if err = payments.Migrate(ctx, w.sqlite); err == nil {
		h, err = payments.KeyHistory(w.sqlite)
	}
	if err != nil {
		w.t.Fatal(err)
	}
	return h
}

func (w *settleWorld) claimWithPoint(key idem.Key, lease time.Duration) {
	w.t.Helper()
	ctx := w.t.Context()
	c, err := w.store.Claim(ctx, idem.ClaimRequest{Scope: settleScope, Key: key, Fingerprint: "fp", Lease: lease, TTL: 24 * time.Hour})
	if err != nil || c.Outcome != idem.Acquired {
		w.t.Fatalf("claim %s: %v %v", key, c.Outcome, err)
	}
	if err := w.store.SaveRecovery(ctx, idem.Ref{Scope: settleScope, Key: key, Token: c.Token}, idem.RecoveryPoint{Name: "charging", Data: []byte(`{"amount":1000}`)}); err != nil {
		w.t.Fatal(err)
	}
}

// completer returns a replica's completer over store (w.store, or a
// wrapper of it), whose Resume is resume.
func (w *settleWorld) completer(store idem.Recoverer, replica string, resume idemhttp.ResumeFunc) *idemhttp.Completer {
	w.t.Helper()
	mw, err := idemhttp.New(&idemhttp.Config{Store: store, SeparateTx: true, SharedScope: true, Lease: 10 * time.Second, Clock: w.clock,
		Holder: idem.Holder{Replica: replica, Incarnation: "1"}})
	if err != nil {
		w.t.Fatal(err)
	}
	c, err := mw.NewCompleter(&idemhttp.CompleterConfig{Resume: resume, Every: time.Hour})
	if err != nil {
		w.t.Fatal(err)
	}
	return c
}

func (w *settleWorld) record(key idem.Key) idem.Record {
	w.t.Helper()
	rec, err := w.store.Get(w.t.Context(), settleScope, key)
	if err != nil {
		w.t.Fatal(err)
	}
	return rec
}

// pausingStore is a real store whose Claims that acquire a key stop, once
// armed, until the test lets them go on: it holds a settle between taking
// the key over and completing it.
type pausingStore struct {
	idem.Recoverer
	armed   atomic.Bool
	claimed chan idem.Key
	proceed chan struct{}
}

func (p *pausingStore) Claim(ctx context.Context, req idem.ClaimRequest) (idem.Claim, error) {
	c, err := p.Recoverer.Claim(ctx, req)
	if err == nil && c.Outcome == idem.Acquired && p.armed.CompareAndSwap(true, false) {
		p.claimed <- req.Key
		<-p.proceed
	}
	return c, err
}

// readsDuringResume is a real store that counts the reads of key made
// while resuming is set: while a resume of the key is under way.
type readsDuringResume struct {
	idem.Recoverer
	key      idem.Key
	resuming atomic.Bool
	reads    atomic.Int64
}

func (s *readsDuringResume) Get(ctx context.Context, scope idem.Scope, key idem.Key) (idem.Record, error) {
	if key == s.key && s.resuming.Load() {
		s.reads.Add(1)
	}
	return s.Recoverer.Get(ctx, scope, key)
}

// doneAsked is a context that closes asked the first time it is asked for
// its Done channel: where whoever was given it starts to wait on it, or
// to do something it may cut short.
type doneAsked struct {
	context.Context
	once  sync.Once
	asked chan struct{}
}

func newDoneAsked(parent context.Context) *doneAsked {
	return &doneAsked{Context: parent, asked: make(chan struct{})}
}

func (c *doneAsked) Done() <-chan struct{} {
	c.once.Do(func() { close(c.asked) })
	return c.Context.Done()
}

// A settle is atomic against a completer finishing the key at the same
// moment, whichever comes first, interleaved step by step: a resume under
// way refuses the settle, and once it finished the settle is refused as
// completed, leaving its answer; a settle that took the key over is not
// resumed by a completer's round, and its answer is the one kept. A
// resume that fails counts the key unknown until a settle ends it. Bad
// input (an unknown key, a key not in flight) is refused, changing
// nothing, and a dry run changes nothing.
func TestSettleIsAtomicAgainstACompleter(t *testing.T) {
	t.Parallel()
	onEveryDatabase(t, testSettleIsAtomic)
}

func testSettleIsAtomic(t *testing.T, w *settleWorld) {
	ctx := t.Context()
	entered, finish := make(chan idem.Key, 1), make(chan struct{})
	var resumed atomic.Int64
	compA := w.completer(w.store, "a", func(_ context.Context, rw http.ResponseWriter, ex idemhttp.Execution) error {
		resumed.Add(1)
		entered <- ex.Key
		<-finish
		rw.Header().Set("Content-Type", "application/json")
		rw.WriteHeader(http.StatusCreated)
		rw.Write([]byte(`{"paid":true}`))
		return nil
	})
	compB := w.completer(w.store, "b", func(context.Context, http.ResponseWriter, idemhttp.Execution) error {
		t.Error("replica b's completer resumed a key")
		return nil
	})

	// Bad input: refused, nothing changed.
	if _, err := compB.Settle(ctx, settleScope, "no-such-key", console.FailedAnswer(), false); !errors.Is(err, keyed.ErrNotStopped) || !errors.Is(err, idem.ErrNotFound) {
		t.Fatalf("settling an unknown key: %v; want ErrNotStopped and ErrNotFound", err)
	}
	if _, err := compB.ResumeKey(ctx, settleScope, "no-such-key", false); !errors.Is(err, keyed.ErrNotStopped) {
		t.Fatalf("resuming an unknown key: %v; want ErrNotStopped", err)
	}
	plain, err := w.store.Claim(ctx, idem.ClaimRequest{Scope: settleScope, Key: "no-point", Fingerprint: "fp", Lease: time.Hour, TTL: 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := compB.Settle(ctx, settleScope, "no-point", console.FailedAnswer(), false); !errors.Is(err, keyed.ErrNotStopped) {
		t.Fatalf("settling a key in flight without a point: %v; want ErrNotStopped", err)
	}
	if rec := w.record("no-point"); rec.State != idem.StateInFlight || rec.Token != plain.Token {
		t.Fatalf("a refused settle changed the key: %+v", rec)
	}

	// 1. A resume under way, then finished: the settle is refused both
	// times, and the resume's answer is the one kept.
	w.stop("k1")
	if _, err := compB.Settle(ctx, settleScope, "k1", console.FailedAnswer(), true); err != nil {
		t.Fatalf("a dry run of settling a stopped key: %v", err)
	}
	if rec := w.record("k1"); rec.State != idem.StateInFlight {
		t.Fatalf("a dry run changed the key: %v", rec.State)
	}
	type result struct {
		finished bool
		err      error
	}
	done := make(chan result, 1)
	go func() {
		f, err := compA.ResumeKey(ctx, settleScope, "k1", false)
		done <- result{f, err}
	}()
	<-entered
	if _, err := compB.Settle(ctx, settleScope, "k1", console.FailedAnswer(), false); !errors.Is(err, keyed.ErrBeingFinished) {
		t.Fatalf("settling while another replica's resume holds the key: %v; want ErrBeingFinished", err)
	}
	// On the resuming replica, a settle waits for its resume to end, and
	// then finds the key completed.
	ownSettle := make(chan error, 1)
	go func() {
		_, err := compA.Settle(ctx, settleScope, "k1", console.FailedAnswer(), false)
		ownSettle <- err
	}()
	close(finish)
	if r := <-done; !r.finished || r.err != nil {
		t.Fatalf("the resume: finished %v, %v", r.finished, r.err)
	}
	if err := <-ownSettle; !errors.Is(err, keyed.ErrNotStopped) || !strings.Contains(err.Error(), "completed") {
		t.Fatalf("a settle on the resuming replica: %v; want it refused once the resume completed the key", err)
	}
	if _, err := compB.Settle(ctx, settleScope, "k1", console.FailedAnswer(), false); !errors.Is(err, keyed.ErrNotStopped) || !strings.Contains(err.Error(), "completed") {
		t.Fatalf("settling a key the resume completed: %v; want ErrNotStopped, completed", err)
	}
	if rec := w.record("k1"); rec.State != idem.StateCompleted || rec.Response.Status != http.StatusCreated || rec.Response.Header.Get(console.SettledHeader) != "" {
		t.Fatalf("k1 after the resume and the refused settle: %v %+v; want the resume's 201", rec.State, rec.Response)
	}

	// 2. A settle that took the key over and has not completed it yet: a
	// completer's round does not resume it, nor does a resume of it; then
	// the settle's answer is kept, and the client's retry gets it.
	w.stop("k2")
	ps := &pausingStore{Recoverer: w.store, claimed: make(chan idem.Key), proceed: make(chan struct{})}
	compS := w.completer(ps, "s", func(context.Context, http.ResponseWriter, idemhttp.Execution) error {
		t.Error("the settling replica's completer resumed a key")
		return nil
	})
	ps.armed.Store(true)
	settled := make(chan error, 1)
	go func() {
		_, err := compS.Settle(ctx, settleScope, "k2", console.FailedAnswer(), false)
		settled <- err
	}()
	<-ps.claimed
	before := resumed.Load()
	if n, err := compA.RunOnce(ctx); n != 0 || err != nil {
		t.Fatalf("a round while the settle holds k2: finished %d, %v; want none", n, err)
	}
	if _, err := compA.ResumeKey(ctx, settleScope, "k2", false); !errors.Is(err, keyed.ErrBeingFinished) {
		t.Fatalf("resuming k2 while the settle holds it: %v; want ErrBeingFinished", err)
	}
	if resumed.Load() != before {
		t.Fatal("k2 was resumed while a settle held it")
	}
	close(ps.proceed)
	if err := <-settled; err != nil {
		t.Fatalf("the settle: %v", err)
	}
	retry, err := w.store.Claim(ctx, idem.ClaimRequest{Scope: settleScope, Key: "k2", Fingerprint: "fp", Lease: time.Second, TTL: 24 * time.Hour})
	if err != nil || retry.Outcome != idem.Completed || retry.Record.Response.Status != http.StatusConflict ||
		retry.Record.Response.Header.Get(console.SettledHeader) != "failed" || !strings.Contains(string(retry.Record.Response.Body), "Settled as failed by an operator") {
		t.Fatalf("the client's retry after the settle: %v %v %+v; want the settled 409", retry.Outcome, err, retry.Record.Response)
	}
	if _, err := compA.Settle(ctx, settleScope, "k2", console.FailedAnswer(), true); !errors.Is(err, keyed.ErrNotStopped) {
		t.Fatalf("a dry run of settling a settled key: %v; want ErrNotStopped", err)
	}

	// 3. A resume that fails leaves the outcome unknown, counted, with
	// its error; a settle (under the lease that resume took) ends it, and
	// the count drops.
	w.stop("k3")
	compF := w.completer(w.store, "f", func(context.Context, http.ResponseWriter, idemhttp.Execution) error {
		return errors.New("card network unavailable")
	})
	if f, err := compF.ResumeKey(ctx, settleScope, "k3", false); f || err == nil || !strings.Contains(err.Error(), "card network unavailable") {
		t.Fatalf("a failing resume: finished %v, %v", f, err)
	}
	if s, fl := compF.Stats(), compF.Failures(settleScope, "k3"); s.Unknown != 1 || fl.Count != 1 || fl.LastError != "card network unavailable" || !fl.Holding {
		t.Fatalf("after a failed resume: unknown %d, failures %+v", s.Unknown, fl)
	}
	answer, err := console.OperatorAnswer(http.StatusCreated, "", `{"status":"succeeded"}`)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := compF.Settle(ctx, settleScope, "k3", answer, false); err != nil {
		t.Fatalf("settling an unknown outcome: %v", err)
	}
	if s := compF.Stats(); s.Unknown != 0 {
		t.Fatalf("after the settle: unknown %d; want 0", s.Unknown)
	}
	if rec := w.record("k3"); rec.State != idem.StateCompleted || rec.Response.Status != http.StatusCreated || rec.Response.Header.Get(console.SettledHeader) != "answer" {
		t.Fatalf("k3 after the settle: %v %+v", rec.State, rec.Response)
	}

	// 4. A dry run asked of a completer while its own round resumes the
	// key (the console's confirmation page, opened by an operator as a
	// round runs) waits for that resume, and finds the key it left
	// unknown stopped under its lease: not refused as being finished.
	w.stop("k4")
	entered4, fail4 := make(chan struct{}, 1), make(chan struct{})
	rs4 := &readsDuringResume{Recoverer: w.store, key: "k4"}
	compW := w.completer(rs4, "w", func(context.Context, http.ResponseWriter, idemhttp.Execution) error {
		rs4.resuming.Store(true)
		entered4 <- struct{}{}
		<-fail4
		return errors.New("card network unavailable")
	})
	resumeDone := make(chan error, 1)
	go func() {
		_, err := compW.ResumeKey(ctx, settleScope, "k4", false)
		resumeDone <- err
	}()
	<-entered4
	// A dry run waits for the resume before it reads the key. Given a
	// context already ended, its wait ends as soon as it begins: it is
	// refused as waiting for this completer's resume, and any read of k4
	// the store saw was made before its wait began (or without one).
	gone, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := compW.Settle(gone, settleScope, "k4", console.FailedAnswer(), true); !errors.Is(err, keyed.ErrBeingFinished) || !strings.Contains(err.Error(), "this completer is resuming it") {
		t.Fatalf("a dry settle given up at once while this completer resumes k4: %v; want it refused as waiting for the resume", err)
	}
	if _, err := compW.ResumeKey(gone, settleScope, "k4", true); !errors.Is(err, keyed.ErrBeingFinished) || !strings.Contains(err.Error(), "this completer is resuming it") {
		t.Fatalf("a dry resume given up at once while this completer resumes k4: %v; want it refused as waiting for the resume", err)
	}
	if n := rs4.reads.Load(); n != 0 {
		t.Fatalf("dry runs read k4 %d times before waiting for this completer's resume of it; want no read before the wait", n)
	}
	dry := make(chan error, 2)
	settleCtx, resumeCtx := newDoneAsked(ctx), newDoneAsked(ctx)
	go func() {
		_, err := compW.Settle(settleCtx, settleScope, "k4", console.FailedAnswer(), true)
		dry <- err
	}()
	go func() {
		_, err := compW.ResumeKey(resumeCtx, settleScope, "k4", true)
		dry <- err
	}()
	// Each dry run asks its context for its Done channel as it starts to
	// wait for the resume (the dry runs above showed that it reads nothing
	// before): both have begun while the resume is under way, and are
	// waiting for it.
	<-settleCtx.asked
	<-resumeCtx.asked
	if n := rs4.reads.Load(); n != 0 {
		t.Fatalf("dry runs read k4 %d times while this completer's resume of it was under way; want them to wait for the resume", n)
	}
	select {
	case err := <-dry:
		t.Fatalf("a dry run answered while this completer's resume of k4 was under way: %v; want it to wait for the resume", err)
	default:
	}
	rs4.resuming.Store(false)
	close(fail4)
	if err := <-resumeDone; err == nil || !strings.Contains(err.Error(), "card network unavailable") {
		t.Fatalf("the failing resume of k4: %v", err)
	}
	for range 2 {
		if err := <-dry; err != nil {
			t.Fatalf("a dry run after the resume left k4 unknown: %v; want it allowed", err)
		}
	}
	if rec := w.record("k4"); rec.State != idem.StateInFlight {
		t.Fatalf("the dry runs changed k4: %v", rec.State)
	}
}
