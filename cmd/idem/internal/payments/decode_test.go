package payments

import (
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/idem-go/idem/idemsqlite"
)

// failingBody fails every read the way a client's connection that timed
// out does: with a *net.OpError naming both ends of the socket.
type failingBody struct{}

func (failingBody) Read([]byte) (int, error) {
	return 0, &net.OpError{Op: "read", Net: "tcp",
		Source: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 8080},
		Addr:   &net.TCPAddr{IP: net.IPv4(10, 9, 8, 7), Port: 54321},
		Err:    timeoutError{}}
}

type timeoutError struct{}

func (timeoutError) Error() string   { return "i/o timeout" }
func (timeoutError) Timeout() bool   { return true }
func (timeoutError) Temporary() bool { return true }

// A body that cannot be read is refused with a fixed sentence: the read
// error names the server's socket address, which is no business of the
// client's. Paths where the service itself reads the body: every write in
// unsafe mode, and account creation without a key.
func TestUnreadableBodyAnswerCarriesNoInternals(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name   string
		unsafe bool
		path   string
	}{
		{"unsafe payment", true, "/v1/payments"},
		{"unsafe deposit", true, "/v1/accounts/acct_x/deposits"},
		{"account without a key", false, "/v1/accounts"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			db, err := idemsqlite.Open(filepath.Join(t.TempDir(), "read.db"), nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.Close() })
			svc, err := New(t.Context(), &Config{DB: db, APIKeys: map[string]string{"k": "acme"}, Unsafe: tt.unsafe, RequestsOnly: true})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { svc.Close() })
			r := httptest.NewRequest(http.MethodPost, tt.path, failingBody{})
			r.Header.Set("Authorization", "Bearer k")
			r.Header.Set("Content-Type", "application/json")
			w := httptest.NewRecorder()
			svc.Handler().ServeHTTP(w, r)
			var p struct{ Type, Detail string }
			if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil || w.Code != http.StatusBadRequest {
				t.Fatalf("answer %d %s; want a 400 problem", w.Code, w.Body)
			}
			if p.Type != ProblemTypePrefix+"invalid-request" || p.Detail != "the request body could not be read" {
				t.Errorf("problem %+v; want invalid-request, detail %q", p, "the request body could not be read")
			}
			for _, leak := range []string{"127.0.0.1", "10.9.8.7", "8080", "tcp", "timeout"} {
				if strings.Contains(w.Body.String(), leak) {
					t.Errorf("the answer carries %q: %s", leak, w.Body)
				}
			}
		})
	}
}

