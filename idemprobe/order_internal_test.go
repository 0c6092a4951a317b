package idemprobe

import (
	"context"
	"slices"
	"strings"
	"testing"
)

func TestCheckTable(t *testing.T) {
	t.Parallel()
	var ran []string
	for _, i := range checkRunOrder {
		ran = append(ran, checks[i].name)
	}
	// The order the checks ran in before they were a table: a change to it
	// changes the requests each check sends and the counters in its bodies.
	want := []string{
		"sequential-replay", "concurrent-duplicates", "key-reuse-refused", "missing-key-refused",
		"malformed-key-refused", "lost-response", "in-flight-duplicate",
		// Added since, after them, so that theirs stay the same.
		"scope-isolation", "revoked-credential", "key-expiry",
		// Check 7 judges the 5xx every other check met on the way.
		"no-credentials-replayed", "5xx-not-kept", "history-linearizable",
	}
	if !slices.Equal(ran, want) {
		t.Errorf("run order %v, want %v", ran, want)
	}
	for i, c := range checks {
		if c.title == "" || c.source == "" || citation(c.source) == "" {
			t.Errorf("check %q lacks a title, a source or a citation the report can show", c.name)
		}
		if i > 0 && c.number < checks[i-1].number {
			t.Errorf("check %q is numbered %d after check %d", c.name, c.number, checks[i-1].number)
		}
	}
}

func TestRunOrder(t *testing.T) {
	t.Parallel()
	run := func(context.Context, *prober, *Check) error { return nil }
	row := func(name string, set func(*check)) check {
		c := check{name: name, run: run}
		if set != nil {
			set(&c)
		}
		return c
	}
	baseline := func(c *check) { c.baseline = true }
	after := func(names ...string) func(*check) { return func(c *check) { c.after = names } }
	afterAll := func(c *check) { c.afterAll = true }

	for _, tc := range []struct {
		name  string
		table []check
		want  []string
		err   string
	}{
		{
			name:  "table order, the baseline first and afterAll last",
			table: []check{row("a", afterAll), row("b", nil), row("c", baseline), row("d", nil)},
			want:  []string{"c", "b", "d", "a"},
		},
		{
			name:  "a row waits for a later one",
			table: []check{row("base", baseline), row("a", after("c")), row("b", nil), row("c", nil)},
			want:  []string{"base", "b", "c", "a"},
		},
		{
			name:  "afterAll rows wait for each other",
			table: []check{row("base", baseline), row("a", func(c *check) { c.afterAll, c.after = true, []string{"b"} }), row("b", afterAll)},
			want:  []string{"base", "b", "a"},
		},
		{name: "no baseline", table: []check{row("a", nil)}, err: "no check is the baseline"},
		{name: "two baselines", table: []check{row("a", baseline), row("b", baseline)}, err: "both the baseline"},
		{name: "one name twice", table: []check{row("a", baseline), row("a", nil)}, err: "two checks are named"},
		{name: "no run function", table: []check{row("a", baseline), {name: "b"}}, err: "no run function"},
		{name: "an unknown check", table: []check{row("a", baseline), row("b", after("z"))}, err: "not in the table"},
		{name: "after an afterAll row", table: []check{row("a", baseline), row("b", after("c")), row("c", afterAll)}, err: "runs after every other"},
		{name: "a waiting baseline", table: []check{row("a", func(c *check) { c.baseline, c.after = true, []string{"b"} }), row("b", nil)}, err: "cannot wait"},
		{name: "a cycle", table: []check{row("a", baseline), row("b", after("c")), row("c", after("b"))}, err: "wait for each other"},
	} {
		order, err := runOrder(tc.table)
		var got []string
		for _, i := range order {
			got = append(got, tc.table[i].name)
		}
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: runOrder = %v, %v; want an error saying %q", tc.name, got, err, tc.err)
		case tc.err == "" && (err != nil || !slices.Equal(got, tc.want)):
			t.Errorf("%s: runOrder = %v, %v; want %v", tc.name, got, err, tc.want)
		}
	}
}
