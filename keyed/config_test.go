package keyed_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/keyed"
)

// New gives every field left zero the default Config documents (an
// engine's Config says what it runs with), lowers a default lease to a
// shorter TTL, and keeps what was set.
func TestConfigDefaults(t *testing.T) {
	t.Parallel()
	store := idemmem.NewStore(nil)
	eng, err := keyed.New(&keyed.Config{Store: store})
	if err != nil {
		t.Fatal(err)
	}
	c := eng.Config()
	for _, d := range []struct {
		field     string
		got, want any
	}{
		{"TTL", c.TTL, 24 * time.Hour},
		{"Lease", c.Lease, 10 * time.Second},
		{"Timeout", c.Timeout, time.Minute},
		{"InflightWait", c.InflightWait, 5 * time.Second},
		{"PollInterval", c.PollInterval, 250 * time.Millisecond},
		{"RecentKeys", c.RecentKeys, 65536},
		{"MemoryReplayFor", c.MemoryReplayFor, 10 * time.Second},
		{"MemoryReplayBytes", c.MemoryReplayBytes, 32 << 20},
		{"DefaultTTL", keyed.DefaultTTL, 24 * time.Hour},
		{"DefaultLease", keyed.DefaultLease, 10 * time.Second},
		{"DefaultInflightWait", keyed.DefaultInflightWait, 5 * time.Second},
	} {
		if d.got != d.want {
			t.Errorf("%s = %v; want the documented default %v", d.field, d.got, d.want)
		}
	}
	if c.Timers == nil || c.Clock == nil || c.Logger == nil {
		t.Errorf("Timers %v, Clock %v, Logger %v; want the defaults, not nil", c.Timers, c.Clock, c.Logger)
	}

	for _, tc := range []struct {
		name       string
		cfg        keyed.Config
		ttl, lease time.Duration
	}{
		{"a TTL shorter than the default lease lowers it", keyed.Config{TTL: 3 * time.Second}, 3 * time.Second, 3 * time.Second},
		{"a TTL as long as the lease", keyed.Config{TTL: 7 * time.Second, Lease: 7 * time.Second}, 7 * time.Second, 7 * time.Second},
		{"a lease set is kept", keyed.Config{TTL: time.Hour, Lease: 2 * time.Second}, time.Hour, 2 * time.Second},
	} {
		tc.cfg.Store = store
		eng, err := keyed.New(&tc.cfg)
		if err != nil {
			t.Errorf("%s: New: %v", tc.name, err)
			continue
		}
		if c := eng.Config(); c.TTL != tc.ttl || c.Lease != tc.lease {
			t.Errorf("%s: TTL %v, Lease %v; want %v, %v", tc.name, c.TTL, c.Lease, tc.ttl, tc.lease)
		}
	}
}

// New refuses a Config it cannot run with, naming the field; a key secret
// of exactly MinKeySecretLen bytes is long enough.
func TestConfigRefusals(t *testing.T) {
	t.Parallel()
	store := idemmem.NewStore(nil)
	for _, tc := range []struct {
		cfg   keyed.Config
		field string
	}{
		{keyed.Config{}, "keyed.Config.Store"},
		{keyed.Config{Store: store, TTL: -time.Second}, "keyed.Config.TTL"},
		{keyed.Config{Store: store, Lease: -time.Second}, "keyed.Config.Lease"},
		{keyed.Config{Store: store, TTL: time.Second, Lease: 2 * time.Second}, "keyed.Config.TTL"},
		{keyed.Config{Store: store, PollInterval: -time.Second}, "keyed.Config.PollInterval"},
		{keyed.Config{Store: store, Timeout: -time.Second}, "keyed.Config.Timeout"},
		{keyed.Config{Store: store, MemoryReplayBytes: -1}, "keyed.Config.MemoryReplayBytes"},
		{keyed.Config{Store: store, KeySecret: make([]byte, keyed.MinKeySecretLen-1)}, "keyed.Config.KeySecret"},
	} {
		_, err := keyed.New(&tc.cfg)
		var ae *idem.ArgumentError
		if !errors.As(err, &ae) || ae.Field != tc.field || !errors.Is(err, idem.ErrInvalidArgument) {
			t.Errorf("New(%+v): %v; want an ArgumentError naming %s", tc.cfg, err, tc.field)
		}
	}
	if _, err := keyed.New(&keyed.Config{Store: store, KeySecret: []byte(strings.Repeat("k", keyed.MinKeySecretLen))}); err != nil {
		t.Errorf("a key secret of MinKeySecretLen bytes: %v; want it accepted", err)
	}
}
