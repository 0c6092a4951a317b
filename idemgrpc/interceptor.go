package idemgrpc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/descriptorpb"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/internal/keywait"
)

// Interceptor makes unary RPCs idempotent. Create it with New; it is safe
// for concurrent use, and one Interceptor serves every method of a server.
type Interceptor struct {
	cfg       Config
	store     idem.Store
	txStore   idem.TxStore   // the store, in the same-transaction forms
	txClaimer idem.TxClaimer // the store, when it claims in its transaction too
	waiter    idem.Waiter
	replayer  idem.Replayer
	recent    *keywait.Recent // nil: none remembered
	replayMD  []string
	log       *slog.Logger
	local     keywait.Local
	gates     keywait.Gates
	types     responseTypes
	policies  sync.Map        // full method -> Policy, as resolved
	counts    []atomic.Uint64 // one per idemhttp.Outcomes
	obs       idemhttp.Observer
	storeName string
}

// New applies the defaults to cfg, validates it and returns an Interceptor.
func New(cfg *Config) (*Interceptor, error) {
	c, err := withDefaults(cfg)
	if err != nil {
		return nil, err
	}
	i := &Interceptor{cfg: c, store: c.Store, log: c.Logger, obs: c.Observer, storeName: fmt.Sprintf("%T", c.Store),
		counts: make([]atomic.Uint64, len(idemhttp.Outcomes))}
	i.waiter, _ = c.Store.(idem.Waiter)
	i.replayer, _ = c.Store.(idem.Replayer)
	i.recent = keywait.NewRecent(c.RecentKeys, c.MemoryReplayFor, c.MemoryReplayBytes, c.Clock)
	if ts, ok := c.Store.(idem.TxStore); ok && !c.SeparateTx {
		i.txStore = ts
		i.txClaimer, _ = ts.(idem.TxClaimer)
	}
	for _, name := range c.ReplayMetadata {
		name = strings.ToLower(name)
		if name == MetadataKey || name == MetadataReplayed || strings.HasPrefix(name, "grpc-") || name == "authorization" {
			return nil, &idem.ArgumentError{Field: "idemgrpc.Config.ReplayMetadata", Reason: name + " must never be replayed"}
		}
		i.replayMD = append(i.replayMD, name)
	}
	return i, nil
}

// Counts returns how many protected calls ended in each Outcome (idemhttp's
// outcomes: the same names, counted the same way).
func (i *Interceptor) Counts() map[idemhttp.Outcome]uint64 {
	out := make(map[idemhttp.Outcome]uint64, len(idemhttp.Outcomes))
	for j, o := range idemhttp.Outcomes {
		out[o] = i.counts[j].Load()
	}
	return out
}

func (i *Interceptor) count(o idemhttp.Outcome) {
	for j, x := range idemhttp.Outcomes {
		if x == o && j < len(i.counts) {
			i.counts[j].Add(1)
			return
		}
	}
}

// Policy returns the policy of fullMethod's calls: its entry in
// Config.Methods, its service's, or Config.Default.
func (i *Interceptor) Policy(fullMethod string) Policy {
	if p, ok := i.policies.Load(fullMethod); ok {
		return p.(Policy)
	}
	return resolvePolicy(i.cfg.Methods, i.cfg.Default, fullMethod)
}

// unaryPolicy is Policy, remembered: grpc-go calls unary interceptors only
// for the methods a server registered, which are few, so the map stays
// small. (Streams reach Stream for any name a client makes up, when the
// server has an UnknownServiceHandler: theirs are not remembered.)
func (i *Interceptor) unaryPolicy(fullMethod string) Policy {
	if p, ok := i.policies.Load(fullMethod); ok {
		return p.(Policy)
	}
	p := resolvePolicy(i.cfg.Methods, i.cfg.Default, fullMethod)
	i.policies.Store(fullMethod, p)
	return p
}

func resolvePolicy(methods map[string]Policy, def Policy, fullMethod string) Policy {
	if p, ok := methods[fullMethod]; ok {
		return p
	}
	if svc, _, ok := splitMethod(fullMethod); ok {
		if p, ok := methods["/"+svc+"/*"]; ok {
			return p
		}
	}
	if def != 0 {
		return def
	}
	if md := methodDescriptor(fullMethod); md != nil {
		if opts, ok := md.Options().(*descriptorpb.MethodOptions); ok {
			switch opts.GetIdempotencyLevel() {
			case descriptorpb.MethodOptions_NO_SIDE_EFFECTS, descriptorpb.MethodOptions_IDEMPOTENT:
				return Off
			}
		}
	}
	return Required
}

