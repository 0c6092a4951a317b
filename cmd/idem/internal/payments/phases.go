package payments

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemgrpc"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/keyed"
)

// A payment at a card network (Config.Acquirer) runs in two phases, each
// committed on its own, so that an execution that dies between the
// network's charge and the service's own commit is finished rather than
// forgotten:
//
//  1. "charging": before the charge, the payment as it will be recorded
//     (its ID, amount, tenant) and the client's key are saved with the
//     idempotency key (idemhttp.SaveRecovery). From then on the key is
//     never released after a failure.
//  2. the card is charged, with a key derived from the client's (chargeKey:
//     every execution sends the same one, and the network answers every
//     retry with the charge it made), and the payment is recorded under
//     its origin (the key and its claim time, which a takeover keeps), so
//     an execution that finds it recorded already answers with it.
//
// A later execution of the key goes on from "charging" with the saved
// payment: the client's retry after the lease ends, a takeover on another
// replica, or, with nobody asking, the completer (Service.resume), whose
// answer the client who comes back gets replayed.
//
// The phases need a key store that keeps recovery points in the service's
// database (idem.Recoverer: the SQLite and PostgreSQL stores). With the
// keys elsewhere (Config.Keys) the payment runs as one piece, and the
// derived charge key alone keeps it from charging twice.
const pointCharging = "charging"

// chargingPoint is the data of the "charging" recovery point.
type chargingPoint struct {
	Payment   Payment `json:"payment"`
	Tenant    string  `json:"tenant"`
	ClientKey string  `json:"client_key,omitempty"`
}

// phased reports whether payments run in phases (see pointCharging).
func (s *Service) phased() bool {
	if s.acquirer == nil || s.unsafe || s.twoStores {
		return false
	}
	_, ok := s.keys.(idem.Recoverer)
	return ok
}

// startCharging is phase 1 of a payment at the card network: it returns
// the payment to charge and the client's key, saved as the "charging"
// recovery point, or, when an earlier execution of the key saved one, the
// payment that execution was making (its ID and time, whatever this
// request's copy says: the fingerprint already made them the same request).
func (s *Service) startCharging(ctx context.Context, p Payment, clientKey string) (Payment, string, error) {
	ex, ok := idemhttp.ExecutionFromContext(ctx)
	if !ok || !s.phased() {
		return p, clientKey, nil
	}
	point := chargingPointName(ctx)
	if ex.Recovery.Name == point {
		pt, err := decodeCharging(ex.Recovery.Data)
		if err != nil {
			return Payment{}, "", err
		}
		s.logger.WarnContext(ctx, "payments: going on with a payment an earlier execution began charging", "payment", pt.Payment.ID)
		return pt.Payment, pt.ClientKey, nil
	}
	data, err := json.Marshal(chargingPoint{Payment: p, Tenant: p.Tenant, ClientKey: clientKey})
	if err != nil {
		return Payment{}, "", err
	}
	if err := idemhttp.SaveRecovery(ctx, point, data); err != nil {
		return Payment{}, "", fmt.Errorf("%w: saving the payment's recovery point: %v", ErrTransient, err)
	}
	return p, clientKey, nil
}

func decodeCharging(data []byte) (chargingPoint, error) {
	var pt chargingPoint
	if err := json.Unmarshal(data, &pt); err != nil {
		return chargingPoint{}, fmt.Errorf("payments: the recovery point %q is unreadable: %w", pointCharging, err)
	}
	if pt.Payment.ID == "" || pt.Tenant == "" {
		return chargingPoint{}, fmt.Errorf("payments: the recovery point %q names no payment", pointCharging)
	}
	pt.Payment.Tenant = pt.Tenant
	return pt, nil
}

// resume is the completer's idemhttp.ResumeFunc: it finishes a payment
// whose execution died after its "charging" point, as the retry of the
// client would: the charge (the same key, so the network's own charge if
// it made one), the payment recorded, and the answer the client gets
// replayed when it comes back. An answer the service would not keep (the
// network or the database unavailable) leaves the outcome unknown: the
// key stays in flight, and the completer tries again after its lease.
func (s *Service) resume(ctx context.Context, w http.ResponseWriter, ex idemhttp.Execution) error {
	if ex.Recovery.Name != pointCharging {
		return fmt.Errorf("payments: no phase goes on from recovery point %q", ex.Recovery.Name)
	}
	pt, err := decodeCharging(ex.Recovery.Data)
	if err != nil {
		return err
	}
	// Which payment this replica is finishing, under the key's digest that
	// the completer's own lines carry: a replica that dies in the middle of
	// it logs nothing more, and whoever reads the logs (idem torture
	// requests --abandon) learns from this line that its resume of the
	// payment ended with it.
	s.logger.WarnContext(ctx, "payments: finishing a payment from its recovery point",
		"payment", pt.Payment.ID, "key", idem.KeyDigest(ex.Scope, ex.Key))
	r, err := http.NewRequestWithContext(ctx, http.MethodPost, "/v1/payments", nil)
	if err != nil {
		return err
	}
	rw := &statusWriter{ResponseWriter: w}
	s.chargeAndRecord(rw, r, pt.Payment, pt.ClientKey)
	if !keep(r, rw.status) {
		return fmt.Errorf("payments: payment %s is not finished yet: the attempt answered %d", pt.Payment.ID, rw.status)
	}
	return nil
}

