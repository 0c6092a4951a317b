package idemprobe

// DraftCases returns the core behaviours of the IETF draft
// draft-ietf-httpapi-idempotency-key-header-07 (15 October 2025) as cases,
// each citing the section it follows by the number and name -07 gives it.
// Add them to Config.Cases to hold an endpoint to the draft's own words
// beside the probe's checks, which also follow Stripe's, Adyen's and idem's
// rules where the draft says nothing:
//
//	cfg.Cases = append(cfg.Cases, idemprobe.DraftCases()...)
//
// A duplicate in flight (draft-concurrent-conflict) may wait for the
// first's answer unless Config.Strict; it needs Config.SlowHeader, and
// draft-scoped-key needs Config.OtherHeader, and each is not applicable
// without. The draft's other rules are not cases here: §2.6's replay of an
// error needs a request the endpoint refuses for a reason of its own, which
// only its owner can write (a Case of theirs), and §2.3 leaves expiry to
// the resource's published policy (check 11, with Config.TTL).
//
// Each call returns a new slice, which the caller may change.
func DraftCases() []Case {
	return []Case{
		{
			Name:   "draft-retry-replayed",
			Title:  "a retry after the first completed gets its result again",
			Source: sourceDraft + " §2.6 Idempotency Enforcement (Retry: the resource SHOULD respond with the result of the previously completed operation)",
			Steps: []Step{
				{Name: "first"},
				{Name: "retry", Want: Want{Same: "first"}},
			},
			Effect: 1,
		},
		{
			Name:  "draft-concurrent-conflict",
			Title: "a retry while the first is in flight gets a conflict (409)",
			Source: sourceDraft + " §2.6 Idempotency Enforcement (Concurrent Request: the resource SHOULD respond with a resource conflict error), " +
				"§2.7 " + draftErrors + " (409 for a request retried while the original is still being processed)",
			Steps: []Step{
				{Name: "first", Slow: true, Background: true},
				{Name: "retry", About: "the retry in flight", Want: Want{Conflict: true}},
			},
			Effect: 1,
		},
		{
			Name:   "draft-missing-key",
			Title:  "a request without a key is refused (400)",
			Source: sourceDraft + " §2.7 " + draftErrors + " (400 when the key is missing for an operation that requires it)",
			Steps: []Step{{
				Name: "no-key", About: "without a key", NoKey: true,
				Want:          Want{Status: []int{400}},
				NotApplicable: "the endpoint does not require keys",
			}},
		},
		{
			Name:  "draft-payload-mismatch",
			Title: "a key reused with another payload is refused (422)",
			Source: sourceDraft + " §2.2 Uniqueness of Idempotency Key (a key MUST NOT be reused with a different payload), " +
				"§2.4 Idempotency Fingerprint, §2.7 " + draftErrors + " (422 for a key reused with a different payload)",
			Steps: []Step{
				{Name: "first"},
				{Name: "other-payload", OtherBody: true, Want: Want{Status: []int{422}}},
			},
			Effect: 1,
		},
		{
			Name:  "draft-corrected-retry",
			Title: "after a 422, a retry not corrected is refused again, and the corrected one gets the first result",
			Source: sourceDraft + " §2.7 " + draftErrors + " (clients MUST correct the request before retrying it, " +
				"or the resource MUST fail the request), §2.6 Idempotency Enforcement (Retry)",
			Steps: []Step{
				{Name: "first"},
				{Name: "other-payload", OtherBody: true, Want: Want{Status: []int{422}}},
				{Name: "uncorrected", OtherBody: true, Want: Want{Status: []int{422}}},
				{Name: "corrected", Want: Want{Same: "first"}},
			},
			Effect: 1,
		},
		{
			Name:   "draft-sf-string-key",
			Title:  "a key sent as a structured-field string is honoured",
			Source: sourceDraft + " §2.1 Syntax (the value is an Item Structured Header whose value MUST be a String)",
			Steps: []Step{
				{Name: "first", RawKey: `"{{key}}"`},
				{Name: "retry", RawKey: `"{{key}}"`, Want: Want{Same: "first"}},
			},
			Effect: 1,
		},
		{
			Name:  "draft-invalid-key",
			Title: "a key that is not a structured-field string is refused before anything runs",
			Source: sourceDraft + " §2.1 Syntax (a String), §5 Security Considerations " +
				"(always validate the key before processing any request)",
			Steps: []Step{{
				Name: "tab", About: "a key with a tab inside its quotes", RawKey: "\"probe\t{{key}}\"",
				Want: Want{Status: []int{4}},
			}},
		},
		{
			Name:  "draft-scoped-key",
			Title: "another client's request under the same key is not given the first's answer",
			Source: sourceDraft + " §5 Security Considerations (a composite key: the client's key and attributes of the client " +
				"known only to the resource)",
			Steps: []Step{
				{Name: "first"},
				{Name: "other-client", About: "the same key under the other credential", AsOther: true,
					Want: Want{Status: []int{2, 4}, Other: "first"}},
			},
			Effect: AnyEffect, // the other client's request may run as its own, or be refused
		},
	}
}
