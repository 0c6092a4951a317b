package main

import (
	"net/url"
	"path/filepath"
	"strings"
	"testing"
)

// TestNoSecretOfAURLIsPrinted runs commands whose URLs carry secrets in
// every place a URL can hold one, against ports nobody listens on (port 1
// refuses at once): each must fail, say what failed, and print no secret.
func TestNoSecretOfAURLIsPrinted(t *testing.T) {
	t.Parallel()
	const pgDown = "postgres://postgres@127.0.0.1:1/db?sslmode=disable"
	for _, tc := range []struct {
		name   string
		args   []string
		secret string
		// want is what stderr must say: what failed, the URL redacted.
		want string
	}{
		{name: "serve, PostgreSQL ?password=", args: []string{"serve", "--db", pgDown + "&password=SEKRET1"}, secret: "SEKRET1",
			want: "opening PostgreSQL " + pgDown + "&password=xxxxx (schema idem): "},
		{name: "serve, PostgreSQL ?sslpassword=", args: []string{"serve", "--db", pgDown + "&sslpassword=SEKRET1b"}, secret: "SEKRET1b",
			want: "opening PostgreSQL " + pgDown + "&sslpassword=xxxxx"},
		{name: "serve, NATS token", args: []string{"serve", "--broker", "nats://SEKRET2@127.0.0.1:1"}, secret: "SEKRET2",
			want: "opening NATS JetStream at nats://xxxxx@127.0.0.1:1: "},
		{name: "serve, NATS tls token", args: []string{"serve", "--broker", "tls://SEKRET2b@127.0.0.1:1"}, secret: "SEKRET2b",
			want: "opening NATS JetStream at tls://xxxxx@127.0.0.1:1: "},
		{name: "serve, NATS user and password", args: []string{"serve", "--broker", "nats://u:SEKRET2c@127.0.0.1:1"}, secret: "SEKRET2c",
			want: "opening NATS JetStream at nats://u:xxxxx@127.0.0.1:1: "},
		{name: "serve, NATS ?token=", args: []string{"serve", "--broker", "nats://127.0.0.1:1?token=SEKRET2d"}, secret: "SEKRET2d",
			want: "opening NATS JetStream at nats://127.0.0.1:1?token=xxxxx: "},
		{name: "serve, RabbitMQ ?auth_token=", args: []string{"serve", "--broker", "amqp://guest:guest@127.0.0.1:1/?auth_token=SEKRET2e"}, secret: "SEKRET2e",
			want: "opening RabbitMQ at amqp://guest:xxxxx@127.0.0.1:1/?auth_token=xxxxx: "},
		// A database "number" rueidis refuses fails before dialling: a
		// refused dial leaves a goroutine of rueidis sleeping for up to a
		// second, which goleak would catch at the end of a short run.
		{name: "serve, Redis ?password=", args: []string{"serve", "--keys", "redis://127.0.0.1:1/db0?password=SEKRET2f"}, secret: "SEKRET2f",
			want: "opening the Redis key store redis://127.0.0.1:1/db0?password=xxxxx: idemredis: invalid Redis URL"},
		{name: "serve, NATS token that does not parse", args: []string{"serve", "--broker", "nats://SEK RET2g@127.0.0.1:1"}, secret: "RET2g",
			want: "--broker: the URL does not parse"},
		{name: "dlq ls", args: []string{"dlq", "ls", "--db", pgDown + "&password=SEKRET3"}, secret: "SEKRET3",
			want: "opening PostgreSQL " + pgDown + "&password=xxxxx"},
		{name: "migrate", args: []string{"migrate", "--db", pgDown + "&password=SEKRET3b"}, secret: "SEKRET3b",
			want: "opening PostgreSQL " + pgDown + "&password=xxxxx"},
		{name: "keys purge, PostgreSQL", args: []string{"keys", "purge", "--db", pgDown + "&password=SEKRET3c"}, secret: "SEKRET3c",
			want: "opening PostgreSQL " + pgDown + "&password=xxxxx"},
		{name: "keys purge, Redis", args: []string{"keys", "purge", "--keys", "redis://127.0.0.1:1/db0?password=SEKRET3d"}, secret: "SEKRET3d",
			want: "opening the Redis key store redis://127.0.0.1:1/db0?password=xxxxx: idemredis: invalid Redis URL"},
		{name: "sqlite path with a key", args: []string{"keys", "purge", "--db", "sqlite:" + filepath.Join(t.TempDir(), "none.db") + "?key=SEKRET3e"}, secret: "SEKRET3e",
			want: "none.db?key=xxxxx does not exist (create it with 'idem migrate --db sqlite:"},
		{name: "bench, Redis URL that does not parse", args: []string{"bench", "--redis", "redis://:SEKRET3f%zz@127.0.0.1:1/0", "--requests", "1", "--rounds", "1"},
			secret: "SEKRET3f", want: "invalid URL escape"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			args := tc.args
			if args[0] == "serve" {
				args = append(args, "--api-keys", "a:b", "--addr", "127.0.0.1:0")
				if !hasFlag(args, "--db") {
					args = append(args, "--db", "sqlite:"+filepath.Join(t.TempDir(), "idem.db"))
				}
			}
			code, out, errOut := runCmd(t, args...)
			if code != exitFailure {
				t.Errorf("exit status %d, want %d; stderr %q", code, exitFailure, errOut)
			}
			if strings.Contains(out, tc.secret) || strings.Contains(errOut, tc.secret) {
				t.Errorf("the secret %q is printed; stdout %q, stderr %q", tc.secret, out, errOut)
			}
			if !strings.Contains(errOut, tc.want) {
				t.Errorf("stderr %q, want it to say %q", errOut, tc.want)
			}
		})
	}
}

func hasFlag(args []string, flag string) bool {
	for _, a := range args {
		if a == flag {
			return true
		}
	}
	return false
}

// TestServeStartUpLineHidesQueryPassword starts serve on the real
// PostgreSQL with a password in the URL's query: trust authentication
// ignores it, so the server starts, and its start-up record must not show
// it.
func TestServeStartUpLineHidesQueryPassword(t *testing.T) {
	t.Parallel()
	pg := postgresURL(t)
	u, err := url.Parse(pg)
	if err != nil {
		t.Fatalf("parsing the PostgreSQL URL: %v", err)
	}
	q := u.Query()
	q.Set("password", "SEKRET4")
	u.RawQuery = q.Encode()
	srv := startServe(t, newApp(nil), "--db", u.String(), "--pg-schema", freshSchema(t, pg), "--api-keys", "acme:k", "--log-level", "info")
	stopCleanly(t, srv)
	logged := srv.stderr.String()
	if strings.Contains(logged, "SEKRET4") {
		t.Errorf("serve printed the password:\n%s", logged)
	}
	if !strings.Contains(logged, "password=xxxxx") || !strings.Contains(logged, "idem serve started") {
		t.Errorf("serve's start-up record does not name the database, password masked:\n%s", logged)
	}
}
