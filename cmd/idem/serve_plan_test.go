package main

import (
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"

	"github.com/idem-go/idem/cmd/idem/internal/payments"
)

// planFor parses args as serve's flags would be, on a command that never
// runs, and returns planServe's answer; env is the environment it sees.
func planFor(t *testing.T, env map[string]string, args ...string) (*servePlan, error) {
	t.Helper()
	var f serveFlags
	cmd := &cobra.Command{Use: "serve"}
	f.define(cmd)
	if err := cmd.ParseFlags(args); err != nil {
		t.Fatalf("parsing %v: %v", args, err)
	}
	f.pgSchemaSet, f.apiKeysSet = cmd.Flags().Changed("pg-schema"), cmd.Flags().Changed("api-keys")
	f.acquirerKeySet = cmd.Flags().Changed("acquirer-key")
	return newApp(env).planServe(&f)
}

// defaultPlan is the plan of `serve --api-keys acme:k`: every other flag
// at its default.
func defaultPlan() *servePlan {
	return &servePlan{
		addr:            "127.0.0.1:8080",
		db:              dbTarget{path: "idem.db", url: defaultDB, shown: "idem.db", flag: defaultDB},
		pgSchema:        defaultPGSchema,
		keysPrefix:      defaultKeysPrefix,
		brokerNamespace: defaultBrokerNamespace,
		shutdownTimeout: 15 * time.Second,
		payments: payments.Config{
			APIKeys:        map[string]string{"k": "acme"},
			KeyTTL:         payments.DefaultKeyTTL,
			InflightWait:   payments.DefaultInflightWait,
			RequestTimeout: payments.DefaultRequestTimeout,
			MaxAttempts:    payments.DefaultMaxAttempts,
			RetryBase:      100 * time.Millisecond,
			RetryCap:       30 * time.Second,
			AckWait:        30 * time.Second,
		},
	}
}

func TestPlanServeRefusesBadFlags(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{args: []string{"--pg-schema", "x"}, want: "--pg-schema applies only to --db postgres://"},
		{args: []string{"--log-level", "loud"}, want: `--log-level "loud": want debug, info, warn or error`},
		{args: []string{"--db", "mysql://x"}, want: `--db: unsupported database scheme "mysql"`},
		{args: []string{"--db", "idem.db"}, want: "--db needs a scheme"},
		{args: []string{"--db", "sqlite:"}, want: "--db sqlite: needs a file path"},
		{args: []string{"--keys", "memcached://h"}, want: `--keys: unsupported key store scheme "memcached"`},
		{args: []string{"--keys", "127.0.0.1:6379"}, want: "--keys needs a URL"},
		{args: []string{"--key-ttl", "0s"}, want: "--key-ttl, --inflight-wait and --shutdown-timeout must be positive"},
		{args: []string{"--inflight-wait", "0s"}, want: "--key-ttl, --inflight-wait and --shutdown-timeout must be positive"},
		{args: []string{"--shutdown-timeout", "-1s"}, want: "--key-ttl, --inflight-wait and --shutdown-timeout must be positive"},
		{args: []string{"--key-lease", "-1s"}, want: "--key-lease must not be negative"},
		{args: []string{"--broker", "mqtt://x"}, want: `--broker: unsupported broker scheme "mqtt"`},
		{args: []string{"--broker", "127.0.0.1:4222"}, want: "--broker needs a URL"},
		{args: []string{"--broker-namespace", "Bad.Name"}, want: `--broker-namespace "Bad.Name": want a lower-case letter`},
		{args: []string{"--ack-wait", "0s"}, want: "--ack-wait must be positive"},
		{args: []string{"--max-attempts", "0"}, want: "--max-attempts, --retry-base and --retry-cap must be positive"},
		{args: []string{"--retry-base", "0s"}, want: "--max-attempts, --retry-base and --retry-cap must be positive"},
		{args: []string{"--retry-base", "2s", "--retry-cap", "1s"}, want: "--retry-cap (1s) must not be shorter than --retry-base (2s)"},
		{args: []string{"--key-lease", "2h", "--key-ttl", "1h"}, want: "--key-lease (2h0m0s) must not be longer than --key-ttl (1h0m0s)"},
		{args: []string{"--request-timeout", "2s"}, want: "--request-timeout (2s) must be longer than --inflight-wait (5s), or 0 for none"},
		{args: []string{"--request-timeout", "5s"}, want: "--request-timeout (5s) must be longer than --inflight-wait (5s)"},
		{args: []string{"--request-timeout", "-1s"}, want: "--request-timeout (-1s) must be longer than --inflight-wait"},
		{args: []string{"--api-keys", ""}, want: "--api-keys is empty"},
		{args: []string{"--acquirer", "ftp://net"}, want: `--acquirer: acquirer URL "ftp://net": want http://HOST:PORT`},
		{args: []string{"--acquirer-key", "k"}, want: "--acquirer-key applies only with --acquirer"},
		{args: []string{"--api-keys", "no-colon"}, want: "--api-keys: "},
		{env: map[string]string{envAPIKeys: "no-colon"}, want: envAPIKeys + ": "},
		{args: []string{"--api-keys", "acme:k"}, env: map[string]string{envKeyDigestSecret: "short-secret"}, want: "$" + envKeyDigestSecret + ": 12 bytes long; at least 16 are needed"},
		// The flags are checked in a fixed order: the first bad one is named.
		{args: []string{"--log-level", "loud", "--db", "mysql://x"}, want: `--log-level "loud"`},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			t.Parallel()
			args := tc.args
			if tc.env == nil && !hasFlag(args, "--api-keys") {
				args = append(args, "--api-keys", "acme:k")
			}
			p, err := planFor(t, tc.env, args...)
			if err == nil {
				t.Fatalf("planServe(%v) = %+v, want an error saying %q", args, p, tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("planServe(%v) = %q, want it to say %q", args, err, tc.want)
			}
		})
	}
}