// Unary returns the unary server interceptor (grpc.UnaryInterceptor, or
// one of grpc.ChainUnaryInterceptor's). Put it after the interceptors that
// authenticate the caller (Config.Scope reads what they found) and after
// any that recovers panics (a handler's panic releases the key and goes
// on up).
func (i *Interceptor) Unary() grpc.UnaryServerInterceptor {
	return i.intercept
}

// Stream returns the stream server interceptor. Streaming RPCs are not
// protected: a stream's messages are many and its answer is not one
// message to keep. A stream that carries an idempotency key to a method
// whose policy is not Off is refused with Unimplemented (reason
// ReasonStreaming), so that its client does not believe it is protected;
// every other stream passes through untouched. Without this interceptor,
// streams pass through whatever they carry.
func (i *Interceptor) Stream() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if i.Policy(info.FullMethod) != Off {
			if md, _ := metadata.FromIncomingContext(ss.Context()); len(md.Get(MetadataKey)) > 0 {
				i.count(idemhttp.OutcomeRejected)
				return refusal(codes.Unimplemented, ReasonStreaming,
					"idempotency keys protect unary calls only; this streaming call was not run", 0)
			}
		}
		return handler(srv, ss)
	}
}

// call is one protected call.
type call struct {
	i      *Interceptor
	ctx    context.Context
	method string
	log    callLog
	obs    *observation
}

func (i *Interceptor) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	pol := i.unaryPolicy(info.FullMethod)
	if pol == Off {
		return handler(ctx, req)
	}
	md, _ := metadata.FromIncomingContext(ctx)
	values := md.Get(MetadataKey)
	if len(values) == 0 && pol == Optional {
		return handler(ctx, req)
	}
	c := &call{i: i, ctx: ctx, method: info.FullMethod, log: callLog{l: i.log, method: info.FullMethod}}
	if i.obs != nil {
		defer c.observe()()
	}
	return c.serve(values, req, handler)
}

