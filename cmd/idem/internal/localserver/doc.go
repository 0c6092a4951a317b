// Package localserver starts private PostgreSQL, Redis, NATS and RabbitMQ
// servers for a program that must crash and restart its own stores: the
// torture runs, which restart a store under load to check that the service
// rides it out. It never touches the machine's own servers. Each server is
// a child process of the caller, listening on 127.0.0.1 alone, on a port
// that was free a moment before it started, with its data, its log and
// everything else it writes in the folder it is given; Server.Restart kills
// it (or stops it cleanly) and starts it again on the same port and data,
// and Server.Close stops it for good, leaving the folder to the caller.
//
// Unlike idemtest's cluster helpers, it is not bound to a testing.TB: a
// command run by a person starts and stops these servers as well as a test
// does, and every failure is an error, not a failed test.
//
// # The servers
//
// StartPostgres runs initdb (user postgres, trust authentication, UTF8) in
// dir/data, then postgres on it with listen_addresses 127.0.0.1, its Unix
// socket in dir and fsync on, so that what it acknowledged survives a
// SIGKILL; it waits until a connection runs a query, which a server in
// crash recovery refuses. PostgreSQL refuses to run as root: a caller
// running as root gets servers that run as the user postgres, which is
// given dir, and every folder above dir that lacks search permission for
// others gets it (o+x, not read), so that the user can reach dir. The programs are
// looked up in PATH, then in the newest /usr/lib/postgresql/*/bin, where
// Debian keeps them.
//
// StartRedis runs redis-server with an append-only file fsynced on every
// write (appendfsync always) and no RDB snapshots, so that a restart after
// a SIGKILL loses nothing it acknowledged; it waits until the server
// answers and has loaded that file (INFO persistence says loading:0).
//
// StartNATS runs nats-server with JetStream, its store in dir/js and an
// HTTP monitoring port of its own, and waits until /healthz answers 200,
// which it does once JetStream has recovered its streams.
//
// StartRabbitMQ runs a RabbitMQ node of its own, as idemamqp's cluster tests
// do for each of their nodes: its own node name, AMQP and distribution
// ports, Erlang cookie (in dir/home, which is its HOME), configuration,
// database and logs, all under dir, and no plugins; it waits until an AMQP
// connection opens, which the node accepts last, once it has booted. The
// programs are those in /usr/lib/rabbitmq/bin when they exist: Debian's
// wrappers in /usr/sbin run them as the machine's rabbitmq user, with that
// node's cookie. The node runs with its input open
// (RABBITMQ_ALLOW_INPUT), on a pipe that the caller holds: that makes the
// launcher exec the Erlang VM instead of waiting on it, so the server
// process is the VM itself, and the VM ends when the pipe closes. It
// registers its name with the machine's epmd, which it starts when none
// runs and which outlives it.
//
// # Life and death
//
// Each server runs in a process group of its own, so that a Ctrl-C on the
// terminal reaches the caller alone, which then stops it. A crash reaches
// every process of the server at once: Restart(ctx, true) freezes the
// group (SIGSTOP, so that it forks nothing more), sends SIGKILL to it and
// to every process descended from the server (PostgreSQL's backends each
// make a session of their own, and one left running would keep the new
// postmaster from starting), waits until none of them is left, and starts
// the server again. Restart(ctx, false) stops it cleanly instead
// (PostgreSQL's fast shutdown, SIGINT; SIGTERM for the others). On Linux
// the kernel kills a server whose caller dies (Pdeathsig), so none
// outlives it; elsewhere the descendants outside the group are not found,
// and PostgreSQL's end by themselves once they see their postmaster gone.
//
// An error names the program and carries the end of its log, which is in
// the server's folder; a program that is not installed is an error that
// names it.
package localserver
