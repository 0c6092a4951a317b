// Package secreturl keeps the secrets of service URLs out of messages and
// logs. It is the one redaction every URL that idem prints goes through:
// the command line's start-up records and errors, the service gate of
// idemtest, and the errors the backends build from a URL they were given.
//
// A URL can carry a secret in three places, and secreturl masks each as
// xxxxx (as net/url's URL.Redacted masks a password):
//
//   - the password of the user-info: postgres://user:SECRET@host/db,
//     redis://:SECRET@host/0, amqp://guest:SECRET@host/;
//   - the whole user-info of a NATS URL without a password, which nats.go
//     sends as a token: nats://SECRET@host:4222, tls://SECRET@host:4222
//     (a user-info alone is a user name for every other scheme);
//   - the value of a query parameter whose name, percent-decoded and
//     lower-cased with '-' read as '_', contains "pass", "secret" or "token"
//     or is "key", "apikey" or "api_key": ?password=, ?sslpassword=,
//     ?passfile=, ?token=, ?auth_token=, ?access_token=, ?client_secret=,
//     ?api-key=. Names that hold file paths, such as PostgreSQL's sslkey and
//     sslcert, are kept: a path says where a secret is, not what it is.
//
// The rules hold for every scheme; those idem uses are postgres,
// postgresql, redis, rediss, nats, tls, amqp, amqps and sqlite. A NATS
// server list (nats://a:4222,nats://b:4222, as nats.go takes it) is
// redacted server by server.
//
// Redact is for URLs shown on purpose. It mirrors net/url: a URL that does
// not parse is never shown, since where a parser gives up the boundaries of
// its secrets are uncertain; only SQLite names, which are file paths, are
// redacted without parsing. What is not secret is shown as it was given.
//
// Scrub is for errors from drivers and clients (pgx, go-redis, rueidis,
// nats.go, amqp091) that may quote the URL they were given or a piece of
// it: every secret Redact would mask is replaced in the error's message, as
// it appears in the URL, percent-decoded and escaped again, and the error
// still wraps the original for errors.Is and errors.As.
package secreturl