func (c *call) serve(values []string, req any, handler grpc.UnaryHandler) (any, error) {
	i := c.i
	switch {
	case len(values) == 0:
		c.tally(idemhttp.OutcomeRejected)
		return nil, refusal(codes.InvalidArgument, ReasonKeyMissing,
			"this call must carry idempotency-key metadata: a unique value (a UUID, say) per intended operation, reused only to retry it", 0)
	case len(values) > 1:
		c.tally(idemhttp.OutcomeRejected)
		return nil, refusal(codes.InvalidArgument, ReasonKeyInvalid, "send exactly one idempotency-key", 0)
	}
	key, err := idem.ParseKey(values[0])
	if err != nil {
		c.tally(idemhttp.OutcomeRejected)
		msg := err.Error()
		var ke *idem.KeyError
		if errors.As(err, &ke) {
			msg = "the idempotency-key is " + ke.Reason + "; it must be 1 to 255 visible ASCII characters"
		}
		return nil, refusal(codes.InvalidArgument, ReasonKeyInvalid, msg, 0)
	}
	var scope idem.Scope
	if i.cfg.Scope != nil {
		if scope, err = i.cfg.Scope(c.ctx, c.method); err != nil {
			c.tally(idemhttp.OutcomeRejected)
			if _, ok := status.FromError(err); ok {
				return nil, err // written for the client
			}
			c.log.LogAttrs(c.ctx, slog.LevelWarn, "scope unavailable: call refused", slog.Any("key", key), slog.String("error", err.Error()))
			return nil, refusal(codes.Unauthenticated, ReasonScope,
				"the server could not tell whom this call's idempotency-key belongs to, so nothing was run", 0)
		}
	}
	if i.cfg.KeySecret != nil {
		key = idemhttp.SealKey(i.cfg.KeySecret, scope, key)
	}
	c.log.scope, c.log.key = scope, key
	c.noteKey(scope, key)
	msg, ok := req.(proto.Message)
	if !ok {
		c.tally(idemhttp.OutcomeRejected)
		c.log.LogAttrs(c.ctx, slog.LevelError, "request is not a protocol buffer message: call refused", slog.String("type", fmt.Sprintf("%T", req)))
		return nil, refusal(codes.Internal, ReasonRequestType, "the server cannot fingerprint this call's request; nothing was run", 0)
	}
	body, err := deterministic.Marshal(msg)
	if err != nil {
		c.tally(idemhttp.OutcomeRejected)
		return nil, refusal(codes.InvalidArgument, ReasonRequestType, "the request cannot be encoded: "+err.Error(), 0)
	}
	// gRPC is HTTP/2: a POST to the full method name, so the fingerprint is
	// idemhttp's recipe over the request as it travels (encoded
	// deterministically, so that a client's field order does not matter).
	fp := idem.NewFingerprint("POST", c.method, "", "application/grpc", body)
	creq := idem.ClaimRequest{Scope: scope, Key: key, Fingerprint: fp, Lease: i.cfg.Lease, TTL: i.cfg.TTL}
	wk := keywait.Key{Scope: scope, Key: key}
	switch kept, seen := i.recent.Lookup(wk, fp); {
	case kept != nil:
		return c.replay(kept)
	case !seen:
		creq.Unseen = true
	default:
		if answered, resp, err := c.answerFromRecord(creq); answered {
			return resp, err
		}
	}

	deadline := time.Now().Add(i.cfg.InflightWait)
	if d, ok := c.ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	var watch <-chan struct{}
	var endWatch func()
	defer func() {
		if endWatch != nil {
			endWatch()
		}
	}()
	waits := 0
	c.begin(c.ctx, idemhttp.PhaseClaim)
	for {
		var claim idem.Claim
		var answered bool
		var resp any
		if i.txClaimer != nil {
			claim, answered, resp, err = c.claimInTx(req, handler, creq, deadline)
			if answered {
				return resp, err
			}
		} else {
			c.markStore()
			claim, err = i.store.Claim(c.ctx, creq)
			c.storeSince(idemhttp.StoreClaim, err)
		}
		if err != nil {
			c.end(idemhttp.PhaseClaim, idemhttp.Event{Claim: idemhttp.ClaimError, Err: err})
			c.tally(idemhttp.OutcomeStoreError)
			c.log.LogAttrs(c.ctx, slog.LevelError, "idempotency store unavailable: call refused", slog.String("error", err.Error()))
			return nil, refusal(codes.Unavailable, ReasonStoreUnavailable,
				"the call was not run, because its idempotency key could not be claimed; retry with the same key", time.Second)
		}
		switch claim.Outcome {
		case idem.Mismatch:
			return nil, c.refuseMismatch(claim.Record.State)
		case idem.Completed:
			c.end(idemhttp.PhaseClaim, idemhttp.Event{Claim: idemhttp.ClaimCompleted})
			i.recent.Keep(wk, claim.Record.Fingerprint, claim.Record.Response, claim.Record.ExpiresAt)
			return c.replay(claim.Record.Response)
		case idem.InFlight:
			creq.Unseen = false
			if watch == nil {
				// Watch from now on and claim again at once, so that a
				// completion between the claim and the watch is not missed.
				watch, endWatch = i.local.Watch(wk)
				continue
			}
			if !c.waitChange(wk, watch, deadline, waits) {
				return nil, c.inFlightTooLong()
			}
			waits++
			endWatch()
			watch, endWatch = i.local.Watch(wk)
		case idem.Acquired:
			if endWatch != nil {
				endWatch()
				endWatch = nil
			}
			c.end(idemhttp.PhaseClaim, idemhttp.Event{Claim: idemhttp.ClaimAcquired, TookOver: claim.TookOver})
			if claim.TookOver {
				c.log.LogAttrs(c.ctx, slog.LevelWarn, "took over an expired lease: an earlier execution may have crashed", slog.Int64("token", int64(claim.Token)))
			}
			ex := Execution{Scope: scope, Key: key, FullMethod: c.method, Token: claim.Token, ClaimedAt: claim.Record.CreatedAt, TookOver: claim.TookOver}
			return c.execute(req, handler, ex, fp, claim.Record.ExpiresAt)
		default:
			c.end(idemhttp.PhaseClaim, idemhttp.Event{Claim: idemhttp.ClaimError})
			c.tally(idemhttp.OutcomeStoreError)
			c.log.LogAttrs(c.ctx, slog.LevelError, "idempotency store returned an unknown outcome", slog.Int("outcome", int(claim.Outcome)))
			return nil, refusal(codes.Unavailable, ReasonStoreUnavailable, "the call was not run; retry with the same key", time.Second)
		}
	}
}
