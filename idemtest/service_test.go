package idemtest_test

import (
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/idem-go/idem/idemtest"
)

// recordingTB records what RequireService asks of the test instead of
// stopping it. Methods RequireService must not call are left to the nil
// embedded TB, so calling one panics.
type recordingTB struct {
	testing.TB
	skipped, failed bool
	msg             string
}

func (r *recordingTB) Helper() {}

func (r *recordingTB) Skipf(format string, args ...any) {
	r.skipped = true
	r.msg = fmt.Sprintf(format, args...)
}

func (r *recordingTB) Fatalf(format string, args ...any) {
	r.failed = true
	r.msg = fmt.Sprintf(format, args...)
}

// listen returns the address of a local port that accepts connections.
func listen(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l.Addr().String()
}

// closedPort returns the address of a local port nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// These tests set environment variables, so they cannot run in parallel.
func TestRequireService(t *testing.T) {
	const envVar = "IDEMTEST_SELFTEST_URL"
	open := "redis://" + listen(t)
	closed := "redis://user:hunter2@" + closedPort(t)

	cases := []struct {
		name       string
		env        string // the service URL variable; "" leaves it unset
		defaultURL string
		require    string // IDEM_REQUIRE_SERVICES
		want       string // the URL returned; "" when the test stops
		skipped    bool
		failed     bool
	}{
		{name: "answers", env: open, defaultURL: closed, want: open},
		{name: "default URL answers", defaultURL: open, want: open},
		{name: "does not answer", env: closed, defaultURL: open, skipped: true},
		{name: "does not answer, required", env: closed, defaultURL: open, require: "1", failed: true},
		{name: "answers, required", env: open, require: "1", want: open},
		{name: "required only with 1", env: closed, require: "true", skipped: true},
		{name: "bad URL fails even when not required", env: "no-scheme-here", failed: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(envVar, tc.env)
			t.Setenv(idemtest.RequireServicesEnv, tc.require)
			rec := &recordingTB{}
			got := idemtest.RequireService(rec, "Redis", envVar, tc.defaultURL)
			if got != tc.want || rec.skipped != tc.skipped || rec.failed != tc.failed {
				t.Fatalf("RequireService = %q, skipped %v, failed %v (%q); want %q, skipped %v, failed %v",
					got, rec.skipped, rec.failed, rec.msg, tc.want, tc.skipped, tc.failed)
			}
			if rec.skipped || rec.failed {
				for _, part := range []string{"Redis", envVar} {
					if !strings.Contains(rec.msg, part) {
						t.Errorf("message %q does not name %q", rec.msg, part)
					}
				}
				if strings.Contains(rec.msg, "hunter2") {
					t.Errorf("message %q shows the password", rec.msg)
				}
			}
		})
	}
}

// A real skip, through the real testing package.
func TestRequireServiceSkips(t *testing.T) {
	const envVar = "IDEMTEST_SELFTEST_SKIP_URL"
	t.Setenv(envVar, "redis://"+closedPort(t))
	t.Setenv(idemtest.RequireServicesEnv, "")
	var ran bool
	t.Run("gated", func(t *testing.T) {
		idemtest.RequireService(t, "Redis", envVar, "")
		ran = true
	})
	if ran {
		t.Error("the gated test went on after RequireService found no service")
	}
}
