package payments

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/idemsqlite"
	"github.com/idem-go/idem/keyed"
	"github.com/jackc/pgx/v5"
)

// SealedKeys counts what SealKeys rewrote, table by table.
type SealedKeys struct {
	Keys, Payments, Deposits, Refunds int
	// Texts counts the payments' descriptions and refunds' reasons
	// sealed, or sealed again with the first body key.
	Texts int
}

// textTables are the tables that keep a client's free text, with its
// column.
var textTables = []struct {
	table, column string
	col           textColumn
}{
	{"payments", "description", colDescription},
	{"refunds", "reason", colReason},
}

// sealTables are the tables that keep a key, with the columns that name
// its scope and the key itself. idem_keys comes first, and apart (see
// sealRecords): its bodies and recovery points are bound to its keys.
var sealTables = []struct{ table, scope, key string }{
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
//
// The kept bodies and recovery points of the keys it rewrites are bound to
// the keys (see keyed.ResealBody, keyed.ResealPoint): it opens them with
// bodyKeys and seals them again for the sealed key, and seals those kept
// in clear when bodyKeys are given (the first seals; give the server's
// IDEM_BODY_KEYS). A recovery point saved before its data carried its
// downstream seed gets the seed of the key in clear, so that a payment in
// flight at its point charges under the same key after the rewrite.
//
// The payments' descriptions and the refunds' reasons are sealed with the
// first of bodyKeys when they are kept in clear, or sealed with another
// of them: after a rotation (a new key put first), a run seals every text
// with the new key, and the old one can then be removed from the
// service's keys. The digests the service keeps of keys it did not seal
// ("idg1_…", see origin) are left as they are: they are found as they
// are after the rewrite. When it rewrote anything, it then rebuilds the
// file (VACUUM) and empties the WAL, so that the rewritten rows' old bytes
// do not stay behind in free pages and WAL frames.
func SealKeys(ctx context.Context, db *idemsqlite.DB, secret []byte, bodyKeys []idemhttp.BodyKey) (SealedKeys, error) {
	if err := checkSealSecret(secret); err != nil {
		return SealedKeys{}, err
	}
	var n SealedKeys
	err := db.WithTx(ctx, func(ctx context.Context, tx *sql.Tx) (err error) {
		n, err = sealKeys(secret, bodyKeys, sealAccess{
			records: func(q string) ([]keyRecord, error) {
				rows, err := tx.QueryContext(ctx, q)
				if err != nil {
					return nil, err
				}
				return scanRecords(rows.Next, rows.Scan, func() error { return errors.Join(rows.Err(), rows.Close()) })
			},
			keys: func(q string) ([][2]string, error) {
				rows, err := tx.QueryContext(ctx, q)
				if err != nil {
					return nil, err
				}
				return scanClearKeys(rows.Next, rows.Scan, func() error { return errors.Join(rows.Err(), rows.Close()) })
			},
			texts: func(q string) ([][3]string, error) {
				rows, err := tx.QueryContext(ctx, q)
				if err != nil {
					return nil, err
				}
				return scanTexts(rows.Next, rows.Scan, func() error { return errors.Join(rows.Err(), rows.Close()) })
			},
			update: func(q string, args ...any) (int64, error) {
				res, err := tx.ExecContext(ctx, q, args...)
				if err != nil {
					return 0, err
				}
				return res.RowsAffected()
			},
			placeholders: [5]string{"?", "?", "?", "?", "?"},
		})
		return err
	})
	if err != nil {
		return SealedKeys{}, err
	}
	if n == (SealedKeys{}) {
		return n, nil
	}
	// A row rewritten in place leaves its old bytes (the raw keys, the
	// text in clear) in the file's free pages and in the WAL's frames
	// until they happen to be reused: the file is rebuilt and the WAL
	// emptied, so that what was sealed is gone from the disk too.
	for _, q := range []string{`VACUUM`, `PRAGMA wal_checkpoint(TRUNCATE)`} {
		if _, err := db.Writer().ExecContext(ctx, q); err != nil {
			return n, fmt.Errorf("sealed, but the old bytes may remain in the file: %s: %w", q, err)
		}
	}
	return n, nil
}

// SealKeysPostgres is SealKeys for a payment database on PostgreSQL (in
// the schema db was opened with). It locks the tables it rewrites for the
// length of its transaction.
func SealKeysPostgres(ctx context.Context, db *idempg.DB, secret []byte, bodyKeys []idemhttp.BodyKey) (SealedKeys, error) {
	if err := checkSealSecret(secret); err != nil {
		return SealedKeys{}, err
	}
	var n SealedKeys
	err := db.WithTx(ctx, func(ctx context.Context, tx pgx.Tx) (err error) {
		n, err = sealKeys(secret, bodyKeys, sealAccess{
			records: func(q string) ([]keyRecord, error) {
				rows, err := tx.Query(ctx, q)
				if err != nil {
					return nil, err
				}
				return scanRecords(rows.Next, rows.Scan, func() error { rows.Close(); return rows.Err() })
			},
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
			texts: func(q string) ([][3]string, error) {
				rows, err := tx.Query(ctx, q)
				if err != nil {
					return nil, err
				}
				return scanTexts(rows.Next, rows.Scan, func() error { rows.Close(); return rows.Err() })
			},
			update: func(q string, args ...any) (int64, error) {
				tag, err := tx.Exec(ctx, q, args...)
				return tag.RowsAffected(), err
			},
			placeholders: [5]string{"$1", "$2", "$3", "$4", "$5"},
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
	records      func(query string) ([]keyRecord, error)
	keys         func(query string) ([][2]string, error)
	texts        func(query string) ([][3]string, error)
	update       func(query string, args ...any) (int64, error)
	placeholders [5]string // the first five parameters
}

// sealKeys rewrites the keys kept in clear of every table of sealTables.
func sealKeys(secret []byte, bodyKeys []idemhttp.BodyKey, db sealAccess) (SealedKeys, error) {
	var n SealedKeys
	ph := db.placeholders
	k, err := sealRecords(secret, bodyKeys, db)
	if err != nil {
		return SealedKeys{}, err
	}
	n.Keys = k
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
			if isOriginDigest(c[1]) {
				// A digest, not a key: found as it is (see origin).
				continue
			}
			sealed := idemhttp.SealKey(secret, idem.Scope(c[0]), idem.Key(c[1]))
			k, err := db.update(`UPDATE `+t.table+` SET `+t.key+` = `+ph[0]+` WHERE `+t.scope+` = `+ph[1]+` AND `+t.key+` = `+ph[2],
				string(sealed), c[0], c[1])
			if err != nil {
				return SealedKeys{}, fmt.Errorf("sealing a key of %s: %w", t.table, err)
			}
			n.add(t.table, int(k))
		}
	}
	if n.Texts, err = sealTexts(bodyKeys, db); err != nil {
		return SealedKeys{}, err
	}
	return n, nil
}

// isOriginDigest reports whether a row's key is the digest the service
// keeps of a key it does not seal (originDigest), rather than a key.
func isOriginDigest(key string) bool { return strings.HasPrefix(key, "idg1_") }

// sealTexts seals the free text kept in clear with the first of bodyKeys,
// and seals again with it the text sealed with another of them (a
// rotation: the older keys can be removed afterwards). It returns how
// many texts it rewrote. A text that bodyKeys do not open stops it.
// Without bodyKeys it changes nothing.
func sealTexts(bodyKeys []idemhttp.BodyKey, db sealAccess) (int, error) {
	if len(bodyKeys) == 0 {
		return 0, nil
	}
	ph := db.placeholders
	n := 0
	for _, t := range textTables {
		rows, err := db.texts(`SELECT id, tenant, ` + t.column + ` FROM ` + t.table + ` WHERE ` + t.column + ` <> ''`)
		if err != nil {
			return 0, fmt.Errorf("reading %s: %w", t.table, err)
		}
		for _, r := range rows {
			out, changed, err := resealText(bodyKeys, t.col, r[1], r[0], r[2])
			if err != nil {
				return 0, err
			}
			if !changed {
				continue
			}
			k, err := db.update(`UPDATE `+t.table+` SET `+t.column+` = `+ph[0]+` WHERE id = `+ph[1], out, r[0])
			if err != nil {
				return 0, fmt.Errorf("sealing a text of %s: %w", t.table, err)
			}
			n += int(k)
		}
	}
	return n, nil
}

// scanTexts reads (id, tenant, text) rows.
func scanTexts(next func() bool, scan func(...any) error, done func() error) ([][3]string, error) {
	var out [][3]string
	for next() {
		var r [3]string
		if err := scan(&r[0], &r[1], &r[2]); err != nil {
			done()
			return nil, err
		}
		out = append(out, r)
	}
	if err := done(); err != nil {
		return nil, err
	}
	return out, nil
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

// keyRecord is what sealRecords reads of one row of idem_keys.
type keyRecord struct {
	scope, key string
	body       []byte
	point      *string
	data       []byte
}

// scanRecords reads keyRecords.
func scanRecords(next func() bool, scan func(...any) error, done func() error) ([]keyRecord, error) {
	var recs []keyRecord
	for next() {
		var r keyRecord
		if err := scan(&r.scope, &r.key, &r.body, &r.point, &r.data); err != nil {
			done()
			return nil, err
		}
		recs = append(recs, r)
	}
	if err := done(); err != nil {
		return nil, err
	}
	return recs, nil
}

// sealRecords rewrites the records of idem_keys whose key is kept in
// clear, or whose body or recovery point is (when bodyKeys are given): the
// key sealed, the body and the point's data opened and sealed again for
// it. It returns how many records it rewrote. A body or point that
// bodyKeys do not open stops it, so that nothing is rewritten that a
// server could no longer read.
func sealRecords(secret []byte, bodyKeys []idemhttp.BodyKey, db sealAccess) (int, error) {
	if db.lock != nil {
		if err := db.lock("idem_keys"); err != nil {
			return 0, fmt.Errorf("locking idem_keys: %w", err)
		}
	}
	recs, err := db.records(`SELECT scope, key, body, recovery_point, recovery_data FROM idem_keys`)
	if err != nil {
		return 0, fmt.Errorf("reading idem_keys: %w", err)
	}
	ph := db.placeholders
	n := 0
	for _, r := range recs {
		scope, key := idem.Scope(r.scope), idem.Key(r.key)
		sealed := key
		if !idemhttp.IsSealedKey(key) {
			sealed = idemhttp.SealKey(secret, scope, key)
		}
		body, data := r.body, r.data
		if len(body) > 0 && (sealed != key || (bodyKeys != nil && !keyed.IsSealedData(body))) {
			if body, err = keyed.ResealBody(bodyKeys, scope, key, sealed, body); err != nil {
				return 0, fmt.Errorf("the body kept for a key of scope %q: %w", r.scope, err)
			}
		}
		if r.point != nil && (sealed != key || !keyed.IsSealedData(data)) {
			if data, err = keyed.ResealPoint(bodyKeys, scope, key, sealed, *r.point, data); err != nil {
				return 0, fmt.Errorf("the recovery point of a key of scope %q: %w", r.scope, err)
			}
		}
		if sealed == key && bytes.Equal(body, r.body) && bytes.Equal(data, r.data) {
			continue
		}
		k, err := db.update(`UPDATE idem_keys SET key = `+ph[0]+`, body = `+ph[1]+`, recovery_data = `+ph[2]+
			` WHERE scope = `+ph[3]+` AND key = `+ph[4], string(sealed), body, data, r.scope, r.key)
		if err != nil {
			return 0, fmt.Errorf("sealing a record of idem_keys: %w", err)
		}
		n += int(k)
	}
	return n, nil
}