// statusWriter remembers the status written through it.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(status int) {
	if w.status == 0 {
		w.status = status
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// errNoCompleter: the service runs no completer (see Service.Completer).
var errNoCompleter = errors.New("payments: no completer runs: payments charge no card, or the key store keeps no recovery points")

// Completer returns the service's completer, or an error saying why there
// is none.
func (s *Service) Completer() (*idemhttp.Completer, error) {
	if s.completer == nil {
		return nil, errNoCompleter
	}
	return s.completer, nil
}

// KeyActions returns what acts on a key stopped at a recovery point,
// whichever face stopped it: each face's completer (the HTTP face's, and
// with Config.GRPC the gRPC face's), each resuming and settling the keys
// of its own face's points, so that the answer it keeps is in the form
// that face's retries read (keyed.Completers). It is what the console and
// the idem keys commands act through.
func (s *Service) KeyActions() (keyed.Completers, error) {
	if s.completer == nil {
		return nil, errNoCompleter
	}
	cs := keyed.Completers{s.completer}
	if s.grpcCompleter != nil {
		cs = append(cs, s.grpcCompleter)
	}
	return cs, nil
}

// HTTPPoints names the recovery points the HTTP face's handlers save
// (its completer's CompleterConfig.Points): a key stopped at another (the
// gRPC face's) is left to that face's completer, whose answers are kept in
// gRPC's form.
func HTTPPoints() []string { return []string{pointCharging} }

// errResumesNothing is the Resume of SettleCompleters' completers.
var errResumesNothing = errors.New("payments: this completer settles, and resumes nothing")

// SettleCompleters returns what settles a key of store stopped at a
// recovery point, for an operator's action outside a running service (idem
// keys settle): each face's completer, as Service.KeyActions, keeping
// answers as the service keeps them (sealed with bodyKeys; on gRPC, the
// codes its face keeps, grpcKeep), and resuming
// nothing (a ResumeKey fails, leaving the key as it was).
func SettleCompleters(store idem.Store, bodyKeys []idemhttp.BodyKey) (keyed.Completers, error) {
	mw, err := idemhttp.New(&idemhttp.Config{Store: store, SeparateTx: true, SharedScope: true, BodyKeys: bodyKeys})
	if err != nil {
		return nil, err
	}
	hc, err := mw.NewCompleter(&idemhttp.CompleterConfig{Points: HTTPPoints(), Resume: func(context.Context, http.ResponseWriter, idemhttp.Execution) error {
		return errResumesNothing
	}})
	if err != nil {
		return nil, err
	}
	ic, err := idemgrpc.New(&idemgrpc.Config{Store: store, SeparateTx: true, SharedScope: true, BodyKeys: bodyKeys, Keep: grpcKeep})
	if err != nil {
		return nil, err
	}
	gc, err := ic.NewCompleter(&idemgrpc.CompleterConfig{Points: GRPCPoints(), Settle: SettleGRPC, Resume: func(context.Context, idemgrpc.Execution) (any, error) {
		return nil, errResumesNothing
	}})
	if err != nil {
		return nil, err
	}
	return keyed.Completers{hc, gc}, nil
}

// NewCompleter starts the service cfg describes for its completer alone,
// for an operator's action on one key outside a running service (idem keys
// resume): the completer's resumes charge the card network and record the
// payment, its event in the outbox, exactly as the service's own do, but
// it runs no rounds of its own (only ResumeKey and Settle act),
// and nothing serves requests or relays events (cfg.APIKeys may be
// empty; cfg.RequestsOnly is implied). Both faces' completers are made
// (Service.KeyActions), so that a key the gRPC face stopped is resumed as
// that face's completer resumes it, its answer kept in gRPC's form.
// cfg.Acquirer is required, and the keys must live in the service's
// database. stop stops what it started.
func NewCompleter(ctx context.Context, cfg *Config) (comp keyed.Completers, stop func() error, err error) {
	if cfg == nil || cfg.Acquirer == nil {
		return nil, nil, fmt.Errorf("%w: a completer needs the card network (Acquirer): it resumes payments there", ErrConfig)
	}
	c := *cfg
	c.completerOnly, c.RequestsOnly = true, true
	c.GRPC = c.Keys == nil && !c.Unsafe
	svc, err := New(ctx, &c)
	if err != nil {
		return nil, nil, err
	}
	if comp, err = svc.KeyActions(); err != nil {
		return nil, nil, errors.Join(err, svc.Close())
	}
	return comp, svc.Close, nil
}
