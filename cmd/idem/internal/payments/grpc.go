package payments

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemgrpc"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemprom"
)

// The gRPC face (Config.GRPC, Service.RegisterGRPC) serves the payments'
// two writes over gRPC: the same service, store, key secret, body keys and
// scopes as the HTTP face, and the same domain code. A call's request is a
// google.protobuf.Struct holding the members the HTTP body holds (so no
// generated code is needed, and grpcurl can call it with -d '{…}'); it is
// encoded as JSON and handed to the HTTP face's handler, whose strict
// reading, checks, phases, charge and answer are the only ones there are.
// The answer comes back as a Struct holding what the HTTP answer's JSON
// holds, or as a status whose code says what the HTTP status says.
//
// Keys travel as idemgrpc reads them (idempotency-key metadata), API keys
// as "authorization: Bearer KEY" metadata, and, with Config.Faults, the
// faults that act inside the handler (delay, fail-before-commit,
// crash-after-charge, drop-charge-answer) as idem-fault metadata.
const (
	// GRPCService is the gRPC face's service name.
	GRPCService = "idem.payments.v1.Payments"
	// GRPCCreatePayment and GRPCCreateRefund are its methods: POST
	// /v1/payments and POST /v1/refunds.
	GRPCCreatePayment = "/" + GRPCService + "/CreatePayment"
	GRPCCreateRefund  = "/" + GRPCService + "/CreateRefund"
	// MetadataFault is the Idem-Fault header's metadata name.
	MetadataFault = "idem-fault"
)

// pointChargingGRPC is the "charging" point of a payment made over gRPC:
// a name of its own, so that the HTTP face's completer, which keeps
// answers in HTTP's form, leaves it to the gRPC face's, which keeps them
// in gRPC's (idemgrpc.CompleterConfig.Points).
const pointChargingGRPC = "charging-grpc"

// isChargingPoint reports whether name is a payment's "charging" point,
// on either face.
func isChargingPoint(name string) bool { return name == pointCharging || name == pointChargingGRPC }

type grpcFaceKey struct{}

// chargingPointName is the name of the "charging" point of the payment
// ctx runs: the gRPC face's when the call came over gRPC.
func chargingPointName(ctx context.Context) string {
	if ctx.Value(grpcFaceKey{}) != nil {
		return pointChargingGRPC
	}
	return pointCharging
}

// newGRPCFace builds the gRPC face's interceptors, one per method, each
// configured as the HTTP face's middleware of its route is, and, when
// payments run in phases, its completer. It returns their metrics, named
// for the gRPC face as the HTTP face's are for HTTP (idem_grpc_… beside
// idem_http_…), under middleware="grpc-payments" and "grpc-refunds".
func (s *Service) newGRPCFace(c *Config) (collectorSet, error) {
	var metrics collectorSet
	for _, m := range []struct {
		name     string
		method   string
		separate bool
		dst      **idemgrpc.Interceptor
	}{
		{"grpc-payments", GRPCCreatePayment, s.twoStores || s.phased(), &s.grpcPayments},
		{"grpc-refunds", GRPCCreateRefund, s.twoStores, &s.grpcRefunds},
	} {
		obs := idemprom.NewGRPCObserver(m.name)
		ic, err := idemgrpc.New(&idemgrpc.Config{
			Store:           s.keys,
			SeparateTx:      m.separate,
			Scope:           grpcScope,
			Methods:         map[string]idemgrpc.Policy{m.method: idemgrpc.Required},
			Default:         idemgrpc.Off,
			TTL:             c.KeyTTL,
			Lease:           c.KeyLease,
			Holder:          c.Holder,
			InflightWait:    c.InflightWait,
			MemoryReplayFor: c.MemoryReplayFor,
			KeySecret:       c.KeySecret,
			BodyKeys:        c.BodyKeys,
			DiscardBodies:   c.DiscardBodies,
			Keep:            grpcKeep,
			Observer:        idemhttp.Observers(obs, c.Observers.middleware(m.name)),
			Clock:           c.Clock,
			Logger:          c.Logger,
		})
		if err != nil {
			return nil, fmt.Errorf("payments: gRPC interceptor of %s: %w", m.method, err)
		}
		*m.dst = ic
		metrics = append(metrics, idemprom.NewGRPCCollector(m.name, ic), obs)
	}
	if s.phased() {
		comp, err := s.grpcPayments.NewCompleter(&idemgrpc.CompleterConfig{Resume: s.resumeGRPC, Every: c.CompleterEvery, Logger: c.Logger,
			Points: GRPCPoints(), Settle: SettleGRPC})
		if err != nil {
			return nil, fmt.Errorf("payments: gRPC completer: %w", err)
		}
		s.grpcCompleter = comp
		metrics = append(metrics, idemprom.NewGRPCCompleterCollector("grpc-payments", comp))
	}
	return metrics, nil
}

