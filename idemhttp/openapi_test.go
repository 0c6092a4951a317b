package idemhttp_test

import (
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemmem"
)

// TestKeyPatternAgreesWithParseKey: the syntax the document publishes is
// the one the middleware enforces.
func TestKeyPatternAgreesWithParseKey(t *testing.T) {
	t.Parallel()
	re := regexp.MustCompile(idemhttp.KeyPattern)
	long := strings.Repeat("k", idem.MaxKeyLen)
	for _, v := range []string{
		"a", "8e03978e-40d5-43e8-bc93-6894a57f9324", long, long + "k", "", " ", "a b", "a\tb", "é",
		`a"b`, `"a"`, `""`, `"`, `"a`, `"a b"`, `"a\"b"`, `"a\\b"`, `"a\b"`, `"a\"`, `"a"b`, `"a";p=1`,
		`"` + long + `"`, `"` + long + `k"`, `"` + strings.Repeat(`\"`, idem.MaxKeyLen) + `"`,
		`"` + strings.Repeat(`\\`, idem.MaxKeyLen+1) + `"`, "\x7f", "~!#$%&'()*+,-./:;<=>?@[]^_`{|}",
	} {
		_, err := idem.ParseKey(v)
		if got, want := re.MatchString(v), err == nil; got != want {
			t.Errorf("KeyPattern matches %q: %v; ParseKey accepts it: %v (%v)", v, got, want, err)
		}
	}
}

func TestPolicyDescribesTheMiddleware(t *testing.T) {
	t.Parallel()
	m, err := idemhttp.New(&idemhttp.Config{SharedScope: true,
		Store:         idemmem.NewStore(nil),
		TTL:           2 * time.Hour,
		Lease:         30 * time.Second,
		MaxBodyBytes:  64,
		ReplayHeaders: []string{"x-request-id"},
		Methods:       []string{"put", "POST"},
	})
	if err != nil {
		t.Fatal(err)
	}
	p := m.Policy()
	if !p.KeyRequired || p.Expiry != 2*time.Hour || p.Lease != 30*time.Second || p.InflightWait != idemhttp.DefaultInflightWait || p.MaxBodyBytes != 64 {
		t.Errorf("Policy() = %+v", p)
	}
	if !slices.Equal(p.Methods, []string{"POST", "PUT"}) {
		t.Errorf("Methods = %v, want [POST PUT]", p.Methods)
	}
	if !slices.Contains(p.ReplayedHeaders, "X-Request-Id") || !slices.Contains(p.ReplayedHeaders, "Location") {
		t.Errorf("ReplayedHeaders = %v", p.ReplayedHeaders)
	}
	// The key's description says how long it is remembered, in seconds.
	if desc, _ := p.OpenAPI().Parameter["description"].(string); !strings.Contains(desc, "Remembered for 7200 seconds from its first use.") {
		t.Errorf("the key's description: %q; want it remembered for 7200 seconds", desc)
	}
	statuses := map[int]idemhttp.PolicyAnswer{}
	for _, a := range p.Answers {
		statuses[a.Status] = a
	}
	for _, s := range []int{400, 409, 413, 422, 503} {
		if _, ok := statuses[s]; !ok {
			t.Errorf("no %d answer in %+v", s, p.Answers)
		}
	}
	if !statuses[409].RetryAfter || !statuses[503].RetryAfter {
		t.Errorf("409 and 503 must say Retry-After: %+v", p.Answers)
	}

	// The scope's refusal is among the answers of a middleware with a
	// Scope, and of no other.
	scoped, err := idemhttp.New(&idemhttp.Config{Store: idemmem.NewStore(nil), Scope: func(r *http.Request) (idem.Scope, error) { return idem.Scope(r.Header.Get("X-Tenant")), nil }})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		p    idemhttp.Policy
		want bool
	}{{"with SharedScope", p, false}, {"with a Scope", scoped.Policy(), true}} {
		says := false
		for _, a := range c.p.Answers {
			for _, pr := range a.Problems {
				says = says || pr.Type == idemhttp.ProblemScope
			}
		}
		if says != c.want {
			t.Errorf("the policy of a middleware %s says it answers %s: %t; want %t", c.name, idemhttp.ProblemScope, says, c.want)
		}
	}

	opt, err := idemhttp.New(&idemhttp.Config{SharedScope: true, Store: idemmem.NewStore(nil), Optional: true})
	if err != nil {
		t.Fatal(err)
	}
	op := opt.Policy()
	if op.KeyRequired {
		t.Error("an Optional middleware's policy requires the key")
	}
	for _, a := range op.Answers {
		for _, pr := range a.Problems {
			if pr.Type == idemhttp.ProblemKeyMissing {
				t.Errorf("an Optional middleware's policy says it answers %s", pr.Type)
			}
		}
	}
	frag := op.OpenAPI()
	if frag.Parameter["required"] != false || frag.Extension["expiry"] != idemhttp.DefaultTTL.Seconds() {
		t.Errorf("fragment of the optional policy: %v, %v", frag.Parameter, frag.Extension)
	}
}
