// Package sqltx shows an effect and its idempotency key committed in one
// transaction, on the embedded SQLite store (idemsqlite).
//
// idemsqlite's Store is an idem.TxStore, so the idemhttp middleware runs
// the handler inside the transaction in which it keeps the handler's
// answer, and hands that transaction on in the request's context. The
// handler writes its order through DB.WithTx(r.Context(), …), which joins
// it: the order row and the key's record commit together, or neither does.
// A crash cannot leave an order without its key (a retry would create a
// second) nor a key without its order (a retry would be told of an order
// that does not exist); an answer that is not kept (a 5xx, a panic) rolls
// the order back and frees the key for the retry.
//
// Inside WithTx use only the *sql.Tx it passes, never DB.Writer(): the
// transaction holds the writer's only connection.
//
// The whole program is in Example.
package sqltx
