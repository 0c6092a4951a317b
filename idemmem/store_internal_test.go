package idemmem

import (
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// A waiter blocks on the channel of the state it saw; every change of that
// state must close it. Checked on the channel itself, because a test from
// outside cannot know whether its waiter started before the change.
func TestEveryChangeClosesTheWaitChannel(t *testing.T) {
	t.Parallel()
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := idem.ClockFunc(func() time.Time { return now })
	req := idem.ClaimRequest{Key: "k", Fingerprint: "fp", Lease: time.Second, TTL: time.Minute}
	k := slot{key: "k"}

	cases := []struct {
		name   string
		change func(t *testing.T, s *Store, c idem.Claim)
	}{
		{"complete", func(t *testing.T, s *Store, c idem.Claim) {
			if err := s.Complete(t.Context(), idem.Ref{Key: "k", Token: c.Token}, idem.Response{}); err != nil {
				t.Fatal(err)
			}
		}},
		{"release", func(t *testing.T, s *Store, c idem.Claim) {
			if err := s.Release(t.Context(), idem.Ref{Key: "k", Token: c.Token}); err != nil {
				t.Fatal(err)
			}
		}},
		{"takeover", func(t *testing.T, s *Store, c idem.Claim) {
			now = now.Add(req.Lease)
			if got, err := s.Claim(t.Context(), req); err != nil || !got.TookOver {
				t.Fatalf("takeover = %+v, %v", got, err)
			}
		}},
		{"expiry and claim anew", func(t *testing.T, s *Store, c idem.Claim) {
			now = now.Add(req.TTL)
			if got, err := s.Claim(t.Context(), req); err != nil || got.Outcome != idem.Acquired {
				t.Fatalf("claim anew = %+v, %v", got, err)
			}
		}},
		{"purge", func(t *testing.T, s *Store, c idem.Claim) {
			now = now.Add(req.TTL)
			if n, err := s.Purge(t.Context(), 10); err != nil || n != 1 {
				t.Fatalf("Purge = %d, %v", n, err)
			}
		}},
	}
	for _, tc := range cases {
		// The cases share now, so they run one after the other.
		s := NewStore(&Config{Clock: clock})
		c, err := s.Claim(t.Context(), req)
		if err != nil {
			t.Fatal(err)
		}
		s.mu.Lock()
		ch := s.records[k].changed
		s.mu.Unlock()
		tc.change(t, s, c)
		select {
		case <-ch:
		default:
			t.Errorf("%s: the wait channel is still open", tc.name)
		}
	}
}
