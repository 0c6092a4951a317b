package idempg_test

import (
	"testing"

	"github.com/idem-go/idem/idempg"
)

// An outbox of another database is not the transport's to move.
func TestOutboxMoverOtherDB(t *testing.T) {
	t.Parallel()
	ob, err := idempg.NewOutbox(t.Context(), messagesDB(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	tr := newTransport(t, messagesDB(t), idempg.TransportConfig{})
	if n, ok, err := tr.MoveOutbox(t.Context(), ob, 10); ok || n != 0 || err != nil {
		t.Errorf("MoveOutbox(another DB's outbox) = %d, %v, %v; want 0, false, nil", n, ok, err)
	}
}
