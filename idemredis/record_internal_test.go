package idemredis

import (
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// inFlight builds an in-flight record as the claim script writes it.
func inFlight(token, created, leased, lease, ttl int64, fp string) string {
	return fmt.Sprintf("i-%d %d %d %d %d %d %s", token, created, leased, lease, ttl, len(fp), fp)
}

// completed builds a completed record as the complete script writes it
// from an in-flight one.
func completed(inFlight string, at int64, resp idem.Response) string {
	return "c" + inFlight[1:] + fmt.Sprint(" ", at) + string(appendCompletion(nil, &resp))
}

func TestRecordRoundTrip(t *testing.T) {
	t.Parallel()
	const (
		created = int64(1_893_456_000_000_000) // 2030
		lease   = int64(10_000_000)
		ttl     = int64(3_600_000_000)
	)
	at := func(us int64) time.Time { return time.UnixMicro(us).UTC() }
	base := idem.Record{
		Scope:          "s",
		Key:            "k",
		Fingerprint:    "v1:abc",
		State:          idem.StateInFlight,
		Token:          42,
		CreatedAt:      at(created),
		LeaseExpiresAt: at(created + 5 + lease),
		ExpiresAt:      at(created + ttl),
	}
	withResponse := func(fp idem.Fingerprint, resp idem.Response) idem.Record {
		r := base
		r.Fingerprint = fp
		r.State = idem.StateCompleted
		r.CompletedAt = at(created + 7)
		r.Response = &resp
		return r
	}
	cases := []struct {
		name  string
		value string
		want  idem.Record
	}{
		{"in flight", inFlight(42, created, created+5, lease, ttl, "v1:abc"), base},
		{
			"fingerprint with spaces and digits",
			inFlight(42, created, created+5, lease, ttl, "1 2 c3 "),
			func() idem.Record { r := base; r.Fingerprint = "1 2 c3 "; return r }(),
		},
		{
			"before 1970",
			inFlight(1, -2_000_000, -1_000_000, lease, ttl, "fp"),
			idem.Record{Scope: "s", Key: "k", Fingerprint: "fp", State: idem.StateInFlight, Token: 1,
				CreatedAt: at(-2_000_000), LeaseExpiresAt: at(-1_000_000 + lease), ExpiresAt: at(-2_000_000 + ttl)},
		},
		{
			"completed, every kind of header",
			completed(inFlight(42, created, created+5, lease, ttl, "v1:abc"), created+7, idem.Response{
				Status: 201,
				Header: http.Header{
					"Content-Type": {"application/json"},
					"X-Multi":      {"a", "b"},
					"X-Empty":      {""},
					"X-None":       {},
					"X-Odd:1":      {"12:x", "\x00\xff"},
				},
				Body: []byte("{\"id\":1}\x00\xff\xfe"),
			}),
			withResponse("v1:abc", idem.Response{
				Status: 201,
				Header: http.Header{
					"Content-Type": {"application/json"},
					"X-Multi":      {"a", "b"},
					"X-Empty":      {""},
					"X-None":       {},
					"X-Odd:1":      {"12:x", "\x00\xff"},
				},
				Body: []byte("{\"id\":1}\x00\xff\xfe"),
			}),
		},
		{
			"completed, no header, no body",
			completed(inFlight(42, created, created+5, lease, ttl, "v1:abc"), created+7, idem.Response{Status: 204}),
			withResponse("v1:abc", idem.Response{Status: 204, Body: []byte{}}),
		},
		{
			"completed, body omitted, negative status",
			completed(inFlight(42, created, created+5, lease, ttl, "fp fp"), created+7, idem.Response{Status: -1, BodyOmitted: true}),
			withResponse("fp fp", idem.Response{Status: -1, BodyOmitted: true, Body: []byte{}}),
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := parseRecord("s", "k", tc.value)
			if err != nil {
				t.Fatalf("parseRecord(%q): %v", tc.value, err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("parseRecord(%q)\n got  %+v %+v\n want %+v %+v", tc.value, got, got.Response, tc.want, tc.want.Response)
			}
		})
	}
}

func TestParseRecordRefuses(t *testing.T) {
	t.Parallel()
	good := inFlight(42, 100, 100, 10, 20, "fp")
	done := completed(good, 150, idem.Response{Status: 200, Header: http.Header{"A": {"b"}}, Body: []byte("x")})
	for _, v := range []string{
		"",
		"x",
		"hello world",
		"i42 100 100 10 20 2 fp",        // no waiter flag
		"ix42 100 100 10 20 2 fp",       // unknown waiter flag
		"i-42 100 100 10 20",            // no fingerprint length
		"i-42 100 100 10 20 5 fp",       // fingerprint shorter than its length
		"i-42 100 100 ten 20 2 fp",      // not a number
		"iw42 100 100 10 20 2 fp extra", // trailing bytes after an in-flight record
		good + " ",                      // trailing bytes after an in-flight record
		"c" + good[1:],                  // completed without a response
		"c" + good[1:] + " 150 200 0 99 1:A1:1:b",  // header longer than the rest
		strings.Replace(done, "1:A1:", "1:A9:", 1), // more header values than there are
	} {
		if rec, err := parseRecord("s", "k", v); !errors.Is(err, errNotRecord) {
			t.Errorf("parseRecord(%q) = %+v, %v; want an error matching errNotRecord", v, rec, err)
		}
	}
}

// Purge reads only the start of each record: the header parses from it
// whatever the fingerprint and the response hold.
func TestParseHeaderFromPrefix(t *testing.T) {
	t.Parallel()
	const maxInt = int64(1<<63 - 1)
	long := inFlight(maxInt, -maxInt, -maxInt, maxInt, maxInt, strings.Repeat("f", 10_000))
	v := completed(long, maxInt, idem.Response{Status: 200, Body: make([]byte, 1<<16)})
	h, err := parseHeader(v[:headerReadLen], false)
	if err != nil {
		t.Fatalf("parseHeader of the first %d bytes: %v", headerReadLen, err)
	}
	want := recordHeader{state: 'c', token: maxInt, created: -maxInt, leased: -maxInt, lease: maxInt, ttl: maxInt}
	want.fpStart = strings.Index(v, " f") + 1
	want.fpEnd = want.fpStart + 10_000
	if h != want {
		t.Errorf("parseHeader = %+v, want %+v", h, want)
	}
}

func TestLiveAt(t *testing.T) {
	t.Parallel()
	// Created at 100 with a TTL of 50 (dead from 150), leased at 120 for 40
	// (lease ends at 160).
	h := func(state byte) recordHeader {
		return recordHeader{state: state, created: 100, ttl: 50, leased: 120, lease: 40}
	}
	cases := []struct {
		state byte
		now   int64
		want  bool
	}{
		{stateInFlight, 149, true},
		{stateInFlight, 150, true}, // TTL over, lease live
		{stateInFlight, 159, true},
		{stateInFlight, 160, false},
		{stateCompleted, 149, true},
		{stateCompleted, 150, false}, // a completed record has no lease
	}
	for _, tc := range cases {
		hh := h(tc.state)
		if got := hh.liveAt(tc.now); got != tc.want {
			t.Errorf("state %c at %d: liveAt = %v, want %v", tc.state, tc.now, got, tc.want)
		}
	}
}

func TestClaimResult(t *testing.T) {
	t.Parallel()
	req := idem.ClaimRequest{Scope: "s", Key: "k", Fingerprint: "fp", Lease: 10 * time.Microsecond, TTL: 20 * time.Microsecond}
	mine := inFlight(7, 100, 100, 10, 20, "fp")
	other := inFlight(7, 100, 100, 10, 20, "other")
	cases := []struct {
		reply    string
		outcome  idem.Outcome
		token    idem.Token
		tookOver bool
	}{
		{"a7 100", idem.Acquired, 7, false},
		{"c" + "w" + completed(mine, 105, idem.Response{Status: 200})[2:], idem.Completed, 0, false},
		{"t" + inFlight(8, 100, 130, 10, 20, "fp"), idem.Acquired, 8, true},
		{mine, idem.InFlight, 0, false},
		{other, idem.Mismatch, 0, false},
		{completed(mine, 105, idem.Response{Status: 200}), idem.Completed, 0, false},
		{completed(other, 105, idem.Response{Status: 200}), idem.Mismatch, 0, false},
	}
	for _, tc := range cases {
		c, err := claimResult(req, 10, 20, tc.reply)
		if err != nil {
			t.Errorf("claimResult(%q): %v", tc.reply, err)
			continue
		}
		if c.Outcome != tc.outcome || c.Token != tc.token || c.TookOver != tc.tookOver {
			t.Errorf("claimResult(%q) = %v, token %d, took over %v; want %v, %d, %v",
				tc.reply, c.Outcome, c.Token, c.TookOver, tc.outcome, tc.token, tc.tookOver)
		}
	}
	c, _ := claimResult(req, 10, 20, "a7 100")
	want := idem.Record{Scope: "s", Key: "k", Fingerprint: "fp", State: idem.StateInFlight, Token: 7,
		CreatedAt: time.UnixMicro(100).UTC(), LeaseExpiresAt: time.UnixMicro(110).UTC(), ExpiresAt: time.UnixMicro(120).UTC()}
	if !reflect.DeepEqual(c.Record, want) {
		t.Errorf("acquired record = %+v, want %+v", c.Record, want)
	}
	for _, bad := range []string{"", "a", "a7", "a7 x", "zzz"} {
		if c, err := claimResult(req, 10, 20, bad); err == nil {
			t.Errorf("claimResult(%q) = %+v, want an error", bad, c)
		}
	}
}
