package keyed

import (
	"bytes"
	"errors"
	"strings"
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

// The longest data SaveRecovery accepts, MaxRecoveryDataLen, still fits
// what every store keeps (idem.MaxRecoveryDataLen) once the engine has put
// it in its envelope and sealed it with the longest body key ID there is
// (32 characters): exactly, since pointOverhead is the most the envelope
// and the sealing add. A byte more is refused before anything is saved.
func TestLongestPointDataFitsOnceSealed(t *testing.T) {
	t.Parallel()
	sealer, err := newBodySealer([]BodyKey{{ID: strings.Repeat("k", 32), Key: bytes.Repeat([]byte{7}, 32)}})
	if err != nil {
		t.Fatal(err)
	}
	seed := downstreamSeed("acme", "pay-1")
	for _, tc := range []struct {
		name   string
		sealer *bodySealer
		want   int
	}{{"clear", nil, MaxRecoveryDataLen + len(pointMagic) + 32}, {"sealed", sealer, idem.MaxRecoveryDataLen}} {
		rp, err := wrapPoint(tc.sealer, "acme", "pay-1", seed, idem.RecoveryPoint{Name: "charging", Data: make([]byte, MaxRecoveryDataLen)})
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if len(rp.Data) != tc.want {
			t.Errorf("%s: the longest data kept as %d bytes, want %d", tc.name, len(rp.Data), tc.want)
		}
		if err := rp.Validate(); err != nil {
			t.Errorf("%s: the longest data, as the store gets it: %v", tc.name, err)
		}
		if _, err := wrapPoint(tc.sealer, "acme", "pay-1", seed, idem.RecoveryPoint{Name: "charging", Data: make([]byte, MaxRecoveryDataLen+1)}); err == nil {
			t.Errorf("%s: data of MaxRecoveryDataLen+1 bytes accepted", tc.name)
		}
	}
}

// A point saved with no data (its name is what it says) is kept as its
// envelope alone, and opens as it was saved: no data, and the seed of the
// execution that saved it, in clear and sealed.
func TestEmptyPointDataRoundTrips(t *testing.T) {
	t.Parallel()
	sealer, err := newBodySealer([]BodyKey{{ID: "k1", Key: bytes.Repeat([]byte{7}, 32)}})
	if err != nil {
		t.Fatal(err)
	}
	// The seed of another key than the record's: a retry after the keys
	// were sealed.
	seed := downstreamSeed("acme", "client-key")
	for _, tc := range []struct {
		name   string
		sealer *bodySealer
	}{{"clear", nil}, {"sealed", sealer}} {
		rp, err := wrapPoint(tc.sealer, "acme", "pay-1", seed, idem.RecoveryPoint{Name: "charging"})
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		got, gotSeed, err := unwrapPoint(tc.sealer, "acme", "pay-1", rp)
		if err != nil || len(got.Data) != 0 || got.Name != "charging" {
			t.Errorf("%s: opened as %+v, %v; want charging with no data", tc.name, got, err)
		}
		if gotSeed != seed {
			t.Errorf("%s: opened with another seed than the one saved", tc.name)
		}
	}
}

// Data that begins as the envelope does but is too short to hold its
// downstream seed was not put in one (data saved before the envelope
// existed may begin so): OpenPoint gives it back as it is, and the
// execution's seed is the record's key's, as for any data kept so. Data of
// exactly the envelope's length is an envelope of empty data.
func TestOpenPointOfDataTooShortForItsEnvelope(t *testing.T) {
	t.Parallel()
	for _, n := range []int{0, 1, 31} {
		saved := []byte(pointMagic + strings.Repeat("s", n))
		got, err := OpenPoint(nil, "acme", "pay-1", "charging", saved)
		if err != nil || !bytes.Equal(got, saved) {
			t.Errorf("OpenPoint of the envelope's magic and %d bytes = %q, %v; want it back as it is", n, got, err)
		}
		_, seed, err := unwrapPoint(nil, "acme", "pay-1", idem.RecoveryPoint{Name: "charging", Data: saved})
		if err != nil || seed != downstreamSeed("acme", "pay-1") {
			t.Errorf("the seed of the envelope's magic and %d bytes = %x, %v; want the record's key's", n, seed, err)
		}
	}
	seed := bytes.Repeat([]byte{5}, 32)
	got, err := OpenPoint(nil, "acme", "pay-1", "charging", append([]byte(pointMagic), seed...))
	if err != nil || len(got) != 0 {
		t.Errorf("OpenPoint of an envelope of empty data = %q, %v; want no data", got, err)
	}
}
