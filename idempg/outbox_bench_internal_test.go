package idempg

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/idem-go/idem/idemtest"
	"github.com/idem-go/idem/internal/pgsql"
)

// BenchmarkOutboxAddOne measures the statement that adds one message to the
// outbox, 8 callers at once, each Add on its own: "values", the single-row
// INSERT Outbox.Add sends for one message, against "unnest", the INSERT
// from arrays it sends for several, given the same one message.
//
//	go test -run '^$' -bench OutboxAddOne -count 5 ./idempg/
func BenchmarkOutboxAddOne(b *testing.B) {
	url := idemtest.RequireService(b, "PostgreSQL", "IDEM_POSTGRES_URL",
		"postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
	suffix := make([]byte, 6)
	rand.Read(suffix)
	schema := "idempg_bench_outbox_" + hex.EncodeToString(suffix)
	db, err := Open(b.Context(), url, &Config{Schema: schema, MaxConns: 10})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		defer db.Close()
		if _, err := db.Pool().Exec(context.Background(), "DROP SCHEMA "+quoteIdent(schema)+" CASCADE"); err != nil {
			b.Error(err)
		}
	})
	if _, err := NewOutbox(b.Context(), db, nil); err != nil {
		b.Fatal(err)
	}
	payload := []byte(`{"type":"payment.succeeded","payment":{"id":"pay_123","amount":1200,"currency":"KRW"}}`)
	headers := `{"content-type":"application/json"}`
	var n atomic.Int64
	for _, bb := range []struct {
		name string
		args func(id string) []any
		sql  string
	}{
		{"values", func(id string) []any {
			return []any{id, "payments", "acct_1", &headers, false, payload, nil, nil}
		}, pgsql.OutboxAddOne},
		{"unnest", func(id string) []any {
			return []any{[]string{id}, []string{"payments"}, []string{"acct_1"}, []*string{&headers}, []bool{false}, [][]byte{payload}, []any{nil}, nil}
		}, outboxAddSQL},
	} {
		b.Run(bb.name, func(b *testing.B) {
			b.SetParallelism(4) // 8 callers on 2 CPUs
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := db.Pool().Exec(b.Context(), bb.sql, bb.args(fmt.Sprint("m-", n.Add(1)))...); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
