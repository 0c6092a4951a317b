package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/payments"
	"github.com/idem-go/idem/idemamqp"
	"github.com/idem-go/idem/idemkafka"
	"github.com/idem-go/idem/idemnats"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/idemsqlite"
	"github.com/idem-go/idem/idemtest"
)

// eventsTransport is one way `idem serve` can carry its payment events:
// the arguments that select it, the test's own connection to it, and
// whether it drops a message whose ID it has stored recently (JetStream's
// duplicate window), which the consumer then never sees.
type eventsTransport struct {
	args     []string
	tr       payments.Transport
	dropsIDs bool
	// unsettled, for the database's own transports, counts the settlement
	// consumer's unsettled messages. Those acknowledge in the consumer's
	// inbox transaction, so a crash after its commit leaves nothing to
	// deliver again.
	unsettled func(t *testing.T) int
}

// eventsCases are the transports of the payment events: each database's
// embedded transport, NATS JetStream and RabbitMQ.
var eventsCases = []struct {
	name  string
	setup func(t *testing.T, e *testEnv) eventsTransport
}{
	{"sqlite", func(t *testing.T, e *testEnv) eventsTransport {
		path := filepath.Join(t.TempDir(), "idem.db")
		db, err := idemsqlite.Open(path, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		tr, err := idemsqlite.NewTransport(t.Context(), db, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tr.Close() })
		return eventsTransport{args: []string{"--db", "sqlite:" + path}, tr: tr, unsettled: func(t *testing.T) int {
			var n int
			if err := db.Reader().QueryRowContext(t.Context(), `SELECT count(*) FROM idem_transport_pending WHERE consumer = ?`,
				payments.SettlementConsumer).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		}}
	}},
	{"postgres", func(t *testing.T, e *testEnv) eventsTransport {
		db, err := idempg.Open(t.Context(), e.pgURL, &idempg.Config{Schema: e.schema, MaxConns: 4})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(db.Close)
		tr, err := idempg.NewTransport(t.Context(), db, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tr.Close() })
		return eventsTransport{args: []string{"--db", e.pgURL, "--pg-schema", e.schema}, tr: tr, unsettled: func(t *testing.T) int {
			var n int
			if err := db.Pool().QueryRow(t.Context(), `SELECT count(*) FROM idem_transport_pending AS p
				JOIN idem_transport_consumers AS c ON c.id = p.consumer_id WHERE c.consumer = $1`,
				payments.SettlementConsumer).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		}}
	}},
	{"nats", func(t *testing.T, e *testEnv) eventsTransport {
		url := idemtest.RequireService(t, "NATS", "IDEM_NATS_URL", "nats://127.0.0.1:4222")
		ns := "e2e-" + randHex(4)
		// What serve makes of --broker-namespace.
		stream := strings.ToUpper(strings.ReplaceAll(ns, "-", "_"))
		tr, err := idemnats.Open(t.Context(), url, &idemnats.Config{Stream: stream, SubjectPrefix: ns})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			tr.Close()
			deleteStream(t, url, stream)
		})
		return eventsTransport{args: []string{"--db", e.pgURL, "--pg-schema", e.schema, "--broker", url, "--broker-namespace", ns},
			tr: tr, dropsIDs: true}
	}},
	{"kafka", func(t *testing.T, e *testEnv) eventsTransport {
		// kfake, in the test's process: no Kafka can be installed on the
		// project's machines. A killed replica's group member keeps its
		// partitions until the group's rebalance gives up on it (the
		// transport's RevokeWait and 5s, 15s), so each restart costs that.
		cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cluster.Close)
		seeds := cluster.ListenAddrs()
		ns := "e2e-" + randHex(4)
		tr, err := idemkafka.Open(t.Context(), seeds, &idemkafka.Config{TopicPrefix: ns + "."})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tr.Close() })
		return eventsTransport{args: []string{"--db", e.pgURL, "--pg-schema", e.schema, "--broker", "kafka://" + strings.Join(seeds, ","), "--broker-namespace", ns}, tr: tr}
	}},
	{"amqp", func(t *testing.T, e *testEnv) eventsTransport {
		url := idemtest.RequireService(t, "RabbitMQ", "IDEM_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
		ns := "e2e-" + randHex(4)
		tr, err := idemamqp.Open(t.Context(), url, &idemamqp.Config{Exchange: ns, QueuePrefix: ns})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := tr.DeleteQueues(ctx); err != nil {
				t.Errorf("deleting the test's queues: %v", err)
			}
			tr.Close()
			deleteAMQP(t, url, ns, ns+"."+payments.SettlementConsumer)
		})
		return eventsTransport{args: []string{"--db", e.pgURL, "--pg-schema", e.schema, "--broker", url, "--broker-namespace", ns}, tr: tr}
	}},
}

