package localserver_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/idem-go/idem/cmd/idem/internal/localserver"
	"github.com/idem-go/idem/idemtest"
)

// start starts a server with fn, skipping the test when its program is
// not installed (failing it under IDEM_REQUIRE_SERVICES=1), and closes it
// when the test ends.
func start(t *testing.T, fn func(context.Context, string) (*localserver.Server, error)) *localserver.Server {
	t.Helper()
	s, err := fn(t.Context(), t.TempDir())
	var notFound *exec.Error
	if errors.As(err, &notFound) || (err != nil && strings.Contains(err.Error(), "which is not installed")) {
		if os.Getenv(idemtest.RequireServicesEnv) == "1" {
			t.Fatalf("%v; %s=1 requires it", err, idemtest.RequireServicesEnv)
		}
		t.Skipf("skipping: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
		if t.Failed() {
			// The server's output, and RabbitMQ's own logs beside it.
			logs, _ := filepath.Glob(filepath.Join(filepath.Dir(s.Log()), "log", "*.log"))
			for _, path := range append([]string{s.Log()}, logs...) {
				b, _ := os.ReadFile(path)
				if len(b) > 8000 {
					b = b[len(b)-8000:]
				}
				t.Logf("--- the end of %s:\n%s", path, b)
			}
		}
	})
	return s
}

// Each server keeps what it acknowledged through a SIGKILL and a restart
// on the same port, and through a clean restart too.
func TestLocalServers(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		start func(context.Context, string) (*localserver.Server, error)
		url   string // the URL's form, up to the port
		// setup, when set, makes what write needs, which a clean restart
		// then writes out.
		setup, write, read func(t *testing.T, url string)
	}{
		{"postgres", localserver.StartPostgres, "postgres://postgres@127.0.0.1:", nil, pgWrite, pgRead},
		{"redis", localserver.StartRedis, "redis://127.0.0.1:", nil, redisWrite, redisRead},
		{"nats", localserver.StartNATS, "nats://127.0.0.1:", nil, natsWrite, natsRead},
		// A queue's declaration lives in Mnesia, whose log the node
		// writes after it has answered declare-ok: a SIGKILL soon after
		// lost the queue, and the message in it, in 1 run of 6 on
		// RabbitMQ 3.10.8 with the CPUs busy ("Recovering 0 queues").
		{"rabbitmq", localserver.StartRabbitMQ, "amqp://guest:guest@127.0.0.1:", amqpDeclare, amqpWrite, amqpRead},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := start(t, tc.start)
			if s.Name() != tc.name || !strings.HasPrefix(s.URL(), tc.url) {
				t.Fatalf("Name %q, URL %q; want %q and a URL starting %q", s.Name(), s.URL(), tc.name, tc.url)
			}
			url := s.URL()
			if tc.setup != nil {
				tc.setup(t, url)
				if err := s.Restart(t.Context(), false); err != nil {
					t.Fatal(err)
				}
			}
			tc.write(t, url)
			if err := s.Restart(t.Context(), true); err != nil {
				t.Fatal(err)
			}
			if s.URL() != url {
				t.Errorf("URL after the restart %q, want %q", s.URL(), url)
			}
			tc.read(t, url)
			if err := s.Restart(t.Context(), false); err != nil {
				t.Fatal(err)
			}
			tc.read(t, url)
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			if err := s.Restart(t.Context(), true); err == nil {
				t.Error("Restart after Close succeeded")
			}
		})
	}
}

// A volatile Redis answers like any other, and forgets everything when
// it restarts, cleanly or not.
func TestVolatileRedis(t *testing.T) {
	t.Parallel()
	s := start(t, localserver.StartVolatileRedis)
	if s.Name() != "redis" {
		t.Errorf("Name %q, want redis", s.Name())
	}
	for _, crash := range []bool{true, false} {
		redisWrite(t, s.URL())
		redisRead(t, s.URL())
		if err := s.Restart(t.Context(), crash); err != nil {
			t.Fatal(err)
		}
		n, err := redisClient(t, s.URL()).DBSize(ctx(t)).Result()
		if err != nil || n != 0 {
			t.Errorf("after a restart (crash %v): %d keys, %v; want none", crash, n, err)
		}
	}
}