// checkMembers refuses names that are not the target's, case for case,
// and names repeated in any object at any depth; what a struct field
// decodes itself (a map, an interface, a json.Unmarshaler) is checked for
// repeats only.
func TestCheckMembers(t *testing.T) {
	t.Parallel()
	type Inner struct {
		Code string `json:"code"`
	}
	type Embedded struct {
		Note string `json:"note"`
	}
	type target struct {
		Embedded
		Amount  int64             `json:"amount"`
		Inner   Inner             `json:"inner"`
		Ptr     *Inner            `json:"ptr"`
		List    []Inner           `json:"list"`
		Labels  map[string]string `json:"labels"`
		Any     any               `json:"any"`
		Raw     json.RawMessage   `json:"raw"`
		Untyped string
		Skipped string `json:"-"`
		hidden  string //nolint:unused // unexported fields are no JSON names
	}
	tests := []struct {
		body string
		err  string // "" for none; otherwise a part of the detail
	}{
		{`{"amount":1,"inner":{"code":"x"},"ptr":{"code":"y"},"list":[{"code":"z"}],"note":"n","Untyped":"u"}`, ""},
		{`{"labels":{"a":"1","b":"2"},"any":{"x":[{"y":1}]},"raw":{"k":1}}`, ""},
		{`null`, ""},
		{`[1,2]`, ""}, // the wrong kind is the decoder's to refuse
		{`{"AMOUNT":1}`, `field "AMOUNT" is not known: names are case-sensitive; did you mean "amount"?`},
		{`{"amount":1,"Amount":2}`, `field "Amount" repeats "amount"`},
		{`{"amount":1,"amount":2}`, `field "amount" appears more than once`},
		{`{"inner":{"code":"x","CODE":"y"}}`, `field "inner.CODE" repeats "code"`},
		{`{"inner":{"Code":"x"}}`, `field "inner.Code" is not known`},
		{`{"ptr":{"cost":1}}`, `unknown field "ptr.cost"`},
		{`{"list":[{"code":"x"},{"code":"x","code":"y"}]}`, `field "list[1].code" appears more than once`},
		{`{"labels":{"a":"1","A":"2"}}`, `field "labels.A" repeats "a"`},
		{`{"any":[{"k":1,"k":2}]}`, `field "any[0].k" appears more than once`},
		{`{"raw":{"k":1,"K":2}}`, `field "raw.K" repeats "k"`},
		{`{"untyped":"u"}`, `did you mean "Untyped"?`},
		{`{"Skipped":"s"}`, `unknown field "Skipped"`},
		{`{"hidden":"h"}`, `unknown field "hidden"`},
		{`{"NOTE":"n"}`, `did you mean "note"?`},
		{`{"Embedded":{"note":"n"}}`, `unknown field "Embedded"`},
		{`{"amount":1,"amoun\u017f":2}`, `unknown field "amounſ"`},
		{`{"an\u212Aount":1}`, "unknown field \"an\u212Aount\""}, // KELVIN SIGN folds to k, but "ankount" is no name
		{`{"` + strings.Repeat("x", 200) + `":1}`, `unknown field "` + strings.Repeat("x", 64) + `"…`},
	}
	for _, tt := range tests {
		err := checkMembers([]byte(tt.body), reflect.TypeFor[*target]())
		switch {
		case tt.err == "" && err != nil:
			t.Errorf("checkMembers(%s) = %v, want nil", tt.body, err)
		case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
			t.Errorf("checkMembers(%s) = %v, want an error with %q", tt.body, err, tt.err)
		}
		var be *bodyError
		if err != nil && !errors.As(err, &be) {
			t.Errorf("checkMembers(%s) = %T, want a *bodyError", tt.body, err)
		}
	}
}

// foldName folds two names alike exactly when encoding/json matches the
// one to a field named the other.
func TestFoldNameAgreesWithEncodingJSON(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ field, name string }{
		{"amount", "AMOUNT"},
		{"amount", "Amount"},
		{"description", "deſcription"}, // U+017F LATIN SMALL LETTER LONG S
		{"kind", "\u212Aind"},          // U+212A KELVIN SIGN
		{"straße", "STRASSE"},
		{"amount", "amounts"},
		{"ǅ", "ǆ"}, // title case and lower case of one letter
	} {
		typ := reflect.StructOf([]reflect.StructField{{Name: "V", Type: reflect.TypeFor[int](), Tag: reflect.StructTag(`json:"` + tt.field + `"`)}})
		dst := reflect.New(typ)
		if err := json.Unmarshal([]byte(`{"`+tt.name+`":1}`), dst.Interface()); err != nil {
			t.Fatal(err)
		}
		var unescaped string
		if err := json.Unmarshal([]byte(`"`+tt.name+`"`), &unescaped); err != nil {
			t.Fatal(err)
		}
		matched := dst.Elem().Field(0).Int() == 1
		if same := foldName(tt.field) == foldName(unescaped); same != matched {
			t.Errorf("foldName(%q) == foldName(%q) is %v; encoding/json matched them: %v", tt.field, unescaped, same, matched)
		}
	}
}

// An error describeJSONError does not know is answered with a fixed
// sentence, and marked for the log.
func TestDescribeJSONErrorHidesTheUnknown(t *testing.T) {
	t.Parallel()
	detail, internal := describeJSONError(errors.New("dial tcp 10.0.0.1:5432: connection refused"))
	if detail != "the body could not be decoded" || !internal {
		t.Errorf("describeJSONError(unknown) = %q, %v", detail, internal)
	}
	detail, internal = describeJSONError(&bodyError{`unknown field "tip"`})
	if detail != `unknown field "tip"` || internal {
		t.Errorf("describeJSONError(bodyError) = %q, %v", detail, internal)
	}
}
