package payments

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync/atomic"

	"github.com/idem-go/idem/cmd/idem/internal/acquirer"
	"github.com/idem-go/idem/idemhttp"
)

// ErrCardDeclined: the card network declined the charge. Deterministic, so
// the idempotency layer keeps and replays it.
var ErrCardDeclined = errors.New("payments: the card was declined")

// errAcquirerRefused: the card network refused the charge for a reason of
// its own (not a decline): the service's fault, answered 502 and not kept.
var errAcquirerRefused = errors.New("payments: the card network refused the charge")

// chargeKey is the idempotency key of a payment's charge (or refund) at
// the card network: the execution's DownstreamKey, named by
// purpose, a digest of the tenant and the key the client sent. Every
// execution of the payment, on every replica, sends the same key, and the
// network makes one charge: a retry whose claim is new (the earlier claim
// rolled back with the work, or was released), a takeover after a crash,
// the completer going on from the recovery point, and each of them after
// `idem keys seal` rewrote the keys or IDEM_KEY_SECRET changed. The client's
// key itself never reaches the network. (A client that reuses a key after
// it expired, while the network still remembers it, gets that old charge
// back; the payment it paid for has it already, and the new payment is
// refused.)
//
// Without a key (the unsafe mode) every attempt gets a fresh key, and every
// retry charges again: the double charge the lab shows.
func chargeKey(ctx context.Context, purpose string) string {
	ex, ok := idemhttp.ExecutionFromContext(ctx)
	if !ok || ex.Key == "" {
		return idemhttp.NewKey()
	}
	return ex.DownstreamKey("payments", purpose)
}

// MetaKeyDigest is the metadata of a charge that names its logical
// payment: ClientKeyDigest of its tenant and the client's key.
const MetaKeyDigest = "idempotency_key_digest"

// ClientKeyDigest is how the card network and `idem reconcile` name a
// logical payment: "ck1_" and 32 hex characters of a SHA-256 of the tenant
// and the key the client sent, so that the client's key itself never
// leaves the service. It is the same in the unsafe mode (which has no
// execution to derive a DownstreamKey from), and before and after the
// service's keys are sealed.
func ClientKeyDigest(tenant, clientKey string) string {
	h := sha256.New()
	for _, part := range []string{"idem lab client key", tenant, clientKey} {
		fmt.Fprintf(h, "%d:%s;", len(part), part)
	}
	return "ck1_" + hex.EncodeToString(h.Sum(nil)[:16])
}

// charge charges the payment's amount at the card network, before the
// payment is recorded, and returns the charge. The account is checked
// first, so that a payment the service would refuse charges nothing.
//
// Between the network's charge and the local commit lies the window the
// lab's faults open (crash-after-charge, drop-charge-answer): a retry of
// the payment sends the same charge key (chargeKey) and gets the same
// charge back, so however often the payment runs, the card is charged
// once.
func (s *Service) charge(ctx context.Context, r *http.Request, p Payment, clientKey string) (acquirer.Charge, error) {
	acct, err := s.store.Account(ctx, p.Tenant, p.AccountID)
	if err != nil {
		return acquirer.Charge{}, err
	}
	if err := paymentRefusal(p, acct.Balance, acct.Currency); err != nil {
		return acquirer.Charge{}, err
	}
	meta := map[string]string{"tenant": p.Tenant, "account_id": p.AccountID}
	// The client's key names the logical payment, so that a reconciliation
	// counts its charges: even in the unsafe mode, which ignores it. Its
	// digest, never the key: the client's key does not leave the service.
	if clientKey != "" {
		meta[MetaKeyDigest] = ClientKeyDigest(p.Tenant, clientKey)
	}
	f := faultsFrom(ctx)
	if f.dropChargeAnswer {
		ctx = context.WithValue(ctx, dropChargeKey{}, new(atomic.Bool))
	}
	ch, err := s.acquirer.Charge(ctx, chargeKey(ctx, "charge"), acquirer.ChargeRequest{
		// The payment's description stays in the service: what a client
		// wrote is none of the network's business, and would be kept there
		// in clear.
		Amount: p.Amount, Currency: p.Currency, Reference: p.AccountID, Metadata: meta,
	})
	switch {
	case errors.Is(err, acquirer.ErrDeclined):
		return acquirer.Charge{}, fmt.Errorf("%w: %v", ErrCardDeclined, err)
	case isStatus(err, http.StatusUnprocessableEntity):
		// The network remembers the key with another charge: the client
		// reused its key for another payment.
		return acquirer.Charge{}, fmt.Errorf("%w: %v", ErrKeyConflict, err)
	case errors.Is(err, acquirer.ErrUnavailable):
		// Unknown or transient: a retry with the same key finds out.
		return acquirer.Charge{}, fmt.Errorf("%w: %v", ErrTransient, err)
	case err != nil:
		return acquirer.Charge{}, fmt.Errorf("%w: %v", errAcquirerRefused, err)
	}
	if f.crashAfterCharge {
		s.crash(r, "the card was charged; the payment is not recorded")
	}
	return ch, nil
}

// refundCharge gives a charge back when the payment it paid for was
// refused after all (the account changed between the check and the
// write). Its key is derived like the charge's, so a retry refunds once.
func (s *Service) refundCharge(ctx context.Context, ch acquirer.Charge) error {
	_, err := s.acquirer.Refund(ctx, chargeKey(ctx, "refund"), ch.ID, 0)
	if err != nil {
		return fmt.Errorf("%w: refunding charge %s of a refused payment: %v", ErrTransient, ch.ID, err)
	}
	return nil
}

type dropChargeKey struct{}

// ChargeFaults wraps the transport of the card network's client so that
// drop-charge-answer can lose the network's first answer to a charge on
// its way back: the charge is made, the service sees a broken connection,
// and its client retries with the same key. Without the fault it passes
// every request through.
func ChargeFaults(base http.RoundTripper) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	return dropFirstAnswer{base}
}

type dropFirstAnswer struct{ base http.RoundTripper }

func (d dropFirstAnswer) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := d.base.RoundTrip(req)
	drop, _ := req.Context().Value(dropChargeKey{}).(*atomic.Bool)
	if err != nil || drop == nil || !drop.CompareAndSwap(false, true) {
		return resp, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return nil, fmt.Errorf("injected fault drop-charge-answer: the card network answered %d, and the answer was lost", resp.StatusCode)
}

// isStatus reports whether err is the card network's refusal with status.
func isStatus(err error, status int) bool {
	var e *acquirer.Error
	return errors.As(err, &e) && e.Status == status
}
