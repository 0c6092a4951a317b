package idem_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

// checkValid reports whether err is what a validation table wants: nil
// when field is "", else an *ArgumentError naming field.
func checkValid(t *testing.T, name string, err error, field string) {
	t.Helper()
	if field == "" {
		if err != nil {
			t.Errorf("%s: %v, want it accepted", name, err)
		}
		return
	}
	var ae *idem.ArgumentError
	if !errors.As(err, &ae) || !errors.Is(err, idem.ErrInvalidArgument) || ae.Field != field {
		t.Errorf("%s: %v, want an *ArgumentError naming %s", name, err, field)
	}
}

// TestClaimRequestValidate protects what a store refuses before touching a
// record: an empty key or fingerprint, a lease or TTL that is not
// positive, a TTL shorter than the lease (equal is fine), a malformed
// holder.
func TestClaimRequestValidate(t *testing.T) {
	t.Parallel()
	ok := idem.ClaimRequest{Scope: "s", Key: "k", Fingerprint: "fp", Lease: time.Second, TTL: time.Hour}
	with := func(f func(*idem.ClaimRequest)) idem.ClaimRequest { r := ok; f(&r); return r }
	tests := []struct {
		name  string
		req   idem.ClaimRequest
		field string
	}{
		{"well formed", ok, ""},
		{"shortest lease and TTL", with(func(r *idem.ClaimRequest) { r.Lease, r.TTL = 1, 1 }), ""},
		{"TTL equal to lease", with(func(r *idem.ClaimRequest) { r.TTL = r.Lease }), ""},
		{"empty key", with(func(r *idem.ClaimRequest) { r.Key = "" }), "Key"},
		{"empty fingerprint", with(func(r *idem.ClaimRequest) { r.Fingerprint = "" }), "Fingerprint"},
		{"zero lease", with(func(r *idem.ClaimRequest) { r.Lease = 0 }), "Lease"},
		{"negative lease", with(func(r *idem.ClaimRequest) { r.Lease = -time.Second }), "Lease"},
		{"zero TTL", with(func(r *idem.ClaimRequest) { r.TTL = 0 }), "TTL"},
		{"TTL shorter than lease", with(func(r *idem.ClaimRequest) { r.TTL = r.Lease - 1 }), "TTL"},
		{"holder with one part", with(func(r *idem.ClaimRequest) { r.Holder = idem.Holder{Replica: "a"} }), "Holder.Incarnation"},
		{"holder", with(func(r *idem.ClaimRequest) { r.Holder = idem.Holder{Replica: "a", Incarnation: "1"} }), ""},
	}
	for _, tt := range tests {
		checkValid(t, tt.name, tt.req.Validate(), tt.field)
	}
	// A zero TTL is refused for what it is, not as shorter than the lease.
	if err := with(func(r *idem.ClaimRequest) { r.TTL = 0 }).Validate(); err == nil || !strings.Contains(err.Error(), "must be positive") {
		t.Errorf("zero TTL: %v, want it refused as not positive", err)
	}
}

// TestHolderValidate protects the holder's rules: zero, or both parts set,
// each at most MaxHolderLen bytes of UTF-8 with no control character (DEL
// included, '~' and space not).
func TestHolderValidate(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("r", idem.MaxHolderLen)
	tests := []struct {
		name  string
		h     idem.Holder
		field string
	}{
		{"zero", idem.Holder{}, ""},
		{"both parts", idem.Holder{Replica: "pod-1", Incarnation: "2026-12-06 ~x"}, ""},
		{"longest parts", idem.Holder{Replica: long, Incarnation: long}, ""},
		{"no replica", idem.Holder{Incarnation: "1"}, "Holder.Replica"},
		{"no incarnation", idem.Holder{Replica: "pod-1"}, "Holder.Incarnation"},
		{"replica too long", idem.Holder{Replica: long + "r", Incarnation: "1"}, "Holder.Replica"},
		{"incarnation too long", idem.Holder{Replica: "pod-1", Incarnation: long + "r"}, "Holder.Incarnation"},
		{"invalid UTF-8", idem.Holder{Replica: "pod\xff", Incarnation: "1"}, "Holder.Replica"},
		{"control character", idem.Holder{Replica: "pod\x1f", Incarnation: "1"}, "Holder.Replica"},
		{"DEL", idem.Holder{Replica: "pod-1", Incarnation: "1\x7f"}, "Holder.Incarnation"},
	}
	for _, tt := range tests {
		checkValid(t, tt.name, tt.h.Validate(), tt.field)
	}
	if got := (idem.Holder{Replica: "pod-1", Incarnation: "7"}).String(); got != "pod-1/7" {
		t.Errorf("String = %q, want pod-1/7", got)
	}
	if got := (idem.Holder{}).String(); got != "" {
		t.Errorf("String of the zero Holder = %q, want empty", got)
	}
}

