package idemprobe

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
	// endpoint that refuses the probe's request; when the endpoint accepts
	// none of its attempts, only the checks that judge failures run.
	baseline bool
	// after names the checks whose outcome this one reads on the prober,
	// so that they run first.
	after []string
	// afterAll marks a check that reads what every other check received:
	// it runs once all those without the mark have.
	afterAll bool
	// judgesFailures marks a check that still runs when the endpoint
	// accepted none of the baseline's attempts, since it judges what those
	// failures showed; every other check is then not run.
	judgesFailures bool
	// requires, when set, returns why the check does not apply with this
	// Config (an option it needs was not given), or "" when it does. A
	// check that does not apply sends nothing.
	requires func(p *prober) string
	// run makes the check: it sets c's verdict and records its evidence.
	// A check that cannot finish says so with c.errorf, keeping the
	// evidence it has; an error it returns is reported the same way.
	run func(ctx context.Context, p *prober, c *Check) error
}

// Where the checks' rules come from. Each row's source names the section of
// the draft it follows, by the number and name -07 gives it (published 15
// October 2025: §2.1 Syntax, §2.2 Uniqueness of Idempotency Key, §2.3
// Idempotency Key Validity and Expiry, §2.4 Idempotency Fingerprint, §2.5
// Responsibilities, §2.6 Idempotency Enforcement, §2.7 Error Handling, §5
// Security Considerations), and says where idem's own behaviour differs
// from it.
const (
	sourceDraft  = "draft-ietf-httpapi-idempotency-key-header-07"
	draftErrors  = "Error Handling"
	sourceStripe = "Stripe's idempotent requests"
	sourceIdem   = "idem's contract"
	sourceAdyen  = "Adyen's API idempotency"

	// idemWaits is where idem differs from the draft's 409 for a request
	// in progress: a duplicate waits for the first answer, within a bound
	// (idemhttp's InflightWait, 5s), and gets 409 only past it.
	idemWaits = "idem differs: a duplicate in flight waits for the first answer, within a bound, before 409"
)

// checks is every check, in the report's order and with the numbers the
// docs give them (doc.go); checkRunOrder is the order they run in.
var checks = []check{
	{
		number: 1, name: "concurrent-duplicates", title: "concurrent duplicates run once",
		source: sourceDraft + " §2.6 Idempotency Enforcement, §2.7 " + draftErrors + " (409 for a request in progress; " +
			idemWaits + "); " + sourceStripe,
		run: checkConcurrentDuplicates,
	},
	{
		number: 2, name: "sequential-replay", title: "sequential duplicates are replayed",
		source:         sourceDraft + " §2.6 Idempotency Enforcement (the first response is returned again); " + sourceStripe + " (Idempotent-Replayed: true)",
		baseline:       true,
		judgesFailures: true,
		run:            checkSequentialReplay,
	},
	{
		number: 3, name: "key-reuse-refused", title: "a key reused with another body is refused (422)",
		source: sourceDraft + " §2.2 Uniqueness of Idempotency Key, §2.4 Idempotency Fingerprint, §2.7 " + draftErrors +
			" (422 for a key reused with another payload)",
		after: []string{"sequential-replay"},
		run:   checkKeyReuse,
	},
	mustCaseCheck(4, missingKey),
	mustCaseCheck(4, malformedKey),
	{
		number: 5, name: "lost-response", title: "a retry after a lost response gets the first execution's answer",
		source: sourceDraft + " §2.6 Idempotency Enforcement; " + sourceStripe + " (retry with the same key after a network error)",
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
		source: sourceIdem + " (transient failures keep nothing; idem differs from the draft's §2.6 Idempotency Enforcement, " +
			"which replays a completed operation's error too, and §2.7 " + draftErrors + " leaves other 5xx to the resource's documentation; " +
			"Stripe instead replays 500s)",
		judgesFailures: true,
		// After the others, to judge every 5xx they met on the way.
		afterAll: true,
		run:      checkTransientFailure,
	},
	{
		number: 8, name: "in-flight-duplicate", title: "a duplicate in flight waits or gets 409 + Retry-After",
		source: sourceDraft + " §2.6 Idempotency Enforcement, §2.7 " + draftErrors + " (409 for a request in progress; " +
			idemWaits + ")",
		requires: needsSlowHeader,
		run:      checkInFlightDuplicate,
	},
	{
		number: 9, name: "scope-isolation", title: "another credential never gets a key's answer",
		source: sourceDraft + " §2.2 Uniqueness of Idempotency Key, §5 Security Considerations (a composite key of the client's key and what the resource knows of the client); " +
			sourceAdyen + " (keys are scoped to the account); " + sourceIdem + " (keys are scoped by tenant)",
		requires: needsOtherHeader,
		run:      checkScopeIsolation,
	},
	{
		number: 10, name: "revoked-credential", title: "a replay does not outlive a revoked credential",
		source:   sourceIdem + " (a replay is an answer like any other: it goes to an authenticated client only); " + sourceDraft + " §2.5 Responsibilities",
		requires: needsRevoke,
		run:      checkRevokedCredential,
	},
	{
		number: 11, name: "key-expiry", title: "after its TTL a key runs anew or is refused",
		source:   sourceDraft + " §2.3 Idempotency Key Validity and Expiry",
		requires: needsTTL,
		run:      checkKeyExpiry,
	},
	{
		number: 12, name: "history-linearizable", title: "a concurrent history is linearizable (Porcupine)",
		source: sourceIdem + " (each key runs once; every answer under it is its first execution's, or a refusal); " +
			sourceDraft + " §2.6 Idempotency Enforcement",
		requires: needsHistory,
		// Last, so that its many requests neither crowd the other checks
		// nor wear down a budget they need.
		afterAll: true,
		run:      checkHistory,
	},
}

var checkRunOrder = mustRunOrder(checks)

// mustCaseCheck is caseCheck for the package's own cases, which every test
// of the package loads: a case that cannot run is a mistake in this code.
func mustCaseCheck(number int, c Case) check {
	row, err := caseCheck(number, c)
	if err != nil {
		panic("idemprobe: " + err.Error())
	}
	return row
}

// checkTable is the table of a run: the probe's checks, then cases,
// numbered on from the last check; and the order they run in.
func checkTable(cases []Case) ([]check, []int, error) {
	if len(cases) == 0 {
		return checks, checkRunOrder, nil
	}
	table := append([]check(nil), checks...)
	next := checks[len(checks)-1].number + 1
	for i, c := range cases {
		row, err := caseCheck(next+i, c)
		if err != nil {
			return nil, nil, err
		}
		table = append(table, row)
	}
	order, err := runOrder(table)
	if err != nil {
		return nil, nil, err
	}
	return table, order, nil
}
