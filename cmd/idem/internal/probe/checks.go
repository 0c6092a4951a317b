package probe

import "context"

// check is one row of the table: what the report calls the check, where its
// rule comes from, what it needs, and the function that makes it. Adding a
// check is adding a row here and its run function in a file of its own.
type check struct {
	// number is the check's number in the docs and the report; rows that
	// are two halves of one rule share it.
	number int
	name   string // stable, for machines
	title  string
	source string // where the rule comes from, as the report cites it

	// baseline marks the check whose first request is the baseline: it
	// runs before every other, since nothing means anything against an
	// endpoint that refuses the probe's request, and only its run may
	// return an error, which stops the probe.
	baseline bool
	// after names the checks whose outcome this one reads on the prober,
	// so that they run first.
	after []string
	// afterAll marks a check that reads what every other check received:
	// it runs once all those without the mark have.
	afterAll bool
	// requires, when set, returns why the check does not apply with this
	// Config (an option it needs was not given), or "" when it does. A
	// check that does not apply sends nothing.
	requires func(p *prober) string
	// run makes the check: it sets c's verdict and records its evidence.
	// A check that cannot finish says so with c.errorf, keeping the
	// evidence it has.
	run func(ctx context.Context, p *prober, c *Check) error
}

// Where the checks' rules come from.
const (
	sourceDraft  = "draft-ietf-httpapi-idempotency-key-header"
	sourceStripe = "Stripe's idempotent requests"
	sourceIdem   = "idem's contract"
)

// checks is every check, in the report's order and with the numbers the
// docs give them (doc.go); checkRunOrder is the order they run in.
var checks = []check{
	{
		number: 1, name: "concurrent-duplicates", title: "concurrent duplicates run once",
		source: sourceDraft + " (Error Scenarios: 409 for a request in progress); " + sourceStripe,
		run:    checkConcurrentDuplicates,
	},
	{
		number: 2, name: "sequential-replay", title: "sequential duplicates are replayed",
		source:   sourceDraft + " (the first response is returned again); " + sourceStripe + " (Idempotent-Replayed: true)",
		baseline: true,
		run:      checkSequentialReplay,
	},
	{
		number: 3, name: "key-reuse-refused", title: "a key reused with another body is refused (422)",
		source: sourceDraft + " (Error Scenarios)",
		after:  []string{"sequential-replay"},
		run:    checkKeyReuse,
	},
	{
		number: 4, name: "missing-key-refused", title: "a missing key is refused (400)",
		source: sourceDraft + " (Error Scenarios)",
		run:    checkMissingKey,
	},
	{
		number: 4, name: "malformed-key-refused", title: "a malformed key is refused (400)",
		source: sourceDraft + " (the key is a structured-field string); " + sourceStripe + " (keys of at most 255 characters)",
		run:    checkMalformedKey,
	},
	{
		number: 5, name: "lost-response", title: "a retry after a lost response gets the first execution's answer",
		source: sourceStripe + " (retry with the same key after a network error)",
		run:    checkLostResponse,
	},
	{
		number: 6, name: "no-credentials-replayed", title: "replays carry no Set-Cookie",
		source:   sourceIdem + " (a replay goes to whoever presents the key)",
		afterAll: true,
		run:      checkReplayedCredentials,
	},
	{
		number: 7, name: "5xx-not-kept", title: "a 5xx is not kept: the retry runs again",
		source:   sourceIdem + " (transient failures keep nothing; Stripe instead replays 500s)",
		requires: needsFaultHeader,
		run:      checkTransientFailure,
	},
	{
		number: 8, name: "in-flight-duplicate", title: "a duplicate in flight waits or gets 409 + Retry-After",
		source:   sourceDraft + " (Error Scenarios: 409 for a request in progress)",
		requires: needsSlowHeader,
		run:      checkInFlightDuplicate,
	},
}

var checkRunOrder = mustRunOrder(checks)
