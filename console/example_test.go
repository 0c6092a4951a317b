package console_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/console"
	"github.com/idem-go/idem/deadletter"
	"github.com/idem-go/idem/idemmem"
)

// A console over in-memory stores: an operator re-drives a dead letter
// with a bearer token, and a second re-drive of it is refused.
func Example() {
	ctx := context.Background()
	letters := idemmem.NewDeadLetters(nil)
	at := time.Date(2026, 5, 1, 9, 0, 0, 0, time.UTC)
	id, _ := letters.Add(ctx, idem.DeadLetter{
		Consumer: "settlement", Class: idem.DeadPermanent,
		Message:       idem.Message{ID: "evt-1", Topic: "payments.succeeded", Key: "acct-1", Payload: []byte(`{"event_id":"evt-1"}`)},
		Attempts:      []idem.Attempt{{Number: 1, At: at, Class: idem.ClassPermanent, Error: "unknown payment"}},
		FirstFailedAt: at, LastFailedAt: at,
	})
	svc, _ := deadletter.New(&deadletter.Config{
		DeadLetters: letters, Ledger: idemmem.NewLedger(), Outbox: idemmem.NewOutbox(nil), InTx: idemmem.Transact,
	})
	ops, _ := console.ParseOperators("alice:s3cret-token-0123456789abcdef")
	con, err := console.New(&console.Config{Letters: svc, Operators: ops})
	if err != nil {
		fmt.Println(err)
		return
	}
	mux := http.NewServeMux()
	mux.Handle("/console/", con.Handler())

	redrive := func() int {
		r := httptest.NewRequest(http.MethodPost, "/console/letters/"+id+"/redrive",
			strings.NewReader(url.Values{"reason": {"payment imported"}}.Encode()))
		r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		r.Header.Set("Authorization", "Bearer s3cret-token-0123456789abcdef")
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, r)
		return w.Code
	}
	fmt.Println("first re-drive:", redrive())
	fmt.Println("second re-drive:", redrive())
	dl, _ := svc.Show(ctx, id)
	last := dl.History[len(dl.History)-1]
	fmt.Println(dl.State, "by", last.Actor+":", last.Reason)
	// Output:
	// first re-drive: 303
	// second re-drive: 409
	// redriven by alice: payment imported
}
