package demo

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/idem-go/idem"
)

// textWidth is the width the explanations are wrapped to.
const textWidth = 100

// indented wraps text to textWidth with every line after the first
// indented by indent's width, and the first starting with indent.
func indented(indent, text string) string {
	lines := strings.Split(strings.TrimSuffix(wrap(text, textWidth-len(indent)), "\n"), "\n")
	pad := strings.Repeat(" ", len(indent))
	for i := range lines {
		if i == 0 {
			lines[i] = indent + lines[i]
		} else {
			lines[i] = pad + lines[i]
		}
	}
	return strings.Join(lines, "\n") + "\n"
}

// of writes "n of m".
func of(n, m int) string { return fmt.Sprintf("%d of %d", n, m) }

// labDuration writes a duration of the lab's clock to a tenth of a second.
func labDuration(d time.Duration) string {
	if d == 0 {
		return "0s"
	}
	return d.Round(100 * time.Millisecond).String()
}

func (p *printer) messagesIntro() {
	p.printf("%s", wrap("idem demo messages: the chapter's second half. Messages come twice, fail for good, fail "+
		"together and come out of order; each scenario runs a consumer built the unsafe way, then as idem builds it, "+
		"on the same events and faults. Every figure is read back from what the consumers wrote, the inbox, the "+
		"transport and the dead letters, on one SQLite file. Time is the lab's own clock, which moves only when every "+
		"consumer waits for it, so the figures are the same on every run.", textWidth))
}

func (p *printer) redeliveryStarts() {
	p.printf("\n%s", indented("1. Redelivery. ", fmt.Sprintf("%d payment events of %s, each added to a settlement total "+
		"(adding is not idempotent). %d acknowledgements are lost on the way back, and the consumer is killed once "+
		"between its commit and its acknowledgement: the transport delivers those events again.",
		redeliveryEvents, money(eventAmount, currency), redeliveryEvents/lostAckEvery)))
}

func (p *printer) redeliveryTable(rows []RedeliveryRow) {
	lines := [][]string{{"run", "consumer", "events", "deliveries", "applied", "total", "should be", "verdict"}}
	for _, r := range rows {
		lines = append(lines, []string{string(r.Mode), r.Consumer, strconv.Itoa(r.Events), strconv.Itoa(r.Deliveries),
			strconv.Itoa(r.Applied), money(r.Total, r.Currency), money(r.ShouldBe, r.Currency), r.Verdict()})
	}
	p.printf("\n%s", columns(lines, []bool{false, false, true, true, true, true, true, false}, false))
}

func (p *printer) poisonStarts() {
	p.printf("\n%s", indented("2. A poison message. ", fmt.Sprintf("One event that always fails (%s: an error nobody "+
		"marked permanent) at the head of the queue, then %d healthy events; one worker each.", errPoison, healthyEvents)))
}

func (p *printer) poisonTable(rows []PoisonRow, dl idem.DeadLetter, db string) {
	lines := [][]string{{"run", "consumer", "healthy applied", "longest wait", "poison attempts", "verdict"}}
	for _, r := range rows {
		wait := labDuration(r.LongestWait)
		if r.Blocked() {
			wait += ", still waiting"
		}
		lines = append(lines, []string{string(r.Mode), r.Consumer, of(r.Applied, r.Healthy), wait,
			strconv.Itoa(r.PoisonAttempts), r.Verdict()})
	}
	p.printf("\n%s", columns(lines, []bool{false, false, true, true, true, false}, false))
	if dl.ID == "" {
		return
	}
	var gaps []string
	for i := 1; i < len(dl.Attempts); i++ {
		gap := dl.Attempts[i].At.Sub(dl.Attempts[i-1].At)
		if gap < time.Second {
			gaps = append(gaps, "+"+gap.Round(time.Millisecond).String())
		} else {
			gaps = append(gaps, "+"+labDuration(gap))
		}
	}
	p.printf("\n%s", indented("   ", fmt.Sprintf("The dead letter %s keeps the event, every attempt with its error "+
		"(%s) and why it left the flow (%s: every attempt the policy allows failed). The waits between the "+
		"attempts, each drawn at random below a bound that doubles: %s. To read it:",
		dl.ID, dl.LastError(), dl.Class, strings.Join(gaps, " "))))
	file := db
	if file == "" {
		file = "FILE"
	}
	p.printf("     idem dlq show %s --db sqlite:%s\n", dl.ID, file)
	p.printf("     IDEM_OPERATORS=me:$(openssl rand -hex 16) idem console --db sqlite:%s\n", file)
	p.printf("       and open http://127.0.0.1:8081/console/letters/%s\n", dl.ID)
	if db == "" {
		p.printf("%s", indented("   ", "(`idem demo messages --keep` keeps the lab's file, so that FILE exists.)"))
	}
}

func (p *printer) stormStarts(capacity int) {
	p.printf("\n%s", indented("3. A retry storm. ", fmt.Sprintf("%d events; %d consumers of %d workers each call a "+
		"ledger service that is down for the first %v, serves %d calls per %v, and falls over for %v when sent more. "+
		"Each consumer retries up to 10 times, from %v doubling.", stormEvents, stormReplicas, stormWorkers,
		outage, capacity, bucket, cooldown, 100*time.Millisecond)))
}

