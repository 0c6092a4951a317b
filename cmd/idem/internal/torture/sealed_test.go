package torture

import (
	"bytes"
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"

	"github.com/idem-go/idem/cmd/idem/internal/payments"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemsqlite"
)

// With IDEM_BODY_KEYS in the replicas' environment the payments'
// descriptions, which name their logical payments, are sealed in their
// rows: the run reads them through the service's own unsealing
// (Config.BodyKeys), not as the sealed bytes.
func TestReadDBOpensSealedDescriptions(t *testing.T) {
	t.Parallel()
	key, _ := base64.StdEncoding.DecodeString("MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=")
	bodyKeys := []idemhttp.BodyKey{{ID: "k1", Key: key}}
	path := filepath.Join(t.TempDir(), "idem.db")
	db, err := idemsqlite.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	svc, err := payments.New(t.Context(), &payments.Config{DB: db, APIKeys: map[string]string{"api-key": tenant}, BodyKeys: bodyKeys})
	if err != nil {
		t.Fatal(err)
	}
	post := func(path, key, body string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, path, bytes.NewBufferString(body))
		r.Header.Set("Authorization", "Bearer api-key")
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set(idemhttp.HeaderKey, key)
		w := httptest.NewRecorder()
		svc.Handler().ServeHTTP(w, r)
		if w.Code != http.StatusCreated {
			t.Fatalf("POST %s: %d %s", path, w.Code, w.Body)
		}
		return w
	}
	acct := post("/v1/accounts", "a", `{"balance":1000,"currency":"EUR"}`)
	id := bytes.Split(bytes.Split(acct.Body.Bytes(), []byte(`"id":"`))[1], []byte(`"`))[0]
	post("/v1/payments", "lp-0001", `{"account_id":"`+string(id)+`","amount":10,"currency":"EUR","description":"lp-0001"}`)
	svc.Close()
	db.Close()

	for _, c := range []struct {
		name string
		keys []idemhttp.BodyKey
		want string
	}{{"with the body keys", bodyKeys, "lp-0001"}} {
		r := &run{cfg: Config{BodyKeys: c.keys}, sqlite: path}
		rows, _, err := r.readDB(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if len(rows) != 1 || rows[0].description != c.want {
			t.Fatalf("%s: rows %+v; want one payment described %q", c.name, rows, c.want)
		}
	}
	// Without them the run refuses to guess: it says it needs the keys.
	if _, _, err := (&run{sqlite: path}).readDB(t.Context()); err == nil {
		t.Fatal("reading sealed descriptions without the body keys: no error")
	}
}
