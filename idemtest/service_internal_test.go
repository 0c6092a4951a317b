package idemtest

import (
	"strings"
	"testing"
)

func TestServiceAddress(t *testing.T) {
	t.Parallel()
	cases := []struct {
		url, addr string
		wantErr   bool
	}{
		{url: "postgres://127.0.0.1:5432/test", addr: "127.0.0.1:5432"},
		{url: "postgres://user:secret@db.internal/test?sslmode=disable", addr: "db.internal:5432"},
		{url: "redis://localhost", addr: "localhost:6379"},
		{url: "redis://localhost:6380/0", addr: "localhost:6380"},
		{url: "nats://127.0.0.1", addr: "127.0.0.1:4222"},
		{url: "amqp://guest:guest@[::1]", addr: "[::1]:5672"},
		{url: "amqps://rabbit.example", addr: "rabbit.example:5671"},
		{url: "unknown://host", wantErr: true},
		{url: "localhost:5432", wantErr: true},
		{url: "postgres:///test", wantErr: true},
		{url: "postgres://u:p@h:port/x", wantErr: true},
	}
	for _, tc := range cases {
		addr, _, err := serviceAddress(tc.url)
		if tc.wantErr {
			if err == nil {
				t.Errorf("serviceAddress(%q) = %q, want an error", tc.url, addr)
			}
			continue
		}
		if err != nil || addr != tc.addr {
			t.Errorf("serviceAddress(%q) = %q, %v; want %q", tc.url, addr, err, tc.addr)
		}
	}
}

func TestServiceAddressRedactsPassword(t *testing.T) {
	t.Parallel()
	for _, raw := range []string{"amqp://guest:hunter2@unknown-scheme-free-host", "weird://u:hunter2@h", "postgres://u:hunter2@h:bad/x"} {
		_, shown, err := serviceAddress(raw)
		if strings.Contains(shown, "hunter2") || (err != nil && strings.Contains(err.Error(), "hunter2")) {
			t.Errorf("serviceAddress(%q) leaks the password: shown %q, err %v", raw, shown, err)
		}
	}
}
