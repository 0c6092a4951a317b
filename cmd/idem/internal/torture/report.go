package torture

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"
)

// Report is what a run did and found.
type Report struct {
	// Name labels the RESULT lines: torture-requests-<db>, with -keys when
	// the keys were in Redis and -unsafe for a run against unsafe mode.
	Name     string
	Seed     uint64
	Replicas int
	Dups     int

	LogicalPayments int   // payments the clients meant to make
	Answered        int   // logical payments whose every attempt got a 2xx
	Attempts        int64 // HTTP requests the clients sent, retries included
	LostResponses   int64 // answers the fault proxies dropped after the replica sent them
	NoAnswer        int64 // requests that got no answer at all: the lost responses, and any other cut connection
	Retried         int64 // requests answered 409 or 5xx (the proxy's 502 for a killed replica among them), and retried
	Kills           int64 // replicas SIGKILLed (and started again)
	StoreResets     int64 // store connections reset by the store proxies (Config.StoreFaults)
	CommitCuts      int64 // store connections cut after a COMMIT was passed on: ambiguous commits
	StoreOutages    int64 // outages of a store (Config.StoreFaults.OutageEvery)
	StoreRestarts   int64 // private stores SIGKILLed and started again (Config.RestartStoresEvery)
	Crashes         int64 // replicas that SIGKILLed themselves between a charge and its commit (Config.CrashAfterCharge)
	Charges         int   // the card network's charges (Config.Acquirer)
	ChargesRefunded int   // of them, charges refunded in full (a payment refused after its charge)
	Reconciled      bool  // idem reconcile ran on the run's database and card network
	Differences     int   // the differences it found
	// Abandoned are the logical payments whose client sent one try and
	// never came back (Config.Abandon); AbandonedFinished those of them
	// the completers charged and recorded; CompleterWait how long after the
	// load the last abandoned execution took to be finished.
	Abandoned         int
	AbandonedFinished int
	CompleterWait     time.Duration
	// SlowestFinish is the longest an abandoned payment waited, from its
	// client giving up (its replica died) to its completion by a
	// completer, and FinishBound the bound every one must be finished
	// within (the completer's documented bound).
	SlowestFinish time.Duration
	FinishBound   time.Duration
	// FromFailedResume is how many abandoned payments had their bound
	// counted from a completer's resume that a replica logged as failed,
	// later than their holder's death, and FromCutOffResume from one that
	// its replica's death cut off (a resume, or a claim whose answer the
	// replica never logged). FromFailedClaim counts those whose bound
	// counted from a completer's claim that failed or ran out of its
	// round's time: it may have taken the key all the same.
	FromFailedResume int
	FromCutOffResume int
	FromFailedClaim  int

	Payments      int   // payments in the database
	MoneyOwed     int64 // the sum of the logical payments' amounts
	MoneyTaken    int64 // what the accounts lost, by their balances in the database
	MoneyTakenAPI int64 // the same, by their balances from the API
	Elapsed       time.Duration

	// Violations says, one line each, every way the promise was broken.
	Violations []string
}

// OK reports whether the promise held: one payment per logical payment,
// the money taken equal to the money owed, every attempt answered 2xx, and
// every answer for one key carrying the same payment.
func (r *Report) OK() bool { return len(r.Violations) == 0 }

