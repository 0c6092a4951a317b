package torture

import (
	"strings"
	"testing"
	"time"
)

// A late finish's violation tells its payment's story from the replicas'
// own lines: its client's death, its lease's end, each completer's
// take-over, resume, failure or death, the replicas' lives, and its
// finish, each relative to the death; what a replica did without naming
// the payment (a claim that failed, a key it died holding before the
// payments' resume named it) is shown when it falls in that span.
func TestLateFinishTimeline(t *testing.T) {
	t.Parallel()
	died := time.Date(2026, 12, 6, 23, 0, 0, 0, time.UTC)
	stamp := func(d time.Duration) string { return died.Add(d).Format(time.RFC3339Nano) }
	r := &run{cfg: Config{KeyLease: 3 * time.Second}}
	r.replicas = []*replica{
		{n: 0, ups: []upSpan{{from: died.Add(-time.Minute), to: died.Add(5 * time.Second)}, {from: died.Add(6 * time.Second)}}},
		{n: 1, ups: []upSpan{{from: died.Add(-time.Minute)}}},
	}
	const digest = "hmac:00112233aabbccdd"
	for _, l := range []struct {
		replica, life int
		line          string
	}{
		{0, 1, "time=" + stamp(4*time.Second) + ` level=WARN msg="completer: finishing an abandoned execution" scope=torture key=` + digest + " method=completer path=charging"},
		{0, 1, "time=" + stamp(4*time.Second) + ` level=WARN msg="payments: finishing a payment from its recovery point" payment=pay_late key=` + digest},
		{1, 1, "time=" + stamp(7*time.Second) + ` level=WARN msg="completer: could not take the abandoned execution over" scope=torture key=hmac:ffffffffffffffff method=completer error="database is locked"`},
		{0, 2, "time=" + stamp(6*time.Second) + ` level=WARN msg="restarted: ended the leases an earlier incarnation of this replica held" replica=torture-replica-0 leases=2`},
		{1, 1, "time=" + stamp(8*time.Second) + ` level=WARN msg="completer: finishing an abandoned execution" scope=torture key=hmac:eeeeeeeeeeeeeeee method=completer`},
	} {
		r.completerLine(l.replica, l.life, l.line)
	}
	r.completerExit(0, 1, died.Add(5*time.Second))
	r.completerExit(1, 1, died.Add(9*time.Second))

	gone := lastHolderGone(died, r.failedResumesOf([]string{"pay_late"}), died.Add(20*time.Second))
	if want := died.Add(5 * time.Second); !gone.Equal(want) {
		t.Fatalf("last holder gone at %s, want the death of the replica resuming it, %s", gone, want)
	}
	deadline, ok := r.finishDeadline(gone)
	if !ok {
		t.Fatal("no deadline")
	}
	r.late = []lateFinish{{key: "logical-key", payments: []string{"pay_late"}, died: died, gone: gone, deadline: deadline, done: died.Add(20 * time.Second)}}
	got := r.lateTimelines()
	for _, want := range []string{
		"payment pay_late (key logical-key): finished 20s after its client's try gave up at 23:00:00.000, 8.3s past its deadline",
		"       +0s its client's try gave up",
		"       +3s its holder's lease ended, at the latest",
		"       +4s replica 0 (start 1): pay_late: its completer took the key " + digest + " over",
		"       +4s replica 0 (start 1): pay_late: resume began",
		"       +5s replica 0 down",
		"       +5s replica 0 (start 1): pay_late: resume cut off: its replica died",
		"       +5s its last holder's end, which the bound counts from",
		"       +6s replica 0 up",
		"       +6s replica 0 (start 2): started, it ended the 2 leases its killed start held",
		"       +7s replica 1 (start 1): completer: could not take the abandoned execution over (key hmac:ffffffffffffffff)",
		"       +9s replica 1 (start 1): its replica died holding key hmac:eeeeeeeeeeeeeeee",
		"    +11.7s its deadline",
		"      +20s finished",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("the timeline lacks %q:\n%s", want, got)
		}
	}
	if strings.Count(got, "\n  ") > maxTimelineLines+1 {
		t.Errorf("the timeline is longer than its bound:\n%s", got)
	}
}
