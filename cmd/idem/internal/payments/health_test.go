package payments

import (
	"context"
	"database/sql"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemsqlite"
	"github.com/idem-go/idem/idemtest"
)

// lockedSQLite opens a service on a SQLite file and a second connection
// to the same file that can take its write lock, as another process (or a
// stalled disk) would hold the service's writes up.
func lockedSQLite(t *testing.T, cfg Config) (*Service, func() (release func())) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "stall.db")
	db, err := idemsqlite.Open(path, &idemsqlite.Config{BusyTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	cfg.DB = db
	if cfg.APIKeys == nil {
		cfg.APIKeys = map[string]string{"k": "acme"}
	}
	svc, err := New(t.Context(), &cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Close() })
	other, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(30000)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Close() })
	lock := func() func() {
		t.Helper()
		conn, err := other.Conn(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.ExecContext(context.Background(), "BEGIN IMMEDIATE"); err != nil {
			t.Fatal(err)
		}
		return func() {
			conn.ExecContext(context.Background(), "ROLLBACK")
			conn.Close()
		}
	}
	return svc, lock
}

func serveJSON(h http.Handler, method, path, key, body string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, path, strings.NewReader(body))
	r.Header.Set("Authorization", "Bearer k")
	r.Header.Set("Content-Type", "application/json")
	if key != "" {
		r.Header.Set("Idempotency-Key", key)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// /healthz reads, /readyz commits a write: with the database's write lock
// held elsewhere, /readyz answers 503 within its timeout while /healthz
// stays 200, and a check made while the stuck write still waits answers
// from it instead of queuing another; once the lock is released, /readyz
// is 200 again.
func TestReadyzCommitsAWrite(t *testing.T) {
	t.Parallel()
	svc, lock := lockedSQLite(t, Config{ProbeTimeout: 200 * time.Millisecond})
	h := svc.Handler()
	// A healthy database is ready. On a busy machine (a -race build
	// beside other work) a commit may take longer than the 200 ms
	// timeout, and that check answers 503; a check made while the write
	// still runs waits for that same write, so a later one answers 200
	// once it commits.
	idemtest.Eventually(t, 30*time.Second, "/readyz 200 on a healthy database", func() bool {
		return serveJSON(h, "GET", "/readyz", "", "").Code == http.StatusOK
	})
	var written int64
	if err := svc.store.(*sqliteStorage).db.Reader().QueryRowContext(t.Context(), `SELECT written_at FROM health_probe`).Scan(&written); err != nil || written == 0 {
		t.Fatalf("the probe's row: %d, %v", written, err)
	}

	release := lock()
	start := time.Now()
	w := serveJSON(h, "GET", "/readyz", "", "")
	if took := time.Since(start); w.Code != http.StatusServiceUnavailable || took > 5*time.Second {
		t.Fatalf("/readyz with the write lock held elsewhere: %d after %v (%s), want 503 within the probe timeout", w.Code, took, w.Body)
	}
	if ct := w.Header().Get("Content-Type"); ct != idemhttp.ProblemContentType {
		t.Errorf("/readyz 503 has Content-Type %q", ct)
	}
	if w := serveJSON(h, "GET", "/healthz", "", ""); w.Code != http.StatusOK {
		t.Errorf("/healthz with the write lock held elsewhere: %d %s, want 200 (it only reads)", w.Code, w.Body)
	}
	if w := serveJSON(h, "GET", "/readyz", "", ""); w.Code != http.StatusServiceUnavailable {
		t.Errorf("/readyz again while the first write waits: %d", w.Code)
	}
	release()
	idemtest.Eventually(t, 30*time.Second, "/readyz 200 once the lock is released", func() bool {
		return serveJSON(h, "GET", "/readyz", "", "").Code == http.StatusOK
	})

}

// A request the database holds up is answered 503 (problem+json,
// Retry-After) in bounded time, having charged nothing; once the database
// answers, the retry with the same key charges once.
func TestStalledDatabaseAnswersInBoundedTime(t *testing.T) {
	t.Parallel()
	svc, lock := lockedSQLite(t, Config{RequestTimeout: 300 * time.Millisecond, InflightWait: 100 * time.Millisecond})
	h := svc.Handler()
	acct := serveJSON(h, "POST", "/v1/accounts", "", `{"balance":100,"currency":"KRW"}`)
	if acct.Code != http.StatusCreated {
		t.Fatalf("account: %d %s", acct.Code, acct.Body)
	}
	id := strings.TrimPrefix(acct.Header().Get("Location"), "/v1/accounts/")
	pay := `{"account_id":"` + id + `","amount":30,"currency":"KRW"}`

	release := lock()
	start := time.Now()
	w := serveJSON(h, "POST", "/v1/payments", "p-1", pay)
	took := time.Since(start)
	if w.Code != http.StatusServiceUnavailable || took > 5*time.Second {
		t.Fatalf("a payment with the database stalled: %d after %v (%s), want 503 within the request timeout", w.Code, took, w.Body)
	}
	if ct, ra := w.Header().Get("Content-Type"), w.Header().Get("Retry-After"); ct != idemhttp.ProblemContentType || ra == "" {
		t.Errorf("the timeout's answer has Content-Type %q, Retry-After %q", ct, ra)
	}
	var p struct{ Type, Detail string }
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil || p.Type != ProblemTypePrefix+"request-timeout" {
		t.Errorf("the timeout's body %s: %v", w.Body, err)
	}
	release()

	// The stalled request may still hold its key for a moment.
	var retry *httptest.ResponseRecorder
	idemtest.Eventually(t, 30*time.Second, "the retry after the stall answered 201", func() bool {
		retry = serveJSON(h, "POST", "/v1/payments", "p-1", pay)
		return retry.Code == http.StatusCreated
	})
	if retry.Code != http.StatusCreated {
		t.Fatalf("the retry after the stall: %d %s", retry.Code, retry.Body)
	}
	var a struct{ Balance int64 }
	got := serveJSON(h, "GET", "/v1/accounts/"+id, "", "")
	if err := json.Unmarshal(got.Body.Bytes(), &a); err != nil || a.Balance != 70 {
		t.Errorf("balance after the stall and the retry: %s (%v), want 70: charged once", got.Body, err)
	}
}

// The readiness write on SQLite takes its turn in idemsqlite's writer
// queue, as every write of the store does: it waits in line behind the
// transaction that holds the writer rather than race the queue for the
// writer's connection in database/sql's pool, which hands it to a waiter
// chosen at random.
func TestSQLiteProbeQueuesForTheWriter(t *testing.T) {
	t.Parallel()
	db, err := idemsqlite.Open(filepath.Join(t.TempDir(), "probe.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := db.WithTx(t.Context(), func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `CREATE TABLE health_probe (id INTEGER PRIMARY KEY, written_at INTEGER NOT NULL)`)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	s := &sqliteStorage{db: db}
	held, release := make(chan struct{}), make(chan struct{})
	holder := make(chan error, 1)
	go func() {
		holder <- db.WithTx(context.Background(), func(context.Context, *sql.Tx) error {
			close(held)
			<-release
			return nil
		})
	}()
	<-held
	probed := make(chan error, 1)
	go func() { probed <- s.Probe(context.Background()) }()
	func() {
		defer close(release)
		idemtest.Eventually(t, 5*time.Second, "the probe waiting in the writer queue", func() bool {
			return db.WriterState().Waiting == 1
		})
	}()
	if err := <-holder; err != nil {
		t.Fatalf("the transaction holding the writer: %v", err)
	}
	if err := <-probed; err != nil {
		t.Fatalf("Probe = %v", err)
	}
	var written int64
	if err := db.Reader().QueryRowContext(t.Context(), `SELECT written_at FROM health_probe WHERE id = 1`).Scan(&written); err != nil || written == 0 {
		t.Fatalf("the probe's row: %d, %v", written, err)
	}
}
