package storetest_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemgrpc"
	"github.com/idem-go/idem/idemgrpc/internal/grpcsuite"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/idemredis"
	"github.com/idem-go/idem/idemtest"
	"github.com/idem-go/idem/keyed"
)

// grpcFace is idemgrpc's face for idemtest.TestFace: the Interceptor in
// front of the suite's handler on a grpc-go server (grpcsuite's Harness,
// one shared scope), behind a recoverer that answers a panic Internal
// "panic: …", and a client that calls Create with the body in a message.
// Replies are OK (Created, the body in the answer), FailedPrecondition
// (Refused) and Unavailable (Transient), the body as the status's message.
type grpcFace struct{}

func (grpcFace) Name() string { return "grpc" }

func (grpcFace) Serve(t *testing.T, cfg idemtest.FaceConfig) idemtest.Server {
	t.Helper()
	e := cfg.Engine
	recoverer := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
		defer func() {
			if v := recover(); v != nil {
				err = status.Errorf(codes.Internal, "panic: %v", v)
			}
		}()
		return handler(ctx, req)
	}
	arrived := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if cfg.Arrived != nil {
			cfg.Arrived(ctx)
		}
		return handler(ctx, req)
	}
	h := grpcsuite.New(t, idemgrpc.Config{Store: e.Store, SeparateTx: e.SeparateTx, SharedScope: true, TTL: e.TTL, Lease: e.Lease,
		Timeout: e.Timeout, Holder: e.Holder, Timers: e.Timers, InflightWait: e.InflightWait, PollInterval: e.PollInterval,
		RecentKeys: e.RecentKeys, MemoryReplayFor: e.MemoryReplayFor, MemoryReplayBytes: e.MemoryReplayBytes, Clock: e.Clock,
		KeySecret: e.KeySecret, BodyKeys: e.BodyKeys, DiscardBodies: e.DiscardBodies, Observer: e.Observer, Logger: e.Logger},
		&grpcsuite.Options{Outer: []grpc.UnaryServerInterceptor{arrived, recoverer}})
	h.Handle(func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
		return replyOf(cfg.Handler(ctx, req.Fields["body"].GetStringValue()))
	})
	return &grpcServer{h: h}
}

func replyOf(r idemtest.Reply) (*structpb.Struct, error) {
	switch r.Kind {
	case idemtest.Refused:
		return nil, status.Error(codes.FailedPrecondition, r.Body)
	case idemtest.Transient:
		return nil, status.Error(codes.Unavailable, r.Body)
	}
	return &structpb.Struct{Fields: map[string]*structpb.Value{"body": structpb.NewStringValue(r.Body)}}, nil
}

type grpcServer struct{ h *grpcsuite.Harness }

func (s *grpcServer) Do(ctx context.Context, key, body string) idemtest.Answer {
	req := &structpb.Struct{Fields: map[string]*structpb.Value{"body": structpb.NewStringValue(body)}}
	out, header, err := s.h.Call(ctx, key, req)
	a := idemtest.Answer{Replayed: len(header[idemgrpc.MetadataReplayed]) == 1 && header[idemgrpc.MetadataReplayed][0] == "true"}
	if err == nil {
		a.Kind, a.Body, a.Raw = idemtest.Created, out.Fields["body"].GetStringValue(), "OK "+out.String()
		return a
	}
	st := status.Convert(err)
	a.Raw = st.Code().String() + " " + st.Message()
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			a.RetryAfter = ri.GetRetryDelay().AsDuration()
		}
	}
	switch reason := idemgrpc.Reason(err); {
	case reason == idemgrpc.ReasonKeyMismatch:
		a.Kind = idemtest.Mismatch
	case reason == idemgrpc.ReasonInFlight:
		a.Kind = idemtest.InFlight
	case reason == idemgrpc.ReasonStoreUnavailable:
		a.Kind = idemtest.Unavailable
	case reason == idemgrpc.ReasonLeaseLost:
		a.Kind = idemtest.LeaseLost
	case reason != "":
		a.Kind = idemtest.Other
	case ctx.Err() != nil, st.Code() == codes.DeadlineExceeded && deadlineEnds(ctx):
		// The server's deadline, the caller's as it arrived, may end a
		// moment before the caller's context does: its DeadlineExceeded
		// is the caller giving up all the same.
		a.Kind = idemtest.Gone
	case st.Code() == codes.Internal && strings.HasPrefix(st.Message(), "panic: "):
		a.Kind = idemtest.Failed
	case st.Code() == codes.Internal && strings.Contains(st.Message(), "kept answer cannot be read"):
		a.Kind = idemtest.Unreadable
	case st.Code() == codes.FailedPrecondition:
		a.Kind, a.Body = idemtest.Refused, st.Message()
	case st.Code() == codes.Unavailable:
		a.Kind, a.Body = idemtest.Transient, st.Message()
	default:
		a.Kind = idemtest.Other
	}
	return a
}

