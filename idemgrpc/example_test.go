package idemgrpc_test

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemgrpc"
	"github.com/idem-go/idem/idemmem"
)

// A payment service's Create, described by hand so that the example needs
// no protoc: a generated service's Register…Server does the same.
const createPayment = "/example.Payments/Create"

func servePayments(srv *grpc.Server, create func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error)) {
	srv.RegisterService(&grpc.ServiceDesc{
		ServiceName: "example.Payments",
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{MethodName: "Create", Handler: func(_ any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
			in := new(structpb.Struct)
			if err := dec(in); err != nil {
				return nil, err
			}
			run := func(ctx context.Context, req any) (any, error) { return create(ctx, req.(*structpb.Struct)) }
			return ic(ctx, in, &grpc.UnaryServerInfo{FullMethod: createPayment}, run)
		}}},
	}, struct{}{})
}

// A server on loopback with the interceptor in front of CreatePayment: the
// call and its retry carry the same key, the payment is made once, and the
// retry gets the first answer, marked replayed.
func Example() {
	keys, err := idemgrpc.New(&idemgrpc.Config{
		Store: idemmem.NewStore(nil), // idemsqlite, idempg or idemredis to keep keys
		// Keys belong to whoever the call authenticated as (here, a tenant
		// named in the metadata, where an authentication interceptor would
		// have put the caller).
		Scope: func(ctx context.Context, _ string) (idem.Scope, error) {
			md, _ := metadata.FromIncomingContext(ctx)
			if t := md.Get("tenant"); len(t) == 1 {
				return idem.Scope(t[0]), nil
			}
			return "", status.Error(codes.Unauthenticated, "who are you?")
		},
	})
	if err != nil {
		panic(err)
	}
	var payments atomic.Int64
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(keys.Unary()), grpc.StreamInterceptor(keys.Stream()))
	servePayments(srv, func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
		n := payments.Add(1)
		return structpb.NewStruct(map[string]any{"id": fmt.Sprintf("pay_%d", n), "amount": req.Fields["amount"].GetNumberValue()})
	})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	go srv.Serve(lis)
	defer srv.Stop()

	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	ctx := metadata.AppendToOutgoingContext(context.Background(), "tenant", "acme", idemgrpc.MetadataKey, "order-1042")
	req, _ := structpb.NewStruct(map[string]any{"amount": 25})
	for range 2 { // the second is a retry after, say, a lost answer
		var header metadata.MD
		out := new(structpb.Struct)
		if err := conn.Invoke(ctx, createPayment, req, out, grpc.Header(&header)); err != nil {
			panic(err)
		}
		fmt.Println(out.Fields["id"].GetStringValue(), "replayed:", header.Get(idemgrpc.MetadataReplayed))
	}
	fmt.Println("payments made:", payments.Load())
	// Output:
	// pay_1 replayed: []
	// pay_1 replayed: [true]
	// payments made: 1
}

// The client's half: the Client gives a call a key and retries it with that
// key when the server answers Unavailable (here, a store that failed once),
// so the payment is made once.
func ExampleClient() {
	keys, err := idemgrpc.New(&idemgrpc.Config{Store: idemmem.NewStore(nil), SharedScope: true})
	if err != nil {
		panic(err)
	}
	var attempts, payments atomic.Int64
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(keys.Unary()))
	servePayments(srv, func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
		if attempts.Add(1) == 1 {
			return nil, status.Error(codes.Unavailable, "the card network timed out") // transient: nothing kept
		}
		payments.Add(1)
		return structpb.NewStruct(map[string]any{"status": "paid"})
	})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	go srv.Serve(lis)
	defer srv.Stop()

	client := &idemgrpc.Client{} // jittered retries, 4 attempts at most, within the call's deadline
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(client.Unary()))
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	req, _ := structpb.NewStruct(map[string]any{"amount": 25})
	out := new(structpb.Struct)
	// WithKey keeps a key that must outlive this process (stored with the
	// order, say); without it the Client makes one per call.
	if err := conn.Invoke(idemgrpc.WithKey(context.Background(), "order-1042"), createPayment, req, out); err != nil {
		panic(err)
	}
	fmt.Println(out.Fields["status"].GetStringValue(), "after", attempts.Load(), "attempts;", payments.Load(), "payment")
	// Output: paid after 2 attempts; 1 payment
}

// A handler that calls another service several times at once names each
// call (WithCallName): every execution of it sends each call with the
// same key, whichever goroutine starts first, so when the first execution
// fails after its calls and the client's retry runs it again, the service
// called replays what it did instead of charging again.
func ExampleWithCallName() {
	serve := func(create func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error)) (addr string, stop func()) {
		keys, err := idemgrpc.New(&idemgrpc.Config{Store: idemmem.NewStore(nil), SharedScope: true})
		if err != nil {
			panic(err)
		}
		srv := grpc.NewServer(grpc.ChainUnaryInterceptor(keys.Unary()))
		servePayments(srv, create)
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			panic(err)
		}
		go srv.Serve(lis)
		return lis.Addr().String(), srv.Stop
	}
	dial := func(addr string) *grpc.ClientConn {
		client := &idemgrpc.Client{}
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithChainUnaryInterceptor(client.Unary()))
		if err != nil {
			panic(err)
		}
		return conn
	}

	var charges atomic.Int64
	network, stopNetwork := serve(func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
		charges.Add(1)
		return req, nil
	})
	defer stopNetwork()
	card := dial(network)
	defer card.Close()

	var runs atomic.Int64
	checkout, stopCheckout := serve(func(ctx context.Context, req *structpb.Struct) (*structpb.Struct, error) {
		errs := make(chan error, 2)
		for _, leg := range []string{"charge", "fee"} {
			go func() {
				msg, _ := structpb.NewStruct(map[string]any{"leg": leg})
				errs <- card.Invoke(idemgrpc.WithCallName(ctx, leg), createPayment, msg, new(structpb.Struct))
			}()
		}
		for range 2 {
			if err := <-errs; err != nil {
				return nil, err
			}
		}
		if runs.Add(1) == 1 {
			return nil, status.Error(codes.Unavailable, "the ledger timed out") // transient: the client retries
		}
		return structpb.NewStruct(map[string]any{"status": "paid"})
	})
	defer stopCheckout()
	conn := dial(checkout)
	defer conn.Close()

	req, _ := structpb.NewStruct(map[string]any{"amount": 25})
	out := new(structpb.Struct)
	if err := conn.Invoke(idemgrpc.WithKey(context.Background(), "order-1042"), createPayment, req, out); err != nil {
		panic(err)
	}
	fmt.Println(out.Fields["status"].GetStringValue(), "after", runs.Load(), "executions;", charges.Load(), "calls made at the card network")
	// Output: paid after 2 executions; 2 calls made at the card network
}
