package console_test

import (
	"errors"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/console"
)

// An operator's answer is refused, with a clear error, when its content
// type holds a control character: it would be sent as a header to the
// client's retry.
func TestOperatorAnswerRefusesControlCharactersInItsType(t *testing.T) {
	t.Parallel()
	for _, ct := range []string{"application/json\r\nX-Evil: 1", "text/plain\x00", "text/\tplain", "text/plain\x7f", "application/json\x1b[31m"} {
		if _, err := console.OperatorAnswer(200, ct, `{}`); !errors.Is(err, idem.ErrInvalidArgument) {
			t.Errorf("OperatorAnswer with content type %q: %v; want an argument error", ct, err)
		}
	}
	a, err := console.OperatorAnswer(201, "application/json; charset=utf-8", `{"ok":true}`)
	if err != nil || a.Header.Get("Content-Type") != "application/json; charset=utf-8" {
		t.Fatalf("a plain content type: %+v, %v", a, err)
	}
}
