package idemsqlite

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"modernc.org/sqlite"

	"github.com/idem-go/idem"
)

// groupDB opens a DB whose groups stay open as long as members queue
// (window), with a table of ids the members write.
func groupDB(t *testing.T, window time.Duration) *DB {
	t.Helper()
	db, err := Open(filepath.Join(t.TempDir(), "group.db"), &Config{GroupCommit: window})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	_, err = db.Writer().Exec(`CREATE TABLE ids (id TEXT PRIMARY KEY);
		CREATE TABLE parents (id TEXT PRIMARY KEY);
		CREATE TABLE children (id TEXT PRIMARY KEY, parent TEXT REFERENCES parents (id) DEFERRABLE INITIALLY DEFERRED);`)
	if err != nil {
		t.Fatal(err)
	}
	return db
}

func committedIDs(t *testing.T, db *DB) []string {
	t.Helper()
	rows, err := db.Reader().QueryContext(t.Context(), `SELECT id FROM ids ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	return ids
}

// writeAfter checks that the writer serves a transaction after a group
// that failed, and that only its write is there.
func writeAfter(t *testing.T, db *DB) {
	t.Helper()
	if err := db.WithTx(t.Context(), func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO ids (id) VALUES ('after')`)
		return err
	}); err != nil {
		t.Fatalf("the transaction after the failed group: %v", err)
	}
	if got := committedIDs(t, db); !slices.Equal(got, []string{"after"}) {
		t.Errorf("committed %v, want [after]", got)
	}
}

// member is one WithTx of a group test: it writes its id, then runs then.
type member struct {
	id    string
	then  func(ctx context.Context, tx *sql.Tx) error
	group *txGroup // the group it ran in
	err   error    // what WithTx returned
}

// runGroup runs the first member, and the others once the first holds
// the writer, each queued behind the one before; the first ends once all
// the others wait behind it. It returns once every WithTx has, with what
// happened in order: "ran <id>" when a member's fn returned, "returned
// <id>" when its WithTx did.
func runGroup(t *testing.T, db *DB, ms []*member) (events []string) {
	t.Helper()
	ctx := t.Context()
	var (
		mu  sync.Mutex
		wg  sync.WaitGroup
		all = make(chan struct{})
	)
	event := func(e string) {
		mu.Lock()
		events = append(events, e)
		mu.Unlock()
	}
	run := func(m *member, first bool) {
		m.err = db.WithTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
			defer event("ran " + m.id)
			m.group = db.carried(ctx).group
			if _, err := tx.ExecContext(ctx, `INSERT INTO ids (id) VALUES (?)`, m.id); err != nil {
				return err
			}
			if first {
				<-all
			}
			if m.then != nil {
				return m.then(ctx, tx)
			}
			return nil
		})
		event("returned " + m.id)
	}
	wg.Go(func() { run(ms[0], true) })
	queuedOrHolding(t, &db.queue)
	for i, m := range ms[1:] {
		wg.Go(func() { run(m, false) })
		queued(t, &db.queue, i+1)
	}
	close(all)
	wg.Wait()
	return events
}

// queuedOrHolding waits until q's turn is held.
func queuedOrHolding(t *testing.T, q *writerQueue) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		q.mu.Lock()
		held := q.held
		q.mu.Unlock()
		if held {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the writer's turn was never taken")
		}
		runtime.Gosched()
	}
}

// Transactions that queue behind one another share one transaction and
// one commit, and none returns before that commit: the first returns only
// once the last has run. One whose fn fails is rolled back alone.
func TestGroupCommitSharesOneCommit(t *testing.T) {
	db := groupDB(t, time.Hour)
	errDeclined := errors.New("declined")
	ms := []*member{{id: "a"}, {id: "b"}, {id: "c", then: func(context.Context, *sql.Tx) error { return errDeclined }}, {id: "d"}}
	events := runGroup(t, db, ms)
	for _, m := range ms {
		if m.group != ms[0].group {
			t.Errorf("%s ran in another group", m.id)
		}
	}
	if ms[0].group.joined != 4 {
		t.Errorf("the group had %d members, want 4", ms[0].group.joined)
	}
	for _, m := range ms {
		if want := error(nil); m.id == "c" {
			if !errors.Is(m.err, errDeclined) {
				t.Errorf("c: %v, want its own error", m.err)
			}
		} else if m.err != want {
			t.Errorf("%s: %v", m.id, m.err)
		}
	}
	if got := committedIDs(t, db); !slices.Equal(got, []string{"a", "b", "d"}) {
		t.Errorf("committed %v, want [a b d]: c rolled back alone", got)
	}
	// The group commits when d, the last, ends: a returns after that.
	if slices.Index(events, "returned a") < slices.Index(events, "ran d") {
		t.Errorf("events %v: a returned before d ran", events)
	}
}

// With GroupCommit negative, every transaction commits alone.
func TestGroupCommitOff(t *testing.T) {
	db := groupDB(t, -1)
	ms := []*member{{id: "a"}, {id: "b"}, {id: "c"}}
	runGroup(t, db, ms)
	for _, m := range ms {
		if m.err != nil || m.group.joined != 1 {
			t.Errorf("%s: %v, in a group of %d; want alone", m.id, m.err, m.group.joined)
		}
	}
	if got := committedIDs(t, db); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Errorf("committed %v", got)
	}
}

