package bench

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/jackc/pgx/v5"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemgrpc"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/idemsqlite"
)

// The gRPC measurements (Options.GRPC) put idemgrpc's interceptor, on the
// same store and database as the HTTP ones, in front of the same payment
// (the debit and the payment's row in the key's transaction), against a
// hand-written interceptor doing the least the same guarantee takes: one
// transaction with the key's INSERT … ON CONFLICT DO NOTHING, the payment's
// work and the kept answer's UPDATE; and for replays one SELECT of the kept
// answer, decoded into the response message. As for HTTP, calls are served
// in-process: the interceptor is called as grpc-go calls it, with the
// call's metadata and a stand-in for its stream, without the transport.

const grpcMethod = "/bench.Payments/Create"

var (
	grpcInfo    = &grpc.UnaryServerInfo{FullMethod: grpcMethod}
	grpcRequest = mustStruct(map[string]any{"account_id": "acct_1", "amount": 1, "currency": "KRW"})
	grpcAnswer  = mustStruct(map[string]any{"id": "pay_bench", "status": "succeeded"})
)

func mustStruct(m map[string]any) *structpb.Struct {
	s, err := structpb.NewStruct(m)
	if err != nil {
		panic(err)
	}
	return s
}

// benchStream stands in for a call's transport stream, so that the
// interceptors' SetHeader has somewhere to go.
type benchStream struct{}

func (benchStream) Method() string               { return grpcMethod }
func (benchStream) SetHeader(metadata.MD) error  { return nil }
func (benchStream) SendHeader(metadata.MD) error { return nil }
func (benchStream) SetTrailer(metadata.MD) error { return nil }

// callGRPC makes one call of account acct's payment with key through ic in
// front of handler, and checks the answer.
func callGRPC(ctx context.Context, ic grpc.UnaryServerInterceptor, handler grpc.UnaryHandler, key string, acct int) error {
	ctx = metadata.NewIncomingContext(context.WithValue(ctx, accountKey{}, acct), metadata.Pairs(idemgrpc.MetadataKey, key))
	ctx = grpc.NewContextWithServerTransportStream(ctx, benchStream{})
	resp, err := ic(ctx, grpcRequest, grpcInfo, handler)
	if err != nil {
		return err
	}
	if m, ok := resp.(*structpb.Struct); !ok || m.Fields["id"].GetStringValue() != "pay_bench" {
		return fmt.Errorf("answer %v", resp)
	}
	return nil
}

// grpcSides measures the interceptor on store against the hand-written
// minimum (first and replay), both doing the payment with pay.
type grpcSides struct {
	store    idem.Store
	accounts int
	// pay does the payment's work, in ctx's transaction for the
	// interceptor's handler.
	pay func(ctx context.Context, acct int) error
	// minimum is the hand-written interceptor for a first execution,
	// minimumReplay for a replay.
	minimum, minimumReplay grpc.UnaryServerInterceptor
}

func runGRPC(ctx context.Context, o *Options, storeName string, g grpcSides) ([]Comparison, error) {
	cfg := &idemgrpc.Config{Store: g.store, SharedScope: true, TTL: benchTTL}
	if o.StoreReplays {
		cfg.MemoryReplayFor = -1
	}
	ic, err := idemgrpc.New(cfg)
	if err != nil {
		return nil, err
	}
	handler := func(ctx context.Context, req any) (any, error) {
		if err := g.pay(ctx, ctx.Value(accountKey{}).(int)); err != nil {
			return nil, status.Error(codes.Unavailable, err.Error())
		}
		return grpcAnswer, nil
	}
	noHandler := func(context.Context, any) (any, error) {
		return nil, status.Error(codes.Internal, "the minimum runs no handler")
	}
	mwFirst := side{name: "middleware", do: func(ctx context.Context, round, i int) error {
		return callGRPC(ctx, ic.Unary(), handler, fmt.Sprintf("grpc-first-%d-%d", round, i), i%g.accounts)
	}}
	minFirst := side{name: "minimum", do: func(ctx context.Context, round, i int) error {
		return callGRPC(ctx, g.minimum, noHandler, fmt.Sprintf("grpc-min-%d-%d", round, i), i%g.accounts)
	}}
	first, err := compareProto(ctx, o, "grpc", storeName, "first", mwFirst, minFirst)
	if err != nil {
		return nil, err
	}
	if err := callGRPC(ctx, ic.Unary(), handler, "grpc-replayed", 0); err != nil {
		return nil, err
	}
	if err := minFirst.do(ctx, -1, 0); err != nil {
		return nil, err
	}
	replay, err := compareProto(ctx, o, "grpc", storeName, "replay",
		side{name: "middleware", do: func(ctx context.Context, round, i int) error {
			return callGRPC(ctx, ic.Unary(), handler, "grpc-replayed", 0)
		}},
		side{name: "minimum", do: func(ctx context.Context, round, i int) error {
			return callGRPC(ctx, g.minimumReplay, noHandler, "grpc-min--1-0", 0)
		}})
	if err != nil {
		return nil, err
	}
	return []Comparison{first, replay}, nil
}

