package secreturl

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
)

func TestRedact(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, in, want string
		// secrets must not appear in what Redact returns.
		secrets []string
	}{
		// PostgreSQL: the user-info password, password and sslpassword in
		// the query; sslkey and sslcert are file paths and stay.
		{name: "postgres user-info password", in: "postgres://u:pw1@h/db", want: "postgres://u:xxxxx@h/db", secrets: []string{"pw1"}},
		{name: "postgres escaped password", in: "postgres://u:p%40ss@h/db", want: "postgres://u:xxxxx@h/db", secrets: []string{"p%40ss", "p@ss"}},
		{name: "postgres query password", in: "postgres://postgres@127.0.0.1:5432/test?sslmode=disable&password=SEKRET",
			want: "postgres://postgres@127.0.0.1:5432/test?sslmode=disable&password=xxxxx", secrets: []string{"SEKRET"}},
		{name: "postgresql sslpassword, sslkey kept", in: "postgresql://u@h:5433/db?sslkey=/etc/idem/client.key&sslpassword=S2&sslcert=/etc/idem/client.crt",
			want: "postgresql://u@h:5433/db?sslkey=/etc/idem/client.key&sslpassword=xxxxx&sslcert=/etc/idem/client.crt", secrets: []string{"S2"}},
		{name: "postgres both", in: "postgres://u:pw3@h/db?password=pw4", want: "postgres://u:xxxxx@h/db?password=xxxxx", secrets: []string{"pw3", "pw4"}},
		{name: "postgres name upper-case", in: "postgres://h/db?PassWord=S5", want: "postgres://h/db?PassWord=xxxxx", secrets: []string{"S5"}},
		{name: "postgres name percent-encoded", in: "postgres://h/db?pass%77ord=S6", want: "postgres://h/db?pass%77ord=xxxxx", secrets: []string{"S6"}},
		{name: "postgres passfile", in: "postgres://h/db?passfile=/home/u/.pgpass", want: "postgres://h/db?passfile=xxxxx", secrets: []string{".pgpass"}},
		{name: "postgres semicolon", in: "postgres://h/db?a=1;password=S7", want: "postgres://h/db?a=1;password=xxxxx", secrets: []string{"S7"}},
		{name: "postgres escaped value", in: "postgres://h/db?password=a%26b%3Dc", want: "postgres://h/db?password=xxxxx", secrets: []string{"a%26b", "b%3Dc"}},
		{name: "postgres fragment kept", in: "postgres://u:pw8@h/db#primary", want: "postgres://u:xxxxx@h/db#primary", secrets: []string{"pw8"}},
		{name: "postgres nothing secret", in: "postgres://postgres@127.0.0.1/test?sslmode=disable", want: "postgres://postgres@127.0.0.1/test?sslmode=disable"},
		{name: "postgres name without value", in: "postgres://h/db?password", want: "postgres://h/db?password"},

		// Redis: the user-info password (a username alone is a name, not a
		// secret) and secret-named query parameters.
		{name: "redis password only", in: "redis://:pw9@h:6379/0", want: "redis://:xxxxx@h:6379/0", secrets: []string{"pw9"}},
		{name: "rediss user and password", in: "rediss://default:pw10@cache.example:6380/2", want: "rediss://default:xxxxx@cache.example:6380/2", secrets: []string{"pw10"}},
		{name: "redis username kept", in: "redis://alice@h/0", want: "redis://alice@h/0"},
		{name: "redis query password", in: "redis://h/0?dial_timeout=5s&password=S11", want: "redis://h/0?dial_timeout=5s&password=xxxxx", secrets: []string{"S11"}},
		{name: "redis scheme lower-cased", in: "REDIS://h/0", want: "redis://h/0"},

		// NATS: a user-info without a password is a token.
		{name: "nats token", in: "nats://SEKRET12@127.0.0.1:4222", want: "nats://xxxxx@127.0.0.1:4222", secrets: []string{"SEKRET12"}},
		{name: "tls token", in: "tls://SEKRET13@nats.example:4222", want: "tls://xxxxx@nats.example:4222", secrets: []string{"SEKRET13"}},
		{name: "nats token upper-case scheme", in: "NATS://SEKRET14@h", want: "nats://xxxxx@h", secrets: []string{"SEKRET14"}},
		{name: "nats user and password", in: "nats://u:pw15@h:4222", want: "nats://u:xxxxx@h:4222", secrets: []string{"pw15"}},
		{name: "nats query token", in: "nats://h:4222?token=S16", want: "nats://h:4222?token=xxxxx", secrets: []string{"S16"}},
		{name: "nats no user-info", in: "nats://127.0.0.1:4222", want: "nats://127.0.0.1:4222"},
		{name: "nats server list", in: "nats://T1@a:4222,nats://u:T2@b:4222,nats://c:4222", want: "nats://xxxxx@a:4222,nats://u:xxxxx@b:4222,nats://c:4222", secrets: []string{"T1", "T2"}},
		{name: "nats server list without schemes", in: "nats://T3@a:4222, T4@b:4222", want: "nats://xxxxx@a:4222, xxxxx@b:4222", secrets: []string{"T3", "T4"}},

		// RabbitMQ: the user-info password and secret-named query
		// parameters; a username alone stays.
		{name: "amqp user and password", in: "amqp://guest:S17@h:5672/", want: "amqp://guest:xxxxx@h:5672/", secrets: []string{"S17"}},
		{name: "amqp username kept", in: "amqp://guest@h:5672/", want: "amqp://guest@h:5672/"},
		{name: "amqps tokens", in: "amqps://h/vhost?heartbeat=10&auth_token=S18&access_token=S19",
			want: "amqps://h/vhost?heartbeat=10&auth_token=xxxxx&access_token=xxxxx", secrets: []string{"S18", "S19"}},

		// Every scheme: keys and secrets by name.
		{name: "api keys", in: "amqp://h/?apikey=S20&api_key=S21&api-key=S22&key=S23&keyfile=/k",
			want: "amqp://h/?apikey=xxxxx&api_key=xxxxx&api-key=xxxxx&key=xxxxx&keyfile=/k", secrets: []string{"S20", "S21", "S22", "S23"}},
		{name: "secrets", in: "redis://h/0?secret=S24&client_secret=S25", want: "redis://h/0?secret=xxxxx&client_secret=xxxxx", secrets: []string{"S24", "S25"}},
		{name: "unknown scheme", in: "mysql://u:S26@h/db?token=S27", want: "mysql://u:xxxxx@h/db?token=xxxxx", secrets: []string{"S26", "S27"}},

		// SQLite: file paths, where '%' and spaces are ordinary characters;
		// they are shown as given, secrets masked.
		{name: "sqlite path", in: "sqlite:idem.db", want: "sqlite:idem.db"},
		{name: "sqlite absolute", in: "sqlite:///var/lib/idem/idem.db", want: "sqlite:///var/lib/idem/idem.db"},
		{name: "sqlite odd path", in: "sqlite:///tmp/100% sure.db", want: "sqlite:///tmp/100% sure.db"},
		{name: "sqlite query key", in: "sqlite:idem.db?_pragma=foreign_keys(1)&key=S28", want: "sqlite:idem.db?_pragma=foreign_keys(1)&key=xxxxx", secrets: []string{"S28"}},
		{name: "sqlite user-info", in: "sqlite://u:S29@idem.db", want: "sqlite://u:xxxxx@idem.db", secrets: []string{"S29"}},
	} {
		got, err := Redact(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("%s: Redact(%q) = %q, %v; want %q", tc.name, tc.in, got, err, tc.want)
		}
		for _, s := range tc.secrets {
			if strings.Contains(got, s) {
				t.Errorf("%s: Redact(%q) = %q shows %q", tc.name, tc.in, got, s)
			}
		}
	}
}

