package main

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
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/payments"
	"github.com/idem-go/idem/deadletter"
	"github.com/idem-go/idem/idemamqp"
	"github.com/idem-go/idem/idemkafka"
	"github.com/idem-go/idem/idemnats"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/idemsqlite"
	"github.com/idem-go/idem/idemtest"
)

type settlementBody struct {
	Currency string `json:"currency"`
	Total    int64  `json:"total"`
	Events   int64  `json:"events"`
}

// waitFor polls cond every 20ms until it holds, failing the test after a
// minute with what last describes.
func waitFor(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		ok, last := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: gave up after a minute; last: %s", what, last)
		}
		time.Sleep(20 * time.Millisecond) // polling, with a deadline
	}
}

func metricsOf(t *testing.T, srv *server) string {
	t.Helper()
	resp, err := http.Get(srv.base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// metricValue reads one sample of the exposition text; -1 when absent.
func metricValue(text, series string) float64 {
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindStringSubmatch(text)
	if m == nil {
		return -1
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		return -1
	}
	return v
}

// pipelineTransport is one way serve carries its events in these tests:
// serve's arguments for the database and the broker, the database URL that
// `idem dlq` takes, and the test's own connection to the transport.
type pipelineTransport struct {
	args []string
	// dbArgs are --db and, for PostgreSQL, --pg-schema.
	dbArgs []string
	tr     payments.Transport
	// deadLetters opens the dead-letter service on the database.
	deadLetters func(ctx context.Context) (*deadletter.Service, error)
}

// pipelineCases are the transports serve's pipeline is tested on: the
// SQLite file's embedded transport, PostgreSQL's, NATS JetStream, Kafka
// (kfake, in the test's process) and RabbitMQ (the last three with the
// events' stores in SQLite).
var pipelineCases = []struct {
	name  string
	setup func(t *testing.T) pipelineTransport
}{
	{"sqlite", func(t *testing.T) pipelineTransport {
		pt, db := sqlitePipeline(t)
		tr, err := idemsqlite.NewTransport(t.Context(), db, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tr.Close() })
		pt.tr = tr
		return pt
	}},
	{"postgres", func(t *testing.T) pipelineTransport {
		url := postgresURL(t)
		schema := freshSchema(t, url)
		db, err := idempg.Open(t.Context(), url, &idempg.Config{Schema: schema, MaxConns: 4})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(db.Close)
		tr, err := idempg.NewTransport(t.Context(), db, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tr.Close() })
		return pipelineTransport{
			args: []string{"--db", url, "--pg-schema", schema}, dbArgs: []string{"--db", url, "--pg-schema", schema}, tr: tr,
			deadLetters: func(ctx context.Context) (*deadletter.Service, error) {
				return payments.DeadLetterServicePostgres(ctx, db)
			},
		}
	}},
	{"nats", func(t *testing.T) pipelineTransport {
		pt, _ := sqlitePipeline(t)
		url := idemtest.RequireService(t, "NATS", "IDEM_NATS_URL", "nats://127.0.0.1:4222")
		ns := "idemtest-" + randomName("")[:8]
		stream := strings.ToUpper(strings.ReplaceAll(ns, "-", "_"))
		tr, err := idemnats.Open(t.Context(), url, &idemnats.Config{Stream: stream, SubjectPrefix: ns})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			tr.Close()
			if err := deleteNATSStream(url, stream); err != nil {
				t.Error(err)
			}
		})
		pt.tr = tr
		pt.args = append(pt.args, "--broker", url, "--broker-namespace", ns)
		return pt
	}},
	{"kafka", func(t *testing.T) pipelineTransport {
		pt, _ := sqlitePipeline(t)
		seeds := startKafka(t)
		ns := "idemtest-" + randomName("")[:8]
		tr, err := idemkafka.Open(t.Context(), seeds, &idemkafka.Config{TopicPrefix: ns + "."})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tr.Close() })
		pt.tr = tr
		pt.args = append(pt.args, "--broker", "kafka://"+strings.Join(seeds, ","), "--broker-namespace", ns)
		return pt
	}},
	{"amqp", func(t *testing.T) pipelineTransport {
		pt, _ := sqlitePipeline(t)
		url := idemtest.RequireService(t, "RabbitMQ", "IDEM_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
		ns := "idemtest-" + randomName("")[:8]
		tr, err := idemamqp.Open(t.Context(), url, &idemamqp.Config{Exchange: ns, QueuePrefix: ns})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := tr.DeleteQueues(ctx); err != nil {
				t.Error(err)
			}
			tr.Close()
			if err := deleteAMQP(url, ns, ns+"."+payments.SettlementConsumer); err != nil {
				t.Error(err)
			}
		})
		pt.tr = tr
		pt.args = append(pt.args, "--broker", url, "--broker-namespace", ns)
		return pt
	}},
}

