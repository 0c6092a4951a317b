// Package consoletest tests the operators' console (package console of the
// library) on the payment service's own dead letters, in a real, migrated
// SQLite database: the console's pages, sessions, cross-site refusals,
// edits, re-drives and discards as an operator meets them. It lives in the
// application's module because the payment service does; the library's
// module requires nothing.
package consoletest
