package idemgrpc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/descriptorpb"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/keyed"
)

// Interceptor makes unary RPCs idempotent. Create it with New; it is safe
// for concurrent use, and one Interceptor serves every method of a server.
// It is a face of the engine (package keyed): it reads the key from the
// call's metadata and fingerprints its request, and speaks the engine's
// answers as gRPC statuses; every decision about the key is the engine's.
type Interceptor struct {
	cfg      Config
	eng      *keyed.Engine
	replayMD []string
	log      *slog.Logger
	types    responseTypes
	policies sync.Map // full method -> Policy, as resolved
}

// New applies the defaults to cfg, validates it and returns an Interceptor.
func New(cfg *Config) (*Interceptor, error) {
	c, err := withDefaults(cfg)
	if err != nil {
		return nil, err
	}
	eng, err := keyed.New(c.engineConfig())
	if err != nil {
		return nil, renamed(err)
	}
	c.applied(eng.Config())
	i := &Interceptor{cfg: c, eng: eng, log: c.Logger}
	for _, name := range c.ReplayMetadata {
		name = strings.ToLower(name)
		if name == MetadataKey || name == MetadataReplayed || strings.HasPrefix(name, "grpc-") || name == "authorization" {
			return nil, &idem.ArgumentError{Field: "idemgrpc.Config.ReplayMetadata", Reason: name + " must never be replayed"}
		}
		i.replayMD = append(i.replayMD, name)
	}
	return i, nil
}

// Engine returns the engine the interceptor is a face of.
func (i *Interceptor) Engine() *keyed.Engine { return i.eng }

// Counts returns how many protected calls ended in each Outcome: the
// engine's outcomes, the same names as idemhttp's, counted the same way.
func (i *Interceptor) Counts() map[keyed.Outcome]uint64 { return i.eng.Counts() }

// Policy returns the policy of fullMethod's calls: its entry in
// Config.Methods, its service's; Off for the health and reflection
// services; else Config.Default, or the descriptor's idempotency_level.
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

// infrastructure are the services whose calls pass through without a key
// unless Config.Methods names them: what a platform calls on every server
// (a health probe, grpcurl listing services) knows nothing of keys, reads
// only, and must not be refused because the server protects its own
// methods.
var infrastructure = []string{"grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection"}

func resolvePolicy(methods map[string]Policy, def Policy, fullMethod string) Policy {
	if p, ok := methods[fullMethod]; ok {
		return p
	}
	if svc, _, ok := splitMethod(fullMethod); ok {
		if p, ok := methods["/"+svc+"/*"]; ok {
			return p
		}
	}
	if svc, _, ok := splitMethod(fullMethod); ok && slices.Contains(infrastructure, svc) {
		return Off
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
				i.eng.Reject(ss.Context(), "", "")
				return refusal(codes.Unimplemented, ReasonStreaming,
					"idempotency keys protect unary calls only; this streaming call was not run", 0)
			}
		}
		return handler(srv, ss)
	}
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
	if i.eng.Observed() {
		// The Event's Request is the call as the HTTP/2 request it is, so
		// that an observer written for idemhttp names it sensibly.
		r := &http.Request{Method: http.MethodPost, URL: &url.URL{Path: info.FullMethod}, Proto: "HTTP/2.0", ProtoMajor: 2,
			Header: http.Header{"Content-Type": {"application/grpc"}}, RequestURI: info.FullMethod}
		ctx = i.eng.Begin(ctx, r.WithContext(ctx))
		defer i.eng.End(ctx)
	}
	c := &call{i: i, ctx: ctx, method: info.FullMethod, req: req, handler: handler}
	c.serve(values)
	if c.raise != nil {
		panic(c.raise) // the handler's, once the key is settled
	}
	return c.out, c.outErr
}

// reject refuses a call before the engine sees it.
func (c *call) reject(err error) {
	c.i.eng.Reject(c.ctx, "", "")
	c.outErr = err
}

func (c *call) serve(values []string) {
	i := c.i
	switch {
	case len(values) == 0:
		c.reject(refusal(codes.InvalidArgument, ReasonKeyMissing,
			"this call must carry idempotency-key metadata: a unique value (a UUID, say) per intended operation, reused only to retry it", 0))
		return
	case len(values) > 1:
		c.reject(refusal(codes.InvalidArgument, ReasonKeyInvalid, "send exactly one idempotency-key", 0))
		return
	}
	key, err := idem.ParseKey(values[0])
	if err != nil {
		msg := err.Error()
		var ke *idem.KeyError
		if errors.As(err, &ke) {
			msg = "the idempotency-key is " + ke.Reason + "; it must be 1 to 255 visible ASCII characters"
		}
		c.reject(refusal(codes.InvalidArgument, ReasonKeyInvalid, msg, 0))
		return
	}
	var scope idem.Scope
	if i.cfg.Scope != nil {
		if scope, err = i.cfg.Scope(c.ctx, c.method); err != nil {
			if _, ok := status.FromError(err); ok {
				c.reject(err) // written for the client
				return
			}
			i.log.LogAttrs(c.ctx, slog.LevelWarn, "scope unavailable: call refused", slog.Any("key", key),
				slog.String("method", c.method), slog.String("error", err.Error()))
			c.reject(refusal(codes.Unauthenticated, ReasonScope,
				"the server could not tell whom this call's idempotency-key belongs to, so nothing was run", 0))
			return
		}
		if scope == "" && !i.cfg.SharedScope {
			// A Scope that reads a tenant from metadata the call lacks:
			// such calls must not share one set of keys and answers.
			i.log.LogAttrs(c.ctx, slog.LevelWarn, "empty scope: call refused", slog.Any("key", key), slog.String("method", c.method))
			c.reject(refusal(codes.Unauthenticated, ReasonScope,
				"the server could not tell whom this call's idempotency-key belongs to (no tenant or credentials), so nothing was run", 0))
			return
		}
	}
	msg, ok := c.req.(proto.Message)
	if !ok {
		i.log.LogAttrs(c.ctx, slog.LevelError, "request is not a protocol buffer message: call refused", slog.Any("scope", scope),
			slog.String("key", idem.KeyDigest(scope, i.eng.SealKey(scope, key))), slog.String("method", c.method), slog.String("type", fmt.Sprintf("%T", c.req)))
		c.i.eng.Reject(c.ctx, scope, key)
		c.outErr = refusal(codes.Internal, ReasonRequestType, "the server cannot fingerprint this call's request; nothing was run", 0)
		return
	}
	body, err := deterministic.Marshal(msg)
	if err != nil {
		c.i.eng.Reject(c.ctx, scope, key)
		c.outErr = refusal(codes.InvalidArgument, ReasonRequestType, "the request cannot be encoded: "+err.Error(), 0)
		return
	}
	// gRPC is HTTP/2: a POST to the full method name, so the fingerprint is
	// idemhttp's recipe over the request as it travels (encoded
	// deterministically, so that a client's field order does not matter).
	fp := idem.NewFingerprint("POST", c.method, "", "application/grpc", body)
	i.eng.Serve(c.ctx, keyed.Request{Scope: scope, Key: key, Fingerprint: fp, Method: c.method}, c)
}

// Restart ends at once the leases an earlier incarnation of this replica
// (Config.Holder) held when it died, on a store that keeps holders
// (idem.Restarter), and returns how many: see keyed.Engine.Restart. Call
// it once as the process starts, before the Completer.
func (i *Interceptor) Restart(ctx context.Context) (int, error) { return i.eng.Restart(ctx) }
