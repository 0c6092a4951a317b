package keywait

import (
	"fmt"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
)

func keyN(i int) Key { return Key{Scope: "s", Key: idem.Key(fmt.Sprint("k", i))} }

func TestRecentKeysForgetsTheOldest(t *testing.T) {
	r := NewRecent(3, 0, 0, idem.SystemClock{})
	for i := range 3 {
		r.Keep(keyN(i), "", nil, time.Time{})
	}
	r.Keep(keyN(1), "", nil, time.Time{}) // known already: nothing moves
	for i := range 3 {
		if !has(r, keyN(i)) {
			t.Fatalf("k%d forgotten while there was room", i)
		}
	}
	r.Keep(keyN(3), "", nil, time.Time{})
	r.Keep(keyN(4), "", nil, time.Time{})
	for i, want := range []bool{false, false, true, true, true} {
		if has(r, keyN(i)) != want {
			t.Errorf("after two more keys, has(k%d) = %v, want %v", i, !want, want)
		}
	}
	if len(r.index) != 3 || r.n != 3 {
		t.Errorf("%d remembered, %d in the ring, want 3", len(r.index), r.n)
	}
	// n <= 0 remembers nothing: 0 (the zero Config) as well as -1.
	for _, n := range []int{-1, 0} {
		var none *Recent = NewRecent(n, time.Minute, 1<<20, idem.SystemClock{})
		none.Keep(keyN(0), "fp", &idem.Response{Status: 201}, time.Now().Add(time.Hour))
		if has(none, keyN(0)) || answer(none, keyN(0), "fp") != nil {
			t.Errorf("a recentKeys of %d keys remembered a key", n)
		}
	}
}

// TestRecentAnswers: an answer is kept for keepFor, never past the
// record's expiry less keepFor, only for its own fingerprint, and within
// the byte bound, oldest dropped first.
func TestRecentAnswers(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := idemmem.NewClock(start)
	r := NewRecent(100, 10*time.Second, 64*1024, clock)
	resp := &idem.Response{Status: 201, Body: []byte(`{"id":1}`)}

	r.Keep(keyN(0), "fp", resp, start.Add(time.Hour))
	if got := answer(r, keyN(0), "fp"); !reflect.DeepEqual(got, resp) {
		t.Fatalf("answer = %v, want the kept one", got)
	}
	if got := answer(r, keyN(0), "other"); got != nil {
		t.Errorf("answer for another fingerprint = %v, want nil (the store says mismatch)", got)
	}
	clock.Advance(10 * time.Second)
	if got := answer(r, keyN(0), "fp"); got != nil || !has(r, keyN(0)) {
		t.Errorf("after keepFor: answer %v, has %v; want none, and the key still remembered", got, has(r, keyN(0)))
	}
	if r.bytes != 0 {
		t.Errorf("%d bytes counted with no answer kept", r.bytes)
	}

	// A record expiring in 15s: kept 5s, leaving 10s for clock skew.
	r.Keep(keyN(1), "fp", resp, clock.Now().Add(15*time.Second))
	clock.Advance(4 * time.Second)
	if answer(r, keyN(1), "fp") == nil {
		t.Error("answer dropped before expiry - keepFor")
	}
	clock.Advance(time.Second)
	if answer(r, keyN(1), "fp") != nil {
		t.Error("answer kept at expiry - keepFor")
	}
	// One expiring within keepFor is not kept at all.
	r.Keep(keyN(2), "fp", resp, clock.Now().Add(9*time.Second))
	if answer(r, keyN(2), "fp") != nil || !has(r, keyN(2)) {
		t.Error("an answer whose record expires within keepFor was kept, or its key forgotten")
	}

	// An answer over 1/64 of the bound is not kept; the bound drops the
	// oldest answers, with their keys.
	r.Keep(keyN(3), "fp", &idem.Response{Status: 200, Body: make([]byte, 2000)}, clock.Now().Add(time.Hour))
	if answer(r, keyN(3), "fp") != nil {
		t.Error("an answer over 1/64 of the bound was kept")
	}
	for i := 10; i < 100; i++ {
		r.Keep(keyN(i), "fp", &idem.Response{Status: 200, Body: make([]byte, 900)}, clock.Now().Add(time.Hour))
	}
	if r.bytes > 64*1024 {
		t.Errorf("%d bytes kept, over the bound of %d", r.bytes, 64*1024)
	}
	if answer(r, keyN(99), "fp") == nil {
		t.Error("the newest answer was dropped")
	}
	if has(r, keyN(10)) {
		t.Error("the oldest answer was kept past the bound")
	}
}

func has(r *Recent, k Key) bool {
	_, seen := r.Lookup(k, "")
	return seen
}

func answer(r *Recent, k Key, fp idem.Fingerprint) *idem.Response {
	resp, _ := r.Lookup(k, fp)
	return resp
}

