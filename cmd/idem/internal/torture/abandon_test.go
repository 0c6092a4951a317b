package torture

import (
	"strings"
	"testing"
	"time"
)

// A late finish's violation tells its payment's story from the replicas'
// own lines: its client's death, its lease's end, each completer's
// take-over, resume, failure or death, the replicas' lives, and its
// finish, each relative to the death; what a replica did that delays
// every key (a round that gave up, a restart) is shown when it falls in
// that span; what it did with another key (a claim that failed, a key it
// died holding before the payments' resume named it) is that key's story,
// not this one's.
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
		{1, 1, "time=" + stamp(7500*time.Millisecond) + ` level=WARN msg="completer: could not list abandoned executions" error="database is locked"`},
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
		"     +7.5s replica 1 (start 1): completer: could not list abandoned executions: this replica's round gave up",
		"    +11.7s its deadline",
		"      +20s finished",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("the timeline lacks %q:\n%s", want, got)
		}
	}
	for _, other := range []string{"hmac:ffffffffffffffff", "hmac:eeeeeeeeeeeeeeee"} {
		if strings.Contains(got, other) {
			t.Errorf("the timeline shows what a replica did with another key, %s:\n%s", other, got)
		}
	}
	if strings.Count(got, "\n  ") > maxTimelineLines+1 {
		t.Errorf("the timeline is longer than its bound:\n%s", got)
	}
}

// completerLog is a replica's warning line of a completer about a key,
// as keyed logs it.
func completerLog(at time.Time, msg, digest string) string {
	return "time=" + at.Format(time.RFC3339Nano) + ` level=WARN msg="` + msg + `" scope=torture key=` + digest + " method=completer path=charging"
}

// A completer's claim of an abandoned key may take it and leave it
// unfinished without a resume's line to say so: a claim that failed (its
// answer lost, or cut off at its round's deadline: it may have committed)
// and a claim whose replica died before logging its answer, or after its
// take-over and before the payments' resume named the payment. The key
// then waits out the lease that claim took, and the completers' bound
// counts from it, for that key alone, as from a failed resume; a claim
// another holder answered moves nothing. The keys are known by the digest
// the replicas' logs name them under, which the run shares with them.
func TestFinishDeadlineCountsFromAFailedOrCutOffClaim(t *testing.T) {
	died := time.Date(2026, 12, 7, 2, 0, 0, 0, time.UTC)
	r := &run{cfg: Config{KeyLease: 3 * time.Second}, replicas: []*replica{{ups: []upSpan{{from: died.Add(-time.Minute)}}}}}
	claimAt := died.Add(3500 * time.Millisecond)
	for _, l := range []struct {
		life     int
		at       time.Time
		msg, key string
	}{
		{1, claimAt, "completer: taking an abandoned execution over", "k-failed"},
		{1, died.Add(4 * time.Second), "completer: could not take the abandoned execution over", "k-failed"},
		{1, claimAt, "completer: taking an abandoned execution over", "k-cut"},
		{1, claimAt, "completer: taking an abandoned execution over", "k-other"},
		{1, claimAt, "completer: another holder has the abandoned execution", "k-other"},
		{1, claimAt, "completer: taking an abandoned execution over", "k-took"},
		{1, claimAt, "completer: finishing an abandoned execution", "k-took"},
	} {
		r.completerLine(0, l.life, completerLog(l.at, l.msg, keyDigest(l.key)))
	}
	r.completerExit(0, 1, died.Add(4*time.Second))
	done := died.Add(10 * time.Second)
	late := func(key string) bool {
		d, ok := r.finishDeadline(lastHolderGone(died, r.failedClaimsOf(keyDigest(key)), done))
		if !ok {
			t.Fatal("no replica up: want the one up all along")
		}
		return done.After(d)
	}
	for key, want := range map[string]bool{"k-failed": false, "k-cut": false, "k-took": false, "k-other": true, "k-never-claimed": true} {
		if got := late(key); got != want {
			t.Errorf("%s finished %s after its holder died: late %v, want %v (bound %s, from its last claim's end when one may have taken it)",
				key, done.Sub(died), got, want, r.finishBound())
		}
	}
	for _, key := range []string{"k-failed", "k-cut", "k-took"} {
		r.countFrom(nil, keyDigest(key), lastHolderGone(died, r.failedClaimsOf(keyDigest(key)), done))
	}
	if r.fromCutOff != 2 || r.fromFailedClaim != 1 || r.fromFailed != 0 {
		t.Errorf("bounds from a cut-off resume or claim %d, from a failed claim %d, from a failed resume %d; want 2, 1, 0", r.fromCutOff, r.fromFailedClaim, r.fromFailed)
	}
	r.late = []lateFinish{{key: "k-cut", digest: keyDigest("k-cut"), died: died, gone: died, deadline: died.Add(6700 * time.Millisecond), done: done}}
	if got := r.lateTimelines(); !strings.Contains(got, "replica 0 (start 1): claim cut off: its replica died with its claim of key "+keyDigest("k-cut")) {
		t.Errorf("the timeline lacks the claim cut off by its replica's death:\n%s", got)
	}
}

