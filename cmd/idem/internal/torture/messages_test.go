package torture

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

func TestMessagesConfigRefusesBadInput(t *testing.T) {
	t.Parallel()
	for name, c := range map[string]*MessagesConfig{
		"nil":                    nil,
		"no executable":          {},
		"negative events":        {Executable: "idem", Events: -1},
		"negative consumers":     {Executable: "idem", Consumers: -1},
		"every ack a kill":       {Executable: "idem", AckKillRate: 1},
		"negative ack wait":      {Executable: "idem", AckWait: -time.Second},
		"redis":                  {Executable: "idem", Broker: "redis://h:6379"},
		"restarts of kfake":      {Executable: "idem", Broker: PrivateKafka, RestartBrokerEvery: time.Second},
		"a db beside sqlite":     {Executable: "idem", DB: "postgres://u@h/db"},
		"a db beside postgres":   {Executable: "idem", Broker: "postgres://u@h/db", DB: "sqlite"},
		"a db that is not one":   {Executable: "idem", Broker: "nats://h:4222", DB: "mysql://x"},
		"restarts of a shared":   {Executable: "idem", Broker: "nats://h:4222", RestartBrokerEvery: time.Second},
		"restarts of sqlite":     {Executable: "idem", RestartBrokerEvery: time.Second},
		"negative restart delay": {Executable: "idem", Broker: PrivateNATS, RestartBrokerEvery: -time.Second},
	} {
		if rep, err := RunMessages(t.Context(), c); err == nil || rep != nil {
			t.Errorf("%s: RunMessages = %v, %v; want an error", name, rep, err)
		}
	}
}

func TestMessagesConfigDefaults(t *testing.T) {
	t.Parallel()
	c, err := (&MessagesConfig{Executable: "idem", Broker: "amqp://guest:guest@h:5672/"}).withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if c.Events != DefaultEvents || c.Keys != DefaultEventKeys || c.Consumers != DefaultConsumers ||
		c.KillEvery != DefaultConsumerKillEvery || c.AckKillRate != DefaultAckKillRate || c.AckWait != DefaultAckWait ||
		c.Timeout != DefaultMessagesTimeout || c.Backlog != DefaultBacklog || c.Seed == 0 || c.DB != "sqlite" {
		t.Errorf("defaults: %+v", c)
	}
	for broker, want := range map[string]string{
		"sqlite": "sqlite", "postgres://u@h/db": "pg", PrivatePostgres: "pg", "nats://h:4222": "nats",
		PrivateNATS: "nats", "amqps://u:p@h/": "amqp", PrivateRabbitMQ: "amqp", "redis://h": "",
		"kafka://h:9092": "kafka", PrivateKafka: "kafka",
	} {
		if kind, _ := brokerKind(broker); kind != want {
			t.Errorf("brokerKind(%q) = %q, want %q", broker, kind, want)
		}
	}
}

// An event's message says which event it is, about which key and where in
// that key's sequence, whatever its message ID; the copy's ID differs.
func TestEventMessages(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		i, keys     int
		key, seq    int64
		wantKey, id string
		copyID      bool
	}{
		{0, 10, 0, 1, "k0", "evt-0", false},
		{9, 10, 9, 1, "k9", "evt-9", false},
		{10, 10, 0, 2, "k0", "evt-10-again", true},
		{12345, 1000, 345, 13, "k345", "evt-12345", false},
	} {
		m := eventMessage(tc.i, tc.keys, tc.copyID)
		e, err := parseEvent(m)
		if err != nil {
			t.Fatalf("event %d: %v", tc.i, err)
		}
		if e != (effect{int64(tc.i), tc.key, tc.seq}) || m.Key != tc.wantKey || m.ID != tc.id || m.Topic != messagesTopic {
			t.Errorf("event %d: %+v, key %q, id %q; want key %d seq %d, %q, %q", tc.i, e, m.Key, m.ID, tc.key, tc.seq, tc.wantKey, tc.id)
		}
		// The dedup key names the event, not the message ID.
		if k, err := eventKey(m); err != nil || k != "e"+strconv.Itoa(tc.i) {
			t.Errorf("event %d: dedup key %q, %v", tc.i, k, err)
		}
	}
	for _, payload := range []string{"", "1 2", "1 2 3 4", "a 2 3", "1 -2 3", "1 2 99999999999999999999"} {
		if _, err := parseEvent(idem.Message{Payload: []byte(payload)}); err == nil {
			t.Errorf("payload %q: no error", payload)
		}
	}
}

