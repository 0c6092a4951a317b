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

// An operator's answer that asks the client to retry (a 5xx, 408, 425,
// 429) is refused: kept, it would be replayed to each of those retries,
// for as long as the key lives, and the client could never use it.
func TestOperatorAnswerRefusesAnAnswerThatAsksForARetry(t *testing.T) {
	t.Parallel()
	for _, status := range []int{408, 425, 429, 500, 502, 503, 504, 599} {
		if _, err := console.OperatorAnswer(status, "application/problem+json", `{"title":"down"}`); !errors.Is(err, idem.ErrInvalidArgument) {
			t.Errorf("OperatorAnswer(%d): %v; want an argument error", status, err)
		}
	}
	for _, status := range []int{200, 201, 302, 400, 402, 404, 409, 422, 499} {
		if _, err := console.OperatorAnswer(status, "application/json", `{}`); err != nil {
			t.Errorf("OperatorAnswer(%d): %v", status, err)
		}
	}
}
