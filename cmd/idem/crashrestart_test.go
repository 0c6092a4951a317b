package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// What `idem serve --acquirer` promises a payment whose replica was
// SIGKILLed between the card network's charge and the payment's commit:
// the client's retry is answered 201, with the payment of that one charge,
// within half the lease of the replica's restart (it ends at once the
// leases its killed run held, --replica-id naming it, rather than waiting
// them out), and, on a second replica that did not restart, within one
// and a half leases (the lease ends, unrenewed). The margins are halves of
// the lease, not seconds, so that a loaded machine's slow replicas do not
// fail what only a lease waited out would.
// The replicas are processes of this test binary run as idem.
func TestServeAcquirerCrashAndRetry(t *testing.T) {
	t.Parallel()
	for name, db := range map[string]func(t *testing.T) []string{
		"sqlite": func(t *testing.T) []string {
			return []string{"--db", "sqlite:" + filepath.Join(t.TempDir(), "idem.db")}
		},
		"postgres": func(t *testing.T) []string {
			u := postgresURL(t)
			return []string{"--db", u, "--pg-schema", freshSchema(t, u)}
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			hs := startCardNetwork(t)
			args := append(db(t), "--acquirer", hs.URL, "--faults", "--log-level", "warn")
			a := startReplica(t, "a", args)
			b := startReplica(t, "b", args)
			acct := a.post(t, "/v1/accounts", "acct", "", map[string]any{"balance": 100000, "currency": "EUR"})
			if acct.status != http.StatusCreated {
				t.Fatalf("creating the account: %s", acct)
			}
			pay := func(key string) map[string]any {
				return map[string]any{"account_id": acct.body["id"], "amount": 1000, "currency": "EUR"}
			}

			// The replica dies after the charge; the retry goes to the
			// other one, which did not restart.
			crash(t, a, "pay-1", pay("pay-1"))
			died := time.Now()
			r := retryUntilAnswered(t, b, "pay-1", pay("pay-1"), 30*time.Second)
			took := time.Since(died)
			t.Logf("the retry on the other replica: %d after %v", r.status, took.Round(time.Millisecond))
			if r.status != http.StatusCreated || took > defaultLease+defaultLease/2 {
				t.Errorf("the retry on the other replica: %s, %v after the crash; want 201 within one and a half leases (%v)", r, took, defaultLease+defaultLease/2)
			}

			// The replica dies after the charge and starts again; the retry
			// goes to it.
			a.restart(t)
			crash(t, a, "pay-2", pay("pay-2"))
			a.restart(t)
			restarted := time.Now()
			r = retryUntilAnswered(t, a, "pay-2", pay("pay-2"), 30*time.Second)
			took = time.Since(restarted)
			t.Logf("the retry on the restarted replica: %d after %v", r.status, took.Round(time.Millisecond))
			if r.status != http.StatusCreated || took > defaultLease/2 {
				t.Errorf("the retry on the restarted replica: %s, %v after its restart; want 201 within half the lease (%v): the restart ends its leases", r, took, defaultLease/2)
			}
			if r.body["charge_id"] == nil || r.body["charge_id"] == "" {
				t.Errorf("the retried payment %v records no charge", r.body)
			}
			b.stop(t)
			a.stop(t)
		})
	}
}

// defaultLease is idem serve's --key-lease by default.
const defaultLease = 10 * time.Second

// replicaProc is an `idem serve` process of the test.
type replicaProc struct {
	id   string
	args []string
	env  []string // beyond the test's own and the API keys
	cmd  *exec.Cmd
	base string
	// grpc is the gRPC face's address, with --grpc.
	grpc string
	done chan struct{}
	mu   sync.Mutex
	logs bytes.Buffer
}

func startReplica(t *testing.T, id string, args []string) *replicaProc {
	t.Helper()
	r := &replicaProc{id: id, args: append([]string{"serve", "--addr", "127.0.0.1:0", "--replica-id", "test-" + id}, args...)}
	r.start(t)
	t.Cleanup(func() {
		if r.cmd != nil && r.cmd.ProcessState == nil {
			r.cmd.Process.Kill()
			<-r.done
		}
	})
	return r
}

func (r *replicaProc) start(t *testing.T) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, r.args...)
	cmd.Env = append(append(os.Environ(), envAPIKeys+"=acme:test-key", envAcquirerKey+"=net-key"), r.env...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	listening := make(chan string, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			r.mu.Lock()
			fmt.Fprintln(&r.logs, line)
			r.mu.Unlock()
			if addr, ok := strings.CutPrefix(line, "idem: grpc listening on "); ok {
				r.mu.Lock()
				r.grpc = strings.TrimSpace(addr)
				r.mu.Unlock()
			}
			if base, ok := strings.CutPrefix(line, "idem: listening on "); ok {
				listening <- strings.TrimSpace(base)
			}
		}
		io.Copy(io.Discard, stderr)
		cmd.Wait()
	}()
	r.cmd, r.done = cmd, done
	select {
	case r.base = <-listening:
	case <-done:
		t.Fatalf("replica %s exited before it listened:\n%s", r.id, r.log())
	case <-time.After(60 * time.Second):
		t.Fatalf("replica %s did not listen within 60s:\n%s", r.id, r.log())
	}
}

func (r *replicaProc) log() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.logs.String()
}

// restart waits for the process to end (it killed itself) and starts it
// again with the same replica ID.
func (r *replicaProc) restart(t *testing.T) {
	t.Helper()
	select {
	case <-r.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("replica %s did not end", r.id)
	}
	r.start(t)
}

func (r *replicaProc) stop(t *testing.T) {
	t.Helper()
	r.cmd.Process.Signal(os.Interrupt)
	select {
	case <-r.done:
	case <-time.After(30 * time.Second):
		t.Errorf("replica %s did not stop within 30s", r.id)
	}
}

type answerOf struct {
	status int
	body   map[string]any
	err    error
}

func (a answerOf) String() string {
	if a.err != nil {
		return a.err.Error()
	}
	return fmt.Sprintf("%d %v", a.status, a.body)
}

func (r *replicaProc) post(t *testing.T, path, key, fault string, body any) answerOf {
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, r.base+path, bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer test-key")
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	if fault != "" {
		req.Header.Set("Idem-Fault", fault)
	}
	client := &http.Client{Timeout: 20 * time.Second}
	resp, err := client.Do(req)
	if err != nil {
		return answerOf{err: err}
	}
	defer resp.Body.Close()
	a := answerOf{status: resp.StatusCode}
	raw, _ := io.ReadAll(resp.Body)
	_ = json.Unmarshal(raw, &a.body)
	return a
}

// crash sends a payment whose replica SIGKILLs itself after the charge.
func crash(t *testing.T, r *replicaProc, key string, body any) {
	t.Helper()
	if a := r.post(t, "/v1/payments", key, "crash-after-charge", body); a.err == nil {
		t.Fatalf("crash-after-charge answered %s; want the connection cut", a)
	}
}

// retryUntilAnswered retries the payment on r, as a client that gets a
// 409 or a 5xx would, every 50ms, until another answer.
func retryUntilAnswered(t *testing.T, r *replicaProc, key string, body any, limit time.Duration) answerOf {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		a := r.post(t, "/v1/payments", key, "", body)
		if a.err == nil && a.status != http.StatusConflict && a.status < 500 || time.Now().After(deadline) {
			return a
		}
		time.Sleep(50 * time.Millisecond)
	}
}
