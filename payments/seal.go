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
	if len(secret) < idemhttp.MinKeySecretLen {
		return SealedKeys{}, &idem.ArgumentError{Field: "secret", Reason: fmt.Sprintf("is %d bytes; at least %d are needed", len(secret), idemhttp.MinKeySecretLen)}
	}
	var n SealedKeys
	err := db.WithTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		n = SealedKeys{}
		for _, t := range sealTables {
			rows, err := tx.QueryContext(ctx, `SELECT DISTINCT `+t.scope+`, `+t.key+` FROM `+t.table+` WHERE `+t.key+` IS NOT NULL`)
			if err != nil {
				return fmt.Errorf("reading %s: %w", t.table, err)
			}
			var clear [][2]string
			for rows.Next() {
				var scope, key string
				if err := rows.Scan(&scope, &key); err != nil {
					rows.Close()
					return err
				}
				if !idemhttp.IsSealedKey(idem.Key(key)) {
					clear = append(clear, [2]string{scope, key})
				}
			}
			if err := errors.Join(rows.Err(), rows.Close()); err != nil {
				return fmt.Errorf("reading %s: %w", t.table, err)
			}
			for _, c := range clear {
				sealed := idemhttp.SealKey(secret, idem.Scope(c[0]), idem.Key(c[1]))
				res, err := tx.ExecContext(ctx, `UPDATE `+t.table+` SET `+t.key+` = ? WHERE `+t.scope+` = ? AND `+t.key+` = ?`, string(sealed), c[0], c[1])
				if err != nil {
					return fmt.Errorf("sealing a key of %s: %w", t.table, err)
				}
				k, _ := res.RowsAffected()
				n.add(t.table, int(k))
			}
		}
		return nil
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
	if len(secret) < idemhttp.MinKeySecretLen {
		return SealedKeys{}, &idem.ArgumentError{Field: "secret", Reason: fmt.Sprintf("is %d bytes; at least %d are needed", len(secret), idemhttp.MinKeySecretLen)}
	}
	var n SealedKeys
	err := db.WithTx(ctx, func(ctx context.Context, tx pgx.Tx) error {
		n = SealedKeys{}
		for _, t := range sealTables {
			// A replica left running would write keys in clear behind the
			// rewrite; the lock makes it wait instead, and then find its
			// keys sealed by nobody: so stop them first (see SealKeys).
			if _, err := tx.Exec(ctx, `LOCK TABLE `+t.table+` IN SHARE ROW EXCLUSIVE MODE`); err != nil {
				return fmt.Errorf("locking %s: %w", t.table, err)
			}
			rows, err := tx.Query(ctx, `SELECT DISTINCT `+t.scope+`, `+t.key+` FROM `+t.table+` WHERE `+t.key+` IS NOT NULL`)
			if err != nil {
				return fmt.Errorf("reading %s: %w", t.table, err)
			}
			var clear [][2]string
			for rows.Next() {
				var scope, key string
				if err := rows.Scan(&scope, &key); err != nil {
					rows.Close()
					return err
				}
				if !idemhttp.IsSealedKey(idem.Key(key)) {
					clear = append(clear, [2]string{scope, key})
				}
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				return fmt.Errorf("reading %s: %w", t.table, err)
			}
			for _, c := range clear {
				sealed := idemhttp.SealKey(secret, idem.Scope(c[0]), idem.Key(c[1]))
				tag, err := tx.Exec(ctx, `UPDATE `+t.table+` SET `+t.key+` = $1 WHERE `+t.scope+` = $2 AND `+t.key+` = $3`, string(sealed), c[0], c[1])
				if err != nil {
					return fmt.Errorf("sealing a key of %s: %w", t.table, err)
				}
				n.add(t.table, int(tag.RowsAffected()))
			}
		}
		return nil
	})
	if err != nil {
		return SealedKeys{}, err
	}
	return n, nil
}