// GRPCPoints names the recovery points the gRPC face's handlers save (its
// completer's CompleterConfig.Points), as HTTPPoints does the HTTP face's.
func GRPCPoints() []string { return []string{pointChargingGRPC} }

// SettleGRPC is the gRPC face's completer's Settle: an operator's answer
// as the gRPC face answers (see grpcAnswer). A 2xx is the body's members
// in a google.protobuf.Struct, as the face answers a payment; a body that
// is not a JSON object is refused. Any other status is the status whose
// code means what the HTTP status means on this face (idemgrpc.SettleCode,
// as for the handlers' answers: the 409 of a settle as failed is
// FailedPrecondition, as a declined payment's 402 is),
// its message the problem's title and detail; the answer's
// Idem-Settled-By-Operator header becomes idem-settled-by-operator
// metadata.
func SettleGRPC(answer idem.Response) (any, error) {
	if answer.Status >= 200 && answer.Status < 300 {
		out := new(structpb.Struct)
		if err := protojson.Unmarshal(bytes.TrimSpace(answer.Body), out); err != nil {
			return nil, fmt.Errorf("the gRPC face answers with a google.protobuf.Struct, made from a JSON object, and this body is not one: %w", err)
		}
		return out, nil
	}
	_, err := idemgrpc.DefaultSettle(answer)
	return nil, status.Error(idemgrpc.SettleCode(answer.Status), status.Convert(err).Message())
}

// grpcScope makes every tenant's keys its own, as scopeByTenant does on
// HTTP. A call with no tenant gets the empty scope, which idemgrpc
// refuses with Unauthenticated (the face sets no SharedScope).
func grpcScope(ctx context.Context, _ string) (idem.Scope, error) {
	return idem.Scope(tenantFrom(ctx)), nil
}

// grpcKeep keeps what the HTTP face keeps (see keep): InvalidArgument is
// a 400, refused before anything ran, which a corrected call may retry
// under its key.
func grpcKeep(method string, code codes.Code) bool {
	return code != codes.InvalidArgument && idemgrpc.DefaultKeep(method, code)
}

// GRPCServer returns a gRPC server with the face's interceptors and its
// service registered, built with opts beside them; nil when the service
// was made without Config.GRPC.
func (s *Service) GRPCServer(opts ...grpc.ServerOption) *grpc.Server {
	if s.grpcPayments == nil {
		return nil
	}
	srv := grpc.NewServer(append(opts, grpc.ChainUnaryInterceptor(s.grpcTimeout, s.grpcUnary))...)
	call := func(path string, h http.HandlerFunc) func(any, context.Context, func(any) error, grpc.UnaryServerInterceptor) (any, error) {
		run := s.grpcHandler(path, s.wakeRelay(h))
		return func(_ any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
			in := new(structpb.Struct)
			if err := dec(in); err != nil {
				return nil, err
			}
			method := GRPCCreatePayment
			if path == "/v1/refunds" {
				method = GRPCCreateRefund
			}
			return ic(ctx, in, &grpc.UnaryServerInfo{FullMethod: method}, func(ctx context.Context, req any) (any, error) {
				return run(ctx, req.(*structpb.Struct))
			})
		}
	}
	srv.RegisterService(&grpc.ServiceDesc{
		ServiceName: GRPCService,
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{
			{MethodName: "CreatePayment", Handler: call("/v1/payments", s.createPayment)},
			{MethodName: "CreateRefund", Handler: call("/v1/refunds", s.createRefund)},
		},
	}, struct{}{})
	return srv
}

