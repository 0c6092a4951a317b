package main

import (
	"bytes"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/idem-go/idem/idemtest"
)

// runTortureMessages runs `idem torture messages` with args and returns its
// exit status, its output and its RESULT figures by metric.
func runTortureMessages(t *testing.T, args ...string) (code int, stdout, stderr string, results map[string]int64) {
	t.Helper()
	var out, errOut bytes.Buffer
	args = append(args, seedArgs(t)...)
	code = run(t.Context(), append([]string{"torture", "messages"}, args...), &out, &errOut)
	results = map[string]int64{}
	for line := range strings.Lines(out.String()) {
		f := strings.Split(strings.TrimSpace(line), ",")
		if len(f) != 5 || f[0] != "RESULT" || !strings.HasPrefix(f[1], "torture-messages-") {
			continue
		}
		if n, err := strconv.ParseInt(f[3], 10, 64); err == nil {
			results[f[2]] = n
		}
	}
	return code, out.String(), errOut.String(), results
}

// checkMessagesHeld fails the test unless every event was applied exactly
// once, nothing was dead-lettered, the consumers were killed on the way
// (by the run and between a commit and its acknowledgement), and the
// RESULT lines carry name.
func checkMessagesHeld(t *testing.T, events int64, name string, code int, stdout, stderr string, r map[string]int64) {
	t.Helper()
	if code != exitOK {
		t.Errorf("exit %d, want %d", code, exitOK)
	}
	if r["events"] != events || r["distinct"] != events || r["applied"] != events {
		t.Errorf("events %d, applied %d, distinct %d; want %d each", r["events"], r["applied"], r["distinct"], events)
	}
	if r["published"] < 2*events || r["copies"] != events {
		t.Errorf("published %d, copies %d: want every event published twice", r["published"], r["copies"])
	}
	if r["twice"] != 0 || r["missing"] != 0 || r["dead_letters"] != 0 || r["violations"] != 0 || !strings.Contains(stdout, "promise: HELD") {
		t.Errorf("twice %d, missing %d, dead letters %d, violations %d", r["twice"], r["missing"], r["dead_letters"], r["violations"])
	}
	if r["kills"] == 0 || r["ack_kills"] == 0 {
		t.Errorf("kills %d, between commit and ack %d: the run did not torture much", r["kills"], r["ack_kills"])
	}
	if !strings.Contains(stdout, "RESULT,"+name+",") {
		t.Errorf("no RESULT lines named %s", name)
	}
	if t.Failed() {
		t.Logf("stdout:\n%s\nstderr:\n%s", stdout, stderr)
	}
}

// The short version of the message torture on every transport: each event
// published twice, consumers SIGKILLed by the run and by themselves
// between commit and ack, each event applied once, in its key's order
// where promised. The first kill by the run comes by the time half the
// events are applied, and the first kill between commit and ack after a
// message drawn from the seed, so however fast the run both happen, and a
// short run proves what a long one does.
func TestTortureMessages(t *testing.T) {
	t.Parallel()
	pg := postgresURL(t)
	nats := idemtest.RequireService(t, "NATS", "IDEM_NATS_URL", "nats://127.0.0.1:4222")
	amqp := idemtest.RequireService(t, "RabbitMQ", "IDEM_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
	// Timeouts far above what each takes alone (5-20s): CI runs them
	// beside every other test of the package, on two cores.
	short := []string{"--keys", "50", "--kill-every", "700ms", "--ack-kills", "0.003", "--ack-wait", "1s", "--timeout", "240s"}
	for _, tc := range []struct {
		name   string
		events int64
		args   []string
		result string
	}{
		// 600 to 800 events: the first kill by the run comes by half of
		// them, the first between commit and ack by a consumer's 50th
		// message at the latest (drawn below events/(4·consumers)), so
		// both are certain in as short a run; with 1,500 to 2,000 the
		// seven took 2m32 in CI, most of it consumers started again
		// under the race detector.
		{"sqlite", 600, nil, "torture-messages-sqlite"},
		{"sqlite-byid", 800, []string{"--by-id", "--consumers", "3"}, "torture-messages-sqlite-byid"},
		{"pg", 600, []string{"--broker", pg}, "torture-messages-pg"},
		{"nats-pg", 600, []string{"--broker", nats, "--db", pg, "--by-id"}, "torture-messages-nats-pg-byid"},
		// A lone consumer killed every 700ms, restarting slowly under
		// CI's load, hardly ran (15 events/s, 128 kills in 90s).
		{"nats", 500, []string{"--broker", nats, "--consumers", "1", "--kill-every", "3s"}, "torture-messages-nats-sqlite"},
		{"amqp-pg", 600, []string{"--broker", amqp, "--db", pg, "--by-id"}, "torture-messages-amqp-pg-byid"},
		// Every kill makes the group rebalance, which waits for the dead
		// member up to twice the ack wait: kills come less often.
		{"kafka", 500, []string{"--broker", "private-kafka", "--kill-every", "3s"}, "torture-messages-kafka-sqlite"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append(append([]string{"--events", strconv.FormatInt(tc.events, 10)}, short...), tc.args...)
			code, stdout, stderr, r := runTortureMessages(t, args...)
			checkMessagesHeld(t, tc.events, tc.result, code, stdout, stderr, r)
			if !strings.Contains(tc.name, "byid") && !strings.Contains(strings.Join(tc.args, " "), "--by-id") && r["out_of_order"] != 0 {
				t.Errorf("%d effects out of their key's order in sequence mode", r["out_of_order"])
			}
			if strings.Contains(stdout+stderr, "guest:guest") || strings.Contains(stdout+stderr, "postgres://") {
				t.Errorf("the output names a URL:\n%s\n%s", stdout, stderr)
			}
		})
	}
}

