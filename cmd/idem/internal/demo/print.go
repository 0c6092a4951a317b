package demo

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// printer writes the demo's progress and results. Customers finish on their
// own goroutines, so every write goes through one lock.
type printer struct {
	mu sync.Mutex
	w  io.Writer
}

func (p *printer) printf(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, format, args...)
}

func (p *printer) intro(r *Report) {
	p.printf("idem demo: %d customers per scenario, each paying %s once from an account holding %s.\n"+
		"Every client sends one Idempotency-Key per intended payment and retries the way a careful\n"+
		"client must. The same scenarios run twice: once against the service with idempotency off\n"+
		"(unsafe), once with it on (protected). What was charged is read back from the service.\n",
		r.Customers, money(r.Amount, r.Currency), money(r.Balance, r.Currency))
}

func (p *printer) runStarts(n int, mode Mode) {
	what := "the service executes every request it receives"
	if mode == ModeProtected {
		what = "the service claims each Idempotency-Key and replays duplicates"
	}
	p.printf("\nRun %d of 2: %s (%s)\n", n, mode, what)
}

func (p *printer) scenarioStarts(sc scenario) {
	p.printf("  %-18s %s\n  %-18s ", sc.name, sc.story, "")
}

func (p *printer) customerDone() { p.printf(".") }

func (p *printer) scenarioDone(r Row) {
	p.printf(" %d attempts, %d payments, %d card charges, %.1fs\n", r.Attempts, r.Payments, r.Charges, r.Elapsed.Seconds())
}

// table prints the report as columns a person reads at a glance: text to
// the left, numbers to the right.
func (p *printer) table(r *Report) {
	header := []string{"run", "scenario", "attempts", "payments", "card charges", "money taken", "should be", "verdict"}
	right := []bool{false, false, true, true, true, true, true, false}
	lines := [][]string{header}
	for _, row := range r.Rows {
		lines = append(lines, []string{
			string(row.Mode), row.Scenario, strconv.Itoa(row.Attempts), strconv.Itoa(row.Payments), strconv.Itoa(row.Charges),
			money(row.Taken, row.Currency), money(row.ShouldBe, row.Currency), row.Verdict(),
		})
	}
	p.printf("\n%s", columns(lines, right, true))
}

// columns lays lines out in columns, the first line being the header:
// right[i] aligns column i to the right (numbers), else to the left; two
// spaces between columns, no trailing spaces, and, with breaks, a blank
// line wherever the first column changes.
func columns(lines [][]string, right []bool, breaks bool) string {
	widths := make([]int, len(right))
	for _, l := range lines {
		for i, cell := range l {
			widths[i] = max(widths[i], utf8.RuneCountInString(cell))
		}
	}
	var b strings.Builder
	for n, l := range lines {
		if breaks && n > 1 && l[0] != lines[n-1][0] {
			b.WriteString("\n") // a blank line between the runs
		}
		for i, cell := range l {
			if i > 0 {
				b.WriteString("  ")
			}
			pad := strings.Repeat(" ", widths[i]-utf8.RuneCountInString(cell))
			switch {
			case right[i]:
				b.WriteString(pad + cell)
			case i == len(l)-1:
				b.WriteString(cell) // no trailing spaces
			default:
				b.WriteString(cell + pad)
			}
		}
		b.WriteString("\n")
	}
	return b.String()
}

// closing explains what the table showed, or says plainly that it did not.
func (p *printer) closing(r *Report) {
	var extra, should int64
	extraCharges := 0
	for _, row := range r.Rows {
		if row.Mode == ModeUnsafe {
			extra += row.Taken - row.ShouldBe
			should += row.ShouldBe
			extraCharges += row.Charges - row.Customers
		}
	}
	if probs := r.problems(); len(probs) > 0 {
		p.printf("\nThe demo did NOT show what it should have:\n  - %s\n", strings.Join(probs, "\n  - "))
		return
	}
	text := fmt.Sprintf("What this showed: a client that hears nothing cannot tell a lost request from a "+
		"lost answer, so it must retry: at-least-once delivery. Without protection every duplicate became "+
		"a charge, and customers paid %s more than the %s they owed; the card network, past the service's "+
		"own database, made %d charges too many. With idempotency keys the service claimed each key "+
		"atomically, ran each payment once, charged each card under a key derived from the customer's, "+
		"and replayed its answer to every duplicate: at-least-once delivery + de-duplication at the "+
		"receiver = exactly once. (%s)",
		money(extra, r.Currency), money(should, r.Currency), extraCharges, r.Elapsed.Round(100*time.Millisecond))
	p.printf("\n%s", wrap(text, 96))
	p.printf("\nThe same for messages (redeliveries, a poison message, a retry storm, reordered events): idem demo messages\n")
}

// wrap breaks text into lines of at most width bytes, at spaces.
func wrap(text string, width int) string {
	var b strings.Builder
	n := 0
	for _, word := range strings.Fields(text) {
		switch {
		case n == 0:
		case n+1+len(word) > width:
			b.WriteByte('\n')
			n = 0
		default:
			b.WriteByte(' ')
			n++
		}
		b.WriteString(word)
		n += len(word)
	}
	b.WriteByte('\n')
	return b.String()
}

// money formats an amount in whole units of its currency with thousands
// separators: 1234567 KRW -> "1,234,567 KRW".
func money(amount int64, cur string) string {
	s := group(amount)
	if cur == "" {
		return s
	}
	return s + " " + cur
}

// group writes n with a comma between each group of three digits.
func group(n int64) string {
	digits := strconv.FormatInt(n, 10)
	sign := ""
	if digits[0] == '-' {
		sign, digits = "-", digits[1:]
	}
	var b strings.Builder
	b.WriteString(sign)
	for i, c := range digits {
		if i > 0 && (len(digits)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}