// grpcRequestTimeout is what a call that ran out of time is answered: the
// gRPC form of requestTimeoutBody (HTTP's 503 is Unavailable).
var grpcRequestTimeout = status.Error(codes.Unavailable, "request-timeout: The call did not finish in time: "+
	"the database or the card network did not answer. It may still complete: retry with the same idempotency-key, "+
	"which replays its result if it did.")

// grpcTimeout bounds every call by Config.RequestTimeout, as
// withRequestTimeout bounds every HTTP request: past it the call ends
// Unavailable whatever it waits for (the card network, a duplicate's
// in-flight wait, a stalled database), with or without a client deadline.
// The call's context is cancelled then, and what it was writing commits or
// not as a whole; the interceptor records what it did under its key, and a
// retry with the key finds out which. A call the client cancelled ends as
// its context says.
func (s *Service) grpcTimeout(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if s.requestTimeout <= 0 {
		return handler(ctx, req)
	}
	tctx, cancel := context.WithTimeout(ctx, s.requestTimeout)
	defer cancel()
	type result struct {
		out any
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := handler(tctx, req)
		done <- result{out, err}
	}()
	select {
	case r := <-done:
		return r.out, r.err
	case <-tctx.Done():
		if err := ctx.Err(); err != nil {
			return nil, status.FromContextError(err).Err()
		}
		return nil, grpcRequestTimeout
	}
}

// grpcUnary authenticates the call, reads its faults, and hands it to the
// interceptor of its method: what the HTTP face's wrappers do around its
// middleware (see routes).
func (s *Service) grpcUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (out any, err error) {
	md, _ := metadata.FromIncomingContext(ctx)
	tenant := ""
	if v := md.Get("authorization"); len(v) == 1 {
		if scheme, token, ok := strings.Cut(v[0], " "); ok && strings.EqualFold(scheme, "Bearer") {
			tenant = s.tenantOf(strings.TrimSpace(token))
		}
	}
	if tenant == "" {
		return nil, status.Error(codes.Unauthenticated, "send a valid API key as 'authorization: Bearer <key>' metadata")
	}
	ctx = context.WithValue(context.WithValue(ctx, tenantKey{}, tenant), grpcFaceKey{}, true)
	if v := md.Get(MetadataFault); s.faults && len(v) > 0 {
		f, err := parseFaults(strings.Join(v, ","))
		if err == nil && (f.dropAfterCommit || f.crashAfterCommit) {
			err = errors.New("drop-after-commit and crash-after-commit act on HTTP answers only")
		}
		if err != nil {
			return nil, status.Error(codes.InvalidArgument, "invalid fault: "+err.Error())
		}
		if f.any() {
			s.logger.InfoContext(ctx, "payments: injecting faults", "method", info.FullMethod, "faults", strings.Join(v, ","))
		}
		ctx = withFaults(ctx, f)
	}
	var ic *idemgrpc.Interceptor
	switch info.FullMethod {
	case GRPCCreatePayment:
		ic = s.grpcPayments
	case GRPCCreateRefund:
		ic = s.grpcRefunds
	default:
		return handler(ctx, req)
	}
	// A crash fault whose Crash returned (a test's) cuts the HTTP
	// connection; here the call ends Unavailable, its key left as the
	// crash left it.
	defer func() {
		if v := recover(); v != nil {
			if v != http.ErrAbortHandler { //nolint:errorlint // a panic value, compared as net/http does
				panic(v)
			}
			out, err = nil, status.Error(codes.Unavailable, "the call was cut off")
		}
	}()
	return ic.Unary()(ctx, req, info, handler)
}

