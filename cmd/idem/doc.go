// Command idem runs the idem reference payment service and its tools.
//
//	idem serve     run the payment service over HTTP
//	idem demo      run the lab: retries double charge without idempotency keys, and never with them
//	idem migrate   create or update the database's tables
//	idem keys      inspect and purge stored idempotency keys
//	idem version   print the version
//
// `idem demo` needs no flags and no setup: it is the place to start.
// `idem <command> --help` describes each command's flags.
//
// Configuration comes from flags, and for secrets also from the environment:
// IDEM_API_KEYS holds the service's API keys ("tenant:key,tenant2:key2")
// when --api-keys is not given. Only this command reads flags and the
// environment; the packages it wires together take their configuration as
// arguments.
//
// Exit status: 0 on success, 1 on failure (the message is on stderr), 2 on a
// usage error such as an unknown flag.
package main