func keyOf(ctx context.Context) string {
	md, _ := metadata.FromIncomingContext(ctx)
	if v := md.Get(idemgrpc.MetadataKey); len(v) == 1 {
		return v[0]
	}
	return ""
}

// decodeAnswer is the minimum's replay: the kept bytes as the response.
func decodeAnswer(b []byte) (any, error) {
	m := new(structpb.Struct)
	if err := proto.Unmarshal(b, m); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return m, nil
}

var deterministic = proto.MarshalOptions{Deterministic: true}

func grpcSQLite(ctx context.Context, o *Options, db *idemsqlite.DB, store idem.Store, accounts int) ([]Comparison, error) {
	return runGRPC(ctx, o, "sqlite", grpcSides{
		store: store, accounts: accounts,
		pay: func(ctx context.Context, acct int) error {
			return db.WithTx(ctx, func(ctx context.Context, tx *sql.Tx) error { return sqliteDebit(ctx, tx, acct) })
		},
		minimum: func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, _ grpc.UnaryHandler) (any, error) {
			key, acct := keyOf(ctx), ctx.Value(accountKey{}).(int)
			err := func() error {
				tx, err := db.Writer().BeginTx(ctx, nil)
				if err != nil {
					return err
				}
				defer tx.Rollback()
				res, err := tx.ExecContext(ctx, `INSERT INTO bench_keys (key) VALUES (?) ON CONFLICT DO NOTHING`, key)
				if err != nil {
					return err
				}
				if n, _ := res.RowsAffected(); n != 1 {
					return fmt.Errorf("key %s already claimed", key)
				}
				if err := sqliteDebit(ctx, tx, acct); err != nil {
					return err
				}
				b, err := deterministic.Marshal(grpcAnswer)
				if err != nil {
					return err
				}
				if _, err := tx.ExecContext(ctx, `UPDATE bench_keys SET status = 0, body = ? WHERE key = ?`, b, key); err != nil {
					return err
				}
				return tx.Commit()
			}()
			if err != nil {
				return nil, status.Error(codes.Unavailable, err.Error())
			}
			return grpcAnswer, nil
		},
		minimumReplay: func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, _ grpc.UnaryHandler) (any, error) {
			var b []byte
			if err := db.Reader().QueryRowContext(ctx, `SELECT body FROM bench_keys WHERE key = ?`, keyOf(ctx)).Scan(&b); err != nil {
				return nil, status.Error(codes.Unavailable, err.Error())
			}
			return decodeAnswer(b)
		},
	})
}

func grpcPostgres(ctx context.Context, o *Options, db *idempg.DB, store idem.Store, accounts int) ([]Comparison, error) {
	return runGRPC(ctx, o, "postgres", grpcSides{
		store: store, accounts: accounts,
		pay: func(ctx context.Context, acct int) error {
			return db.WithTx(ctx, func(ctx context.Context, tx pgx.Tx) error { return debit(ctx, tx, acct) })
		},
		minimum: func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, _ grpc.UnaryHandler) (any, error) {
			key, acct := keyOf(ctx), ctx.Value(accountKey{}).(int)
			err := pgx.BeginFunc(ctx, db.Pool(), func(tx pgx.Tx) error {
				tag, err := tx.Exec(ctx, `INSERT INTO bench_keys (key) VALUES ($1) ON CONFLICT DO NOTHING`, key)
				if err != nil {
					return err
				}
				if tag.RowsAffected() != 1 {
					return fmt.Errorf("key %s already claimed", key)
				}
				if err := debit(ctx, tx, acct); err != nil {
					return err
				}
				b, err := deterministic.Marshal(grpcAnswer)
				if err != nil {
					return err
				}
				_, err = tx.Exec(ctx, `UPDATE bench_keys SET status = 0, body = $2 WHERE key = $1`, key, b)
				return err
			})
			if err != nil {
				return nil, status.Error(codes.Unavailable, err.Error())
			}
			return grpcAnswer, nil
		},
		minimumReplay: func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, _ grpc.UnaryHandler) (any, error) {
			var b []byte
			if err := db.Pool().QueryRow(ctx, `SELECT body FROM bench_keys WHERE key = $1`, keyOf(ctx)).Scan(&b); err != nil {
				return nil, status.Error(codes.Unavailable, err.Error())
			}
			return decodeAnswer(b)
		},
	})
}