// A private broker of the run's own, SIGKILLed and started again under
// the load: the consumers resubscribe, the publisher publishes again what
// was refused, and nothing is applied twice or lost. The first restart
// comes by the time half the events are applied, so every run meets one.
func TestTortureMessagesBrokerRestarts(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		broker, result string
		events         int64
		args           []string
	}{
		// 800 events: the first restart comes by half of them, the first
		// kill too, so fewer prove as much; with 2,000 the three took
		// 2m04 in CI.
		{"private-nats", "torture-messages-nats-sqlite-byid", 800, []string{"--by-id", "--restart-broker-every", "2s"}},
		{"private-postgres", "torture-messages-pg", 800, []string{"--restart-broker-every", "2s"}},
		// RabbitMQ by event ID, which hands few messages back with a
		// delay. In key and sequence mode a held message is copied to a
		// delay queue, and RabbitMQ 3.10 restarted every few seconds
		// leaves, now and then, a delay queue whose dead-lettering never
		// starts ("Cannot forward any dead-letter messages", the
		// default exchange "does not exist", at boot;
		// rabbitmq-server#12625): its expired copies stay in it, neither
		// lost nor delivered, and their keys wait for them. Restarted
		// every 30s, a million events held in that mode.
		// 1,000 events here: with 20,000 the run took 170 to 300s of its
		// 300s, and twice in CI its last events came only after the
		// timeout (slow; none lost or applied twice); with 8,000, beside
		// the Kafka and card-network tortures, 6,940 came within 300s
		// and the rest within 2 minutes more. Since the first restart
		// comes by half the events, fewer prove as much. idem torture
		// messages is the long form.
		{"private-rabbitmq", "torture-messages-amqp-sqlite-byid", 1000, []string{"--by-id", "--restart-broker-every", "3s"}},
	} {
		t.Run(tc.broker, func(t *testing.T) {
			args := append([]string{"--broker", tc.broker, "--events", strconv.FormatInt(tc.events, 10), "--keys", "50",
				// How long a restarted broker takes to serve again depends
				// on the machine (RabbitMQ's boots take seconds on two
				// busy cores): --timeout ends the run only once no event
				// has been applied for a minute.
				"--kill-every", "1s", "--ack-kills", "0.003", "--ack-wait", "1s", "--timeout", "60s"}, tc.args...)
			code, stdout, stderr, r := runTortureMessages(t, args...)
			if code != exitOK && strings.Contains(stderr, "which is not installed") {
				if os.Getenv(idemtest.RequireServicesEnv) == "1" {
					t.Fatalf("%s; %s=1 requires it", strings.TrimSpace(stderr), idemtest.RequireServicesEnv)
				}
				t.Skipf("skipping: %s", strings.TrimSpace(stderr))
			}
			checkMessagesHeld(t, tc.events, tc.result, code, stdout, stderr, r)
			if r["broker_restarts"] < 1 {
				t.Errorf("%d broker restarts, want at least 1", r["broker_restarts"])
			}
		})
	}
}

