package keyed

import (
	"bytes"
	"testing"
)

// The cost of keys and answers at rest, per request: one HMAC-SHA-256 of
// the key, one AES-256-GCM seal of the kept body (on a first execution) or
// open (on a replay), for a 200-byte answer like the payment service's.
//
//	go test -run '^$' -bench AtRest ./keyed/
func BenchmarkAtRest(b *testing.B) {
	secret := bytes.Repeat([]byte("s"), 32)
	s, err := newBodySealer([]BodyKey{{ID: "k1", Key: bytes.Repeat([]byte("k"), 32)}})
	if err != nil {
		b.Fatal(err)
	}
	body := bytes.Repeat([]byte(`{"a":1}`), 29)[:200]
	ks := newKeySealer(secret)
	if got, want := ks.seal("tenant-a", "k"), SealKey(secret, "tenant-a", "k"); got != want {
		b.Fatalf("the engine's sealer gives %q, SealKey %q", got, want)
	}
	b.Run("SealKey", func(b *testing.B) {
		for b.Loop() {
			ks.seal("tenant-a", "0f8fad5b-d9cb-469f-a165-70867728950e")
		}
	})
	sealed, err := s.seal("tenant-a", "k", body)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("SealBody", func(b *testing.B) {
		for b.Loop() {
			if _, err := s.seal("tenant-a", "k", body); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("OpenBody", func(b *testing.B) {
		for b.Loop() {
			if _, _, err := s.open("tenant-a", "k", sealed); err != nil {
				b.Fatal(err)
			}
		}
	})
}
