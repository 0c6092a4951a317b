// Package idemgrpc makes unary gRPC calls idempotent with an
// idempotency-key in their metadata: what package idemhttp does for HTTP,
// on the same stores, for the other way Go services call each other.
//
// A unary RPC that creates something (CreatePayment) has HTTP's POST
// problem: the client's deadline passes, it cannot tell a lost request
// from a lost answer, and its retry (gRPC's own retryPolicy, or a loop of
// its own) runs the call again. The Interceptor claims the call's key
// atomically in an idem.Store as the call arrives, runs the handler at
// most once per key, keeps the answer, and replays it to every duplicate.
// It is a face of the engine (package keyed), as idemhttp is: every
// decision about a key is the engine's, the same on both, and keyed's
// documentation has the table of what each case gets on each.
//
//	keys, err := idemgrpc.New(&idemgrpc.Config{
//		Store: store,
//		// Keys belong to whoever the call authenticated as: the same key
//		// from two callers names two operations.
//		Scope: func(ctx context.Context, _ string) (idem.Scope, error) { return tenantOf(ctx) },
//		Methods: map[string]idemgrpc.Policy{"/payments.v1.Payments/GetPayment": idemgrpc.Off},
//	})
//	if err != nil { … }
//	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(authenticate, keys.Unary()), grpc.StreamInterceptor(keys.Stream()))
//
// and the client sends one key per intended operation, with every attempt
// of it:
//
//	client := &idemgrpc.Client{}
//	conn, err := grpc.NewClient(target, grpc.WithChainUnaryInterceptor(client.Unary()), …)
//
// # What each call gets
//
// Beside idemhttp's answers, for the same situations:
//
//	situation                                  gRPC                                  HTTP (idemhttp)
//	no key where required, a malformed key     InvalidArgument                       400
//	the first call with a key                  the handler's answer                  the handler's answer
//	a duplicate of a kept answer               that answer, idempotent-replayed:true 2xx–4xx, Idempotent-Replayed: true
//	the same key, another request              FailedPrecondition                    422
//	a duplicate still in flight after the wait Aborted, with a RetryInfo             409 with Retry-After
//	the store unreachable                      Unavailable, with a RetryInfo         503 with Retry-After
//	the scope cannot be told                   Unauthenticated                       400
//
// Every status the interceptor makes itself carries a google.rpc.ErrorInfo
// whose domain is ErrorDomain and whose reason is one of the Reason…
// constants: Reason(err) tells the interceptor's FailedPrecondition (a key
// reused) from the handler's own.
//
// Which answers are kept is the handler's status code's nature
// (Config.Keep; DefaultKeep): OK and the codes a handler decides from the
// request and the state it finds (InvalidArgument, NotFound,
// AlreadyExists, PermissionDenied, FailedPrecondition, OutOfRange) are
// deterministic, kept and replayed with their message and details. The
// others (Unavailable, DeadlineExceeded, ResourceExhausted, Aborted,
// Internal, Unknown…), a handler that gave up when its context ended, and
// a panic keep nothing and release the key, so that a retry really runs
// again. A panic goes on up once the key is released (grpc-go does not
// recover panics: put a recovering interceptor before this one).
//
// A kept answer is the response message's deterministic encoding, its
// status (code, message, details), and the header and trailer metadata
// Config.ReplayMetadata names; nothing else the handler set is replayed.
// An encoding over Config.MaxResponseBytes (1 MiB) is never truncated: in
// the same-transaction forms the call is rolled back (Internal,
// ReasonResponseTooLarge); otherwise its replays carry an empty message
// and idempotent-body-omitted: true.
// A replay is returned as the message type the method answers with, found
// from the handler's earlier answers in this process or from the protobuf
// registry (where every generated package registers its services); where
// neither knows it, the encoding is carried as is, and the client reads
// the same answer.
//
// The fingerprint, which tells a retry from another request under the same
// key, is idem.NewFingerprint over the call as it travels: POST, the full
// method name, and the request message's deterministic encoding (maps
// sorted), so that a client that encodes its fields in another order is
// not refused.
//
// A duplicate of a key this process completed is answered, within
// Config.MemoryReplayFor (10s) of the completion, from the answer it kept
// in memory; later, and for keys it remembers (Config.RecentKeys), by one
// read of the record (idem.Replayer where the store has it); anywhere
// else, by the claim, which finds the key completed. Every path gives the
// same answer, as in idemhttp ("Where a replay comes from").
//
// # Policies, and streams
//
// Config.Methods sets each method's Policy (Required, Optional, Off), by
// full method name or by service; Config.Default the others'. Off lets a
// method's calls through without a key: mark so what must never be
// refused for want of one. The health service (grpc.health.v1.Health) and
// server reflection (v1 and v1alpha) are Off unless Config.Methods names
// them, whatever Default says: a load balancer's or Kubernetes' probe and
// grpcurl send no key, and a server that adds the interceptor must go on
// answering them. A method whose descriptor declares idempotency_level
// NO_SIDE_EFFECTS or IDEMPOTENT is Off unless configured otherwise: its
// contract already makes a second run harmless. A Client resolves the
// same policies, and sends the calls that are Off without a key.
//
// Streaming RPCs are not protected: their messages are many, and their
// answer is no one message to keep. Interceptor.Stream refuses a stream
// that carries an idempotency key to a method that is not Off, with
// Unimplemented (ReasonStreaming), so that its client does not believe it
// protected; other streams pass through untouched.
//
// # Effects past the database's edge
//
// As on idemhttp: a handler whose work calls another service (a charge at
// a card network) saves a recovery point before it does (SaveRecovery,
// from its context), in the claim-first form (Config.SeparateTx); from
// then on its key is never released after a failure, in any form: it
// stays in flight with its point, for the client's retry (which goes on
// from Execution.Recovery) or a Completer (Interceptor.NewCompleter),
// which finishes an abandoned call with nobody asking. The store must be
// an idem.Recoverer.
//
// An outcome the Completer cannot learn is a person's to decide, as on
// idemhttp (the console, idem keys settle): Completer.Settle is given the
// operator's answer in HTTP's terms, and keeps it as the call's answer
// (CompleterConfig.Settle; DefaultSettle makes it the status whose code
// means that HTTP status, SettleCode), so that the client's retry gets a
// status or a message it reads, with its headers as header metadata
// (idem-settled-by-operator). keyed.Completers sends each key to the
// Completer of the face that stopped it, where idemhttp's and idemgrpc's
// share a store.
//
// # Two forms, three stores
//
// As idemhttp's: with a plain idem.Store (idemmem, idemredis) the key is
// claimed, the handler runs, and the answer is kept afterwards. With an
// idem.TxStore (idemsqlite, idempg, idempgsql) the handler runs inside
// the store's transaction, reached through its context as the store
// documents (idemsqlite.DB.WithTx, idempg.DB.WithTx join it): its writes
// and the kept answer commit together, and an execution whose lease was
// taken over is refused at commit and rolled back. With an
// idem.TxClaimer the key is claimed in that same transaction, and the
// duplicates of a key this process is executing wait in the process, not
// in the database.
//
// # Leases, and keys passed on
//
// Each claim holds its key under a lease (Config.Lease) and a fencing
// token, and the engine renews the lease while the handler runs, so a live
// handler keeps its key however long it runs; its context ends at
// Config.Timeout, or when its lease cannot be renewed, and not before: not
// when the caller goes away nor when the call's own deadline passes. A
// caller that gave up retries, and its retry should find the answer kept,
// not a run cut off half-way (rolled back, in the same-transaction forms)
// to start again, and be cut off again at the same deadline. A process that
// dies mid-call leaves its key in flight until the lease ends; then a
// retry takes it over, and ExecutionFromContext says so (TookOver), with
// the ClaimedAt that an effect outside the store records to find an
// earlier run's work. The engine's table (package keyed) says what
// happens in every case, the same as on idemhttp.
//
// A handler that calls further services passes its key on, one key per
// call, derived from its own and the call's name: WithCallName(ctx,
// "reserve-stock") for a call through a Client, Execution.DownstreamKey
// for a key sent another way. Every execution of the call (after a
// transient failure, a takeover, a Completer's resume) sends each call with
// the same key, whatever order its calls start in, so the services called
// replay what the first execution asked of them. A call through a Client
// that is not named gets a key numbered by its rank among the handler's
// calls to that method (DownstreamKey, deprecated): the same only when the
// calls are made one after another, in the same order.
//
// # Observability
//
// Config.Observer is the engine's Observer, as idemhttp's is: the same
// phases, outcomes and store round trips, so idemprom's MiddlewareObserver
// (latency histograms) and idemotel's observer (spans) watch gRPC calls as
// they watch HTTP requests. The Event's Request stands for the call (POST, its full method
// name as the path), and its Status is HTTPStatus of the gRPC code.
// Interceptor.Counts counts every protected call's Outcome.
package idemgrpc