func TestRedactRefusesWhatDoesNotParse(t *testing.T) {
	t.Parallel()
	for _, in := range []string{
		"postgres://u:pw%zz1@h/db",
		"redis://:pw2@h:port/0",
		"nats://TOK EN3@h",
		"amqp://guest:pw4@h:notaport/",
		"postgres://h/db\x7f?password=pw5",
		":pw6@h",
	} {
		got, err := Redact(in)
		if !errors.Is(err, ErrUnparsable) || got != "" {
			t.Errorf("Redact(%q) = %q, %v; want no text and ErrUnparsable", in, got, err)
		}
		if err != nil && strings.Contains(err.Error(), "pw") {
			t.Errorf("Redact(%q) error %q quotes the URL", in, err)
		}
	}
}

func TestScrub(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, raw, msg string
		secrets        []string
		// keep must still be in the scrubbed message.
		keep string
	}{
		{name: "user-info password", raw: "postgres://u:hunter2@h/db", msg: "dial postgres://u:hunter2@h/db: refused (hunter2)",
			secrets: []string{"hunter2"}, keep: "refused"},
		{name: "query password", raw: "postgres://u@h:1/db?sslmode=disable&password=SEKRET1",
			msg: "cannot parse `postgres://u@h:1/db?sslmode=disable&password=SEKRET1`: bad", secrets: []string{"SEKRET1"}, keep: "sslmode=disable"},
		{name: "nats token", raw: "nats://SEKRET2@127.0.0.1:1", msg: "nats: authorization violation for SEKRET2", secrets: []string{"SEKRET2"}, keep: "authorization violation"},
		{name: "nats query token", raw: "nats://h?token=SEKRET3", msg: "bad token SEKRET3", secrets: []string{"SEKRET3"}, keep: "bad token"},
		{name: "decoded user-info", raw: "postgres://u:p%40ss%21@h/db", msg: "auth failed for p@ss! and p%40ss%21", secrets: []string{"p@ss!", "p%40ss%21"}, keep: "auth failed"},
		{name: "decoded query value", raw: "redis://h/0?password=a+b%21c", msg: `password "a b!c", raw a+b%21c`, secrets: []string{"a b!c", "a+b%21c"}, keep: "password"},
		{name: "re-escaped", raw: "amqp://guest:p@ss@h/", msg: "dial amqp://guest:p%40ss@h/", secrets: []string{"p%40ss"}, keep: "dial amqp://guest:"},
		{name: "many secrets", raw: "amqps://u:S4@h/?auth_token=S5&apikey=S6", msg: "S4 S5 S6 and more", secrets: []string{"S4", "S5", "S6"}, keep: "and more"},
		{name: "unparsable URL, best effort", raw: "postgres://u:pw%zz7@h/db?password=S8", msg: `parse "postgres://u:pw%zz7@h/db?password=S8": invalid URL escape "%zz"`,
			secrets: []string{"pw%zz7", "S8"}, keep: "invalid URL escape"},
		{name: "nats server list", raw: "nats://a:4222, T10@b:4222", msg: "nats: authorization violation for T10", secrets: []string{"T10"}, keep: "violation"},
		{name: "tls token", raw: "tls://T11@h:4222", msg: "tls://T11@h:4222: handshake failed", secrets: []string{"T11"}, keep: "handshake failed"},
		{name: "rediss password", raw: "rediss://default:T12@h:6380/0", msg: "WRONGPASS for T12", secrets: []string{"T12"}, keep: "WRONGPASS"},
		{name: "postgresql sslpassword", raw: "postgresql://u@h/db?sslkey=/k.pem&sslpassword=T13", msg: "decrypting /k.pem with T13: bad", secrets: []string{"T13"}, keep: "decrypting /k.pem"},
		{name: "amqps access_token", raw: "amqps://h/?access_token=T14", msg: "refused token T14", secrets: []string{"T14"}, keep: "refused token"},
		{name: "sqlite key", raw: "sqlite:idem.db?key=S9", msg: "open idem.db?key=S9: denied", secrets: []string{"S9"}, keep: "denied"},
	} {
		got := Scrub(errors.New(tc.msg), tc.raw)
		for _, s := range tc.secrets {
			if strings.Contains(got.Error(), s) {
				t.Errorf("%s: Scrub(%q) = %q shows %q", tc.name, tc.msg, got, s)
			}
		}
		if !strings.Contains(got.Error(), tc.keep) || !strings.Contains(got.Error(), Mask) {
			t.Errorf("%s: Scrub(%q) = %q; want %q kept and the secret masked", tc.name, tc.msg, got, tc.keep)
		}
	}
}