func TestPlanServe(t *testing.T) {
	t.Parallel()
	t.Run("defaults", func(t *testing.T) {
		t.Parallel()
		p, err := planFor(t, nil, "--api-keys", "acme:k")
		if err != nil {
			t.Fatal(err)
		}
		if want := defaultPlan(); !reflect.DeepEqual(p, want) {
			t.Errorf("plan\n %+v\nwant\n %+v", p, want)
		}
	})

	t.Run("every flag", func(t *testing.T) {
		t.Parallel()
		pg := "postgres://u:s3cret@db.example/idem"
		p, err := planFor(t, nil,
			"--addr", ":9090", "--db", pg, "--pg-schema", "replica",
			"--keys", "redis://:s3cret@cache.example:6379/2", "--keys-prefix", "pay",
			"--key-ttl", "2h", "--key-lease", "1m", "--inflight-wait", "3s", "--request-timeout", "0",
			"--shutdown-timeout", "5s", "--api-keys", "acme:k1,beta:k2",
			"--unsafe-no-idempotency", "--faults", "--workers=false", "--log-level", "debug",
			"--broker", "nats://127.0.0.1:4222", "--broker-namespace", "pay-2", "--ack-wait", "10s",
			"--max-attempts", "3", "--retry-base", "1s", "--retry-cap", "1m")
		if err != nil {
			t.Fatal(err)
		}
		want := &servePlan{
			addr:            ":9090",
			db:              dbTarget{postgres: true, url: pg, shown: "postgres://u:xxxxx@db.example/idem", flag: "postgres://u:xxxxx@db.example/idem"},
			pgSchema:        "replica",
			keys:            keysTarget{url: "redis://:s3cret@cache.example:6379/2", shown: "redis://:xxxxx@cache.example:6379/2"},
			keysPrefix:      "pay",
			broker:          brokerTarget{kind: "nats", url: "nats://127.0.0.1:4222", shown: "nats://127.0.0.1:4222"},
			brokerNamespace: "pay-2",
			logLevel:        slog.LevelDebug,
			shutdownTimeout: 5 * time.Second,
			payments: payments.Config{
				APIKeys:      map[string]string{"k1": "acme", "k2": "beta"},
				KeyTTL:       2 * time.Hour,
				KeyLease:     time.Minute,
				InflightWait: 3 * time.Second,
				Unsafe:       true,
				Faults:       true,
				RequestsOnly: true,
				// --request-timeout 0 is "none", which payments.Config
				// spells -1: its zero means the default.
				RequestTimeout: -1,
				MaxAttempts:    3,
				RetryBase:      time.Second,
				RetryCap:       time.Minute,
				AckWait:        10 * time.Second,
			},
		}
		if !reflect.DeepEqual(p, want) {
			t.Errorf("plan\n %+v\nwant\n %+v", p, want)
		}
	})

	t.Run("API keys from the environment", func(t *testing.T) {
		t.Parallel()
		p, err := planFor(t, map[string]string{envAPIKeys: "acme:k"})
		if err != nil {
			t.Fatal(err)
		}
		if want := defaultPlan(); !reflect.DeepEqual(p, want) {
			t.Errorf("plan\n %+v\nwant\n %+v", p, want)
		}
	})

	t.Run("the flag before the environment", func(t *testing.T) {
		t.Parallel()
		p, err := planFor(t, map[string]string{envAPIKeys: "beta:other"}, "--api-keys", "acme:k")
		if err != nil {
			t.Fatal(err)
		}
		if want := defaultPlan(); !reflect.DeepEqual(p, want) {
			t.Errorf("plan\n %+v\nwant\n %+v", p, want)
		}
	})

	t.Run("no API keys: a development key", func(t *testing.T) {
		t.Parallel()
		p, err := planFor(t, nil)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(p.devKey, "idem_dev_") || len(p.payments.APIKeys) != 1 || p.payments.APIKeys[p.devKey] != "dev" {
			t.Fatalf("devKey %q, APIKeys %v; want one idem_dev_ key for tenant dev", p.devKey, p.payments.APIKeys)
		}
		want := defaultPlan()
		want.devKey, want.payments.APIKeys = p.devKey, p.payments.APIKeys
		if !reflect.DeepEqual(p, want) {
			t.Errorf("plan\n %+v\nwant\n %+v", p, want)
		}
	})
}

