// Package storetest runs idemgrpc's conformance suite (internal/grpcsuite)
// on the stores that need a driver: SQLite, PostgreSQL and Redis, and
// checks the same-transaction form's effects on SQLite and PostgreSQL. It
// also runs idemtest.TestFace, the engine's behaviours every face passes,
// through idemgrpc (grpcFace) on those stores and the in-memory one.
//
// It is a module of its own, never tagged, so that its requirements
// (modernc.org/sqlite, pgx, go-redis) stay out of the go.mod of idemgrpc,
// which a program importing idemgrpc reads.
package storetest