// A replica's round that gave up without holding a key (its listing
// failed, or it ran out of time before taking the key over) voids that
// replica's window for the bound, from then; another replica's window,
// up all along with no round given up, still bounds the finish.
func TestFinishDeadlineCountsFromARoundThatGaveUp(t *testing.T) {
	died := time.Date(2026, 12, 7, 2, 0, 0, 0, time.UTC)
	always := func() *replica { return &replica{ups: []upSpan{{from: died.Add(-time.Minute)}}} }
	r := &run{cfg: Config{KeyLease: 3 * time.Second}, replicas: []*replica{always(), always()}}
	r.completerLine(0, 1, "time="+died.Add(4*time.Second).Format(time.RFC3339Nano)+` level=WARN msg="completer: could not list abandoned executions" error="context deadline exceeded"`)
	done := died.Add(7 * time.Second)
	if d, ok := r.finishDeadline(died); !ok || !done.After(d) {
		t.Errorf("deadline %s (%v): want the other replica's, %s, which a finish at %s is past", d, ok, died.Add(6700*time.Millisecond), done)
	}
	r.completerLine(1, 1, completerLog(died.Add(5*time.Second), "completer: the round ran out of time before it could take the abandoned execution over", keyDigest("k")))
	if d, ok := r.finishDeadline(died); !ok || !d.Equal(died.Add(7700*time.Millisecond)) {
		t.Errorf("deadline %s (%v): want %s, the bound from replica 0's round that gave up at +4s", d, ok, died.Add(7700*time.Millisecond))
	}
}

// The events named by no payment and no key are bounded, and the last
// ones are kept: a late finish near the run's end still has its story.
func TestUnnamedEventsKeepTheLast(t *testing.T) {
	r := &run{}
	at := time.Date(2026, 12, 7, 2, 0, 0, 0, time.UTC)
	for i := range maxUnnamed + 10 {
		r.noteLocked("", event{at: at.Add(time.Duration(i) * time.Second)})
	}
	if n := len(r.unnamed); n != maxUnnamed || !r.unnamed[n-1].at.Equal(at.Add(time.Duration(maxUnnamed+9)*time.Second)) || !r.unnamed[0].at.Equal(at.Add(10*time.Second)) {
		t.Errorf("%d unnamed events kept, from %s to %s; want the last %d", n, r.unnamed[0].at, r.unnamed[n-1].at, maxUnnamed)
	}
}

// A completer's claim that took the key and found its recovery point
// cannot be opened (the replicas' BodyKeys lack the key that sealed it)
// was answered: keyed logs it at ERROR, yields the key and leaves it in
// flight. The claim is not left open to be read, at its replica's death,
// as one cut off holding the key; the key's story says why it stays in
// flight.
func TestClaimWhoseRecoveryPointCannotBeOpened(t *testing.T) {
	t.Parallel()
	died := time.Date(2026, 12, 7, 2, 0, 0, 0, time.UTC)
	r := &run{cfg: Config{KeyLease: 3 * time.Second}, replicas: []*replica{{ups: []upSpan{{from: died.Add(-time.Minute)}}}}}
	digest := keyDigest("k-sealed")
	r.completerLine(0, 1, completerLog(died.Add(3500*time.Millisecond), "completer: taking an abandoned execution over", digest))
	r.completerLine(0, 1, "time="+died.Add(3600*time.Millisecond).Format(time.RFC3339Nano)+
		` level=ERROR msg="completer: the recovery point cannot be opened (are BodyKeys missing a key?); the key stays in flight" scope=torture key=`+digest+
		` method=completer path=charging error="idem: no body key opens the sealed recovery point"`)
	r.completerExit(0, 1, died.Add(5*time.Second))
	if got := r.failedClaimsOf(digest); len(got) != 0 {
		t.Errorf("the claim answered by a recovery point that cannot be opened was read as failed or cut off at %v; want it matched", got)
	}
	r.late = []lateFinish{{key: "k-sealed", digest: digest, died: died, gone: died, deadline: died.Add(6700 * time.Millisecond), done: died.Add(20 * time.Second)}}
	got := r.lateTimelines()
	if strings.Contains(got, "claim cut off") || !strings.Contains(got, "its recovery point cannot be opened") {
		t.Errorf("the key's story: want its recovery point that cannot be opened, not a claim cut off:\n%s", got)
	}
}

// A round's give-up voids its replica's window only when that round began
// in the window: rounds overlap (one starts every interval whatever the
// others are doing), so a round begun before the window, before the key's
// lease ended, says nothing of the window's own round by giving up within
// it; that round, should it fail, logs its own give-up. keyed's lines
// say when their round began (round_began); a line that does not voids
// the window as before.
func TestFinishDeadlineIgnoresAGiveUpOfAnEarlierRound(t *testing.T) {
	died := time.Date(2026, 12, 7, 2, 0, 0, 0, time.UTC)
	always := func() *replica { return &replica{ups: []upSpan{{from: died.Add(-time.Minute)}}} }
	r := &run{cfg: Config{KeyLease: 3 * time.Second}, replicas: []*replica{always(), always()}}
	began := func(d time.Duration) string { return " round_began=" + died.Add(d).Format(time.RFC3339Nano) }
	// Replica 0: a round begun at +2.3s, before the lease's end (+3s),
	// ran out of its 2.7s at +5s.
	r.completerLine(0, 1, completerLog(died.Add(5*time.Second), "completer: the round ran out of time before it could take the abandoned execution over", keyDigest("other"))+
		" timeout=2.7s"+began(2300*time.Millisecond))
	// Replica 1: a round begun at +3.5s, in the window, could not list.
	r.completerLine(1, 1, "time="+died.Add(4*time.Second).Format(time.RFC3339Nano)+` level=WARN msg="completer: could not list abandoned executions" error="database is locked"`+began(3500*time.Millisecond))
	want := died.Add(6700 * time.Millisecond)
	if d, ok := r.finishDeadline(died); !ok || !d.Equal(want) {
		t.Errorf("deadline %s (%v); want %s: replica 0's window from the lease's end, the give-up of a round begun before it aside (replica 1's, from +4s, ends at +7.7s)", d, ok, want)
	}
}
