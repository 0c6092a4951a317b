// Package ormtest runs idempgsql under the libraries applications reach
// PostgreSQL through, GORM (gorm.io/gorm with gorm.io/driver/postgres) and
// sqlx, on both database/sql drivers (pgx's stdlib and lib/pq): the Inbox,
// the Outbox and the idemhttp middleware, each in the library's own
// transactions, nested and failing. It is a module of its own, which no
// package of idem imports, so that no user of idempgsql gets GORM or sqlx
// in their module graph; it holds tests only.
package ormtest