// tenantOf returns the tenant whose API key token is, or "".
func (s *Service) tenantOf(token string) string {
	if token == "" {
		return ""
	}
	sum := sha256.Sum256([]byte(token))
	tenant := ""
	// Compare with every key, without stopping at a match, so the time
	// taken says nothing about which keys exist.
	for _, k := range s.apiKeys {
		if subtle.ConstantTimeCompare(sum[:], k.sum[:]) == 1 {
			tenant = k.tenant
		}
	}
	return tenant
}

// grpcHandler runs h, the HTTP face's handler of path, for a call: its
// request's members as the JSON body, its idempotency key as the
// Idempotency-Key header (the charge's metadata carries its digest, and
// the recovery point the key, sealed), and h's answer as the call's.
func (s *Service) grpcHandler(path string, h http.Handler) func(context.Context, *structpb.Struct) (*structpb.Struct, error) {
	return func(ctx context.Context, in *structpb.Struct) (*structpb.Struct, error) {
		body, err := protojson.Marshal(in)
		if err != nil {
			return nil, status.Error(codes.InvalidArgument, "the request cannot be read as JSON: "+err.Error())
		}
		r, err := http.NewRequestWithContext(ctx, http.MethodPost, path, bytes.NewReader(body))
		if err != nil {
			return nil, status.Error(codes.Internal, "the request could not be made")
		}
		r.Header.Set("Content-Type", "application/json")
		if md, _ := metadata.FromIncomingContext(ctx); len(md.Get(idemgrpc.MetadataKey)) == 1 {
			r.Header.Set(idemhttp.HeaderKey, md.Get(idemgrpc.MetadataKey)[0])
		}
		held := &heldResponse{header: http.Header{}}
		h.ServeHTTP(held, r)
		return grpcAnswer(held.status, held.body)
	}
}

// resumeGRPC is the gRPC face's completer's Resume: resume's, answered as
// the gRPC face answers.
func (s *Service) resumeGRPC(ctx context.Context, ex idemgrpc.Execution) (any, error) {
	if ex.Recovery.Name != pointChargingGRPC {
		return nil, fmt.Errorf("payments: no phase of the gRPC face goes on from recovery point %q", ex.Recovery.Name)
	}
	pt, err := decodeCharging(ex.Recovery.Data)
	if err != nil {
		return nil, err
	}
	r, err := http.NewRequestWithContext(context.WithValue(ctx, grpcFaceKey{}, true), http.MethodPost, "/v1/payments", nil)
	if err != nil {
		return nil, err
	}
	held := &heldResponse{header: http.Header{}}
	s.chargeAndRecord(held, r, pt.Payment, pt.ClientKey)
	return grpcAnswer(held.status, held.body)
}

// grpcAnswer is the HTTP face's answer (status, JSON body) as the gRPC
// face's: 2xx as the body's members in a Struct, a problem as the status
// whose code means what its HTTP status means, its message the problem's
// slug and detail. The code is idemgrpc.SettleCode's, the one rule of the
// face's answers and the operator's settled ones: a key reused for another
// operation (422) is FailedPrecondition, as the interceptor's own refusal
// of a reused key is, so that a client branches on one code for it.
func grpcAnswer(code int, body []byte) (*structpb.Struct, error) {
	if code == 0 {
		code = http.StatusOK
	}
	if code >= 200 && code < 300 {
		out := new(structpb.Struct)
		if err := protojson.Unmarshal(bytes.TrimSpace(body), out); err != nil {
			return nil, status.Error(codes.Internal, "the answer could not be encoded")
		}
		return out, nil
	}
	var p struct {
		Type   string `json:"type"`
		Detail string `json:"detail"`
	}
	_ = json.Unmarshal(body, &p)
	msg := strings.TrimPrefix(p.Type, ProblemTypePrefix)
	if p.Detail != "" {
		msg += ": " + p.Detail
	}
	return nil, status.Error(idemgrpc.SettleCode(code), msg)
}
