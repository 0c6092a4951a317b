package idemkafka_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemkafka"
)

func TestParseURL(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want []string
	}{
		{"kafka://127.0.0.1:9092", []string{"127.0.0.1:9092"}},
		{"KAFKA://a:1,b:2/", []string{"a:1", "b:2"}},
		{"a:1, b:2", []string{"a:1", "b:2"}},
		{"kafka://[::1]:9092", []string{"[::1]:9092"}},
		{"nats://a:1", nil},
		{"kafka://a", nil},
		{"kafka://a:1,", nil},
		{"kafka://user@a:1:2", nil},
	} {
		got, err := idemkafka.ParseURL(tc.in)
		if tc.want == nil {
			if !errors.Is(err, idem.ErrInvalidArgument) {
				t.Errorf("ParseURL(%q) = %v, %v; want idem.ErrInvalidArgument", tc.in, got, err)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("ParseURL(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}
