package keyed

import (
	"bytes"
	"errors"
	"testing"

	"github.com/idem-go/idem"
)

// OpenPoint gives back the data an execution saved, whether the point was
// kept in clear or sealed, and refuses a sealed point without its key or
// read under another record.
func TestOpenPoint(t *testing.T) {
	t.Parallel()
	keys := []BodyKey{{ID: "k1", Key: bytes.Repeat([]byte{7}, 32)}}
	sealer, err := newBodySealer(keys)
	if err != nil {
		t.Fatal(err)
	}
	saved := []byte(`{"payment":{"id":"pay_1"}}`)
	seed := downstreamSeed("acme", "pay-1")
	for _, tc := range []struct {
		name   string
		sealer *bodySealer
		keys   []BodyKey
	}{{"clear", nil, nil}, {"sealed", sealer, keys}} {
		rp, err := wrapPoint(tc.sealer, "acme", "pay-1", seed, idem.RecoveryPoint{Name: "charging", Data: saved})
		if err != nil {
			t.Fatal(err)
		}
		got, err := OpenPoint(tc.keys, "acme", "pay-1", "charging", rp.Data)
		if err != nil || !bytes.Equal(got, saved) {
			t.Errorf("%s: OpenPoint = %q, %v; want %q", tc.name, got, err, saved)
		}
		if tc.sealer == nil {
			continue
		}
		if _, err := OpenPoint(nil, "acme", "pay-1", "charging", rp.Data); !errors.Is(err, ErrBodyUnreadable) {
			t.Errorf("sealed point without keys: %v; want ErrBodyUnreadable", err)
		}
		if _, err := OpenPoint(tc.keys, "acme", "pay-2", "charging", rp.Data); !errors.Is(err, ErrBodyUnreadable) {
			t.Errorf("sealed point under another key: %v; want ErrBodyUnreadable", err)
		}
	}
}