// Print writes the final table, then the violations, if any.
func (r *Report) Print(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	row := func(name string, value any) { fmt.Fprintf(tw, "%s\t%v\t\n", name, value) }
	fmt.Fprintf(w, "%s (%d replicas, %d attempts per logical payment, seed %d)\n", r.Name, r.Replicas, r.Dups, r.Seed)
	row("logical payments", r.LogicalPayments)
	row("answered 2xx every time", r.Answered)
	row("attempts sent", r.Attempts)
	row("lost responses", r.LostResponses)
	row("no answer", r.NoAnswer)
	row("retried on 409/5xx (502: killed)", r.Retried)
	row("replicas killed", r.Kills)
	row("store connections reset", r.StoreResets)
	row("commits cut (ambiguous)", r.CommitCuts)
	row("store outages", r.StoreOutages)
	row("stores restarted (SIGKILL)", r.StoreRestarts)
	row("crashes after a charge (SIGKILL)", r.Crashes)
	row("card network charges", r.Charges)
	row("charges refunded in full", r.ChargesRefunded)
	if r.Reconciled {
		row("idem reconcile: differences", r.Differences)
	}
	if r.Abandoned > 0 {
		row("abandoned by their client", r.Abandoned)
		row("of them finished by a completer", r.AbandonedFinished)
		row("completers' wait after the load", r.CompleterWait.Round(time.Millisecond))
		row("slowest finished after its client gave up", r.SlowestFinish.Round(time.Millisecond))
		row("the completers' bound", r.FinishBound)
		row("bound from a failed resume", r.FromFailedResume)
		row("bound from a resume or claim cut off by a death", r.FromCutOffResume)
		row("bound from a failed claim", r.FromFailedClaim)
	}
	row("payments in the database", r.Payments)
	row("money owed", r.MoneyOwed)
	row("money taken (database)", r.MoneyTaken)
	row("money taken (API)", r.MoneyTakenAPI)
	row("time", r.Elapsed.Round(time.Millisecond))
	row("attempts/s", fmt.Sprintf("%.1f", r.attemptsPerSecond()))
	tw.Flush()
	printVerdict(w, r.Violations)
}

// printVerdict writes whether the promise held, then the violations, the
// first maxViolationsShown of them.
func printVerdict(w io.Writer, violations []string) {
	verdict := "HELD"
	if len(violations) > 0 {
		verdict = fmt.Sprintf("BROKEN (%d violations)", len(violations))
	}
	fmt.Fprintf(w, "promise: %s\n", verdict)
	for i, v := range violations {
		if i == maxViolationsShown {
			fmt.Fprintf(w, "  … and %d more\n", len(violations)-i)
			break
		}
		fmt.Fprintf(w, "  %s\n", v)
	}
}

// PrintResults writes the figures as lines
// RESULT,<name>,<metric>,<value>,<unit>.
func (r *Report) PrintResults(w io.Writer) {
	line := func(metric string, value any, unit string) {
		fmt.Fprintf(w, "RESULT,%s,%s,%v,%s\n", r.Name, metric, value, unit)
	}
	line("logical_payments", r.LogicalPayments, "payments")
	line("answered", r.Answered, "payments")
	line("attempts", r.Attempts, "requests")
	line("lost_responses", r.LostResponses, "responses")
	line("no_answer", r.NoAnswer, "requests")
	line("retried", r.Retried, "requests")
	line("kills", r.Kills, "kills")
	line("store_resets", r.StoreResets, "connections")
	line("commit_cuts", r.CommitCuts, "connections")
	line("store_outages", r.StoreOutages, "outages")
	line("store_restarts", r.StoreRestarts, "restarts")
	line("crashes_after_charge", r.Crashes, "crashes")
	line("charges", r.Charges, "charges")
	line("charges_refunded", r.ChargesRefunded, "charges")
	if r.Reconciled {
		line("reconcile_differences", r.Differences, "differences")
	}
	if r.Abandoned > 0 {
		line("abandoned", r.Abandoned, "payments")
		line("abandoned_finished", r.AbandonedFinished, "payments")
		line("completer_wait_s", fmt.Sprintf("%.2f", r.CompleterWait.Seconds()), "s")
		line("slowest_finish_s", fmt.Sprintf("%.2f", r.SlowestFinish.Seconds()), "s")
		line("finish_bound_s", fmt.Sprintf("%.2f", r.FinishBound.Seconds()), "s")
		line("from_failed_resume", r.FromFailedResume, "payments")
		line("from_cut_off_resume", r.FromCutOffResume, "payments")
		line("from_failed_claim", r.FromFailedClaim, "payments")
	}
	line("payments", r.Payments, "payments")
	line("money_owed", r.MoneyOwed, "minor_units")
	line("money_taken", r.MoneyTaken, "minor_units")
	line("money_taken_api", r.MoneyTakenAPI, "minor_units")
	line("time_s", fmt.Sprintf("%.2f", r.Elapsed.Seconds()), "s")
	line("attempts_per_s", fmt.Sprintf("%.1f", r.attemptsPerSecond()), "requests/s")
	line("violations", len(r.Violations), "violations")
}

func (r *Report) attemptsPerSecond() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Attempts) / r.Elapsed.Seconds()
}