// TestTimeUp: a run that went its timeout without an event applied says
// so, and, once it drained, whether the events it lacked were slow
// (applied with the faults stopped) or lost.
func TestTimeUp(t *testing.T) {
	for _, tc := range []struct {
		name    string
		late    int64
		drained bool
		want    string
	}{
		{"no drain", 0, false, "no event was applied for 3m0s (the timeout), with 700 of 1000 applied"},
		{"slow", 300, true, "no event was applied for 3m0s (the timeout), with 700 of 1000 applied; with the faults stopped the other 300 were applied within 2m0s: slow, not lost"},
		{"lost", 200, true, "no event was applied for 3m0s (the timeout), with 700 of 1000 applied; with the faults stopped 200 more were applied within 2m0s, and 100 never were"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := timeUp(3*time.Minute, 2*time.Minute, 1000, 700, tc.late, tc.drained); got != tc.want {
				t.Errorf("timeUp = %q, want %q", got, tc.want)
			}
		})
	}
}

// A run ends only once it has met every fault its checks ask for: the
// first kill and broker restart drawn from the seed, and, in a churned
// run, a consumer that left its group and joined again; until then its
// load goes on waiting (bounded by Timeout, as for a stall).
func TestMessagesRunWaitsForItsFaults(t *testing.T) {
	t.Parallel()
	r := &messagesRun{cfg: MessagesConfig{ChurnEvery: time.Second}, firstKillAt: 5}
	if r.faultsMet() {
		t.Fatal("faults met before the first kill")
	}
	r.kills.Add(1)
	if r.faultsMet() {
		t.Fatal("a churned run's faults met before any consumer left its group")
	}
	r.churns.Add(1)
	if !r.faultsMet() {
		t.Fatal("faults not met after the first kill and a churn")
	}
	if calm := (&messagesRun{}); !calm.faultsMet() {
		t.Error("a run with no faults asked for waits for some")
	}
}

// The run's stall clock does not run while the run itself keeps the broker
// down: a RabbitMQ restart may take minutes on a busy machine (its ready
// timeout is three), longer than the minute CI gives a stall, and no event
// can be applied without a broker. Once the broker serves again, a run that
// applies nothing for the timeout is stalled, as before.
func TestStallWatchDoesNotCountTheBrokersRestart(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	w := newStallWatch(time.Minute, t0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	if w.stalled(at(59*time.Second), 0, false) {
		t.Fatal("stalled before the timeout")
	}
	if w.stalled(at(61*time.Second), 10, false) {
		t.Fatal("stalled although events were applied")
	}
	// The broker goes down for a restart 30s later, and boots for 2 minutes.
	for d := 91 * time.Second; d <= 211*time.Second; d += 250 * time.Millisecond {
		if w.stalled(at(d), 10, true) {
			t.Fatalf("stalled %s into the broker's restart, no event applied since %s before it", d-91*time.Second, 30*time.Second)
		}
	}
	// Back: a minute more with nothing applied is a stall.
	if w.stalled(at(211*time.Second+59*time.Second), 10, false) {
		t.Fatal("stalled less than the timeout after the broker came back")
	}
	if !w.stalled(at(211*time.Second+61*time.Second), 10, false) {
		t.Fatal("not stalled a timeout after the broker came back with no event applied")
	}
}

// The restarts that took long are said by the progress lines, which the
// load's goroutine alone writes (Progress need not be safe for concurrent
// writes: restartLoop writing it too raced with printProgress).
func TestProgressSaysTheSlowRestarts(t *testing.T) {
	t.Parallel()
	var out strings.Builder
	r := &messagesRun{cfg: MessagesConfig{Events: 10, Progress: &out}}
	r.printProgress()
	if strings.Contains(out.String(), "took over") {
		t.Fatalf("no slow restart, yet: %q", out.String())
	}
	r.slowRestarts.Add(2)
	r.slowestRestart.Store(int64(73 * time.Second))
	out.Reset()
	r.printProgress()
	if want := "(2 took over 10s, the longest 1m13s, not counted against the timeout)"; !strings.Contains(out.String(), want) {
		t.Fatalf("progress %q; want it to say %q", out.String(), want)
	}
}