func deleteStream(t *testing.T, url, stream string) {
	nc, err := nats.Connect(url)
	if err != nil {
		t.Errorf("connecting to delete stream %s: %v", stream, err)
		return
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Error(err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := js.DeleteStream(ctx, stream); err != nil {
		t.Errorf("deleting stream %s: %v", stream, err)
	}
}

// deleteAMQP deletes the exchange and the queue serve declared. Its delay
// queues expire on their own.
func deleteAMQP(t *testing.T, url, exchange, queue string) {
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Errorf("connecting to delete exchange %s: %v", exchange, err)
		return
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Error(err)
		return
	}
	defer ch.Close()
	// And the queue that keeps what the main queue gives up past its
	// delivery limit (see idemamqp's doc).
	if _, err := ch.QueueDelete(queue+".limit", false, false, false); err != nil {
		t.Errorf("deleting queue %s.limit: %v", queue, err)
	}
	if _, err := ch.QueueDelete(queue, false, false, false); err != nil {
		t.Errorf("deleting queue %s: %v", queue, err)
	}
	if err := ch.ExchangeDelete(exchange, false, false); err != nil {
		t.Errorf("deleting exchange %s: %v", exchange, err)
	}
}

// audit is a second consumer of the payment events, with a name of its
// own: it sees every event the relay published, as the broker or the
// embedded transport delivers it.
type audit struct {
	mu     sync.Mutex
	events map[string]idem.Message // by event_id
	done   chan struct{}
}

func startAudit(t *testing.T, tr payments.Transport) *audit {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	st, err := tr.Subscribe(ctx, idem.Subscription{Topic: payments.TopicPaymentSucceeded, Consumer: "audit"})
	if err != nil {
		cancel()
		t.Fatalf("subscribing the audit consumer: %v", err)
	}
	a := &audit{events: make(map[string]idem.Message), done: make(chan struct{})}
	go func() {
		defer close(a.done)
		for {
			d, err := st.Next(ctx)
			if err != nil {
				return
			}
			m := d.Message()
			var ev payments.PaymentEvent
			if json.Unmarshal(m.Payload, &ev) == nil && ev.EventID != "" {
				a.mu.Lock()
				if _, seen := a.events[ev.EventID]; !seen {
					a.events[ev.EventID] = m
				}
				a.mu.Unlock()
			}
			_ = d.Ack(ctx)
		}
	}()
	t.Cleanup(func() {
		cancel()
		st.Close()
		<-a.done
	})
	return a
}

func (a *audit) snapshot() []idem.Message {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]idem.Message, 0, len(a.events))
	for _, m := range a.events {
		out = append(out, m)
	}
	return out
}

type settlement struct {
	Currency string `json:"currency"`
	Total    int64  `json:"total"`
	Events   int64  `json:"events"`
}

func (e *testEnv) settlement(t *testing.T, base string) settlement {
	t.Helper()
	var s settlement
	e.call(t, http.MethodGet, base+"/v1/settlement", nil, http.StatusOK, &s)
	return s
}

