package deadletter_test

import (
	"context"
	"errors"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/deadletter"
)

// refusingOutbox is an outbox that cannot be written to (its database
// down, say).
type refusingOutbox struct{ idem.Outbox }

func (refusingOutbox) Add(context.Context, ...idem.Message) error {
	return errors.New("outbox unavailable")
}

// Discarding a letter with no parked message behind it sends nothing, so it
// does not touch the outbox: it succeeds while the outbox cannot be written,
// where a re-drive, which must write its message there, fails and changes
// nothing.
func TestDiscardWithNothingToSendLeavesTheOutboxAlone(t *testing.T) {
	t.Parallel()
	e := newEnv(t, transactInTx)
	svc, err := deadletter.New(&deadletter.Config{DeadLetters: e.letters, Ledger: e.ledger, Outbox: refusingOutbox{e.outbox}, Clock: e.clock, InTx: transactInTx.InTx})
	if err != nil {
		t.Fatal(err)
	}
	kept := e.deadLetter("settlement", idem.DeadPermanent, message("evt-1", "acct-1"))
	gone := e.deadLetter("settlement", idem.DeadPermanent, message("evt-2", "acct-2"))
	if _, err := svc.Redrive(context.Background(), []string{kept}, nil); err == nil {
		t.Fatal("Redrive with an outbox that cannot be written succeeded; want its error")
	}
	if dl := e.letter(kept); dl.State == idem.LetterRedriven {
		t.Fatalf("the letter whose re-drive failed is %v; want it unchanged", dl.State)
	}
	res, err := svc.Discard(context.Background(), []string{gone}, "bob", "refunded by hand")
	if err != nil {
		t.Fatalf("Discard with nothing to send, the outbox down: %v; want it done", err)
	}
	if len(res) != 1 || res[0].Action != "discarded" || e.letter(gone).State != idem.LetterDiscarded {
		t.Fatalf("Discard = %+v; want the letter discarded", res)
	}
}
