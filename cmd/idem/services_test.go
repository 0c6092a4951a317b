package main

import (
	"context"
	crand "crypto/rand"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/idem-go/idem/idemtest"
)

func postgresURL(t *testing.T) string {
	t.Helper()
	return idemtest.RequireService(t, "PostgreSQL", "IDEM_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable")
}

func redisURL(t *testing.T) string {
	t.Helper()
	return idemtest.RequireService(t, "Redis", "IDEM_REDIS_URL", "redis://127.0.0.1:6379/0")
}

// randomName is prefix followed by random lower-case letters and digits,
// a valid unquoted PostgreSQL identifier and Redis key prefix.
func randomName(prefix string) string {
	return prefix + strings.ToLower(crand.Text()[:16])
}

// freshSchema names a schema no other test uses, and drops it (with
// everything in it) when the test ends. The schema itself is created by
// whatever opens it first.
func freshSchema(t *testing.T, url string) string {
	t.Helper()
	schema := randomName("idem_cmd_")
	t.Cleanup(func() {
		// t.Context is already cancelled when cleanups run.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Errorf("dropping schema %s: %v", schema, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, `DROP SCHEMA IF EXISTS `+pgx.Identifier{schema}.Sanitize()+` CASCADE`); err != nil {
			t.Errorf("dropping schema %s: %v", schema, err)
		}
	})
	return schema
}

// freshPrefix names a Redis key prefix no other test uses, and deletes its
// keys when the test ends.
func freshPrefix(t *testing.T, url string) string {
	t.Helper()
	prefix := randomName("idemcmd")
	t.Cleanup(func() {
		opts, err := redis.ParseURL(url)
		if err != nil {
			t.Errorf("cleaning up Redis prefix %s: %v", prefix, err)
			return
		}
		client := redis.NewClient(opts)
		defer client.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		iter := client.Scan(ctx, 0, prefix+":*", 500).Iterator()
		for iter.Next(ctx) {
			client.Del(ctx, iter.Val())
		}
		if err := iter.Err(); err != nil {
			t.Errorf("cleaning up Redis prefix %s: %v", prefix, err)
		}
	})
	return prefix
}

func TestServeOnPostgres(t *testing.T) {
	t.Parallel()
	for _, withRedis := range []bool{false, true} {
		name := "keys in PostgreSQL"
		if withRedis {
			name = "keys in Redis"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			pg := postgresURL(t)
			dbArgs := []string{"--db", pg, "--pg-schema", freshSchema(t, pg)}
			if withRedis {
				rd := redisURL(t)
				dbArgs = append(dbArgs, "--keys", rd, "--keys-prefix", freshPrefix(t, rd))
			}
			const apiKey = "test-key-pg"
			srv := startServe(t, newApp(nil), append(dbArgs, "--api-keys", "acme:"+apiKey, "--log-level", "info", "--key-lease", "30s")...)
			paymentID := checkChargesOnce(t, srv, apiKey)
			stopCleanly(t, srv)

			logged := srv.stderr.String()
			for _, want := range []string{"db=", "schema idem_cmd_", "key_lease=30s"} {
				if !strings.Contains(logged, want) {
					t.Errorf("serve's start-up record lacks %q:\n%s", want, logged)
				}
			}
			if withRedis && !strings.Contains(logged, `keys="redis://`) {
				t.Errorf("serve did not log the key store:\n%s", logged)
			}
			checkKeysTools(t, paymentID, dbArgs...)

			// A second server on the same schema finds the data the first
			// left: a replica started later, or the first restarted.
			srv2 := startServe(t, newApp(nil), append(dbArgs, "--api-keys", "acme:"+apiKey, "--log-level", "warn")...)
			var got paymentBody
			if resp := srv2.call(t, "GET", "/v1/payments/"+paymentID, apiKey, "", nil, &got); resp.StatusCode != 200 || got.ID != paymentID {
				t.Errorf("GET the payment from a second server: status %d, %+v", resp.StatusCode, got)
			}
			stopCleanly(t, srv2)
		})
	}
}

func TestMigrateConcurrentlyOnPostgres(t *testing.T) {
	t.Parallel()
	pg := postgresURL(t)
	schema := freshSchema(t, pg)
	args := []string{"migrate", "--db", pg, "--pg-schema", schema}

	type result struct {
		code        int
		out, errOut string
	}
	results := make([]result, 2)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range results {
		wg.Go(func() {
			<-start
			var r result
			r.code, r.out, r.errOut = runCmd(t, args...)
			results[i] = r
		})
	}
	close(start)
	wg.Wait()
	for i, r := range results {
		if r.code != exitOK || strings.Count(r.out, "up to date") != 2 {
			t.Errorf("migrate %d: exit %d, stdout %q, stderr %q; want 0 and two 'up to date'", i, r.code, r.out, r.errOut)
		}
		if !strings.Contains(r.out, "(schema "+schema+")") {
			t.Errorf("migrate %d: stdout %q does not name the schema", i, r.out)
		}
	}
	if code, out, errOut := runCmd(t, args...); code != exitOK {
		t.Fatalf("migrate again: exit %d, stdout %q, stderr %q", code, out, errOut)
	}

	ctx := t.Context()
	conn, err := pgx.Connect(ctx, pg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var n int
	err = conn.QueryRow(ctx, `SELECT count(*) FROM information_schema.tables WHERE table_schema = $1 AND table_name IN ('accounts', 'payments', 'deposits', 'settlements', 'idem_outbox', 'idem_inbox', 'idem_dead_letters')`, schema).Scan(&n)
	if err != nil || n != 7 {
		t.Fatalf("payment and message tables in schema %s: %d, %v; want 7", schema, n, err)
	}
	if code, out, errOut := runCmd(t, "dlq", "ls", "--db", pg, "--pg-schema", schema, "--json"); code != exitOK || strings.TrimSpace(out) != "[]" {
		t.Errorf("dlq ls on a migrated schema: exit %d, stdout %q, stderr %q", code, out, errOut)
	}

	code, _, errOut := runCmd(t, "keys", "show", "--db", pg, "--pg-schema", schema, "--scope", "t", "k")
	if code != exitFailure || !strings.Contains(errOut, "no idempotency key") {
		t.Errorf("keys show on a migrated schema: exit %d, stderr %q", code, errOut)
	}
}

// deleteNATSStream deletes a stream a test's serve created.
func deleteNATSStream(url, stream string) error {
	nc, err := nats.Connect(url)
	if err != nil {
		return fmt.Errorf("connecting to delete stream %s: %w", stream, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := js.DeleteStream(ctx, stream); err != nil {
		return fmt.Errorf("deleting stream %s: %w", stream, err)
	}
	return nil
}

// deleteAMQP deletes the exchange and queue a test's serve declared; its
// delay queues expire on their own.
func deleteAMQP(url, exchange, queue string) error {
	conn, err := amqp.Dial(url)
	if err != nil {
		return fmt.Errorf("connecting to delete exchange %s: %w", exchange, err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	// And the queue that keeps what the main queue gives up past its
	// delivery limit (see idemamqp's doc).
	if _, err := ch.QueueDelete(queue+".limit", false, false, false); err != nil {
		return fmt.Errorf("deleting queue %s.limit: %w", queue, err)
	}
	if _, err := ch.QueueDelete(queue, false, false, false); err != nil {
		return fmt.Errorf("deleting queue %s: %w", queue, err)
	}
	if err := ch.ExchangeDelete(exchange, false, false); err != nil {
		return fmt.Errorf("deleting exchange %s: %w", exchange, err)
	}
	return nil
}
