package idempgsql

import (
	"errors"

	"github.com/idem-go/idem"
)

// SQLSTATEs the package tells apart.
const serializationFailure = "40001"

// SQLState returns the SQLSTATE of the first error in err's chain that
// carries one, as both drivers' server errors do (lib/pq's *pq.Error and
// pgx's *pgconn.PgError have a method SQLState), or "" when none does: a
// connection that failed, a context that ended, an error of idem's.
func SQLState(err error) string {
	var s interface{ SQLState() string }
	if errors.As(err, &s) {
		return s.SQLState()
	}
	return ""
}

// Classify returns the class of err in idem's vocabulary (see
// idem.Classify), reading the SQLSTATE of a server's error with either
// driver:
//
//   - transient, so retried: a serialization failure (40001), a deadlock
//     (40P01), a statement whose completion is unknown (40003), a lock
//     not available (55P03) or an object in use (55006), a cancelled
//     statement or its timeout (57014), a server shutting down, restarting
//     or not yet accepting connections (57P01, 57P02, 57P03), an idle
//     session's timeout (57P05), insufficient resources (class 53: too
//     many connections, out of memory, disk full), a connection exception
//     (class 08), and a system or I/O error (class 58). A connection that
//     failed without a SQLSTATE (driver.ErrBadConn, an unexpected EOF, a
//     network error) is transient too, as any unmarked error is. So are
//     the database's own failures that a SQLSTATE of a statement's class
//     would not tell: a server that refuses the connection's role or
//     password (class 28) or database (3D000), which is a store that is
//     down (credentials being rotated, a database being restored), not a
//     bad message; and a feature not supported (0A000), whose most common
//     case is "cached plan must not change result type": a statement that
//     pgx's stdlib cached, or that the application prepared, before a
//     migration changed its table fails on that connection only, and runs
//     on a new one.
//   - permanent, so dead-lettered at once rather than retried: an
//     integrity constraint violation (class 23: a unique violation, 23505;
//     a foreign key, a NOT NULL or a CHECK constraint), a data exception
//     (class 22: a value out of range, malformed text), a program limit
//     exceeded (class 54: an index row over PostgreSQL's size limit, too
//     many columns or arguments), a syntax error or an access rule
//     violation (class 42: a table or column that does not exist, a
//     privilege missing), a cardinality violation (21), a schema that does
//     not exist (3F) and a WITH CHECK OPTION violation (44): the same
//     statement fails the same way when retried.
//
// Any other error, and one marked with idem.Permanent, is classed as
// idem.Classify classes it. A serialization failure or a deadlock inside a
// transaction is retried by running the whole transaction again: its
// snapshot or its locks are what failed, and a retry inside it (after a
// rollback to a savepoint) fails the same way.
func Classify(err error) idem.ErrorClass {
	if idem.IsPermanent(err) {
		return idem.ClassPermanent
	}
	code := SQLState(err)
	if len(code) == 5 {
		switch code {
		case "40001", "40P01", "40003", "55P03", "55006", "57014", "57P01", "57P02", "57P03", "57P05":
			return idem.ClassTransient
		}
		switch code[:2] {
		case "08", "53", "58", "28", "3D", "0A":
			return idem.ClassTransient
		case "21", "22", "23", "3F", "42", "44", "54":
			return idem.ClassPermanent
		}
	}
	return idem.Classify(err)
}

// Classified returns err marked with idem.Permanent when Classify classes
// it permanent, and err unchanged otherwise (nil for nil): what a
// consumer's handler returns, so that the consumer, which classes errors
// with idem.Classify, dead-letters a unique violation at once and retries
// a deadlock.
func Classified(err error) error {
	if err == nil || idem.IsPermanent(err) || Classify(err) != idem.ClassPermanent {
		return err
	}
	return idem.Permanent(err)
}