func sqlitePipeline(t *testing.T) (pipelineTransport, *idemsqlite.DB) {
	path := filepath.Join(t.TempDir(), "idem.db")
	db, err := idemsqlite.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return pipelineTransport{
		args: []string{"--db", "sqlite:" + path}, dbArgs: []string{"--db", "sqlite:" + path},
		deadLetters: func(ctx context.Context) (*deadletter.Service, error) {
			return payments.DeadLetterService(ctx, db)
		},
	}, db
}

// firstEvents subscribes to the payment events under a consumer name of
// the test's own and returns a function that waits for the first n.
func firstEvents(t *testing.T, tr payments.Transport) func(n int) []idem.Message {
	ctx, cancel := context.WithCancel(context.Background())
	st, err := tr.Subscribe(ctx, idem.Subscription{Topic: payments.TopicPaymentSucceeded, Consumer: "audit"})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	var (
		mu   sync.Mutex
		seen []idem.Message
		done = make(chan struct{})
	)
	go func() {
		defer close(done)
		for {
			d, err := st.Next(ctx)
			if err != nil {
				return
			}
			mu.Lock()
			seen = append(seen, d.Message())
			mu.Unlock()
			_ = d.Ack(ctx)
		}
	}()
	t.Cleanup(func() {
		cancel()
		st.Close()
		<-done
	})
	return func(n int) []idem.Message {
		t.Helper()
		var out []idem.Message
		waitFor(t, fmt.Sprintf("%d events seen by the audit consumer", n), func() (bool, string) {
			mu.Lock()
			defer mu.Unlock()
			out = append([]idem.Message(nil), seen...)
			return len(out) >= n, fmt.Sprint(len(out), " seen")
		})
		return out
	}
}

// The whole pipeline of `idem serve`, over real HTTP, on every transport:
// every payment is announced through the outbox, relayed and settled once;
// copies, malformed messages and injected failures end where they must;
// `idem dlq` and /metrics show the dead letters.
func TestServeSettlesEveryPaymentOnce(t *testing.T) {
	t.Parallel()
	for _, c := range pipelineCases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			testServeSettles(t, c.setup(t))
		})
	}
}