// TestRecentAnswerIsACopy: a kept answer comes back whole (status, every
// header value, body, the omitted-body flag), as a copy that neither the
// caller's later changes nor another lookup's reach, and never for a key
// whose hash it shares without being it.
func TestRecentAnswerIsACopy(t *testing.T) {
	r := NewRecent(10, time.Minute, 1<<20, idem.SystemClock{})
	resp := &idem.Response{Status: 409, Header: http.Header{
		"Content-Type": {"application/json"},
		"Link":         {"</a>; rel=a", "</b>; rel=b"},
	}, Body: []byte(`{"error":"x"}`), BodyOmitted: false}
	want := &idem.Response{Status: resp.Status, Header: resp.Header.Clone(), Body: append([]byte(nil), resp.Body...)}
	r.Keep(keyN(0), "fp", resp, time.Now().Add(time.Hour))
	resp.Body[0] = 'X'
	resp.Header.Set("Content-Type", "text/plain")
	got := answer(r, keyN(0), "fp")
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("answer = %+v, want %+v", got, want)
	}
	got.Body[0] = 'Y'
	got.Header.Set("Link", "changed")
	if again := answer(r, keyN(0), "fp"); !reflect.DeepEqual(again, want) {
		t.Fatalf("after the caller changed its copy: %+v, want %+v", again, want)
	}

	r.Keep(keyN(1), "fp", &idem.Response{Status: 200, BodyOmitted: true}, time.Now().Add(time.Hour))
	if got := answer(r, keyN(1), "fp"); got == nil || !got.BodyOmitted || got.Body != nil || got.Header != nil {
		t.Errorf("omitted body: %+v", got)
	}

	// Another key under keyN(0)'s hash (made to share it here, as two keys
	// do once in 2^64) is seen but never answered with keyN(0)'s answer.
	r.mu.Lock()
	r.index[r.hash(keyN(7))] = r.index[r.hash(keyN(0))]
	r.mu.Unlock()
	if resp, seen := r.Lookup(keyN(7), "fp"); resp != nil || !seen {
		t.Errorf("a key sharing another's hash: answer %+v, seen %v; want none, seen", resp, seen)
	}
}

// TestRecentAnswerSizes: an answer of any shape comes back whole (a key of
// the longest length, a long scope, no header, no body), an answer is kept
// when its encoding takes exactly 1/64 of the bound and not one byte more,
// and the bytes counted are those of the answers kept when a key's answer
// is replaced.
func TestRecentAnswerSizes(t *testing.T) {
	// Scopes, keys and fingerprints of every length: long ones together,
	// a long scope with a one-character key, the longest key in the
	// default (empty) scope, a one-character key with a fingerprint as
	// NewFingerprint makes them; each with and without a body.
	maxKey := idem.Key(strings.Repeat("k", idem.MaxKeyLen))
	realFP := idem.NewFingerprint("POST", "/payments", "", "application/json", []byte(`{"amount":1}`))
	for _, c := range []struct {
		k  Key
		fp idem.Fingerprint
	}{
		{Key{Scope: idem.Scope(strings.Repeat("s", 300)), Key: maxKey}, idem.Fingerprint(strings.Repeat("f", 64))},
		{Key{Scope: idem.Scope(strings.Repeat("s", 300)), Key: "k"}, "fp"},
		{Key{Key: maxKey}, "fp"},
		{Key{Key: "k"}, realFP},
	} {
		for _, resp := range []*idem.Response{
			{Status: 204},
			{Status: 200, Header: http.Header{"X": {"1"}}},
			{Status: 201, Body: make([]byte, 3000)},
		} {
			r := NewRecent(10, time.Minute, 1<<20, idem.SystemClock{})
			r.Keep(c.k, c.fp, resp, time.Now().Add(time.Hour))
			if got := answer(r, c.k, c.fp); !reflect.DeepEqual(got, resp) {
				t.Errorf("answer for a key of %d bytes in a scope of %d, fingerprint of %d = %+v, want %+v",
					len(c.k.Key), len(c.k.Scope), len(c.fp), got, resp)
			}
		}
	}

	k := keyN(0)
	resp := &idem.Response{Status: 200, Body: []byte("0123456789")}
	size := len(encodeAnswer(k, "fp", resp))
	r := NewRecent(10, time.Minute, 64*size, idem.SystemClock{})
	r.Keep(k, "fp", resp, time.Now().Add(time.Hour))
	if answer(r, k, "fp") == nil {
		t.Errorf("an answer of exactly 1/64 of the bound (%d bytes) was not kept", size)
	}
	r = NewRecent(10, time.Minute, 64*size-64, idem.SystemClock{})
	r.Keep(k, "fp", resp, time.Now().Add(time.Hour))
	if answer(r, k, "fp") != nil {
		t.Errorf("an answer of 1/64 of the bound plus a byte (%d bytes) was kept", size)
	}

	r = NewRecent(10, time.Minute, 1<<20, idem.SystemClock{})
	r.Keep(k, "fp", &idem.Response{Status: 200, Body: make([]byte, 100)}, time.Now().Add(time.Hour))
	r.Keep(k, "fp", &idem.Response{Status: 200, Body: make([]byte, 10)}, time.Now().Add(time.Hour))
	if want := len(r.slots[r.index[r.hash(k)]].answer); r.bytes != want {
		t.Errorf("after an answer replaced another, %d bytes counted, want the %d of the answer kept", r.bytes, want)
	}
}

// TestRecentAnswersFillTheBoundExactly: answers whose bytes add up to
// exactly the bound are all kept; the bound drops answers only past it.
func TestRecentAnswersFillTheBoundExactly(t *testing.T) {
	resp := &idem.Response{Status: 200, Body: []byte("0123456789")}
	size := len(encodeAnswer(keyN(10), "fp", resp)) // every keyN(10..73) encodes alike
	r := NewRecent(100, time.Minute, 64*size, idem.SystemClock{})
	for i := 10; i < 74; i++ {
		r.Keep(keyN(i), "fp", resp, time.Now().Add(time.Hour))
	}
	if r.bytes != 64*size {
		t.Fatalf("%d bytes counted, want %d", r.bytes, 64*size)
	}
	for i := 10; i < 74; i++ {
		if answer(r, keyN(i), "fp") == nil {
			t.Fatalf("answer of k%d dropped with the bound exactly reached, not passed", i)
		}
	}
}