// The error for a server that does not start names its program and
// carries its log's end.
func TestLocalServerStartFailure(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	// A file where the folder should be.
	if err := os.WriteFile(dir+"/data", []byte("not a folder"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := localserver.StartPostgres(t.Context(), dir)
	if err == nil {
		t.Fatal("StartPostgres on a file succeeded")
	}
	if strings.Contains(err.Error(), "which is not installed") {
		if os.Getenv(idemtest.RequireServicesEnv) == "1" {
			t.Fatal(err)
		}
		t.Skip(err)
	}
	if !strings.Contains(err.Error(), "initdb") {
		t.Errorf("the error does not name initdb: %v", err)
	}
}

func ctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// pgWrite also leaves a backend busy with a long query when the crash
// comes. Each backend is a session of its own, outside the postmaster's
// process group, and one that computes notices its postmaster's death only
// once it waits for something: left running, it keeps the new postmaster
// from starting beside the shared memory it holds.
func pgWrite(t *testing.T, url string) {
	conn, err := pgx.Connect(ctx(t), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx(t), `CREATE TABLE kept (v text); INSERT INTO kept VALUES ('acknowledged')`); err != nil {
		t.Fatal(err)
	}
	busy, err := pgx.Connect(ctx(t), url)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		// Ends with an error when the crash cuts the connection.
		_, _ = busy.Exec(context.Background(), `SELECT count(*) FROM generate_series(1, 100000000000)`)
	}()
	t.Cleanup(func() {
		busy.Close(context.Background())
		<-done
	})
	for step := time.Millisecond; ; step = min(2*step, 100*time.Millisecond) {
		var n int
		if err := conn.QueryRow(ctx(t), `SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND query LIKE '%generate_series%' AND pid <> pg_backend_pid()`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
		time.Sleep(step)
	}
}

func pgRead(t *testing.T, url string) {
	conn, err := pgx.Connect(ctx(t), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var v string
	if err := conn.QueryRow(ctx(t), `SELECT v FROM kept`).Scan(&v); err != nil || v != "acknowledged" {
		t.Fatalf("the row after the restart: %q, %v", v, err)
	}
}

func redisClient(t *testing.T, url string) *redis.Client {
	opts, err := redis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(opts)
	t.Cleanup(func() { c.Close() })
	return c
}

func redisWrite(t *testing.T, url string) {
	if err := redisClient(t, url).Set(ctx(t), "kept", "acknowledged", 0).Err(); err != nil {
		t.Fatal(err)
	}
}

func redisRead(t *testing.T, url string) {
	if v, err := redisClient(t, url).Get(ctx(t), "kept").Result(); err != nil || v != "acknowledged" {
		t.Fatalf("the key after the restart: %q, %v", v, err)
	}
}

func natsJS(t *testing.T, url string) jetstream.JetStream {
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

func natsWrite(t *testing.T, url string) {
	js := natsJS(t, url)
	if _, err := js.CreateStream(ctx(t), jetstream.StreamConfig{Name: "KEPT", Subjects: []string{"kept"}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx(t), "kept", []byte("acknowledged")); err != nil {
		t.Fatal(err)
	}
}

func natsRead(t *testing.T, url string) {
	stream, err := natsJS(t, url).Stream(ctx(t), "KEPT")
	if err != nil {
		t.Fatal(err)
	}
	msg, err := stream.GetMsg(ctx(t), 1)
	if err != nil || string(msg.Data) != "acknowledged" {
		t.Fatalf("the message after the restart: %v", err)
	}
}

func amqpChannel(t *testing.T, url string) *amqp.Channel {
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

func amqpDeclare(t *testing.T, url string) {
	if _, err := amqpChannel(t, url).QueueDeclare("kept", true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
}

func amqpWrite(t *testing.T, url string) {
	ch := amqpChannel(t, url)
	// Confirmed: the broker has the message on disk when it says so.
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	conf, err := ch.PublishWithDeferredConfirmWithContext(ctx(t), "", "kept", false, false,
		amqp.Publishing{DeliveryMode: amqp.Persistent, Body: []byte("acknowledged")})
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := conf.WaitContext(ctx(t)); err != nil || !ok {
		t.Fatalf("publish confirmed %v, %v", ok, err)
	}
}

func amqpRead(t *testing.T, url string) {
	ch := amqpChannel(t, url)
	// Not acknowledged, so that the clean restart after the first read
	// finds it still there.
	msg, ok, err := ch.Get("kept", false)
	if err != nil || !ok || string(msg.Body) != "acknowledged" {
		t.Fatalf("the message after the restart: %q, %v, %v", msg.Body, ok, err)
	}
}
