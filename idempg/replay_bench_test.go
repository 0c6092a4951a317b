package idempg_test

import (
	"context"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idempg"
)

// BenchmarkReplay measures Store.Replay of a completed key, 8 callers at
// once, three ways in one run on one schema: "prepared", the default (a
// statement prepared once per connection, read through pgconn); "pgx", the
// same SELECT through pgx's QueryRow (statements cached by pgx), which a
// store with a Config.Clock of its own takes; and "minimum", the SELECT of
// status and body by key that hand-written code would send. Compare the
// ns/op of the three:
//
//	go test -run '^$' -bench Replay -count 5 ./idempg/
func BenchmarkReplay(b *testing.B) {
	url := pgURL(b)
	schema := freshSchema(b, url)
	db := openDB(b, url, idempg.Config{Schema: schema, MaxConns: 10})
	s := newStore(b, db)
	ctx := b.Context()
	fp := idem.NewFingerprint("POST", "/v1/payments", "", "application/json", []byte(`{"amount":1}`))
	completeKey(b, s, "k", fp, idem.Response{Status: 201, Header: map[string][]string{"Content-Type": {"application/json"}},
		Body: []byte(`{"id":"pay_123","status":"succeeded"}`)})
	if _, err := db.Pool().Exec(ctx, `CREATE TABLE minimum_keys (key text PRIMARY KEY, status int, body bytea);
		INSERT INTO minimum_keys VALUES ('k', 201, '{"id":"pay_123","status":"succeeded"}')`); err != nil {
		b.Fatal(err)
	}
	// A store with a clock of its own reads through pgx (its time is a
	// parameter of the SELECT).
	viaPgx := newStore(b, openDB(b, url, idempg.Config{Schema: schema, MaxConns: 10, Clock: idem.SystemClock{}}))

	replay := func(s *idempg.Store) func(context.Context) error {
		return func(ctx context.Context) error {
			resp, mismatch, err := s.Replay(ctx, "", "k", fp)
			if err == nil && (mismatch || resp == nil || resp.Status != 201) {
				b.Fatalf("Replay = %+v, %v", resp, mismatch)
			}
			return err
		}
	}
	for _, bb := range []struct {
		name string
		do   func(context.Context) error
	}{
		{"prepared", replay(s)},
		{"pgx", replay(viaPgx)},
		{"minimum", func(ctx context.Context) error {
			var status int
			var body []byte
			return db.Pool().QueryRow(ctx, `SELECT status, body FROM minimum_keys WHERE key = $1`, "k").Scan(&status, &body)
		}},
	} {
		b.Run(bb.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetParallelism(4) // 8 callers on 2 CPUs
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := bb.do(ctx); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// completeKey claims key and completes it with resp.
func completeKey(t testing.TB, s *idempg.Store, key idem.Key, fp idem.Fingerprint, resp idem.Response) {
	t.Helper()
	c, err := s.Claim(t.Context(), idem.ClaimRequest{Key: key, Fingerprint: fp, Lease: time.Minute, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(t.Context(), idem.Ref{Key: key, Token: c.Token}, resp); err != nil {
		t.Fatal(err)
	}
}
