// Package keyed is the engine of idempotency keys: the one place where the
// key's protocol is written, whatever carries the request. It claims a
// request's key in an idem.Store, waits for an execution of the key already
// in flight (within the caller's deadline), runs the request's handler at
// most once, keeps its answer or releases the key, replays the kept answer
// to every duplicate, keeps recovery points for work that leaves the
// database, finishes abandoned executions (Completer), and tells an
// Observer every phase.
//
// A face puts a protocol in front of it: idemhttp (HTTP middleware),
// idemgrpc (a gRPC interceptor), or one of your own. A face reads the key, the
// scope and a fingerprint from its request, runs its handler capturing the
// answer as an idem.Response, writes an answer or a replay back, and speaks
// the engine's refusals in its protocol's words: it implements Face and
// calls Engine.Serve. It makes no call to the store of its own, so every
// rule below holds the same on every face, and one suite,
// idemtest.TestFace, checks each face against it on each store.
//
//	eng, err := keyed.New(&keyed.Config{Store: store})
//	…
//	ctx = eng.Begin(ctx, nil) // observed requests only; End ends it
//	defer eng.End(ctx)
//	eng.Serve(ctx, keyed.Request{Scope: tenant, Key: key, Fingerprint: fp, Method: "pay"}, face)
//
// # What happens, on each face
//
// Every request ends in one Outcome (Engine.Counts; the End of an
// Observer's PhaseRequest), goes through the phases an Observer sees
// within PhaseRequest (C claim, H handler, K complete, R replay; in the
// same-transaction forms K begins before H and ends with the commit), and
// gets its answer:
//
//	case                                phases     engine                                      idemhttp                               idemgrpc
//	first run, answer deterministic     C H K      claim, run, keep (OutcomeExecuted)          the handler's answer                   the handler's answer
//	duplicate of a completed key        R, or C R  replay; nothing runs (OutcomeReplayed)      kept answer, Idempotent-Replayed       kept answer, idempotent-replayed
//	same key, another request           C, or R    refused; nothing runs (OutcomeMismatch)     422 key-mismatch                       FailedPrecondition IDEMPOTENCY_KEY_MISMATCH
//	duplicate while one is in flight    C R        waits (within C); then replays its answer   (as a replay)                          (as a replay)
//	  … still in flight at the end      C          OutcomeConflict; retry when its lease ends  409, Retry-After                       Aborted, RetryInfo
//	  … whose caller left meanwhile     C          OutcomeConflict                             nothing (nobody reads it)              Canceled or DeadlineExceeded
//	caller leaves while handler runs    C H K      handler goes on; its answer is kept         —                                      —
//	handler runs past its lease         C H K      lease renewed every third of it; kept       duplicates: 409, Retry-After           duplicates: Aborted, RetryInfo
//	lease cannot be renewed             C H K      handler's context cancelled (cause wraps    as its handler answers; its            as its handler answers; its
//	                                               idem.ErrLeaseLost); completion fenced       completion may be refused (below)      completion may be refused (below)
//	transient answer (5xx; Unavail.)    C H K      key released (OutcomeReleased)              the handler's answer                   the handler's status
//	handler panics                      C H K      key released (OutcomeReleased)              500 handler-failed                     the panic, raised again
//	handler's time ends, no answer      C H K      key released (OutcomeReleased)              500 handler-failed                     the handler's error
//	handler ends like a crash           C H        outside a transaction: key left to its      connection cut (http.ErrAbortHandler)  —
//	                                               lease (OutcomeAborted); inside: released
//	handler saves a recovery point                 SaveRecovery from the handler's context;    idemhttp.SaveRecovery; its Completer:  idemgrpc.SaveRecovery; its Completer:
//	                                               separate form, an idem.Recoverer store      Middleware.NewCompleter                Interceptor.NewCompleter
//	failure after a recovery point      C H        never released: lease yielded, key kept     503 unfinished, or the handler's       the handler's error, or its panic
//	  (any form, any failure)                      in flight with its point (Unfinished)       answer
//	answer too large to keep            C H K      outside a transaction: kept without its     the whole answer; replays say          the whole answer; replays say
//	                                               body; inside: rolled back, released         Idempotent-Body-Omitted / 500          idempotent-body-omitted / Internal
//	store fails at the claim            C          nothing runs (OutcomeStoreError)            503, Retry-After                       Unavailable, RetryInfo
//	store fails keeping the answer      C H K      key left to its lease (OutcomeStoreError)   the handler's answer                   the handler's answer
//	lease taken over meanwhile          C H K      completion refused (OutcomeLeaseLost);      the answer / 503 lease-lost            the answer / Unavailable LEASE_LOST
//	                                               inside a transaction: rolled back
//	commit fails, outcome unknown       C H K      the store is asked: committed, executed;    the answer / 503 store-unavailable     the answer / Unavailable
//	                                               else released (with a point: yielded)
//	kept answer cannot be read          R, or C R  refused; never run again (StoreError)       500 kept-answer-unreadable             Internal
//	key missing, malformed; body        —          refused by the face (OutcomeRejected)       400 / 413                              InvalidArgument
//	  too large to fingerprint
//	scope cannot be told                —          refused by the face (OutcomeRejected)       400 scope                              Unauthenticated
//	not protected: no key where         —          not involved: nothing observed, counted     Config.Optional                        Policy Off, Optional; the health
//	  optional, or a method let through                                                                                               and reflection services
//	abandoned key with a point          —          a Completer resumes it, keeps the answer    the retry gets it replayed             the retry gets it replayed
//	calls the handler passes on                    Execution.DownstreamKey(name): one key      WithCallName for a RoundTripper        WithCallName for a Client
//	                                               per named call, the same every execution
//
// The wait for a duplicate in flight lasts at most Config.InflightWait and
// never past the caller's own deadline; it ends at once when the caller
// leaves. It is woken by this process's own completion of the key, by the
// store (idem.Waiter) or by polling (Config.PollInterval).
//
// The handler's context carries the request context's values, not its
// cancellation: a caller that leaves (a client timing out, a dropped
// connection) does not cut its execution short, since its retry is due
// and should find the answer kept, not an effect cut off half-way to run
// again. What bounds a handler is its own time, Config.Timeout (a minute by
// default), not the lease: while it runs, the engine renews its lease every
// third of it (idem.Store.Renew; one chain of timers for the whole engine,
// and nothing at all for a request shorter than that), so a live handler
// keeps its key however long it runs, and the lease can be short (10s by
// default), so that the key of a holder that died is free within seconds.
// A handler whose lease cannot be renewed before it ends (the store
// unreachable) has its context cancelled, with a cause that wraps
// idem.ErrLeaseLost, so that it stops before another takes the key over;
// its late completion is refused (fencing). The engine counts a lease from
// when its claim (or renewal) was sent, which the store's own clock can only
// follow; with a store that decides leases by the engine's own Clock
// (idem.LocalClock: idemsqlite, idemmem), from when the store began it, so
// that a claim that waited long for SQLite's writer keeps its whole lease.
// In the ClaimTx form there is
// nothing to renew: no other transaction sees the key until the claim
// commits. On a store that writes serially (idemsqlite), whose CompleteTx
// holds the only writer from the handler's first write to its commit, the
// renewals wait behind that transaction, and so would another's takeover:
// there a handler is cancelled only when a renewal finds its key taken
// over, not for want of renewals.
//
// A duplicate refused because the key is still in flight is told to retry
// when the holder's lease ends (Refusal.RetryAfter, at least a second): a
// holder that died can be taken over then; a live one will have renewed it.
//
// A replica names itself as the holder of its claims (Config.Holder: a
// replica and an incarnation of it). One that restarts calls
// Engine.Restart, which ends at once the leases its earlier incarnation
// held (on a store that keeps holders, idem.Restarter): the client's retry
// then takes such a key over at once, and the Completer resumes those with
// a recovery point in its first round.
//
// # Forms
//
// How the key is claimed and the handler run depends on the store (see
// Config.Store): the separate form (Claim, run, Complete or Release); the
// CompleteTx form (Claim, then the handler inside the store's transaction,
// which keeps the answer as it commits: an idem.TxStore); the ClaimTx form
// (the claim in that same transaction: an idem.TxClaimer that does not
// write serially). Recovery points need the separate form: in a
// transaction they would roll back with everything else.
//
// # Recovery points
//
// An execution whose work leaves the database (a charge at a card network)
// saves a recovery point before it does (SaveRecovery, from the handler's
// context, on any face). From then on its key is never released after a
// failure, in any form: its phases may have done something outside, so
// the key stays in flight with its point, its lease yielded, for the
// client's retry (which goes on from Execution.Recovery) or a Completer.
//
// # Keys passed on
//
// A handler whose work calls other services sends each call with a key
// derived from its own and the call's name: Execution.DownstreamKey(name),
// or DownstreamKey(ctx, name) from its context (idemhttp.WithCallName and
// idemgrpc.WithCallName give it to their clients' calls). Every execution
// of one request, on any face and any replica, a Completer's resume
// included, sends the same key for the same name, so the service called
// replays what an earlier execution asked of it. A name, not a number: a
// handler that makes its calls concurrently starts them in another order
// each time.
//
// # Keys and answers at rest
//
// The engine seals keys (Config.KeySecret: the store keeps an HMAC of the
// scope and the key) and kept bodies (Config.BodyKeys: AES-256-GCM, bound
// to their record) before the store sees them, or keeps no bodies at all
// (Config.DiscardBodies), the same on every face and every store. A
// recovery point's data is sealed with the same keys, bound to its record
// and its name. The keys an execution passes downstream
// (Execution.DownstreamKey) derive from the scope and the key the client
// sent, which the engine keeps in each point it saves, so sealing the
// keys or changing the secret never changes them.
//
// # Observing
//
// Config.Observer sees each request as PhaseRequest (Begin to End), around
// PhaseClaim, PhaseHandler and PhaseComplete, or PhaseReplay, and every
// round trip to the store. The handler's context is derived from
// PhaseHandler's, so a tracing observer's span is the parent of what the
// handler does. With no Observer the engine calls nothing and allocates
// nothing for it.
package keyed
