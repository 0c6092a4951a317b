// Package idemmem is the in-memory idem.Store: the reference implementation
// of the contract, for tests, examples and single-process programs that can
// afford to forget every key on restart.
//
// It keeps records in a map behind one mutex, so Claim is atomic by
// construction and the code reads as a specification of the contract: a
// new or expired key is claimed anew, a different fingerprint is a
// mismatch, a live lease means in flight, an ended lease is taken over with a
// greater fencing token, and a completed key replays its response. Every
// record handed out is a copy; callers cannot change what the store keeps.
//
// It is an idem.Recoverer and an idem.Restarter too: it keeps recovery
// points and the holder of each claim, and Renew and YieldEarlier change
// a lease under the same lock.
//
// The store also implements idem.Waiter: each record has a channel that is
// closed when it is completed, released, taken over or purged, so a
// duplicate request can wait for the first one instead of polling.
//
// Time comes from Config.Clock, so tests move leases and TTLs with a manual
// clock (Clock) instead of sleeping. Nothing is purged on its own:
// call Purge periodically, as with every Store.
//
// The message side lives here too, each described on its type: Transport,
// Inbox (with Tx, Transact and Counters), Outbox, DeadLetters and Ledger.
//
// Because records live in the process, idemmem cannot give the guarantees
// of a durable store across crashes or between processes; use idemsqlite,
// or a shared backend, for that.
package idemmem
