package keywait

import (
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// BenchmarkRecentKeys measures what a first execution costs the recent
// keys: a lookup that finds nothing, then the keep of its answer, with the
// default bounds and the ring full.
func BenchmarkRecentKeys(b *testing.B) {
	r := NewRecent(1<<16, 10*time.Second, 32<<20, idem.SystemClock{})
	resp := &idem.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"id":"pay_bench","status":"succeeded"}`)}
	expires := time.Now().Add(24 * time.Hour)
	keys := make([]Key, 2*(1<<16))
	for i := range keys {
		keys[i] = Key{Scope: "", Key: idem.Key("first-0-" + strconv.Itoa(i))}
	}
	for _, k := range keys[:1<<16] {
		r.Keep(k, "fp", resp, expires)
	}
	i := 0
	for b.Loop() {
		k := keys[i%len(keys)]
		i++
		if _, seen := r.Lookup(k, "fp"); !seen {
			r.Keep(k, "fp", resp, expires)
		}
	}
}
