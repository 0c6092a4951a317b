// Package pgsql is what idem's two PostgreSQL backends share: idempg, on
// pgx, and idempgsql, on database/sql. They keep their records in the same
// tables, so that either can read what the other wrote and both can run
// against one schema at once (an application's handlers on database/sql,
// its relay on pgx): the schema's migrations live here, with the
// statements both run and how their rows map to idem's types. How a
// statement reaches the server (pipelines, batches, transactions) is each
// backend's own.
//
// Every statement names its tables unqualified and takes its parameters as
// $1, $2, ... with the types both drivers send: text, bigint, boolean,
// bytea and timestamptz values, JSON as text cast in the statement, and a
// NULL time standing for the database's clock.
package pgsql
