package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/idem-go/idem/idemtest"
)

// On a primary that streams to an asynchronous standby, a commit the
// service acknowledged can be lost in a failover: serve says so, and with
// --strict refuses to serve.
func TestServeStrictRefusesAnAsyncStandby(t *testing.T) {
	t.Parallel()
	pair := idemtest.StartPostgresPair(t, nil)
	db := pair.Primary.URL("postgres")
	const apiKey = "test-key-1"

	code, _, errOut := runCmd(t, "serve", "--addr", "127.0.0.1:0", "--db", db, "--api-keys", "acme:"+apiKey, "--strict")
	if code != exitFailure || !strings.Contains(errOut, "--strict") || !strings.Contains(errOut, "PostgreSQL") || !strings.Contains(errOut, "synchronous_standby_names") {
		t.Fatalf("serve --strict on an asynchronous standby: exit %d, stderr:\n%s", code, errOut)
	}
	if strings.Contains(errOut, "listening on") {
		t.Fatalf("serve --strict listened before refusing:\n%s", errOut)
	}

	srv := startServe(t, newApp(nil), "--db", db, "--api-keys", "acme:"+apiKey, "--log-level", "warn")
	checkChargesOnce(t, srv, apiKey)
	srv.stop()
	if log := srv.stderr.String(); !strings.Contains(log, "a guarantee rests on a setting the server lacks") {
		t.Errorf("serve without --strict did not warn:\n%s", log)
	}
}

// With the standby synchronous, --strict serves.
func TestServeStrictServesASyncStandby(t *testing.T) {
	t.Parallel()
	pair := idemtest.StartPostgresPair(t, &idemtest.PostgresPairConfig{Synchronous: true})
	const apiKey = "test-key-1"
	srv := startServe(t, newApp(nil), "--db", pair.Primary.URL("postgres"), "--api-keys", "acme:"+apiKey, "--log-level", "warn", "--strict")
	checkChargesOnce(t, srv, apiKey)
	stopCleanly(t, srv)
}

// kfake is one broker without replicas: every Kafka topic serve uses has
// one copy, which --strict refuses, naming the setting.
func TestServeStrictRefusesAnUnreplicatedKafkaTopic(t *testing.T) {
	t.Parallel()
	seeds := startKafka(t)
	db := "sqlite:" + filepath.Join(t.TempDir(), "idem.db")
	code, _, errOut := runCmd(t, "serve", "--addr", "127.0.0.1:0", "--db", db, "--api-keys", "acme:test-key-1",
		"--broker", "kafka://"+strings.Join(seeds, ","), "--strict")
	if code != exitFailure || !strings.Contains(errOut, "--strict") || !strings.Contains(errOut, "Kafka: ") || !strings.Contains(errOut, "replication.factor 1") {
		t.Fatalf("serve --strict on an unreplicated Kafka topic: exit %d, stderr:\n%s", code, errOut)
	}
	if strings.Contains(errOut, "listening on") {
		t.Fatalf("serve --strict listened before refusing:\n%s", errOut)
	}
}