func TestScrubKeepsWhatHasNoSecret(t *testing.T) {
	t.Parallel()
	plain := errors.New("connection refused")
	for _, raw := range []string{"postgres://u@h/db", "postgres://u:pw@h/db", "nats://h:4222", "nats://TOKEN@h", "not a URL at all", ""} {
		if got := Scrub(plain, raw); got != plain {
			t.Errorf("Scrub(plain, %q) = %v, want the same error", raw, got)
		}
	}
	if Scrub(nil, "postgres://u:pw@h/db") != nil {
		t.Errorf("Scrub(nil) != nil")
	}
}

func TestScrubKeepsTheChain(t *testing.T) {
	t.Parallel()
	raw := "nats://SEKRET@h"
	err := Scrub(fmt.Errorf("connecting with SEKRET: %w", context.DeadlineExceeded), raw)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Scrub lost the wrapped error: errors.Is(%v, context.DeadlineExceeded) is false", err)
	}
	if strings.Contains(err.Error(), "SEKRET") {
		t.Errorf("Scrub = %q", err)
	}
}

// TestScrubURLError checks the error net/url itself builds, which quotes the
// whole URL.
func TestScrubURLError(t *testing.T) {
	t.Parallel()
	raw := "amqp://guest:S1@h:bad/?auth_token=S2"
	_, perr := url.Parse(raw)
	if perr == nil {
		t.Fatalf("url.Parse(%q) succeeded; the test needs a URL that does not parse", raw)
	}
	got := Scrub(fmt.Errorf("dial: %w", perr), raw)
	if msg := got.Error(); strings.Contains(msg, "S1") || strings.Contains(msg, "S2") || !strings.Contains(msg, "invalid port") {
		t.Errorf("Scrub(%q) = %q", perr, msg)
	}
}
