package main

import (
	"errors"
	"net"
	"strings"
	"testing"

	"github.com/idem-go/idem"
)

// --replica-id's default names a replica apart from every other that may
// run at once, or names none: a name that two running replicas share
// makes each that starts end the live leases of the others (a duplicate or
// a completer then takes over a key whose execution still runs). A host
// with no name of its own ("localhost", as some container platforms give
// every instance, or none at all) therefore gets anonymous claims; and a
// long host name is shortened, never the address that tells apart the
// replicas of one host.
func TestDefaultReplicaID(t *testing.T) {
	t.Parallel()
	addr := &net.TCPAddr{IP: net.IPv6unspecified, Port: 8080}
	other := &net.TCPAddr{IP: net.IPv6unspecified, Port: 8081}
	long := strings.Repeat("h", 250)
	for _, tc := range []struct {
		name string
		host string
		err  error
		want string
	}{
		{"a host name", "pay-7f9c", nil, "pay-7f9c/[::]:8080"},
		{"localhost", "localhost", nil, ""},
		{"localhost, in capitals", "LOCALHOST", nil, ""},
		{"localhost.localdomain", "localhost.localdomain", nil, ""},
		{"no host name", "", nil, ""},
		{"the host name unknown", "pay-7f9c", errors.New("no name"), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := defaultReplicaID(tc.host, tc.err, addr); got != tc.want {
				t.Errorf("defaultReplicaID(%q, %v, %v) = %q; want %q", tc.host, tc.err, addr, got, tc.want)
			}
		})
	}
	t.Run("a long host name", func(t *testing.T) {
		a, b := defaultReplicaID(long, nil, addr), defaultReplicaID(long, nil, other)
		if a == b {
			t.Errorf("two replicas of a host with a %d-byte name, on ports 8080 and 8081, share the name %q", len(long), a)
		}
		for _, id := range []string{a, b} {
			if err := (idem.Holder{Replica: id, Incarnation: "x"}).Validate(); err != nil {
				t.Errorf("defaultReplicaID = %q: %v", id, err)
			}
		}
	})
}