var duplicateSeries = regexp.MustCompile(`(?m)^idem_consumer_messages_total\{consumer="settlement",outcome="duplicate"\} (\S+)$`)

// duplicates is how many duplicate events the replica's settlement
// consumer absorbed since it started, from its /metrics.
func (e *testEnv) duplicates(t *testing.T, r *replica) int {
	t.Helper()
	resp, err := e.hc.Get(r.URL + "/metrics")
	if err != nil {
		t.Fatalf("replica %s /metrics: %v", r.name, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	m := duplicateSeries.FindSubmatch(b)
	if m == nil {
		t.Fatalf("replica %s /metrics has no duplicate counter:\n%s", r.name, b)
	}
	n, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		t.Fatal(err)
	}
	return int(n)
}

// Every payment event is published more than once, and the settlement
// consumer, whose effect is an increment, applies each exactly once: the
// service is SIGKILLed while payments flow (its relay and consumer die
// wherever they are) and restarted; then every event is published again
// under its own ID, as a relay that died between publishing and marking
// publishes it again, and once more under a new transport ID, which no
// broker can recognise. Last, the consumer is killed right after its
// commit: on a broker, before its acknowledgement, so the event it had
// applied comes back after the restart and is absorbed; on the database's
// own transport, whose acknowledgement commits with the settlement, with
// nothing left to deliver again.
func TestEventsSettledOnceDespiteDuplicates(t *testing.T) {
	t.Parallel()
	for _, c := range eventsCases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			testEventsSettledOnce(t, c.setup)
		})
	}
}