// A group whose commit fails (a deferred foreign key, which SQLite checks
// at COMMIT) commits none of its members, and every member returns an
// error: one that failed on its own after others returns the group's
// failure instead, since what it saw may never have committed. The writer
// serves the next transaction.
func TestGroupCommitFailureFailsEveryMember(t *testing.T) {
	db := groupDB(t, time.Hour)
	errOwn := errors.New("its own")
	ms := []*member{
		{id: "a"},
		{id: "b", then: func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO children (id, parent) VALUES ('orphan', 'nobody')`)
			return err
		}},
		{id: "c", then: func(context.Context, *sql.Tx) error { return errOwn }},
	}
	runGroup(t, db, ms)
	for _, m := range ms {
		var te *txError
		if !errors.As(m.err, &te) || te.op != "commit" || !errors.Is(m.err, ms[0].group.err) {
			t.Errorf("%s: %v; want the group's commit error", m.id, m.err)
		}
	}
	if ms[0].group.err == nil {
		t.Fatal("the group committed")
	}
	if got := committedIDs(t, db); len(got) != 0 {
		t.Errorf("committed %v, want nothing", got)
	}
	writeAfter(t, db)
}

var (
	registerStarted sync.Once
	writeStarted    = make(chan struct{}, 1)
)

// A member's write interrupted makes SQLite roll back the whole
// transaction: the group fails, so the member before it returns an error
// and its write is not there. The context fn receives does not interrupt
// (see TestGroupCommitCancelledClaim); a statement run with a context of
// its own does.
func TestGroupCommitInterruptedMember(t *testing.T) {
	registerStarted.Do(func() {
		sqlite.MustRegisterScalarFunction("idemtest_started", 0, func(*sqlite.FunctionContext, []driver.Value) (driver.Value, error) {
			select {
			case writeStarted <- struct{}{}:
			default:
			}
			return int64(1), nil
		})
	})
	db := groupDB(t, time.Hour)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go func() {
		<-writeStarted
		cancel()
	}()
	ms := []*member{
		{id: "a"},
		{id: "b", then: func(_ context.Context, tx *sql.Tx) error {
			// A write that runs until interrupted.
			_, err := tx.ExecContext(ctx, `INSERT INTO ids (id)
				WITH RECURSIVE n(x) AS (SELECT idemtest_started() UNION ALL SELECT x + 1 FROM n LIMIT 1000000000)
				SELECT 'n' || x FROM n`)
			return err
		}},
	}
	runGroup(t, db, ms)
	for _, m := range ms {
		if m.err == nil || !strings.Contains(m.err.Error(), "interrupted") {
			t.Errorf("%s returned %v; want the interrupted group's error", m.id, m.err)
		}
	}
	if !strings.Contains(ms[1].err.Error(), context.Canceled.Error()) || errors.Is(ms[1].err, context.Canceled) {
		t.Errorf("b returned %v; want its own error told, not returned", ms[1].err)
	}
	if got := committedIDs(t, db); len(got) != 0 {
		t.Errorf("committed %v, want nothing", got)
	}
	writeAfter(t, db)
}

// A transaction that does not join groups (an unsynced one: a claim, a
// hand-out) waiting first in line ends the group before it: it runs on the
// writer with nothing of the group's left uncommitted.
func TestGroupCommitEndsBeforeAnUnsyncedTransaction(t *testing.T) {
	db := groupDB(t, time.Hour)
	ctx := t.Context()
	proceed := make(chan struct{})
	first := make(chan error, 1)
	go func() {
		first <- db.WithTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
			if _, err := tx.ExecContext(ctx, `INSERT INTO ids (id) VALUES ('a')`); err != nil {
				return err
			}
			<-proceed
			return nil
		})
	}()
	queuedOrHolding(t, &db.queue)
	unsynced := make(chan []string, 1)
	go func() {
		var seen []string
		err := db.withUnsyncedTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
			// Read on the writer: only what has committed is there, since
			// the transaction is its own.
			rows, err := tx.QueryContext(ctx, `SELECT id FROM ids`)
			if err != nil {
				return err
			}
			defer rows.Close()
			for rows.Next() {
				var id string
				rows.Scan(&id)
				seen = append(seen, id)
			}
			_, err = tx.ExecContext(ctx, `INSERT INTO ids (id) VALUES ('u')`)
			return err
		})
		if err != nil {
			seen = append(seen, fmt.Sprint("error: ", err))
		}
		unsynced <- seen
	}()
	queued(t, &db.queue, 1)
	close(proceed)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if seen := <-unsynced; !slices.Equal(seen, []string{"a"}) {
		t.Errorf("the unsynced transaction saw %v, want [a], committed before it", seen)
	}
	if got := committedIDs(t, db); !slices.Equal(got, []string{"a", "u"}) {
		t.Errorf("committed %v", got)
	}
}

// A claim (withClaimTx) that reaches the writer while a group is open joins
// it, and commits with it, where another unsynced transaction would end
// the group first; one that finds no group open runs alone, unsynced.
func TestGroupCommitTakesInAClaim(t *testing.T) {
	db := groupDB(t, time.Hour)
	ctx := t.Context()
	proceed := make(chan struct{})
	type result struct {
		group *txGroup
		err   error
	}
	first := make(chan result, 1)
	go func() {
		var r result
		r.err = db.WithTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
			r.group = db.carried(ctx).group
			if _, err := tx.ExecContext(ctx, `INSERT INTO ids (id) VALUES ('a')`); err != nil {
				return err
			}
			<-proceed
			return nil
		})
		first <- r
	}()
	queuedOrHolding(t, &db.queue)
	claim := func(id string) <-chan result {
		out := make(chan result, 1)
		go func() {
			var r result
			r.err = db.withClaimTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
				r.group = db.carried(ctx).group
				_, err := tx.ExecContext(ctx, `INSERT INTO ids (id) VALUES (?)`, id)
				return err
			})
			out <- r
		}()
		return out
	}
	joined := claim("c")
	queued(t, &db.queue, 1)
	close(proceed)
	a, c := <-first, <-joined
	if a.err != nil || c.err != nil {
		t.Fatalf("the transaction: %v; the claim: %v", a.err, c.err)
	}
	if c.group == nil || c.group != a.group || a.group.joined != 2 {
		t.Errorf("the claim ran in group %p, the transaction before it in %p: want one group of 2", c.group, a.group)
	}
	alone := <-claim("d")
	if alone.err != nil || alone.group != nil {
		t.Errorf("a claim with no group open: %v, in group %p; want alone", alone.err, alone.group)
	}
	if got := committedIDs(t, db); !slices.Equal(got, []string{"a", "c", "d"}) {
		t.Errorf("committed %v", got)
	}
}

// claimHook is what idemtest_claim_started signals and waits for, set
// by each run of TestGroupCommitCancelledClaim.
type claimHook struct{ started, proceed chan struct{} }

var (
	registerClaimStarted sync.Once
	currentClaimHook     atomic.Pointer[claimHook]
)

// A claim whose request is cancelled while its statement runs in a group
// fails alone: its statement is not interrupted (which would make SQLite
// roll back the whole group), its part is rolled back once the statement
// is done, and it returns its context's error; the member before it, and
// the group, commit. A trigger on the claim's INSERT makes the statement
// last: it waits until the claim's context is cancelled, then calls, for
// each of 2,000 rows, a function that yields the processor, so that the
// driver's goroutine watching the context runs, and interrupts the
// statement, if the claim's statement has the claim's context.
func TestGroupCommitCancelledClaim(t *testing.T) {
	registerClaimStarted.Do(func() {
		sqlite.MustRegisterScalarFunction("idemtest_claim_started", 0, func(*sqlite.FunctionContext, []driver.Value) (driver.Value, error) {
			h := currentClaimHook.Load()
			h.started <- struct{}{}
			<-h.proceed
			return int64(1), nil
		})
		sqlite.MustRegisterScalarFunction("idemtest_yield", 1, func(_ *sqlite.FunctionContext, args []driver.Value) (driver.Value, error) {
			runtime.Gosched()
			return args[0], nil
		})
	})
	hook := &claimHook{started: make(chan struct{}, 1), proceed: make(chan struct{})}
	currentClaimHook.Store(hook)
	db := groupDB(t, time.Hour)
	ctx := t.Context()
	store, err := NewStore(ctx, db, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = db.Writer().ExecContext(ctx, `CREATE TABLE filler (x INTEGER);
		INSERT INTO filler WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n LIMIT 2000) SELECT x FROM n;
		CREATE TRIGGER slow_claim AFTER INSERT ON idem_keys WHEN NEW.key = 'slow' BEGIN
			SELECT idemtest_claim_started();
			SELECT sum(idemtest_yield(x)) FROM filler;
		END;`)
	if err != nil {
		t.Fatal(err)
	}
	claimCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		<-hook.started
		cancel()
		close(hook.proceed)
	}()
	claimed := make(chan error, 1)
	ms := []*member{{id: "a", then: func(context.Context, *sql.Tx) error {
		go func() {
			_, err := store.Claim(claimCtx, idem.ClaimRequest{Key: "slow", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour, Unseen: true})
			claimed <- err
		}()
		queued(t, &db.queue, 1)
		return nil
	}}}
	runGroup(t, db, ms)
	err = <-claimed
	if ms[0].err != nil {
		t.Errorf("the member before the cancelled claim: %v; want it committed", ms[0].err)
	}
	if !errors.Is(err, context.Canceled) {
		t.Errorf("the cancelled claim: %v; want its context's error", err)
	}
	if got := committedIDs(t, db); !slices.Equal(got, []string{"a"}) {
		t.Errorf("committed %v, want [a]", got)
	}
	if _, err := store.Get(ctx, "", "slow"); !errors.Is(err, idem.ErrNotFound) {
		t.Errorf("Get of the cancelled claim's key = %v; want ErrNotFound (its part rolled back)", err)
	}
}