// TestTortureMessagesCatchesUnsafe is the torture's own test: consumers
// with an inbox that records nothing apply redelivered events again, and
// the run must say which and fail. Every event's copy is applied again
// and one consumer kills itself between commit and ack after a message
// drawn from the seed, so a few hundred events make it certain. The rate
// of such kills beyond that one is low: each is a consumer started again
// (seconds, under the race detector on a busy machine), and without an
// inbox each brings more events applied again, which the copies make
// certain already; at 0.005 the run took twice as long.
func TestTortureMessagesCatchesUnsafe(t *testing.T) {
	t.Parallel()
	code, stdout, stderr, r := runTortureMessages(t, "--unsafe-no-inbox", "--events", "500", "--keys", "50",
		"--kill-every", "0", "--ack-kills", "0.0005", "--ack-wait", "1s", "--timeout", "90s")
	if code != exitFailure {
		t.Errorf("exit %d, want %d", code, exitFailure)
	}
	if r["twice"] == 0 || r["applied"] <= r["events"] || r["violations"] == 0 {
		t.Errorf("twice %d, applied %d of %d events, violations %d: want events applied twice", r["twice"], r["applied"], r["events"], r["violations"])
	}
	if r["ack_kills"] == 0 {
		t.Errorf("no consumer killed itself between commit and ack: the scheduled kill did not happen")
	}
	for _, want := range []string{"promise: BROKEN", "events applied more than once", "RESULT,torture-messages-sqlite-unsafe,"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("stdout lacks %q", want)
		}
	}
	if t.Failed() {
		t.Logf("stdout:\n%s\nstderr:\n%s", stdout, stderr)
	}
}

func TestTortureMessagesUsage(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"--events", "0"},
		{"--consumers", "-1"},
		{"--ack-kills", "1"},
		{"--ack-kills", "-0.1"},
		{"--ack-wait", "0"},
		{"--backlog", "-1"},
		{"--timeout", "0"},
		{"--broker", "kafka://x"},
		{"--broker", "sqlite:/tmp/x.db"},
		{"--db", "postgres://u@h/db"},
		{"--broker", "nats://h:4222", "--db", "mysql://x"},
		{"--restart-broker-every", "1s"},
		{"--broker", "nats://h:4222", "--restart-broker-every", "1s"},
		{"--broker", "private-nats", "--restart-broker-every", "-1s"},
		{"--broker", "private-kafka", "--restart-broker-every", "1s"},
		{"extra"},
	} {
		code, stdout, stderr, _ := runTortureMessages(t, args...)
		if code != exitUsage || stdout != "" || !strings.Contains(stderr, "idem: ") {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit %d and a message", args, code, stdout, stderr, exitUsage)
		}
	}
	// The worker is started by the run alone.
	var out, errOut bytes.Buffer
	if code := run(t.Context(), []string{"torture", "messages-worker"}, &out, &errOut); code != exitUsage || !strings.Contains(errOut.String(), "started by 'idem torture messages'") {
		t.Errorf("messages-worker without its configuration: exit %d, stderr %q", code, errOut.String())
	}
}

// The rebalance storm, short: on Kafka (kfake in the run's process), with
// the inboxes in PostgreSQL, a consumer leaves its group cleanly and joins
// again every 300ms once the calm part is over, another is SIGKILLed every
// 3s, and some kill themselves between a commit and its acknowledgement:
// every event applied once, in its key's order, no consumer's streams
// holding more than their limit, and both rates reported. The long form
// (100,000 events and more) is in docs/kafka.md.
func TestTortureMessagesRebalanceStorm(t *testing.T) {
	t.Parallel()
	pg := postgresURL(t)
	const events = 2000
	code, stdout, stderr, r := runTortureMessages(t, "--broker", "private-kafka", "--db", pg, "--events", strconv.Itoa(events),
		"--keys", "50", "--consumers", "3", "--churn-every", "300ms", "--kill-every", "3s", "--ack-kills", "0.003",
		"--ack-wait", "1s", "--timeout", "300s")
	checkMessagesHeld(t, events, "torture-messages-kafka-pg", code, stdout, stderr, r)
	if r["out_of_order"] != 0 {
		t.Errorf("%d effects out of their key's order", r["out_of_order"])
	}
	if r["churns"] == 0 {
		t.Errorf("no consumer left and joined: the storm did not blow")
	}
	if r["held_reports"] == 0 || r["held_peak"] == 0 || r["held_peak"] > r["held_limit"] {
		t.Errorf("held at most %d of %d (%d reports)", r["held_peak"], r["held_limit"], r["held_reports"])
	}
	if !strings.Contains(stdout, "RESULT,torture-messages-kafka-pg,calm_events_per_s,") || !strings.Contains(stdout, "RESULT,torture-messages-kafka-pg,churn_events_per_s,") {
		t.Errorf("no rates reported:\n%s", stdout)
	}
}
