package torture

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"
)

// MessagesReport is what a message torture did and found.
type MessagesReport struct {
	// Name labels the RESULT lines: torture-messages-<broker>, with
	// -<db> when the inbox is in another database than the broker, -byid
	// for de-duplication by event ID and -unsafe for a run without an
	// inbox.
	Name      string
	Seed      uint64
	Consumers int
	// Mode is how the consumers de-duplicate: "key and sequence number" or
	// "event ID".
	Mode string

	Events    int   // events the run meant to apply
	Keys      int   // the keys they are spread over
	Published int64 // messages published: every event, its copy, and publications retried
	Copies    int64 // copies of events published after the originals, half under another message ID

	Applied  int64 // effects in the database
	Distinct int64 // events with an effect
	Twice    int64 // events applied more than once
	Missing  int64 // events never applied
	// AppliedLate counts the events applied only after the time was up,
	// in the drain with the faults stopped: slow, not lost. Drained says
	// whether there was a drain.
	AppliedLate int64
	Drained     bool
	OutOfOrder  int64 // effects applied out of their key's order
	// OrderKept says whether per-key order is part of the promise: it is
	// in sequence mode; by event ID, competing consumers apply a key's
	// events in any order, and OutOfOrder says how often they did.
	OrderKept   bool
	DeadLetters int64

	Kills          int64 // consumers SIGKILLed by the run (and started again)
	AckKills       int64 // consumers that SIGKILLed themselves between a commit and its acknowledgement
	BrokerRestarts int64 // private brokers SIGKILLed and started again
	Churns         int64 // consumers that left their group cleanly and joined again
	Elapsed        time.Duration

	// Churned says whether the run had churn: CalmRate is then the events
	// applied per second in its calm part (no churn, no kills by the run),
	// ChurnRate in the rest.
	Churned             bool
	CalmRate, ChurnRate float64
	// HeldPeak is the most messages a consumer's streams said they held,
	// HeldLimit their limit, HeldReports how often they said it (Kafka's
	// streams; 0 on the other transports).
	HeldPeak, HeldLimit, HeldReports int64

	// Violations says, one line each, every way the promise was broken.
	Violations []string
}

// OK reports whether the promise held: every event applied, none twice,
// nothing dead-lettered, and in sequence mode every key's events applied
// in order.
func (r *MessagesReport) OK() bool { return len(r.Violations) == 0 }

// Print writes the final table, then the violations, if any.
func (r *MessagesReport) Print(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	row := func(name string, value any) { fmt.Fprintf(tw, "%s\t%v\t\n", name, value) }
	fmt.Fprintf(w, "%s (%d consumers, de-duplicating by %s, seed %d)\n", r.Name, r.Consumers, r.Mode, r.Seed)
	row("events", r.Events)
	row("keys", r.Keys)
	row("messages published", r.Published)
	row("copies re-published", r.Copies)
	row("consumers killed", r.Kills)
	row("killed between commit and ack", r.AckKills)
	row("brokers restarted (SIGKILL)", r.BrokerRestarts)
	if r.Churned {
		row("consumers that left and joined", r.Churns)
	}
	if r.HeldReports > 0 {
		row("most held by a consumer's streams", fmt.Sprintf("%d of %d", r.HeldPeak, r.HeldLimit))
	}
	row("effects applied", r.Applied)
	row("events applied", r.Distinct)
	row("events applied twice", r.Twice)
	row("events missing", r.Missing)
	if r.Drained {
		row("applied after the time was up", r.AppliedLate)
	}
	order := "out of order"
	if !r.OrderKept {
		order += " (not promised)"
	}
	row(order, r.OutOfOrder)
	row("dead letters", r.DeadLetters)
	row("time", r.Elapsed.Round(time.Millisecond))
	row("events/s", fmt.Sprintf("%.1f", r.eventsPerSecond()))
	if r.Churned {
		row("events/s calm", fmt.Sprintf("%.1f", r.CalmRate))
		row("events/s under churn", fmt.Sprintf("%.1f", r.ChurnRate))
	}
	tw.Flush()
	printVerdict(w, r.Violations)
}

// PrintResults writes the figures as lines
// RESULT,<name>,<metric>,<value>,<unit>.
func (r *MessagesReport) PrintResults(w io.Writer) {
	line := func(metric string, value any, unit string) {
		fmt.Fprintf(w, "RESULT,%s,%s,%v,%s\n", r.Name, metric, value, unit)
	}
	line("events", r.Events, "events")
	line("published", r.Published, "messages")
	line("copies", r.Copies, "messages")
	line("kills", r.Kills, "kills")
	line("ack_kills", r.AckKills, "kills")
	line("broker_restarts", r.BrokerRestarts, "restarts")
	line("applied", r.Applied, "effects")
	line("distinct", r.Distinct, "events")
	line("twice", r.Twice, "events")
	line("missing", r.Missing, "events")
	if r.Drained {
		line("applied_late", r.AppliedLate, "events")
	}
	line("out_of_order", r.OutOfOrder, "effects")
	line("dead_letters", r.DeadLetters, "messages")
	line("time_s", fmt.Sprintf("%.2f", r.Elapsed.Seconds()), "s")
	line("events_per_s", fmt.Sprintf("%.1f", r.eventsPerSecond()), "events/s")
	if r.Churned {
		line("churns", r.Churns, "churns")
		line("calm_events_per_s", fmt.Sprintf("%.1f", r.CalmRate), "events/s")
		line("churn_events_per_s", fmt.Sprintf("%.1f", r.ChurnRate), "events/s")
	}
	if r.HeldReports > 0 {
		line("held_peak", r.HeldPeak, "messages")
		line("held_limit", r.HeldLimit, "messages")
		line("held_reports", r.HeldReports, "reports")
	}
	line("violations", len(r.Violations), "violations")
}

func (r *MessagesReport) eventsPerSecond() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Distinct) / r.Elapsed.Seconds()
}