func (p *printer) stormTable(rows []StormRow) {
	lines := [][]string{{"run", "retries", "events", "calls", "peak per 100ms", "capacity", "fell over again", "applied", "all done at", "verdict"}}
	for _, r := range rows {
		lines = append(lines, []string{string(r.Mode), r.Consumer, strconv.Itoa(r.Events), strconv.Itoa(r.Calls),
			strconv.Itoa(r.Peak), strconv.Itoa(r.Capacity), strconv.Itoa(r.FellOver), strconv.Itoa(r.Applied),
			labDuration(r.Drained), r.Verdict()})
	}
	p.printf("\n%s", columns(lines, []bool{false, false, true, true, true, true, true, true, true, false}, false))
	p.printf("\n%s", histogram(rows))
}

// histogramWidth bounds the histogram's columns.
const histogramWidth = 80

// histogram draws, for each run of the storm, its calls per 100 ms once
// the service is back, as a line of bars: each column is one window or
// more (the busiest shown), its bar's height a share of the capacity, and
// a full block a window over capacity.
func histogram(rows []StormRow) string {
	back := int(outage / bucket)
	n, capacity := 0, 0
	for _, r := range rows {
		n = max(n, len(r.Buckets)-back)
		capacity = r.Capacity
	}
	if n <= 0 || capacity == 0 {
		return ""
	}
	per := (n + histogramWidth - 1) / histogramWidth // windows per column
	cols := (n + per - 1) / per
	levels := []rune("▁▂▃▄▅▆▇")
	var b strings.Builder
	fmt.Fprintf(&b, "   calls per %v once the service is back, at %v (each column %v; █ over the capacity of %d):\n",
		bucket, outage, time.Duration(per)*bucket, capacity)
	label := 0
	for _, r := range rows {
		label = max(label, len(r.Consumer))
	}
	for _, r := range rows {
		line := make([]rune, 0, cols)
		for c := range cols {
			most := 0
			for w := back + c*per; w < min(back+(c+1)*per, len(r.Buckets)); w++ {
				most = max(most, r.Buckets[w])
			}
			switch {
			case most == 0:
				line = append(line, ' ')
			case most > capacity:
				line = append(line, '█')
			default:
				line = append(line, levels[min(len(levels)-1, (most*len(levels)-1)/capacity)])
			}
		}
		fmt.Fprintf(&b, "   %-*s  %s\n", label, r.Consumer, strings.TrimRight(string(line), " "))
	}
	// An axis: the time, every second or every few, where labels fit.
	windowsPerSecond := int(time.Second / bucket)
	every := max(1, (5*per+windowsPerSecond-1)/windowsPerSecond) // seconds between labels, 5 columns apart at least
	axis := []rune(strings.Repeat(" ", cols+4))
	first := int(outage / time.Second)
	for sec := first; (sec-first)*windowsPerSecond/per < cols; sec += every {
		for i, ch := range strconv.Itoa(sec) + "s" {
			if c := (sec-first)*windowsPerSecond/per + i; c < len(axis) {
				axis[c] = ch
			}
		}
	}
	fmt.Fprintf(&b, "   %-*s  %s\n", label, "", strings.TrimRight(string(axis), " "))
	return b.String()
}

func (p *printer) orderStarts() {
	p.printf("\n%s", indented("4. Order. ", fmt.Sprintf("%d accounts, each paid %s and then refunded %s, one event "+
		"each with the account as its key. Each payment's event times out on its first attempt and is retried %v later, "+
		"while the refund's goes on.", orderAccounts, money(eventAmount, currency), money(orderRefund, currency), orderRetry)))
}

func (p *printer) orderTable(rows []OrderRow) {
	lines := [][]string{{"run", "consumer", "refund first", "final right", "history right", "verdict"}}
	for _, r := range rows {
		lines = append(lines, []string{string(r.Mode), r.Consumer, strconv.Itoa(r.RefundFirst),
			of(r.FinalRight, r.Accounts), of(r.HistoryRight, r.Accounts), r.Verdict()})
	}
	p.printf("\n%s", columns(lines, []bool{false, false, true, true, true, false}, false))
}

// messagesClosing says what the tables showed, or plainly that they did
// not.
func (p *printer) messagesClosing(r *MessagesReport) {
	if probs := r.problems(); len(probs) > 0 {
		p.printf("\nThe demo did NOT show what it should have:\n  - %s\n", strings.Join(probs, "\n  - "))
		return
	}
	red, poison, storm := r.Redelivery[0], r.Poison, r.Storm
	text := fmt.Sprintf("What this showed: delivery is at least once, so a consumer gets some messages twice; "+
		"without an inbox the total was off by %s, and with the inbox committed in the effect's transaction every "+
		"redelivery was recognised and added nothing. A message that always fails, retried forever at the head of "+
		"its queue, held %d healthy events for as long as the lab watched; bounded retries with backoff moved it "+
		"to the dead letters after %d attempts, kept with every attempt and the reason, and the others went on at once. "+
		"Retries without jitter arrived %d at a time and knocked the recovering service over %d times; full jitter "+
		"spread them to at most %d per 100 ms, and it held. Retries reorder a key's messages: adding still ends "+
		"right but passes through states that never were, setting ends wrong, per-key order fixes both, and an "+
		"event that carries the final state with a version needs no order at all. (%s)",
		money(red.Total-red.ShouldBe, red.Currency), poison[0].Healthy-poison[0].Applied, poison[1].PoisonAttempts,
		storm[0].Peak, storm[0].FellOver, storm[1].Peak, r.Elapsed.Round(100*time.Millisecond))
	p.printf("\n%s", wrap(text, textWidth))
}
