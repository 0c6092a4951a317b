package idemprobe

// missingKey is check 4's first half, written as a case: an operation
// without a key must be refused with 400, and run nothing, unless the
// endpoint runs it, and so does not require keys.
var missingKey = Case{
	Name:   "missing-key-refused",
	Title:  "a missing key is refused (400)",
	Source: sourceDraft + " §2.7 " + draftErrors + " (400 for a missing key)",
	Steps: []Step{{
		About: "without a key", NoKey: true,
		Want:          Want{Status: []int{400}},
		NotApplicable: "the endpoint does not require keys",
	}},
	Pass: "answered 400 without a key",
}
