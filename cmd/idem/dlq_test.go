package main

import (
	"errors"
	"testing"
	"time"

	"github.com/idem-go/idem"
)

func TestDLQFilter(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name  string
		flags filterFlags
		want  idem.DeadLetterFilter
		usage bool
	}{
		{"none", filterFlags{}, idem.DeadLetterFilter{}, false},
		{"consumer and class", filterFlags{consumer: "settlement", class: "exhausted"},
			idem.DeadLetterFilter{Consumer: "settlement", Class: idem.DeadExhausted}, false},
		{"since a duration", filterFlags{since: "90m"}, idem.DeadLetterFilter{Since: now.Add(-90 * time.Minute)}, false},
		{"since a time", filterFlags{since: "2026-04-30T00:00:00Z"}, idem.DeadLetterFilter{Since: time.Date(2026, 4, 30, 0, 0, 0, 0, time.UTC)}, false},
		{"unknown class", filterFlags{class: "transient"}, idem.DeadLetterFilter{}, true},
		{"bad since", filterFlags{since: "yesterday"}, idem.DeadLetterFilter{}, true},
	}
	for _, tt := range tests {
		got, err := tt.flags.filter(now)
		var ue *usageError
		if errors.As(err, &ue) != tt.usage || (err != nil) != tt.usage {
			t.Errorf("%s: error %v, want a usage error: %v", tt.name, err, tt.usage)
			continue
		}
		if !tt.usage && (got.Consumer != tt.want.Consumer || got.Class != tt.want.Class || !got.Since.Equal(tt.want.Since)) {
			t.Errorf("%s: filter = %+v, want %+v", tt.name, got, tt.want)
		}
	}
}
