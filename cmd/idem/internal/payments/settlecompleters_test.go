package payments

import (
	"errors"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemgrpc"
	"github.com/idem-go/idem/idemsqlite"
)

// The gRPC face's completer that idem keys settle builds
// (SettleCompleters) keeps what the service's own keeps (grpcKeep), as the
// console's settle, made by the service's completer, does: a settle with
// a 400, which the gRPC face answers InvalidArgument and never keeps, is
// refused by both, the key left as it was.
func TestSettleCompletersKeepWhatTheGRPCFaceKeeps(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db, err := idemsqlite.Open(filepath.Join(t.TempDir(), "settle.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	store, err := idemsqlite.NewStore(ctx, db, nil)
	if err != nil {
		t.Fatal(err)
	}
	claim, err := store.Claim(ctx, idem.ClaimRequest{Scope: "acme", Key: "k1", Fingerprint: "fp", Lease: time.Minute, TTL: time.Hour})
	if err != nil || claim.Outcome != idem.Acquired {
		t.Fatalf("claim: %v, %v", claim.Outcome, err)
	}
	ref := idem.Ref{Scope: "acme", Key: "k1", Token: claim.Token}
	if err := store.SaveRecovery(ctx, ref, idem.RecoveryPoint{Name: pointChargingGRPC, Data: []byte("{}")}); err != nil {
		t.Fatal(err)
	}
	if err := store.Yield(ctx, ref); err != nil {
		t.Fatal(err)
	}
	if grpcKeep("", idemgrpc.SettleCode(http.StatusBadRequest)) {
		t.Fatal("the gRPC face keeps the code of a 400; this test needs one it does not")
	}
	comps, err := SettleCompleters(store, nil)
	if err != nil {
		t.Fatal(err)
	}
	answer := idem.Response{Status: http.StatusBadRequest, Body: []byte(`{"title":"bad"}`), Header: http.Header{"Content-Type": {"application/problem+json"}}}
	for _, dry := range []bool{true, false} {
		if _, err := comps.Settle(ctx, "acme", "k1", answer, dry); !errors.Is(err, idem.ErrInvalidArgument) {
			t.Errorf("idem keys settle's completers, a settle (dry run %t) of a gRPC key with a 400: %v; want it refused, as the service's completer refuses it", dry, err)
		}
	}
	if rec, err := store.Get(ctx, "acme", "k1"); err != nil || rec.State != idem.StateInFlight || rec.Recovery.Name != pointChargingGRPC {
		t.Fatalf("the key after the refused settles: %+v, %v; want it in flight at its point", rec, err)
	}
}
