package demo

import "testing"

func TestMoney(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		n    int64
		cur  string
		want string
	}{
		{0, "KRW", "0 KRW"},
		{7, "KRW", "7 KRW"},
		{999, "KRW", "999 KRW"},
		{1000, "KRW", "1,000 KRW"},
		{96000, "KRW", "96,000 KRW"},
		{288000, "KRW", "288,000 KRW"},
		{1234567, "KRW", "1,234,567 KRW"},
		{-192000, "KRW", "-192,000 KRW"},
		{-1000, "", "-1,000"},
		{100, "", "100"},
	} {
		if got := money(tc.n, tc.cur); got != tc.want {
			t.Errorf("money(%d, %q) = %q, want %q", tc.n, tc.cur, got, tc.want)
		}
	}
}

func TestRowVerdict(t *testing.T) {
	t.Parallel()
	base := Row{Customers: 2, ShouldBe: 24000, Currency: "KRW"}
	for _, tc := range []struct {
		name string
		edit func(*Row)
		once bool
		want string
	}{
		{"exactly once", func(r *Row) { r.Payments, r.Charges, r.Taken, r.ChargedOnce = 2, 2, 24000, 2 }, true, "exactly once"},
		{"card charged twice", func(r *Row) { r.Payments, r.Charges, r.Taken, r.ChargedOnce = 2, 4, 24000, 0 }, false,
			"CARD CHARGED TWICE (+2 charges)"},
		{"double charged", func(r *Row) { r.Payments, r.Taken, r.Overcharged, r.ChargedOnce = 5, 60000, 36000, 0 }, false,
			"DOUBLE CHARGED (+36,000 KRW)"},
		{"lost", func(r *Row) { r.Payments, r.Taken, r.Missing, r.ChargedOnce = 1, 12000, 12000, 1 }, false,
			"lost payment (-12,000 KRW)"},
		{"both", func(r *Row) { r.Payments, r.Taken, r.Overcharged, r.Missing = 2, 24000, 12000, 12000 }, false,
			"DOUBLE CHARGED (+12,000 KRW) and lost payment (-12,000 KRW)"},
		{"payment without a charge", func(r *Row) { r.Payments, r.Taken, r.ChargedOnce = 3, 24000, 1 }, false,
			"inconsistent (payments and balances disagree)"},
		{"no customers", func(r *Row) { r.Customers, r.ShouldBe = 0, 0 }, false,
			"inconsistent (payments and balances disagree)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := base
			tc.edit(&r)
			if got := r.ExactlyOnce(); got != tc.once {
				t.Errorf("ExactlyOnce() = %v, want %v", got, tc.once)
			}
			if got := r.Verdict(); got != tc.want {
				t.Errorf("Verdict() = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestReportOK(t *testing.T) {
	t.Parallel()
	once := func(m Mode, sc string) Row {
		return Row{Mode: m, Scenario: sc, Customers: 1, Payments: 1, Charges: 1, Taken: 100, ShouldBe: 100, ChargedOnce: 1}
	}
	twice := func(m Mode, sc string) Row {
		return Row{Mode: m, Scenario: sc, Customers: 1, Payments: 2, Taken: 200, ShouldBe: 100, Overcharged: 100}
	}
	lost := func(m Mode, sc string) Row {
		return Row{Mode: m, Scenario: sc, Customers: 1, ShouldBe: 100, Missing: 100}
	}
	all := func(m Mode, f func(Mode, string) Row) []Row {
		var rows []Row
		for _, sc := range scenarios {
			rows = append(rows, f(m, sc.name))
		}
		return rows
	}
	good := append(all(ModeUnsafe, once), all(ModeProtected, once)...)
	good[1] = twice(ModeUnsafe, good[1].Scenario)

	for _, tc := range []struct {
		name string
		rows []Row
		want bool
	}{
		{"unsafe doubles, protected once", good, true},
		{"unsafe never doubles", append(all(ModeUnsafe, once), all(ModeProtected, once)...), false},
		{"protected doubles", append(all(ModeUnsafe, twice), all(ModeProtected, twice)...), false},
		{"protected loses", append(all(ModeUnsafe, twice), all(ModeProtected, lost)...), false},
		{"protected run missing", all(ModeUnsafe, twice), false},
		{"unsafe run missing", all(ModeProtected, once), false},
		{"no rows", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := &Report{Customers: 1, Amount: 100, Currency: "KRW", Rows: tc.rows}
			if got := r.OK(); got != tc.want {
				t.Errorf("OK() = %v, want %v; problems: %q", got, tc.want, r.problems())
			}
		})
	}
	var nilReport *Report
	if nilReport.OK() {
		t.Errorf("(*Report)(nil).OK() = true")
	}
}

func TestWrap(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in    string
		width int
		want  string
	}{
		{"", 10, "\n"},
		{"one", 10, "one\n"},
		{"one two three", 7, "one two\nthree\n"},
		{"one  two\nthree", 20, "one two three\n"},
		{"averyveryverylongword x", 5, "averyveryverylongword\nx\n"},
	} {
		if got := wrap(tc.in, tc.width); got != tc.want {
			t.Errorf("wrap(%q, %d) = %q, want %q", tc.in, tc.width, got, tc.want)
		}
	}
}
