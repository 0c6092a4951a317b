package idempgsql_test

import (
	"context"
	"fmt"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idempgsql"
)

// InFlightAtPoints lists every key in flight with a recovery point, its
// holder's lease ended or not, oldest lease end first: the executions that
// went past the database's edge (a card network charged, say) and whose
// outcome is not in the books yet, as an audit of those books wants them
// (idem reconcile). Abandoned lists only those whose lease has ended, which
// a Completer takes over. A key in flight without a point is in neither
// list. Both read through the partial index idem_keys_recovering.
func ExampleStore_InFlightAtPoints() {
	sqldb, done := exampleSQL("pgx")
	defer done()

	ctx := context.Background()
	// An injected clock, so that the leases end when the example says
	// (without one, the database's clock judges them).
	clock := idemmem.NewClock(time.Date(2026, 1, 1, 9, 0, 0, 0, time.UTC))
	db, err := idempgsql.NewDB(ctx, sqldb, &idempgsql.Config{Clock: clock})
	if err != nil {
		panic(err)
	}
	store, err := idempgsql.NewStore(ctx, db)
	if err != nil {
		panic(err)
	}

	// start claims key for lease and, unless point is empty, saves the
	// recovery point its execution reached.
	start := func(key idem.Key, lease time.Duration, point string) {
		claim, err := store.Claim(ctx, idem.ClaimRequest{Scope: "merchant-7", Key: key,
			Fingerprint: idem.NewFingerprint("POST", "/payments", "", "application/json", []byte(key)),
			Lease:       lease, TTL: 24 * time.Hour})
		if err != nil {
			panic(err)
		}
		if point == "" {
			return
		}
		ref := idem.Ref{Scope: "merchant-7", Key: key, Token: claim.Token}
		if err := store.SaveRecovery(ctx, ref, idem.RecoveryPoint{Name: point, Data: []byte(`{"charge":"ch_` + string(key) + `"}`)}); err != nil {
			panic(err)
		}
	}
	start("order-1", 10*time.Second, "charged") // its holder dies
	start("order-2", time.Hour, "charging")     // its holder runs on
	start("order-3", 10*time.Second, "")        // no point saved
	clock.Advance(time.Minute)                  // order-1's and order-3's leases end

	inFlight, err := store.InFlightAtPoints(ctx, 100)
	if err != nil {
		panic(err)
	}
	for _, rec := range inFlight {
		fmt.Printf("in flight at a point: %s at %q, %s, lease ended %v\n", rec.Key, rec.Recovery.Name, rec.Recovery.Data, !rec.LeaseExpiresAt.After(clock.Now()))
	}
	abandoned, err := store.Abandoned(ctx, 100)
	if err != nil {
		panic(err)
	}
	for _, rec := range abandoned {
		fmt.Printf("abandoned: %s at %q\n", rec.Key, rec.Recovery.Name)
	}
	// Output:
	// in flight at a point: order-1 at "charged", {"charge":"ch_order-1"}, lease ended true
	// in flight at a point: order-2 at "charging", {"charge":"ch_order-2"}, lease ended false
	// abandoned: order-1 at "charged"
}
