package idemnats

import (
	"errors"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

func TestSubjectMapping(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		prefix, topic, want string
	}{
		{"", "payments.succeeded", "idem.payments.succeeded"},
		{"acme", "payments.succeeded", "acme.payments.succeeded"},
		{"a.b", "x", "a.b.x"},
	} {
		cfg, err := (&Config{SubjectPrefix: tc.prefix}).withDefaults()
		if err != nil {
			t.Fatal(err)
		}
		tr := &Transport{cfg: cfg}
		got := tr.Subject(tc.topic)
		if got != tc.want {
			t.Errorf("prefix %q: Subject(%q) = %q, want %q", tc.prefix, tc.topic, got, tc.want)
		}
		if back := tr.topic(got); back != tc.topic {
			t.Errorf("prefix %q: topic(%q) = %q, want %q", tc.prefix, got, back, tc.topic)
		}
	}
}

func TestValidSubject(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		s               string
		wildcards, want bool
	}{
		{"a", false, true},
		{"a.b.c", false, true},
		{"", false, false},
		{"a..b", false, false},
		{".a", false, false},
		{"a.", false, false},
		{"a b", false, false},
		{"a.*", false, false},
		{"a.*", true, true},
		{"a.>", true, true},
		{"a.>.b", true, false},
		{"a.b*", true, false},
		{"ünï.cødé", false, true},
	} {
		if got := validSubject(tc.s, tc.wildcards); got != tc.want {
			t.Errorf("validSubject(%q, %v) = %v, want %v", tc.s, tc.wildcards, got, tc.want)
		}
	}
}

func TestStoreRace(t *testing.T) {
	t.Parallel()
	race := &jetstream.APIError{Code: 500, ErrorCode: 10049, Description: "error creating store for stream"}
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"the race", race, true},
		{"wrapped", fmt.Errorf("create: %w", race), true},
		{"another API error", &jetstream.APIError{Code: 400, ErrorCode: 10058}, false},
		{"not an API error", errors.New("boom"), false},
	} {
		if got := storeRace(tc.err); got != tc.want {
			t.Errorf("%s: storeRace = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// Pull requests go to the API subjects of the JetStream context the
// transport was given.
func TestAPIPrefix(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		opts jetstream.JetStreamOptions
		want string
	}{
		{jetstream.JetStreamOptions{}, "$JS.API."},
		{jetstream.JetStreamOptions{Domain: "hub"}, "$JS.hub.API."},
		{jetstream.JetStreamOptions{APIPrefix: "acme.js"}, "acme.js."},
		{jetstream.JetStreamOptions{APIPrefix: "acme.js."}, "acme.js."},
	} {
		if got := apiPrefix(tc.opts); got != tc.want {
			t.Errorf("apiPrefix(%+v) = %q, want %q", tc.opts, got, tc.want)
		}
	}
}
