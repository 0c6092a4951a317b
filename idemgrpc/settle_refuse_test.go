package idemgrpc_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemgrpc"
	"github.com/idem-go/idem/idemmem"
)

// stoppedKey leaves scope ""/key in flight at the point "charging" with its
// holder's lease given up, as a call whose holder stopped there leaves it.
func stoppedKey(t *testing.T, store *idemmem.Store, key idem.Key) idem.Record {
	t.Helper()
	claim, err := store.Claim(t.Context(), idem.ClaimRequest{Key: key, Fingerprint: idem.Fingerprint("fp"), Lease: time.Minute, TTL: time.Hour})
	if err != nil || claim.Outcome != idem.Acquired {
		t.Fatalf("claiming %s: %v, %v", key, claim.Outcome, err)
	}
	ref := idem.Ref{Key: key, Token: claim.Token}
	if err := store.SaveRecovery(t.Context(), ref, idem.RecoveryPoint{Name: "charging", Data: []byte("ch")}); err != nil {
		t.Fatal(err)
	}
	if err := store.Yield(t.Context(), ref); err != nil {
		t.Fatal(err)
	}
	rec, err := store.Get(t.Context(), "", key)
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

// A settle whose answer the gRPC face would not keep from a handler (a
// code that tells the client to retry: Unavailable, Internal,
// ResourceExhausted, Unauthenticated...) is refused, the key left as it
// was: kept, it would be replayed to every retry, which the client makes
// because of that very code, for as long as the key lives. And a dry run
// refuses what the settle would: an answer the face cannot keep.
func TestSettleRefusesAnAnswerTheFaceWouldNotKeep(t *testing.T) {
	t.Parallel()
	store := idemmem.NewStore(nil)
	ic, err := idemgrpc.New(&idemgrpc.Config{Store: store, SharedScope: true, Default: idemgrpc.Required})
	if err != nil {
		t.Fatal(err)
	}
	comp, err := ic.NewCompleter(&idemgrpc.CompleterConfig{Resume: func(context.Context, idemgrpc.Execution) (any, error) { return nil, errors.New("not here") }})
	if err != nil {
		t.Fatal(err)
	}
	problem := func(status int) idem.Response {
		return idem.Response{Status: status, Body: []byte(`{"title":"settled"}`), Header: http.Header{"Content-Type": {"application/problem+json"}}}
	}
	for _, st := range []int{http.StatusUnauthorized, http.StatusTooManyRequests, http.StatusInternalServerError, http.StatusServiceUnavailable, http.StatusGatewayTimeout} {
		for _, dry := range []bool{true, false} {
			key := idem.Key("k-" + http.StatusText(st))
			before := stoppedKey(t, store, key)
			if _, err := comp.Settle(t.Context(), "", key, problem(st), dry); !errors.Is(err, idem.ErrInvalidArgument) {
				t.Errorf("a settle (dry run %t) with %d, %v on gRPC: %v; want it refused as an invalid argument", dry, st, idemgrpc.SettleCode(st), err)
			}
			if after, err := store.Get(t.Context(), "", key); err != nil || after.State != idem.StateInFlight || after.Token != before.Token || after.Recovery.Name != "charging" {
				t.Fatalf("the key after a refused settle with %d: %+v, %v; want it as it was", st, after, err)
			}
		}
	}
	key := idem.Key("k-201")
	stoppedKey(t, store, key)
	ok := idem.Response{Status: http.StatusCreated, Body: []byte(`{"id":"p1"}`), Header: http.Header{"Content-Type": {"application/json"}}}
	if _, err := comp.Settle(t.Context(), "", key, ok, true); !errors.Is(err, idemgrpc.ErrSettleNeedsMessage) {
		t.Errorf("a dry run of DefaultSettle's settle of a 201: %v; want ErrSettleNeedsMessage, as the settle itself", err)
	}
	key = "k-409"
	stoppedKey(t, store, key)
	if _, err := comp.Settle(t.Context(), "", key, problem(http.StatusConflict), true); err != nil {
		t.Errorf("a dry run of a settle as failed: %v", err)
	}
	if _, err := comp.Settle(t.Context(), "", key, problem(http.StatusConflict), false); err != nil {
		t.Errorf("a settle as failed: %v", err)
	}
}
