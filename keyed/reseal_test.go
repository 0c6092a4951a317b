package keyed_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/idem-go/idem/keyed"
)

var (
	bodyKey1 = keyed.BodyKey{ID: "k1", Key: bytes.Repeat([]byte{1}, 32)}
	bodyKey2 = keyed.BodyKey{ID: "~k2", Key: bytes.Repeat([]byte{2}, 32)} // '~' is the last visible ASCII character an ID may hold
)

// ResealBody (what `idem keys seal` does to each kept body) opens a body
// with the keys given and seals it with the first of them for the new
// key: the result opens under the new key with the new body key alone,
// not under the old key, nor with the old body key alone. A body in clear
// is sealed; an empty one, or one with no keys given, is left as it is.
func TestResealBodyMovesABodyToItsNewKey(t *testing.T) {
	t.Parallel()
	plain := []byte(`{"id":1}`)
	sealed, err := keyed.ResealBody([]keyed.BodyKey{bodyKey1}, "t", "a", "a", plain)
	if err != nil || !keyed.IsSealedData(sealed) {
		t.Fatalf("ResealBody of a body in clear: %q, %v; want it sealed", sealed, err)
	}
	moved, err := keyed.ResealBody([]keyed.BodyKey{bodyKey2, bodyKey1}, "t", "a", "b", sealed)
	if err != nil || !keyed.IsSealedData(moved) {
		t.Fatalf("ResealBody to key b: %q, %v", moved, err)
	}
	if got, err := keyed.OpenBody([]keyed.BodyKey{bodyKey2}, "t", "b", moved); err != nil || !bytes.Equal(got, plain) {
		t.Fatalf("the moved body under b with the new body key: %q, %v; want %q", got, err, plain)
	}
	if _, err := keyed.OpenBody([]keyed.BodyKey{bodyKey1}, "t", "b", moved); !errors.Is(err, keyed.ErrBodyUnreadable) {
		t.Fatalf("the moved body with the old body key alone: %v; want ErrBodyUnreadable (sealed with the first key)", err)
	}
	if _, err := keyed.OpenBody([]keyed.BodyKey{bodyKey2, bodyKey1}, "t", "a", moved); !errors.Is(err, keyed.ErrBodyUnreadable) {
		t.Fatalf("the moved body under its old key: %v; want ErrBodyUnreadable (bound to b)", err)
	}

	if got, err := keyed.ResealBody([]keyed.BodyKey{bodyKey1}, "t", "a", "b", nil); err != nil || len(got) != 0 {
		t.Fatalf("ResealBody of an empty body: %q, %v; want it empty, not sealed", got, err)
	}
	if got, err := keyed.ResealBody(nil, "t", "a", "b", plain); err != nil || !bytes.Equal(got, plain) {
		t.Fatalf("ResealBody with no keys of a body in clear: %q, %v; want it as it is", got, err)
	}
	if got, err := keyed.ResealBody(nil, "t", "a", "b", sealed); !errors.Is(err, keyed.ErrBodyUnreadable) || got != nil {
		t.Fatalf("ResealBody with no keys of a sealed body: %q, %v; want ErrBodyUnreadable", got, err)
	}
	if _, err := keyed.ResealBody([]keyed.BodyKey{bodyKey2}, "t", "a", "b", sealed); !errors.Is(err, keyed.ErrBodyUnreadable) {
		t.Fatalf("ResealBody without the key it was sealed with: %v; want ErrBodyUnreadable", err)
	}
}

// ResealPoint does to a recovery point's data what ResealBody does to a
// body: the result opens under the new key with the new body key, and
// not with the old one alone; a point it cannot open is an error wrapping
// ErrBodyUnreadable.
func TestResealPointMovesAPointToItsNewKey(t *testing.T) {
	t.Parallel()
	data := []byte(`{"charge":"ch_1"}`)
	sealed, err := keyed.ResealPoint([]keyed.BodyKey{bodyKey1}, "t", "a", "a", "charge", data)
	if err != nil || !keyed.IsSealedData(sealed) {
		t.Fatalf("ResealPoint of a point in clear: %q, %v; want it sealed", sealed, err)
	}
	moved, err := keyed.ResealPoint([]keyed.BodyKey{bodyKey2, bodyKey1}, "t", "a", "b", "charge", sealed)
	if err != nil {
		t.Fatalf("ResealPoint to key b: %v", err)
	}
	if got, err := keyed.OpenPoint([]keyed.BodyKey{bodyKey2}, "t", "b", "charge", moved); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("the moved point under b: %q, %v; want %q", got, err, data)
	}
	if _, err := keyed.OpenPoint([]keyed.BodyKey{bodyKey1}, "t", "b", "charge", moved); !errors.Is(err, keyed.ErrBodyUnreadable) {
		t.Fatalf("the moved point with the old body key alone: %v; want ErrBodyUnreadable", err)
	}
	if got, err := keyed.ResealPoint([]keyed.BodyKey{bodyKey2}, "t", "a", "b", "charge", sealed); !errors.Is(err, keyed.ErrBodyUnreadable) || got != nil {
		t.Fatalf("ResealPoint without the key it was sealed with: %q, %v; want ErrBodyUnreadable", got, err)
	}
}

// Body keys are checked before anything is opened: an ID of 1 to 32
// visible ASCII characters ('!' to '~'), else an error naming the key,
// wherever the character that is not visible stands (the first included).
func TestResealRefusesBadBodyKeys(t *testing.T) {
	t.Parallel()
	key := bytes.Repeat([]byte{3}, 32)
	for _, id := range []string{"", strings.Repeat("x", 33), "a b", "k\x7f", "k\x1f", " k1", "\x7fk1", "é"} {
		keys := []keyed.BodyKey{{ID: id, Key: key}}
		if got, err := keyed.ResealBody(keys, "t", "a", "b", []byte("x")); err == nil || !strings.Contains(err.Error(), "BodyKeys[0]") || got != nil {
			t.Errorf("ResealBody with ID %q: %q, %v; want an error naming BodyKeys[0]", id, got, err)
		}
		if got, err := keyed.ResealPoint(keys, "t", "a", "b", "p", []byte("x")); err == nil || !strings.Contains(err.Error(), "BodyKeys[0]") || got != nil {
			t.Errorf("ResealPoint with ID %q: %q, %v; want an error naming BodyKeys[0]", id, got, err)
		}
	}
	for _, id := range []string{"!", strings.Repeat("~", 32)} {
		if _, err := keyed.ResealBody([]keyed.BodyKey{{ID: id, Key: key}}, "t", "a", "b", []byte("x")); err != nil {
			t.Errorf("ResealBody with ID %q: %v; want it accepted", id, err)
		}
	}
}