// Bad flags change nothing: serve refuses them before it opens the
// database, so not even its file is created.
func TestServeBadFlagsCreateNothing(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"--key-lease", "2h", "--key-ttl", "1h"},
		{"--request-timeout", "2s"},
		{"--retry-base", "2s", "--retry-cap", "1s"},
		{"--broker", "kafka://x"},
		{"--api-keys", "no-colon"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), "idem.db")
			if !hasFlag(args, "--api-keys") {
				args = append(args, "--api-keys", "acme:k")
			}
			code, _, errOut := runCmd(t, append([]string{"serve", "--db", "sqlite:" + path, "--addr", "127.0.0.1:0"}, args...)...)
			if code != exitFailure {
				t.Errorf("exit status %d, want %d; stderr %q", code, exitFailure, errOut)
			}
			if _, err := os.Stat(path); !os.IsNotExist(err) {
				t.Errorf("serve %v created %s (Stat: %v)", args, path, err)
			}
		})
	}
}

// The secret of the digests under which the logs name keys comes from the
// environment, for the replicas of one service to name a key alike.
func TestPlanServeTakesTheKeyDigestSecret(t *testing.T) {
	t.Parallel()
	const secret = "a secret of the service's own"
	p, err := planFor(t, map[string]string{envKeyDigestSecret: secret}, "--api-keys", "acme:k")
	if err != nil || string(p.keyDigestSecret) != secret {
		t.Fatalf("planServe with $%s set: secret %q, %v; want it taken", envKeyDigestSecret, p.keyDigestSecret, err)
	}
	if p, err := planFor(t, nil, "--api-keys", "acme:k"); err != nil || p.keyDigestSecret != nil {
		t.Fatalf("planServe without it: secret %q, %v; want none (each process its own)", p.keyDigestSecret, err)
	}
}