// TestRecoveryPointValidate protects the limits every store accepts: a
// name of 1 to MaxRecoveryNameLen bytes of UTF-8 without control
// characters, data of at most MaxRecoveryDataLen bytes.
func TestRecoveryPointValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		rp    idem.RecoveryPoint
		field string
	}{
		{"named", idem.RecoveryPoint{Name: "charged ~ step 2"}, ""},
		{"longest name and data", idem.RecoveryPoint{Name: strings.Repeat("n", idem.MaxRecoveryNameLen), Data: make([]byte, idem.MaxRecoveryDataLen)}, ""},
		{"empty name", idem.RecoveryPoint{}, "RecoveryPoint.Name"},
		{"name too long", idem.RecoveryPoint{Name: strings.Repeat("n", idem.MaxRecoveryNameLen+1)}, "RecoveryPoint.Name"},
		{"name not UTF-8", idem.RecoveryPoint{Name: "a\xff"}, "RecoveryPoint.Name"},
		{"data too long", idem.RecoveryPoint{Name: "n", Data: make([]byte, idem.MaxRecoveryDataLen+1)}, "RecoveryPoint.Data"},
		{"control character", idem.RecoveryPoint{Name: "a\x1f"}, "RecoveryPoint.Name"},
		{"DEL", idem.RecoveryPoint{Name: "a\x7f"}, "RecoveryPoint.Name"},
	}
	for _, tt := range tests {
		checkValid(t, tt.name, tt.rp.Validate(), tt.field)
	}
	if !(idem.RecoveryPoint{}).IsZero() || (idem.RecoveryPoint{Name: "n"}).IsZero() {
		t.Error("IsZero must hold exactly for a point with no name")
	}
}

// TestMessageAndSubscriptionValidate protects what a publish and a
// subscribe refuse: a message without ID or topic; a subscription without
// topic or consumer, or with a negative AckWait or MaxInFlight (zero is the
// transport's default).
func TestMessageAndSubscriptionValidate(t *testing.T) {
	t.Parallel()
	checkValid(t, "message", idem.Message{ID: "m1", Topic: "t"}.Validate(), "")
	checkValid(t, "message without ID", idem.Message{Topic: "t"}.Validate(), "Message.ID")
	checkValid(t, "message without topic", idem.Message{ID: "m1"}.Validate(), "Message.Topic")

	ok := idem.Subscription{Topic: "t", Consumer: "c"}
	checkValid(t, "subscription with defaults", ok.Validate(), "")
	s := ok
	s.AckWait, s.MaxInFlight = 1, 1
	checkValid(t, "subscription with limits", s.Validate(), "")
	s = ok
	s.Topic = ""
	checkValid(t, "subscription without topic", s.Validate(), "Subscription.Topic")
	s = ok
	s.Consumer = ""
	checkValid(t, "subscription without consumer", s.Validate(), "Subscription.Consumer")
	s = ok
	s.AckWait = -1
	checkValid(t, "negative AckWait", s.Validate(), "Subscription.AckWait")
	s = ok
	s.MaxInFlight = -1
	checkValid(t, "negative MaxInFlight", s.Validate(), "Subscription.MaxInFlight")
}

// TestErrorMarks protects the marks a handler puts on its errors: nil
// stays nil, a marked error keeps its text and what it wraps, and only
// RetryAfter's errors carry a delay.
func TestErrorMarks(t *testing.T) {
	t.Parallel()
	if idem.Permanent(nil) != nil || idem.RetryAfter(nil, time.Second) != nil {
		t.Fatal("marking a nil error made an error")
	}
	base := errors.New("card declined")
	p := idem.Permanent(base)
	if !errors.Is(p, base) || p.Error() != "card declined" || idem.Classify(p) != idem.ClassPermanent {
		t.Errorf("Permanent(err) = %v: want err's text, wrapping it, classified permanent", p)
	}
	r := idem.RetryAfter(base, 3*time.Second)
	if d, ok := idem.RetryDelay(r); !ok || d != 3*time.Second || !errors.Is(r, base) {
		t.Errorf("RetryDelay(RetryAfter(err, 3s)) = %s, %v; want 3s, true, wrapping err", d, ok)
	}
	if d, ok := idem.RetryDelay(base); ok || d != 0 {
		t.Errorf("RetryDelay of an unmarked error = %s, %v; want 0, false", d, ok)
	}
}

// TestDeadLetterLastError protects LastError: the last attempt's error,
// empty with no attempt.
func TestDeadLetterLastError(t *testing.T) {
	t.Parallel()
	if got := (idem.DeadLetter{}).LastError(); got != "" {
		t.Errorf("LastError with no attempt = %q", got)
	}
	d := idem.DeadLetter{Attempts: []idem.Attempt{{Number: 1, Error: "first"}, {Number: 2, Error: "last"}}}
	if got := d.LastError(); got != "last" {
		t.Errorf("LastError = %q, want last", got)
	}
}

// A Nack delay is validated alike on every transport: no delay (deliver
// again at once) and any positive one are accepted; a negative one, a time
// subtracted the wrong way round, is the caller's mistake, refused as an
// argument error rather than read as "at once".
func TestValidateNackDelay(t *testing.T) {
	for _, tc := range []struct {
		delay time.Duration
		field string
	}{
		{0, ""},
		{time.Nanosecond, ""},
		{time.Hour, ""},
		{-time.Nanosecond, "delay"},
		{-time.Minute, "delay"},
	} {
		checkValid(t, tc.delay.String(), idem.ValidateNackDelay(tc.delay), tc.field)
	}
}
