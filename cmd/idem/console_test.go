package main

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestConsoleRefusesWithoutOperators(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	db := filepath.Join(dir, "idem.db")
	for _, args := range [][]string{
		{"serve", "--console", "--api-keys", "acme:k", "--db", "sqlite:" + db},
		{"serve", "--console", "--operators", "", "--api-keys", "acme:k", "--db", "sqlite:" + db},
		{"console", "--db", "sqlite:" + db},
	} {
		code, _, errOut := runCmd(t, args...)
		if code == exitOK || !strings.Contains(errOut, "needs operators") || !strings.Contains(errOut, envOperators) {
			t.Errorf("%v: exit %d, stderr %q; want a refusal naming --operators and $%s", args, code, errOut, envOperators)
		}
	}
	for _, args := range [][]string{
		{"serve", "--operators", "alice:t", "--api-keys", "acme:k", "--db", "sqlite:" + db},
		{"serve", "--console", "--operators", "alice:s3cr3t,alice:other", "--api-keys", "acme:k", "--db", "sqlite:" + db},
	} {
		code, _, errOut := runCmd(t, args...)
		if code == exitOK || strings.Contains(errOut, "s3cr3t") {
			t.Errorf("%v: exit %d, stderr %q; want a refusal that shows no token", args, code, errOut)
		}
	}
	if _, err := os.Stat(db); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused start created the database: %v", err)
	}
}

func TestServeMountsConsole(t *testing.T) {
	t.Parallel()
	db := "sqlite:" + filepath.Join(t.TempDir(), "idem.db")
	srv := startServe(t, newApp(map[string]string{envOperators: "alice:op-token-1-0123456789abcdef"}), "--db", db, "--api-keys", "acme:k", "--console", "--console-public-https")
	get := func(path, token string) (int, string) {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, srv.base+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("/console/", "op-token-1-0123456789abcdef"); code != http.StatusOK || !strings.Contains(body, "Dead letters waiting") {
		t.Errorf("console overview with the operator's token: %d", code)
	}
	// The service's executions stopped at a recovery point have their page.
	if code, body := get("/console/outcomes", "op-token-1-0123456789abcdef"); code != http.StatusOK || !strings.Contains(body, "No execution is stopped at a recovery point") {
		t.Errorf("console's unknown outcomes: %d %q", code, body)
	}
	// The API key of a tenant is not an operator's.
	if code, _ := get("/console/letters", "k"); code != http.StatusUnauthorized {
		t.Errorf("console with a tenant's API key: %d, want 401", code)
	}
	if code, _ := get("/console/letters", ""); code != http.StatusUnauthorized {
		t.Errorf("console without a token: %d, want 401", code)
	}
	// Behind a proxy that serves it over https, its cookie is Secure.
	noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := noFollow.PostForm(srv.base+"/console/login", url.Values{"token": {"op-token-1-0123456789abcdef"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if cs := resp.Cookies(); resp.StatusCode != http.StatusSeeOther || len(cs) != 1 || !cs[0].Secure {
		t.Errorf("login with --console-public-https: %d, cookies %+v; want one Secure cookie", resp.StatusCode, cs)
	}
	// The API still answers beside it.
	if code, _ := get("/healthz", ""); code != http.StatusOK {
		t.Errorf("/healthz: %d", code)
	}
	stopCleanly(t, srv)
	if strings.Contains(srv.stderr.String(), "op-token-1-0123456789abcdef") {
		t.Errorf("the operator's token is in serve's log:\n%s", srv.stderr)
	}
}

func TestConsoleCommand(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	db := "sqlite:" + filepath.Join(dir, "idem.db")
	if code, _, errOut := runCmd(t, "console", "--db", db, "--operators", "alice:op-token-2-0123456789abcdef"); code == exitOK || !strings.Contains(errOut, "does not exist") {
		t.Fatalf("console on a missing database: exit %d, %q; want it refused, creating nothing", code, errOut)
	}
	if code, _, errOut := runCmd(t, "migrate", "--db", db); code != exitOK {
		t.Fatalf("migrate: %d %s", code, errOut)
	}
	ctx, cancel := context.WithCancel(t.Context())
	pr, pw := io.Pipe()
	a := newApp(nil)
	a.stderr = pw
	done := make(chan int, 1)
	go func() {
		done <- a.run(ctx, []string{"console", "--addr", "127.0.0.1:0", "--db", db, "--operators", "alice:op-token-2-0123456789abcdef"})
		pw.Close()
	}()
	addr := make(chan string, 1)
	var logs strings.Builder
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			logs.WriteString(sc.Text() + "\n")
			if u, ok := strings.CutPrefix(sc.Text(), "idem: console on "); ok {
				addr <- u
			}
		}
		close(addr)
	}()
	u, ok := <-addr
	if !ok {
		t.Fatalf("console exited before listening: %d", <-done)
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, u+"letters", nil)
	req.Header.Set("Authorization", "Bearer op-token-2-0123456789abcdef")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "0</strong> letters match") {
		t.Errorf("GET %sletters: %d", u, resp.StatusCode)
	}
	cancel()
	if code := <-done; code != exitOK {
		t.Errorf("console exit %d", code)
	}
	for range addr {
	}
	if strings.Contains(logs.String(), "op-token-2-0123456789abcdef") {
		t.Errorf("the token is in the log:\n%s", logs.String())
	}
}

// The standalone console names keys in its logs (its completers' resumes
// and settles) under $IDEM_KEY_DIGEST_SECRET as serve does, so that its
// lines and the replicas' name a key alike; a secret too short is refused
// before anything is opened, as serve refuses it.
func TestConsoleTakesTheKeyDigestSecret(t *testing.T) {
	t.Parallel()
	db := filepath.Join(t.TempDir(), "idem.db")
	code, _, errOut := runWithEnv(t, map[string]string{envKeyDigestSecret: "short-secret"},
		"console", "--operators", "alice:t", "--db", "sqlite:"+db, "--addr", "no-port")
	if want := "$" + envKeyDigestSecret + ": 12 bytes long; at least 16 are needed"; code != exitUsage || !strings.Contains(errOut, want) {
		t.Errorf("console with a short $%s: exit %d, stderr %q; want a usage error saying %q", envKeyDigestSecret, code, errOut, want)
	}
	if _, err := os.Stat(db); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused start created the database: %v", err)
	}
}
