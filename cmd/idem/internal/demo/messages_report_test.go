package demo

import (
	"strings"
	"testing"
	"time"
)

// goodMessages is a report in which every row shows what it exists to
// show.
func goodMessages() *MessagesReport {
	return &MessagesReport{
		Redelivery: []RedeliveryRow{
			{Mode: ModeUnsafe, Events: 20, Deliveries: 26, Applied: 26, Total: 312_000, ShouldBe: 240_000, Currency: "KRW"},
			{Mode: ModeProtected, Events: 20, Deliveries: 26, Applied: 20, Total: 240_000, ShouldBe: 240_000, Currency: "KRW"},
		},
		Poison: []PoisonRow{
			{Mode: ModeUnsafe, Healthy: 20, Applied: 0, LongestWait: 2 * time.Minute, PoisonAttempts: 121},
			{Mode: ModeProtected, Healthy: 20, Applied: 20, PoisonAttempts: poisonAttempts, DeadLetter: "dl_1"},
		},
		Storm: []StormRow{
			{Mode: ModeUnsafe, Events: 100, Calls: 620, Peak: 100, Capacity: 30, FellOver: 3, Applied: 100},
			{Mode: ModeProtected, Events: 100, Calls: 575, Peak: 16, Capacity: 30, Applied: 100},
		},
		Order: []OrderRow{
			{Mode: ModeUnsafe, Adds: true, Accounts: 5, Events: 10, RefundFirst: 5, FinalRight: 5, HistoryRight: 0, Lowest: -5_000},
			{Mode: ModeUnsafe, Accounts: 5, Events: 10, RefundFirst: 5, FinalRight: 0, HistoryRight: 0},
			{Mode: ModeProtected, Adds: true, Ordered: true, Accounts: 5, Events: 10, FinalRight: 5, HistoryRight: 5},
			{Mode: ModeProtected, Ordered: true, Accounts: 5, Events: 10, FinalRight: 5, HistoryRight: 5},
			{Mode: ModeProtected, Accounts: 5, Events: 10, RefundFirst: 5, FinalRight: 5, HistoryRight: 5},
		},
	}
}

func TestMessagesReportOK(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		edit func(*MessagesReport)
		want string // in a problem; "" for OK
	}{
		{"every row shows it", func(*MessagesReport) {}, ""},
		{"no redelivery counted twice", func(r *MessagesReport) { r.Redelivery[0].Total, r.Redelivery[0].Applied = 240_000, 20 }, "redelivery, unsafe"},
		{"the inbox let one through", func(r *MessagesReport) { r.Redelivery[1].Total, r.Redelivery[1].Applied = 252_000, 21 }, "redelivery, protected"},
		{"nothing delivered twice", func(r *MessagesReport) { r.Redelivery[1].Deliveries = 20 }, "some delivered twice"},
		{"the naive consumer let one pass", func(r *MessagesReport) { r.Poison[0].Applied = 1 }, "poison, unsafe"},
		{"healthy events stuck behind idem's", func(r *MessagesReport) { r.Poison[1].Applied = 19 }, "poison, protected"},
		{"no dead letter", func(r *MessagesReport) { r.Poison[1].DeadLetter = "" }, "dead letter"},
		{"the herd fit under the capacity", func(r *MessagesReport) { r.Storm[0].Capacity, r.Storm[0].FellOver = 1000, 0 }, "storm, no jitter"},
		{"jitter fell over too", func(r *MessagesReport) { r.Storm[1].FellOver, r.Storm[1].Peak = 1, 40 }, "storm, full jitter"},
		{"jitter lost events", func(r *MessagesReport) { r.Storm[1].Applied = 90 }, "storm, full jitter"},
		{"adding got the history right", func(r *MessagesReport) { r.Order[0].HistoryRight = 5 }, "history wrong"},
		{"setting got it right unordered", func(r *MessagesReport) { r.Order[1].FinalRight = 5 }, "want a refund undone"},
		{"per-key order got adding wrong", func(r *MessagesReport) { r.Order[2].HistoryRight = 4 }, "adds, per-key order"},
		{"per-key order got it wrong", func(r *MessagesReport) { r.Order[3].FinalRight = 4 }, "sets status, per-key order"},
		{"versions got it wrong", func(r *MessagesReport) { r.Order[4].HistoryRight = 4 }, "version"},
		{"versions never saw a refund first", func(r *MessagesReport) { r.Order[4].RefundFirst = 0 }, "refunds came first"},
		{"a scenario missing", func(r *MessagesReport) { r.Storm = nil }, "storm scenario has 0 rows"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := goodMessages()
			for i, d := range orderDesigns {
				r.Order[i].Consumer = d.consumer
			}
			tc.edit(r)
			probs := r.problems()
			if tc.want == "" {
				if !r.OK() {
					t.Errorf("OK() = false: %q", probs)
				}
				return
			}
			if r.OK() {
				t.Fatalf("OK() = true, want a problem about %q", tc.want)
			}
			if !strings.Contains(strings.Join(probs, "\n"), tc.want) {
				t.Errorf("problems %q do not mention %q", probs, tc.want)
			}
		})
	}
	var nilReport *MessagesReport
	if nilReport.OK() {
		t.Errorf("(*MessagesReport)(nil).OK() = true")
	}
}

