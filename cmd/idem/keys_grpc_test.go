package main

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/cmd/idem/internal/acquirer"
	"github.com/idem-go/idem/cmd/idem/internal/payments"
	"github.com/idem-go/idem/console"
)

// Payments made over the gRPC face whose replica died after the card
// network charged them are settled and resumed by an operator as HTTP's
// are, from idem keys settle and resume and from the console's actions,
// each by the gRPC face's completer: the gRPC client's retry gets the
// settled answer in gRPC's form (a kept status, a Struct, with
// idem-settled-by-operator metadata), or the resumed payment with its one
// charge; and every action is in the key's history.
func TestOperatorActionsOnGRPCKeys(t *testing.T) {
	t.Parallel()
	for name, dbArgs := range map[string]func(t *testing.T) []string{
		"sqlite": func(t *testing.T) []string {
			return []string{"--db", "sqlite:" + t.TempDir() + "/idem.db"}
		},
		"postgres": func(t *testing.T) []string {
			u := postgresURL(t)
			return []string{"--db", u, "--pg-schema", freshSchema(t, u)}
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			testOperatorActionsOnGRPCKeys(t, dbArgs(t))
		})
	}
}

func testOperatorActionsOnGRPCKeys(t *testing.T, dbArgs []string) {
	hs := startCardNetwork(t)
	a := startReplica(t, "grpc-ops", append(append([]string{}, dbArgs...), "--acquirer", hs.URL, "--faults", "--grpc", "127.0.0.1:0",
		"--log-level", "warn", "--key-lease", "1s"))
	acct := a.post(t, "/v1/accounts", "acct", "", map[string]any{"balance": 100000, "currency": "EUR"})
	if acct.status != http.StatusCreated {
		t.Fatalf("creating the account: %s", acct)
	}
	pay := func(key string) map[string]any {
		return map[string]any{"account_id": acct.body["id"], "amount": 1000, "currency": "EUR", "description": key}
	}
	net, err := acquirer.NewClient(acquirer.ClientConfig{URL: hs.URL, APIKey: "net-key"})
	if err != nil {
		t.Fatal(err)
	}
	charges := func() int {
		t.Helper()
		chs, err := net.Charges(t.Context(), "")
		if err != nil {
			t.Fatal(err)
		}
		return len(chs)
	}
	// crashGRPC makes a payment over gRPC whose replica dies after the
	// charge, and waits for the holder's lease to end; the replica stays
	// down, so no completer of its own finishes the key.
	crashGRPC := func(key string) {
		t.Helper()
		if a.cmd.ProcessState != nil {
			a.start(t)
		}
		before := charges()
		if got := a.grpcCall(t, payments.GRPCCreatePayment, "test-key", key, "crash-after-charge", pay(key)); got.err == nil {
			t.Fatalf("crash-after-charge over gRPC answered %v; want the call cut", got.out)
		}
		select {
		case <-a.done:
		case <-time.After(30 * time.Second):
			t.Fatal("the replica did not die after the charge")
		}
		if n := charges(); n != before+1 {
			t.Fatalf("%d charges after the crash of %s; want %d", n, key, before+1)
		}
		s, _, done := openTestDB(t, dbArgs)
		defer done()
		deadline := time.Now().Add(30 * time.Second)
		for {
			rec, err := s.Get(t.Context(), "acme", idem.Key(key))
			if err != nil {
				t.Fatal(err)
			}
			if rec.State != idem.StateInFlight || rec.Recovery.Name != "charging-grpc" {
				t.Fatalf("%s after the crash: %v at %q; want in flight at the gRPC face's point", key, rec.State, rec.Recovery.Name)
			}
			if !rec.LeaseExpiresAt.After(time.Now()) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the dead holder's lease of %s did not end", key)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	withNet := []string{"--acquirer", hs.URL, "--acquirer-key", "net-key"}
	cli := func(args ...string) (int, string, string) {
		return runCmd(t, append(append(append([]string{}, args[:2]...), append([]string{"--scope", "acme", "--operator", "alice"}, dbArgs...)...), args[2:]...)...)
	}

	// From a terminal.
	crashGRPC("g-cli-failed")
	if code, out, errOut := cli("keys", "settle", "g-cli-failed", "--failed", "--reason", "no charge found", "--dry-run"); code != exitOK || !strings.Contains(out, "dry run") {
		t.Fatalf("keys settle --dry-run of a gRPC key: exit %d, %q, %q", code, out, errOut)
	}
	if code, out, errOut := cli("keys", "settle", "g-cli-failed", "--failed", "--reason", "no charge found"); code != exitOK || !strings.Contains(out, "gets gRPC status FailedPrecondition") {
		t.Fatalf("keys settle --failed of a gRPC key: exit %d, %q, %q", code, out, errOut)
	}
	crashGRPC("g-cli-answer")
	// A 2xx on the gRPC face is a Struct: a body that is no JSON object
	// is refused, changing nothing.
	if code, _, errOut := cli("keys", "settle", "g-cli-answer", "--status", "201", "--body", `[1,2]`, "--reason", "r"); code == exitOK || !strings.Contains(errOut, "google.protobuf.Struct") {
		t.Fatalf("keys settle of a gRPC key with a JSON array: exit %d, %q; want it refused", code, errOut)
	}
	if code, out, errOut := cli("keys", "settle", "g-cli-answer", "--status", "201", "--body", `{"id":"pay_settled","status":"succeeded"}`, "--reason", "the bank confirmed it"); code != exitOK || !strings.Contains(out, "gets gRPC status OK") {
		t.Fatalf("keys settle --status 201 of a gRPC key: exit %d, %q, %q", code, out, errOut)
	}
	crashGRPC("g-cli-resume")
	if code, out, errOut := cli(append([]string{"keys", "resume", "g-cli-resume", "--reason", "the completer is down"}, withNet...)...); code != exitOK || !strings.Contains(out, "gRPC client's retry gets status OK") {
		t.Fatalf("keys resume of a gRPC key: exit %d, %q, %q", code, out, errOut)
	}

	// From the console, acting through the completers a service with
	// --grpc gives it (here without rounds of their own, as idem keys
	// resume's: the replica is down).
	act := func(key, action string, form url.Values) {
		t.Helper()
		schema := ""
		if len(dbArgs) == 4 {
			schema = dbArgs[3]
		}
		db, err := openDB(t.Context(), dbArgs[1], schema, true)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		actions, stop, err := payments.NewCompleter(t.Context(), &payments.Config{DB: db.sqlite, Postgres: db.pg, Acquirer: net,
			Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		defer stop()
		ops, err := console.ParseOperators("alice:op-token-1-0123456789abcdef")
		if err != nil {
			t.Fatal(err)
		}
		con, err := openConsole(t.Context(), db, nil, nil, actions, net, ops, false, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		// The confirmation page's dry run goes to the gRPC face's
		// completer too.
		page := httptest.NewRequestWithContext(t.Context(), http.MethodGet, consolePath+"outcomes/act?"+url.Values{"scope": {"acme"}, "key": {key}, "action": {action}}.Encode(), nil)
		page.Header.Set("Authorization", "Bearer op-token-1-0123456789abcdef")
		shown := httptest.NewRecorder()
		con.Handler().ServeHTTP(shown, page)
		if shown.Code != http.StatusOK || action == console.ActionSettleFailed && !strings.Contains(shown.Body.String(), "FailedPrecondition") {
			t.Fatalf("console's confirmation of %s on %s: %d\n%s", action, key, shown.Code, shown.Body)
		}
		form.Set("scope", "acme")
		form.Set("key", key)
		form.Set("action", action)
		form.Set("confirm", "yes")
		req := httptest.NewRequestWithContext(t.Context(), http.MethodPost, consolePath+"outcomes/act", strings.NewReader(form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Authorization", "Bearer op-token-1-0123456789abcdef")
		rec := httptest.NewRecorder()
		con.Handler().ServeHTTP(rec, req)
		if loc := rec.Header().Get("Location"); rec.Code != http.StatusSeeOther || !strings.Contains(loc, "done=") || strings.Contains(loc, "failed") && action == console.ActionResume {
			t.Fatalf("console %s of %s: %d, to %q\n%s", action, key, rec.Code, loc, rec.Body)
		}
	}
	crashGRPC("g-con-failed")
	act("g-con-failed", console.ActionSettleFailed, url.Values{"reason": {"nothing at the network"}})
	crashGRPC("g-con-answer")
	act("g-con-answer", console.ActionSettleAnswer, url.Values{"reason": {"refunded by phone"}, "status": {"402"},
		"content_type": {"application/problem+json"}, "body": {`{"title":"Declined","detail":"the card was declined by its bank"}`}})
	crashGRPC("g-con-resume")
	act("g-con-resume", console.ActionResume, url.Values{"reason": {"network is back"}})

	// The history says who, what and why.
	_, h, done := openTestDB(t, dbArgs)
	for key, want := range map[string]string{"g-cli-failed": console.ActionSettleFailed, "g-cli-answer": console.ActionSettleAnswer, "g-cli-resume": console.ActionResume,
		"g-con-failed": console.ActionSettleFailed, "g-con-answer": console.ActionSettleAnswer, "g-con-resume": console.ActionResume} {
		evs, err := h.KeyEvents(t.Context(), "acme", idem.Key(key), console.KeyEventsQuery{})
		if err != nil || len(evs) != 1 || evs[0].Actor != "alice" || evs[0].Action != want || evs[0].Reason == "" ||
			!strings.HasPrefix(evs[0].Result, "settled") && evs[0].Result != "finished" {
			t.Errorf("%s's history: %+v %v; want alice's %s with its reason", key, evs, err, want)
		}
	}
	done()
	chargesBefore := charges()

	// The gRPC clients' retries, on the service started again.
	a.start(t)
	defer a.stop(t)
	retry := func(key string) grpcAnswer {
		t.Helper()
		got := a.grpcCall(t, payments.GRPCCreatePayment, "test-key", key, "", pay(key))
		if !got.replayed() {
			t.Errorf("the retry of %s was not replayed: %v %v", key, got.out, got.err)
		}
		return got
	}
	for _, key := range []string{"g-cli-failed", "g-con-failed"} {
		got := retry(key)
		if st := status.Convert(got.err); st.Code() != codes.FailedPrecondition || !strings.Contains(st.Message(), "Settled as failed by an operator") ||
			strings.Join(got.header.Get("idem-settled-by-operator"), ",") != "failed" {
			t.Errorf("the retry of %s: %v, metadata %v; want FailedPrecondition settled as failed", key, got.err, got.header)
		}
	}
	if got := retry("g-cli-answer"); got.err != nil || got.out.GetFields()["id"].GetStringValue() != "pay_settled" ||
		strings.Join(got.header.Get("idem-settled-by-operator"), ",") != "answer" {
		t.Errorf("the retry of g-cli-answer: %v %v, metadata %v; want the operator's Struct", got.out, got.err, got.header)
	}
	if got := retry("g-con-answer"); status.Code(got.err) != codes.FailedPrecondition || status.Convert(got.err).Message() != "Declined: the card was declined by its bank" ||
		strings.Join(got.header.Get("idem-settled-by-operator"), ",") != "answer" {
		t.Errorf("the retry of g-con-answer: %v, metadata %v; want the operator's 402 as FailedPrecondition", got.err, got.header)
	}
	for _, key := range []string{"g-cli-resume", "g-con-resume"} {
		if got := retry(key); got.err != nil || got.out.GetFields()["charge_id"].GetStringValue() == "" {
			t.Errorf("the retry of %s: %v %v; want the resumed payment with its charge", key, got.out, got.err)
		}
	}
	if n := charges(); n != chargesBefore {
		t.Errorf("%d charges after the retries; want the %d the dead executions made", n, chargesBefore)
	}
}
