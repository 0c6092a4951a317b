package main

import (
	"bytes"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

func TestWriteRecord(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	completed := idem.Record{
		Scope: "acme", Key: "pay-1", Fingerprint: "v1:abc", State: idem.StateCompleted, Token: 7,
		CreatedAt: now.Add(-time.Hour), CompletedAt: now.Add(-time.Hour + time.Second), ExpiresAt: now.Add(23 * time.Hour),
		Response: &idem.Response{
			Status: 201,
			Header: http.Header{"Content-Type": {"application/json"}, "Location": {"/v1/payments/p1"}},
			Body:   []byte(`{"id":"p1","amount":12000}`),
		},
	}
	inFlight := idem.Record{
		Scope: "acme", Key: "pay-2", Fingerprint: "v1:def", State: idem.StateInFlight, Token: 1,
		CreatedAt: now, LeaseExpiresAt: now.Add(time.Minute), ExpiresAt: now.Add(24 * time.Hour),
	}
	omitted := completed
	omitted.Response = &idem.Response{Status: 200, BodyOmitted: true}
	binary := completed
	binary.Response = &idem.Response{Status: 200, Body: []byte{0, 1, 2, 0xff}}
	text := completed
	text.Response = &idem.Response{Status: 402, Body: []byte("no money\nat all\n")}

	for _, tc := range []struct {
		name    string
		rec     idem.Record
		want    []string
		notWant []string
	}{
		{"completed JSON", completed, []string{
			"scope        acme\n", "key          pay-1\n", "state        completed\n", "fingerprint  v1:abc\n",
			"token        7\n", "created      2030-01-02T02:04:05Z (1h0m0s ago)\n",
			"completed    2030-01-02T02:04:06Z (59m59s ago)\n", "expires      2030-01-03T02:04:05Z (in 23h0m0s)\n",
			"status       201 Created\n", "header       Content-Type: application/json\n",
			"header       Location: /v1/payments/p1\n",
			"body:\n  {\n    \"id\": \"p1\",\n    \"amount\": 12000\n  }\n",
		}, []string{"lease ends"}},
		{"in flight", inFlight, []string{"state        in_flight\n", "lease ends   2030-01-02T03:05:05Z (in 1m0s)\n",
			"no stored answer yet"}, []string{"body:", "status"}},
		{"body omitted", omitted, []string{"(not kept: larger than the store keeps, or the server keeps no bodies)"}, nil},
		{"binary body", binary, []string{"(4 bytes of binary data)"}, nil},
		{"text body", text, []string{"402 Payment Required", "body:\n  no money\n  at all\n"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var b bytes.Buffer
			if err := writeRecord(&b, tc.rec, now); err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.want {
				if !strings.Contains(b.String(), w) {
					t.Errorf("output lacks %q:\n%s", w, b.String())
				}
			}
			for _, w := range tc.notWant {
				if strings.Contains(b.String(), w) {
					t.Errorf("output has %q:\n%s", w, b.String())
				}
			}
		})
	}
}
