package payments

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/idemsqlite"
	"github.com/jackc/pgx/v5"
)

// SealedKeys counts what SealKeys rewrote, table by table.
type SealedKeys struct {
	Keys, Payments, Deposits, Refunds int
}

// sealTables are the tables that keep a key, with the columns that name
// its scope and the key itself.
var sealTables = []struct{ table, scope, key string }{
	{"idem_keys", "scope", "key"},
	{"payments", "tenant", "idempotency_key"},
	{"deposits", "tenant", "idempotency_key"},
	{"refunds", "tenant", "idempotency_key"},
}

func (n *SealedKeys) add(table string, k int) {
	switch table {
	case "idem_keys":
		n.Keys += k
	case "payments":
		n.Payments += k
	case "deposits":
		n.Deposits += k
	case "refunds":
		n.Refunds += k
	}
}

// SealKeys rewrites every key kept in clear in a payment database on SQLite
// (the idempotency keys and the payments', deposits' and refunds' origins)
// into its sealed form under secret (idemhttp.SealKey), in one transaction:
// all of them, or none if it fails. Keys already sealed are left as they
// are, so running it twice changes nothing the second time.
//
// It is the migration for turning idemhttp.Config.KeySecret on for a
// service that ran without it: stop every replica, run it (`idem keys
// seal`), start them with the secret. A replica that ran without the secret
// in between would look its duplicates up in clear and run them again.
func SealKeys(ctx context.Context, db *idemsqlite.DB, secret []byte) (SealedKeys, error) {
	if err := checkSealSecret(secret); err != nil {
		return SealedKeys{}, err
	}
	var n SealedKeys
	err := db.WithTx(ctx, func(ctx context.Context, tx *sql.Tx) (err error) {
		n, err = sealKeys(secret, sealAccess{
			keys: func(q string) ([][2]string, error) {
				rows, err := tx.QueryContext(ctx, q)
				if err != nil {
					return nil, err
				}
				return scanClearKeys(rows.Next, rows.Scan, func() error { return errors.Join(rows.Err(), rows.Close()) })
			},
			update: func(q string, args ...any) (int64, error) {
				res, err := tx.ExecContext(ctx, q, args...)
				if err != nil {
					return 0, err
				}
				return res.RowsAffected()
			},
			placeholders: [3]string{"?", "?", "?"},
		})
		return err
	})
	if err != nil {
		return SealedKeys{}, err
	}
	return n, nil
}

// SealKeysPostgres is SealKeys for a payment database on PostgreSQL (in
// the schema db was opened with). It locks the tables it rewrites for the
// length of its transaction.
func SealKeysPostgres(ctx context.Context, db *idempg.DB, secret []byte) (SealedKeys, error) {
	if err := checkSealSecret(secret); err != nil {
		return SealedKeys{}, err
	}
	var n SealedKeys
	err := db.WithTx(ctx, func(ctx context.Context, tx pgx.Tx) (err error) {
		n, err = sealKeys(secret, sealAccess{
			lock: func(table string) error {
				// A replica left running would write keys in clear behind
				// the rewrite; the lock makes it wait instead, and then find
				// its keys sealed by nobody: so stop them first (see
				// SealKeys).
				_, err := tx.Exec(ctx, `LOCK TABLE `+table+` IN SHARE ROW EXCLUSIVE MODE`)
				return err
			},
			keys: func(q string) ([][2]string, error) {
				rows, err := tx.Query(ctx, q)
				if err != nil {
					return nil, err
				}
				return scanClearKeys(rows.Next, rows.Scan, func() error { rows.Close(); return rows.Err() })
			},
			update: func(q string, args ...any) (int64, error) {
				tag, err := tx.Exec(ctx, q, args...)
				return tag.RowsAffected(), err
			},
			placeholders: [3]string{"$1", "$2", "$3"},
		})
		return err
	})
	if err != nil {
		return SealedKeys{}, err
	}
	return n, nil
}

func checkSealSecret(secret []byte) error {
	if len(secret) < idemhttp.MinKeySecretLen {
		return &idem.ArgumentError{Field: "secret", Reason: fmt.Sprintf("is %d bytes; at least %d are needed", len(secret), idemhttp.MinKeySecretLen)}
	}
	return nil
}

// sealAccess is what sealKeys needs of one database's transaction.
type sealAccess struct {
	lock         func(table string) error // nil: no lock needed
	keys         func(query string) ([][2]string, error)
	update       func(query string, args ...any) (int64, error)
	placeholders [3]string // the sealed key's, the scope's, the key's
}

// sealKeys rewrites the keys kept in clear of every table of sealTables.
func sealKeys(secret []byte, db sealAccess) (SealedKeys, error) {
	var n SealedKeys
	ph := db.placeholders
	for _, t := range sealTables {
		if db.lock != nil {
			if err := db.lock(t.table); err != nil {
				return SealedKeys{}, fmt.Errorf("locking %s: %w", t.table, err)
			}
		}
		clear, err := db.keys(`SELECT DISTINCT ` + t.scope + `, ` + t.key + ` FROM ` + t.table + ` WHERE ` + t.key + ` IS NOT NULL`)
		if err != nil {
			return SealedKeys{}, fmt.Errorf("reading %s: %w", t.table, err)
		}
		for _, c := range clear {
			sealed := idemhttp.SealKey(secret, idem.Scope(c[0]), idem.Key(c[1]))
			k, err := db.update(`UPDATE `+t.table+` SET `+t.key+` = `+ph[0]+` WHERE `+t.scope+` = `+ph[1]+` AND `+t.key+` = `+ph[2],
				string(sealed), c[0], c[1])
			if err != nil {
				return SealedKeys{}, fmt.Errorf("sealing a key of %s: %w", t.table, err)
			}
			n.add(t.table, int(k))
		}
	}
	return n, nil
}

// scanClearKeys reads (scope, key) rows, keeping the keys not sealed yet.
func scanClearKeys(next func() bool, scan func(...any) error, done func() error) ([][2]string, error) {
	var clear [][2]string
	for next() {
		var scope, key string
		if err := scan(&scope, &key); err != nil {
			done()
			return nil, err
		}
		if !idemhttp.IsSealedKey(idem.Key(key)) {
			clear = append(clear, [2]string{scope, key})
		}
	}
	if err := done(); err != nil {
		return nil, err
	}
	return clear, nil
}