func testEventsSettledOnce(t *testing.T, setup func(*testing.T, *testEnv) eventsTransport) {
	e := newEnv(t)
	et := setup(t, e)
	aud := startAudit(t, et.tr)
	args := append([]string{"serve", "--addr", "127.0.0.1:0", "--api-keys", e.tenant + ":" + e.apiKey, "--log-level", "warn",
		"--faults", "--key-lease", "2s", "--ack-wait", "2s", "--retry-base", "1ms", "--retry-cap", "20ms"}, et.args...)

	began := time.Now()
	phase := func(what string) { t.Logf("%6.1fs  %s", time.Since(began).Seconds(), what) }
	var cur atomic.Pointer[replica]
	a := launch(t, "a", args...).ready(t, e.hc)
	cur.Store(a)
	acct := e.createAccount(t, a.URL, 100_000_000)

	// 1,000 payments from 8 clients; after the 300th, the service is
	// killed and another takes its place. Clients retry with the same key
	// until they get a 201.
	const n = 1000
	var (
		next, made atomic.Int64
		sum        atomic.Int64
		restarted  = make(chan struct{})
		wg         sync.WaitGroup
	)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	for range 8 {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= n {
					return
				}
				key := fmt.Sprintf("pay-%d", i)
				amount := i%50 + 1
				var last result
				for {
					r := cur.Load()
					last = do(e.hc, e.paymentRequest(ctx, r.URL, key, paymentBody(acct, amount, key), ""))
					if last.status == http.StatusCreated {
						break
					}
					if ctx.Err() != nil {
						t.Errorf("payment %s: no 201 before the deadline; last: %s", key, last)
						return
					}
					select { // the client's back-off
					case <-ctx.Done():
					case <-time.After(20 * time.Millisecond):
					}
				}
				sum.Add(amount)
				if made.Add(1) == 300 {
					close(restarted)
				}
			}
		})
	}
	<-restarted
	a.kill(t)
	b := launch(t, "b", args...).ready(t, e.hc)
	cur.Store(b)
	wg.Wait()
	if t.Failed() {
		return
	}
	phase("1,000 payments made, the service killed and restarted after the 300th")

	waitFor(t, "every payment settled", time.Minute, func() bool {
		return e.settlement(t, b.URL).Events >= n
	})
	if s := e.settlement(t, b.URL); s.Events != n || s.Total != sum.Load() {
		t.Fatalf("settlement = %+v, want %d KRW over %d events", s, sum.Load(), n)
	}
	phase("every payment settled once")
	waitFor(t, "the audit consumer saw every event", time.Minute, func() bool {
		return len(aud.snapshot()) >= n
	})

	// Every event again under its own ID, and once more under a new one.
	dupBefore := e.duplicates(t, b)
	events := aud.snapshot()
	for start := 0; start < len(events); start += 100 {
		batch := events[start:min(start+100, len(events))]
		var msgs []idem.Message
		for _, m := range batch {
			cp := m
			cp.ID = "copy-" + m.ID
			msgs = append(msgs, m, cp)
		}
		if err := et.tr.Publish(ctx, msgs...); err != nil {
			t.Fatalf("re-publishing events: %v", err)
		}
	}
	want := 2 * n
	if et.dropsIDs {
		want = n // the broker drops the copies under the same ID
	}
	waitFor(t, fmt.Sprintf("%d duplicates absorbed", want), time.Minute, func() bool {
		return e.duplicates(t, b)-dupBefore >= want
	})
	if s := e.settlement(t, b.URL); s.Events != n || s.Total != sum.Load() {
		t.Fatalf("settlement after the copies = %+v, want %d KRW over %d events", s, sum.Load(), n)
	}
	phase(fmt.Sprintf("%d copies re-published; %d duplicates absorbed by the restarted service, settlement unchanged",
		2*len(events), e.duplicates(t, b)))
	if et.unsettled != nil {
		// On a loaded machine a copy may be delivered again (its ack wait
		// passed) and counted twice: wait until every copy is settled, so
		// that what is unsettled after the crash below is the crash's.
		waitFor(t, "every copy acknowledged", time.Minute, func() bool { return et.unsettled(t) == 0 })
	}

	// Another event, under an ID of its own, for a payment that settled:
	// the consumer processes it (adding nothing: the payment is marked
	// settled), commits its inbox row, and dies before acknowledging.
	var ev payments.PaymentEvent
	if err := json.Unmarshal(events[0].Payload, &ev); err != nil {
		t.Fatal(err)
	}
	ev.EventID = "evt-crash-" + randHex(6)
	body, _ := json.Marshal(ev)
	b.expectExit.Store(true)
	if err := et.tr.Publish(ctx, idem.Message{ID: ev.EventID, Topic: payments.TopicPaymentSucceeded, Key: ev.AccountID,
		Payload: body, Headers: map[string]string{"Idem-Fault": "crash-after-settle"}}); err != nil {
		t.Fatal(err)
	}
	b.waitExit(t)
	if !b.killedBySIGKILL() {
		t.Fatalf("replica b: %s, want killed by SIGKILL after settling", b.cmd.ProcessState)
	}
	c := launch(t, "c", args...).ready(t, e.hc)
	if et.unsettled != nil {
		// The acknowledgement committed with the settlement: the crash
		// came after both, and nothing is delivered again.
		if n := et.unsettled(t); n != 0 {
			t.Errorf("%d settlement messages unsettled after the consumer's crash, want none: the acknowledgement commits with the effect", n)
		}
	} else {
		waitFor(t, "the unacknowledged event delivered again and absorbed", time.Minute, func() bool {
			return e.duplicates(t, c) >= 1
		})
	}
	if s := e.settlement(t, c.URL); s.Events != n || s.Total != sum.Load() {
		t.Errorf("settlement after the consumer's crash = %+v, want %d KRW over %d events: a second event of a settled payment adds nothing", s, sum.Load(), n)
	}
	if et.unsettled != nil {
		phase("killed right after the commit, which acknowledged the event with its settlement: nothing delivered again")
	} else {
		phase("killed between commit and acknowledgement; the redelivery absorbed after the restart")
	}
}