func (s *grpcServer) Counts() map[keyed.Outcome]uint64 { return s.h.Interceptor.Counts() }

func (s *grpcServer) Restart(ctx context.Context) (int, error) { return s.h.Interceptor.Restart(ctx) }

func (s *grpcServer) NewCompleter(cfg keyed.CompleterConfig, resume idemtest.FaceResume) (*keyed.Completer, error) {
	return s.h.Interceptor.NewCompleter(&idemgrpc.CompleterConfig{Every: cfg.Every, Timeout: cfg.Timeout, Limit: cfg.Limit,
		Parallel: cfg.Parallel, Logger: cfg.Logger,
		Resume: func(ctx context.Context, ex idemgrpc.Execution) (any, error) {
			// The engine's own Execution, which the context carries: the
			// downstream keys derive from it (keyed.DownstreamKey).
			kex, ok := keyed.ExecutionFromContext(ctx)
			if !ok || kex.Key != ex.Key || kex.Token != ex.Token {
				return nil, fmt.Errorf("the Resume's context carries %+v, its Execution is %+v", kex, ex)
			}
			reply, err := resume(ctx, kex)
			if err != nil {
				return nil, err
			}
			return replyOf(reply)
		}})
}

// The engine's behaviours through idemgrpc, on every store: the same suite
// idemhttp passes (idemtest.TestFace).
func TestFaceMemory(t *testing.T) {
	t.Parallel()
	idemtest.TestFace(t, grpcFace{}, func(t *testing.T, clock idem.Clock) idem.Store {
		return idemmem.NewStore(&idemmem.Config{Clock: clock})
	})
}

func TestFaceSQLite(t *testing.T) {
	t.Parallel()
	idemtest.TestFace(t, grpcFace{}, func(t *testing.T, clock idem.Clock) idem.Store {
		return sqliteStore(t, openSQLite(t), clock)
	})
}

func TestFacePostgres(t *testing.T) {
	t.Parallel()
	url := idemtest.RequireService(t, "PostgreSQL", "IDEM_POSTGRES_URL", defaultPostgresURL)
	idemtest.TestFace(t, grpcFace{}, func(t *testing.T, clock idem.Clock) idem.Store {
		return pgStore(t, openPG(t, url, clock))
	})
}

func TestFaceRedis(t *testing.T) {
	t.Parallel()
	url := idemtest.RequireService(t, "Redis", "IDEM_REDIS_URL", defaultRedisURL)
	opt, err := redis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	client := redis.NewClient(opt)
	t.Cleanup(func() { client.Close() })
	idemtest.TestFace(t, grpcFace{}, func(t *testing.T, clock idem.Clock) idem.Store {
		prefix := randomName("idemgrpc-face-")
		s, err := idemredis.NewStore(t.Context(), client, &idemredis.Config{Prefix: prefix, Clock: clock})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			s.Close()
			deleteKeys(t, client, prefix)
		})
		return s
	})
}

// The suite on idempgsql, PostgreSQL through database/sql (pgx's stdlib
// driver), as idempgsql's own tests run it for idemhttp.
func TestFacePostgresSQL(t *testing.T) {
	t.Parallel()
	url := idemtest.RequireService(t, "PostgreSQL", "IDEM_POSTGRES_URL", defaultPostgresURL)
	idemtest.TestFace(t, grpcFace{}, func(t *testing.T, clock idem.Clock) idem.Store {
		return pgsqlStore(t, url, clock)
	})
}

// deadlineEnds reports whether ctx has a deadline, once it has ended.
func deadlineEnds(ctx context.Context) bool {
	if _, ok := ctx.Deadline(); !ok {
		return false
	}
	<-ctx.Done()
	return true
}
