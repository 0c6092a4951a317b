package idempg_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idempg"
)

// With a key secret and body keys, the key's row holds neither the
// client's key nor a recovery point's data in clear, and the retry reads
// the point back as it was saved.
func TestRecoveryPointSealedAtRest(t *testing.T) {
	t.Parallel()
	db := openDB(t, pgURL(t), idempg.Config{})
	const clientKey, secretData = "client-key-7f3e9a", "charge card 4242 for the sealed point"
	m, err := idemhttp.New(&idemhttp.Config{Store: newStore(t, db), SharedScope: true, SeparateTx: true,
		KeySecret:    []byte("a key secret of 32 bytes, random"),
		BodyKeys:     []idemhttp.BodyKey{{ID: "k1", Key: []byte("0123456789abcdef0123456789abcdef")}},
		InflightWait: -1})
	if err != nil {
		t.Fatal(err)
	}
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
	var rows int
	err = db.WithTx(context.Background(), func(ctx context.Context, tx pgx.Tx) error {
		// The whole row as text, as a dump would show it.
		r, err := tx.Query(ctx, `SELECT k::text, recovery_point, recovery_data FROM idem_keys k`)
		if err != nil {
			return err
		}
		defer r.Close()
		for r.Next() {
			var row, name string
			var data []byte
			if err := r.Scan(&row, &name, &data); err != nil {
				return err
			}
			rows++
			if strings.Contains(row, clientKey) || name != "charging" || len(data) == 0 || bytes.Contains(data, []byte("4242")) ||
				strings.Contains(row, "4242") || strings.Contains(row, `\x`+"34323432") {
				t.Errorf("the store keeps %s (point %q, data %q)", row, name, data)
			}
		}
		return r.Err()
	})
	if err != nil || rows != 1 {
		t.Fatalf("%d rows, %v; want one", rows, err)
	}
	if rec := do(); rec.Code != http.StatusCreated || rec.Body.String() != "charged" {
		t.Fatalf("the retry: %d %s", rec.Code, rec.Body)
	}
}