func testServeSettles(t *testing.T, pt pipelineTransport) {
	audit := firstEvents(t, pt.tr)
	// dlq runs `idem dlq sub rest…` on the test's database.
	dlq := func(sub string, rest ...string) (int, string, string) {
		return runCmd(t, append(append([]string{"dlq", sub}, rest...), pt.dbArgs...)...)
	}
	const apiKey = "test-key-settle"
	args := append([]string{"--api-keys", "acme:" + apiKey, "--log-level", "warn", "--faults", "--retry-base", "1ms", "--retry-cap", "5ms"}, pt.args...)
	srv := startServe(t, newApp(nil), args...)

	settlement := func() settlementBody {
		var s settlementBody
		if resp := srv.call(t, "GET", "/v1/settlement", apiKey, "", nil, &s); resp.StatusCode != http.StatusOK {
			t.Fatalf("GET /v1/settlement: status %d", resp.StatusCode)
		}
		return s
	}
	if s := settlement(); s != (settlementBody{}) {
		t.Errorf("settlement before any account = %+v, want zero values", s)
	}

	var acct accountBody
	if resp := srv.call(t, "POST", "/v1/accounts", apiKey, "acct-1", map[string]any{"balance": 10_000_000, "currency": "KRW"}, &acct); resp.StatusCode != http.StatusCreated {
		t.Fatalf("POST /v1/accounts: status %d", resp.StatusCode)
	}
	const n = 200
	var sum int64
	for i := range n {
		amount := int64(i + 1)
		sum += amount
		var p paymentBody
		resp := srv.call(t, "POST", "/v1/payments", apiKey, fmt.Sprintf("pay-%d", i), map[string]any{"account_id": acct.ID, "amount": amount, "currency": "KRW"}, &p)
		if resp.StatusCode != http.StatusCreated {
			t.Fatalf("payment %d: status %d", i, resp.StatusCode)
		}
	}
	// A retry of a payment announces nothing more.
	srv.call(t, "POST", "/v1/payments", apiKey, "pay-0", map[string]any{"account_id": acct.ID, "amount": 1, "currency": "KRW"}, nil)
	waitFor(t, "every payment settled", func() (bool, string) {
		s := settlement()
		return s.Events >= n, fmt.Sprintf("%+v", s)
	})
	if s := settlement(); s.Total != sum || s.Events != n || s.Currency != "KRW" {
		t.Fatalf("settlement = %+v, want %d KRW over %d events", s, sum, n)
	}
	// A transport whose streams hold messages in memory shows them, and
	// their bound (idemprom.StreamStatser); the others have no such
	// gauges.
	limit := metricValue(metricsOf(t, srv), `idem_stream_held_limit{consumer="settlement"}`)
	if kafka := strings.Contains(strings.Join(pt.args, " "), "kafka://"); kafka != (limit > 0) {
		t.Errorf("idem_stream_held_limit = %v on a transport that is Kafka: %v", limit, kafka)
	}

	// The test publishes straight to the transport, as another relay
	// would.
	ctx := t.Context()
	tr := pt.tr
	first := audit(1)[0]
	firstID, body := first.ID, first.Payload
	var ev payments.PaymentEvent
	if err := json.Unmarshal(body, &ev); err != nil || ev.EventID != firstID || ev.Type != "payment.succeeded" || ev.Tenant != "acme" || ev.Amount != 1 || first.Key != ev.AccountID {
		t.Fatalf("first event %s = %+v (%v), want event 1 of acme with its ID as the message ID", body, ev, err)
	}
	publish := func(m idem.Message) {
		t.Helper()
		if m.Topic == "" {
			m.Topic = payments.TopicPaymentSucceeded
		}
		if err := tr.Publish(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	counter := func(outcome string) float64 {
		return metricValue(metricsOf(t, srv), `idem_consumer_messages_total{consumer="settlement",outcome="`+outcome+`"}`)
	}

	// A copy re-published under another transport ID is absorbed.
	publish(idem.Message{ID: "copy-of-" + firstID, Key: ev.AccountID, Payload: body})
	waitFor(t, "the copy absorbed", func() (bool, string) {
		d := counter("duplicate")
		return d >= 1, fmt.Sprint("duplicates ", d)
	})

	// A malformed message is dead-lettered after one attempt, permanent.
	publish(idem.Message{ID: "bad-1", Key: "k-bad", Payload: []byte("{not json")})
	// So is an event of a payment that does not exist.
	ghost := ev
	ghost.EventID, ghost.PaymentID = "evt-ghost", "pay_missing"
	gb, _ := json.Marshal(ghost)
	publish(idem.Message{ID: ghost.EventID, Key: "k-ghost", Payload: gb})

	// An event failing three times is processed once, on attempt 4. It is
	// a second event (its own ID) for the first payment, which is settled
	// already, so it adds nothing.
	retriedBefore := counter("retried")
	processedBefore := counter("processed")
	flaky := ev
	flaky.EventID = "evt-fail-3"
	fb, _ := json.Marshal(flaky)
	publish(idem.Message{ID: flaky.EventID, Key: ev.AccountID, Payload: fb, Headers: map[string]string{"Idem-Fault": "fail-times=3"}})
	waitFor(t, "the fail-times=3 event processed", func() (bool, string) {
		p := counter("processed")
		return p-processedBefore >= 1, fmt.Sprint("processed ", p-processedBefore)
	})
	if s := settlement(); s.Total != sum || s.Events != n {
		t.Errorf("settlement after the fail-times=3 event = %+v, want %d over %d events: the payment counts once", s, sum, n)
	}
	if r := counter("retried"); r-retriedBefore != 3 {
		t.Errorf("retries for the fail-times=3 event: %v, want 3 (settled on attempt 4)", r-retriedBefore)
	}

	// An event failing a hundred times is dead-lettered after
	// --max-attempts 3, with every attempt recorded: the service restarts
	// with it.
	stopExpectingDeadLetters(t, srv)
	srv = startServe(t, newApp(nil), append(args, "--max-attempts", "3")...)
	doomed := ev
	doomed.EventID = "evt-fail-100"
	dbody, _ := json.Marshal(doomed)
	publish(idem.Message{ID: doomed.EventID, Key: ev.AccountID, Payload: dbody, Headers: map[string]string{"Idem-Fault": "fail-times=100"}})

	var letters []letterJSON
	waitFor(t, "three dead letters in idem dlq ls --json", func() (bool, string) {
		code, out, errOut := dlq("ls", "--json")
		if code != exitOK {
			return false, fmt.Sprintf("exit %d: %s", code, errOut)
		}
		letters = nil
		if err := json.Unmarshal([]byte(out), &letters); err != nil {
			return false, err.Error()
		}
		return len(letters) == 3, out
	})
	byMsg := map[string]letterJSON{}
	for _, l := range letters {
		byMsg[l.MessageID] = l
	}
	if l := byMsg["bad-1"]; l.ErrorClass != "permanent" || l.Attempts != 1 || l.Consumer != "settlement" || l.State != "dead" || l.Payload != "{not json" {
		t.Errorf("the malformed message's letter = %+v, want permanent after 1 attempt, its payload as it came", l)
	}
	dl := byMsg["evt-fail-100"]
	if dl.ErrorClass != "exhausted" || dl.Attempts != 3 || !strings.Contains(dl.LastError, "fail-times=100") || dl.Key != ev.AccountID || dl.Topic != payments.TopicPaymentSucceeded {
		t.Errorf("the fail-times=100 letter = %+v, want exhausted after 3 attempts", dl)
	}
	if l := byMsg["evt-ghost"]; l.ErrorClass != "permanent" || l.Attempts != 1 || !strings.Contains(l.LastError, "pay_missing") {
		t.Errorf("the unknown payment's letter = %+v, want permanent after 1 attempt, naming the payment", l)
	}
	if code, out, _ := dlq("ls", "--class", "permanent", "--json"); code != exitOK || !strings.Contains(out, `"bad-1"`) || !strings.Contains(out, `"evt-ghost"`) || strings.Contains(out, "evt-fail-100") {
		t.Errorf("dlq ls --class permanent: exit %d, %s", code, out)
	}
	if code, out, _ := dlq("show", dl.ID); code != exitOK || !strings.Contains(out, "fail-times=100") {
		t.Errorf("dlq show: exit %d:\n%s", code, out)
	}

	m := metricsOf(t, srv)
	if v := metricValue(m, `idem_dead_letters{consumer="settlement"}`); v != 3 {
		t.Errorf("idem_dead_letters = %v, want 3:\n%s", v, m)
	}
	if v := metricValue(m, `idem_dead_letter_oldest_age_seconds{consumer="settlement"}`); v < 0 {
		t.Errorf("idem_dead_letter_oldest_age_seconds missing:\n%s", m)
	}

	// Re-driven with the fault header edited away, it settles once.
	if code, out, _ := dlq("discard", byMsg["bad-1"].ID); code == exitOK {
		t.Errorf("dlq discard without --reason succeeded: %s", out)
	}
	code, out, errOut := dlq("redrive", "--all-matching", "--consumer", "settlement", "--class", "exhausted", "--dry-run")
	if code != exitOK || !strings.Contains(out, dl.ID+": would be redriven") || strings.Contains(out, byMsg["bad-1"].ID) {
		t.Errorf("dlq redrive --all-matching --dry-run: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if code, out, _ := dlq("redrive", "--dry-run", dl.ID); code != exitOK || !strings.Contains(out, "would be") {
		t.Errorf("dlq redrive --dry-run ID: exit %d, %q", code, out)
	}
	svc, err := pt.deadLetters(ctx)
	if err != nil {
		t.Fatal(err)
	}
	processedBefore = counter("processed") // the restarted service counts from zero
	_, err = svc.Redrive(ctx, []string{dl.ID}, &deadletter.RedriveOptions{
		Actor:  "test",
		Reason: "fault removed",
		Edit: func(m idem.Message) (idem.Message, error) {
			delete(m.Headers, "Idem-Fault")
			return m, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the re-driven event processed", func() (bool, string) {
		p := counter("processed")
		return p-processedBefore >= 1, fmt.Sprint("processed ", p-processedBefore)
	})
	if code, out, errOut := dlq("discard", "--reason", "not an event", byMsg["bad-1"].ID, byMsg["evt-ghost"].ID); code != exitOK {
		t.Errorf("dlq discard: exit %d: %s%s", code, out, errOut)
	}
	waitFor(t, "no dead letters left in /metrics", func() (bool, string) {
		v := metricValue(metricsOf(t, srv), `idem_dead_letters{consumer="settlement"}`)
		return v == 0, fmt.Sprint(v)
	})
	if s := settlement(); s.Total != sum || s.Events != n {
		t.Errorf("final settlement = %+v, want %d over %d events: the first payment's later events add nothing", s, sum, n)
	}
	stopExpectingDeadLetters(t, srv)
}

// stopExpectingDeadLetters is stopCleanly for a server that dead-letters
// messages on purpose, which it logs as errors: it checks the exit status
// and that every error logged is a dead letter.
func stopExpectingDeadLetters(t *testing.T, srv *server) {
	t.Helper()
	if code := srv.stop(); code != exitOK {
		t.Fatalf("serve exit status after cancel = %d, want 0; stderr:\n%s", code, srv.stderr)
	}
	for line := range strings.Lines(srv.stderr.String()) {
		if strings.Contains(line, "level=ERROR") && !strings.Contains(line, `msg="message dead-lettered"`) {
			t.Errorf("serve logged an error: %s", line)
		}
	}
}

func TestServeBrokerFlag(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--broker", "redis://x"}, `unsupported broker scheme "redis"`},
		{[]string{"--broker", "kafka://x"}, `"x": want HOST:PORT`},
		{[]string{"--broker", "kafka://127.0.0.1:1"}, "opening Kafka at kafka://127.0.0.1:1"},
		{[]string{"--broker", "127.0.0.1:4222"}, "--broker needs a URL"},
		{[]string{"--broker", "nats://127.0.0.1:4222", "--broker-namespace", "Bad.Name"}, "--broker-namespace"},
		{[]string{"--broker", "nats://127.0.0.1:4222", "--ack-wait", "0s"}, "--ack-wait must be positive"},
		// Nothing listens on port 1: the connection fails, and the message
		// must not echo the password.
		{[]string{"--broker", "amqp://guest:s3cret@127.0.0.1:1/"}, "opening RabbitMQ at amqp://guest:xxxxx@127.0.0.1:1/"},
	} {
		dbURL := "sqlite:" + filepath.Join(t.TempDir(), "idem.db")
		code, _, errOut := runCmd(t, append([]string{"serve", "--db", dbURL, "--api-keys", "a:b"}, c.args...)...)
		if code == exitOK {
			t.Errorf("serve %v: exit 0", c.args)
		}
		if !strings.Contains(errOut, c.want) {
			t.Errorf("serve %v: stderr %q, want %q", c.args, errOut, c.want)
		}
		if strings.Contains(errOut, "s3cret") {
			t.Errorf("serve %v echoed a password: %q", c.args, errOut)
		}
	}
}
