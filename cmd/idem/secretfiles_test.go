package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Every secret the command reads from the environment is also read from a
// file that NAME_FILE names, its trailing newline trimmed; a file that
// cannot be read is an error naming the variable, never a secret.
func TestSecretsFromFiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	ops := write("operators", "alice:op-token-from-a-file-0123456789\n")
	a := newApp(map[string]string{envOperators + "_FILE": ops})
	got, err := a.consoleOperators("", false)
	if err != nil || len(got) != 1 || got[0].Name != "alice" || got[0].Token != "op-token-from-a-file-0123456789" {
		t.Fatalf("operators from $%s_FILE: %+v, %v", envOperators, got, err)
	}
	keys, _, err := newApp(map[string]string{envAPIKeys + "_FILE": write("apikeys", "acme:api-key-from-a-file\n")}).apiKeys("", false)
	if err != nil || keys["api-key-from-a-file"] != "acme" && keys["acme"] != "api-key-from-a-file" {
		t.Fatalf("API keys from $%s_FILE: %v, %v", envAPIKeys, keys, err)
	}
	db := "sqlite:" + filepath.Join(dir, "idem.db")
	if code, _, errOut := runCmd(t, "migrate", "--db", db); code != exitOK {
		t.Fatalf("migrate: exit %d, %q", code, errOut)
	}
	secret := write("secret", "c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LTMyYg==\n")
	if code, out, errOut := runWithEnv(t, map[string]string{envKeySecret + "_FILE": secret}, "keys", "seal", "--db", db); code != exitOK || !strings.Contains(out, "sealed 0 idempotency keys") {
		t.Fatalf("keys seal with $%s_FILE: exit %d, %q, %q", envKeySecret, code, out, errOut)
	}
	missing := filepath.Join(dir, "no-such-file")
	code, _, errOut := runWithEnv(t, map[string]string{envKeySecret + "_FILE": missing}, "keys", "seal", "--db", db)
	if code == exitOK || !strings.Contains(errOut, envKeySecret+"_FILE") {
		t.Fatalf("keys seal with an unreadable $%s_FILE: exit %d, %q; want an error naming it", envKeySecret, code, errOut)
	}
	// The variable itself wins over its file.
	v, ok, err := newApp(map[string]string{envAcquirerKey: "from-env", envAcquirerKey + "_FILE": missing}).secretEnv(envAcquirerKey)
	if v != "from-env" || !ok || err != nil {
		t.Fatalf("secretEnv with both: %q, %v, %v", v, ok, err)
	}
}
