package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/deadletter"
	"github.com/idem-go/idem/idemsqlite"
	"github.com/idem-go/idem/payments"
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

// The whole pipeline of `idem serve` on SQLite, over real HTTP: every
// payment is announced through the outbox, relayed to the embedded
// transport and settled once; copies, malformed messages and injected
// failures end where they must; `idem dlq` and /metrics show the dead
// letters.
func TestServeSettlesEveryPaymentOnce(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "idem.db")
	dbURL := "sqlite:" + path
	const apiKey = "test-key-settle"
	args := []string{"--db", dbURL, "--api-keys", "acme:" + apiKey, "--log-level", "warn", "--faults", "--retry-base", "1ms", "--retry-cap", "5ms"}
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

	// The test's own connection to the file: it publishes straight to the
	// transport, as another relay or a broker would.
	ctx := t.Context()
	db, err := idemsqlite.Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	tr, err := idemsqlite.NewTransport(ctx, db, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	var (
		firstID string
		body    []byte
	)
	if err := db.Reader().QueryRowContext(ctx, `SELECT id, payload FROM idem_transport_messages WHERE topic = ? ORDER BY seq LIMIT 1`,
		payments.TopicPaymentSucceeded).Scan(&firstID, &body); err != nil {
		t.Fatal(err)
	}
	var ev payments.PaymentEvent
	if err := json.Unmarshal(body, &ev); err != nil || ev.EventID != firstID || ev.Type != "payment.succeeded" || ev.Tenant != "acme" || ev.Amount != 1 {
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

	// An event failing three times settles once, on attempt 4. It is a
	// second event (its own ID) for the first payment, so it counts.
	retriedBefore := counter("retried")
	flaky := ev
	flaky.EventID = "evt-fail-3"
	fb, _ := json.Marshal(flaky)
	publish(idem.Message{ID: flaky.EventID, Key: ev.AccountID, Payload: fb, Headers: map[string]string{"Idem-Fault": "fail-times=3"}})
	waitFor(t, "the fail-times=3 event settled", func() (bool, string) {
		s := settlement()
		return s.Events == n+1, fmt.Sprintf("%+v", s)
	})
	if s := settlement(); s.Total != sum+ev.Amount {
		t.Errorf("settlement after the fail-times=3 event = %+v, want total %d", s, sum+ev.Amount)
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
	waitFor(t, "two dead letters in idem dlq ls --json", func() (bool, string) {
		code, out, errOut := runCmd(t, "dlq", "ls", "--db", dbURL, "--json")
		if code != exitOK {
			return false, fmt.Sprintf("exit %d: %s", code, errOut)
		}
		letters = nil
		if err := json.Unmarshal([]byte(out), &letters); err != nil {
			return false, err.Error()
		}
		return len(letters) == 2, out
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
	if code, out, _ := runCmd(t, "dlq", "ls", "--db", dbURL, "--class", "permanent", "--json"); code != exitOK || !strings.Contains(out, `"bad-1"`) || strings.Contains(out, "evt-fail-100") {
		t.Errorf("dlq ls --class permanent: exit %d, %s", code, out)
	}
	if code, out, _ := runCmd(t, "dlq", "show", "--db", dbURL, dl.ID); code != exitOK || !strings.Contains(out, "fail-times=100") {
		t.Errorf("dlq show: exit %d:\n%s", code, out)
	}

	m := metricsOf(t, srv)
	if v := metricValue(m, `idem_dead_letters{consumer="settlement"}`); v != 2 {
		t.Errorf("idem_dead_letters = %v, want 2:\n%s", v, m)
	}
	if v := metricValue(m, `idem_dead_letter_oldest_age_seconds{consumer="settlement"}`); v < 0 {
		t.Errorf("idem_dead_letter_oldest_age_seconds missing:\n%s", m)
	}

	// Re-driven with the fault header edited away, it settles once.
	if code, out, _ := runCmd(t, "dlq", "discard", "--db", dbURL, byMsg["bad-1"].ID); code == exitOK {
		t.Errorf("dlq discard without --reason succeeded: %s", out)
	}
	code, out, errOut := runCmd(t, "dlq", "redrive", "--db", dbURL, "--all-matching", "--consumer", "settlement", "--class", "exhausted", "--dry-run")
	if code != exitOK || !strings.Contains(out, dl.ID+": would be redriven") || strings.Contains(out, byMsg["bad-1"].ID) {
		t.Errorf("dlq redrive --all-matching --dry-run: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if code, out, _ := runCmd(t, "dlq", "redrive", "--db", dbURL, "--dry-run", dl.ID); code != exitOK || !strings.Contains(out, "would be") {
		t.Errorf("dlq redrive --dry-run ID: exit %d, %q", code, out)
	}
	svc, err := payments.DeadLetterService(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
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
	waitFor(t, "the re-driven event settled", func() (bool, string) {
		s := settlement()
		return s.Events == n+2, fmt.Sprintf("%+v", s)
	})
	if code, out, errOut := runCmd(t, "dlq", "discard", "--db", dbURL, "--reason", "not an event", byMsg["bad-1"].ID); code != exitOK {
		t.Errorf("dlq discard: exit %d: %s%s", code, out, errOut)
	}
	waitFor(t, "no dead letters left in /metrics", func() (bool, string) {
		v := metricValue(metricsOf(t, srv), `idem_dead_letters{consumer="settlement"}`)
		return v == 0, fmt.Sprint(v)
	})
	if s := settlement(); s.Total != sum+2*ev.Amount || s.Events != n+2 {
		t.Errorf("final settlement = %+v, want %d over %d events", s, sum+2*ev.Amount, n+2)
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
	for _, broker := range []string{"nats://127.0.0.1:4222", "amqp://guest:guest@127.0.0.1:5672/", "kafka://x"} {
		dbURL := "sqlite:" + filepath.Join(t.TempDir(), "idem.db")
		code, _, errOut := runCmd(t, "serve", "--db", dbURL, "--broker", broker, "--api-keys", "a:b")
		if code == exitOK {
			t.Errorf("serve --broker %s: exit 0", broker)
		}
		if !strings.HasPrefix(broker, "kafka") && !strings.Contains(errOut, "not wired into serve yet") {
			t.Errorf("serve --broker %s: stderr %q, want 'not wired into serve yet'", broker, errOut)
		}
		if strings.Contains(errOut, "guest:guest") {
			t.Errorf("serve --broker echoed a password: %q", errOut)
		}
	}
}