func TestRowVerdicts(t *testing.T) {
	t.Parallel()
	r := goodMessages()
	for _, tc := range []struct{ got, want string }{
		{r.Redelivery[0].Verdict(), "COUNTED TWICE (+72,000 KRW)"},
		{r.Redelivery[1].Verdict(), "exactly once"},
		{RedeliveryRow{Events: 2, Applied: 1, Total: 100, ShouldBe: 200, Currency: "KRW"}.Verdict(), "LOST (-100 KRW)"},
		{r.Poison[0].Verdict(), "BLOCKED: 20 healthy events stuck behind it"},
		{r.Poison[1].Verdict(), "flows; poison dead-lettered after 10 attempts"},
		{r.Storm[0].Verdict(), "FELL OVER AGAIN (3 times)"},
		{StormRow{Events: 1, Applied: 1, Peak: 40, Capacity: 30, FellOver: 1}.Verdict(), "FELL OVER AGAIN (once)"},
		{r.Storm[1].Verdict(), "held"},
		{r.Order[0].Verdict(), "HISTORY WRONG (went to -5,000): adding needs order"},
		{r.Order[1].Verdict(), "WRONG STATE (5 refunds undone): setting needs order or versions"},
		{r.Order[2].Verdict(), "right: it keeps per-key order"},
		{r.Order[3].Verdict(), "right: it keeps per-key order"},
		{r.Order[4].Verdict(), "right: a version needs no order"},
	} {
		if tc.got != tc.want {
			t.Errorf("verdict %q, want %q", tc.got, tc.want)
		}
	}
}

func TestHistogram(t *testing.T) {
	t.Parallel()
	back := int(outage / bucket)
	buckets := func(at map[int]int) []int {
		b := make([]int, back+30)
		for i, n := range at {
			b[back+i] = n
		}
		return b
	}
	got := histogram([]StormRow{
		{Consumer: "no jitter", Capacity: 30, Buckets: buckets(map[int]int{5: 100, 21: 70})},
		{Consumer: "full jitter", Capacity: 30, Buckets: buckets(map[int]int{0: 30, 1: 4, 2: 15})},
	})
	want := "   calls per 100ms once the service is back, at 1s (each column 100ms; █ over the capacity of 30):\n" +
		"   no jitter         █               █\n" +
		"   full jitter  ▇▁▄\n" +
		"                1s        2s        3s\n"
	if got != want {
		t.Errorf("histogram:\n%s\nwant:\n%s", got, want)
	}
}
