package idemsqlite_test

import (
	"bytes"
	"context"
	"database/sql"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemsqlite"
)

// With a key secret and body keys, neither the client's key nor a
// recovery point's data is anywhere in the database's files (the file and
// its WAL), and the retry reads the point back as it was saved.
func TestRecoveryPointSealedAtRest(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	db, err := idemsqlite.Open(filepath.Join(dir, "idem.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	const clientKey, secretData = "client-key-7f3e9a", "charge card 4242 for the sealed point"
	m := mustMiddleware(t, &idemhttp.Config{Store: newStore(t, db, nil), SharedScope: true, SeparateTx: true,
		KeySecret:    []byte("a key secret of 32 bytes, random"),
		BodyKeys:     []idemhttp.BodyKey{{ID: "k1", Key: []byte("0123456789abcdef0123456789abcdef")}},
		InflightWait: -1})
	h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ex, _ := idemhttp.ExecutionFromContext(r.Context())
		if ex.Recovery.IsZero() {
			if err := idemhttp.SaveRecovery(r.Context(), "charging", []byte(secretData)); err != nil {
				t.Errorf("SaveRecovery: %v", err)
			}
			http.Error(w, "card network down", http.StatusServiceUnavailable)
			return
		}
		if string(ex.Recovery.Data) != secretData {
			t.Errorf("the retry goes on from %q, want %q", ex.Recovery.Data, secretData)
		}
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "charged")
	}))
	do := func() *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodPost, "/pay", strings.NewReader("{}"))
		req.Header.Set(idemhttp.HeaderKey, clientKey)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	if rec := do(); rec.Code != http.StatusServiceUnavailable {
		t.Fatalf("first run: %d %s", rec.Code, rec.Body)
	}
	var keys, points int
	err = db.WithTx(context.Background(), func(ctx context.Context, tx *sql.Tx) error {
		rows, err := tx.QueryContext(ctx, `SELECT key, recovery_point, recovery_data FROM idem_keys`)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var key, name string
			var data []byte
			if err := rows.Scan(&key, &name, &data); err != nil {
				return err
			}
			keys++
			if key == clientKey || name != "charging" || len(data) == 0 || bytes.Contains(data, []byte("4242")) {
				t.Errorf("the store keeps key %q, point %q, data %q", key, name, data)
			} else {
				points++
			}
		}
		return rows.Err()
	})
	if err != nil || keys != 1 || points != 1 {
		t.Fatalf("%d keys, %d sealed points, %v; want one of each", keys, points, err)
	}
	scanFiles(t, dir, clientKey, "4242")
	if rec := do(); rec.Code != http.StatusCreated || rec.Body.String() != "charged" {
		t.Fatalf("the retry: %d %s", rec.Code, rec.Body)
	}
	scanFiles(t, dir, clientKey, "4242")
}

// scanFiles fails t if any file under dir holds one of secrets.
func scanFiles(t *testing.T, dir string, secrets ...string) {
	t.Helper()
	n := 0
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		n++
		for _, s := range secrets {
			if bytes.Contains(b, []byte(s)) {
				t.Errorf("%s holds %q", filepath.Base(path), s)
			}
		}
		return nil
	})
	if err != nil || n < 2 {
		t.Fatalf("scanned %d files (want the database and its WAL): %v", n, err)
	}
}
