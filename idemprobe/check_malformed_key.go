package idemprobe

import (
	"fmt"
	"strings"
)

// malformedKeyLen is longer than the 255 characters Stripe and idem
// accept.
const malformedKeyLen = 300

// malformedKey is check 4's second half, written as a case: a key too long
// and a key with a control character in it must each be refused with 400,
// and run nothing. Each is an operation of its own.
var malformedKey = Case{
	Name:  "malformed-key-refused",
	Title: "a malformed key is refused (400)",
	Source: sourceDraft + " §2.1 Syntax (the key is a structured-field string), §5 Security Considerations " +
		"(validate the key before processing the request); " + sourceStripe + " (keys of at most 255 characters)",
	Steps: []Step{
		{
			Name: "long", About: fmt.Sprintf("a key of %d characters", malformedKeyLen),
			Key: "long", RawKey: strings.Repeat("k", malformedKeyLen),
			Want: Want{Status: []int{400}},
		},
		{
			Name: "tab", About: "a key with a control character (tab)",
			Key: "tab", RawKey: "probe\t{{key}}",
			Want: Want{Status: []int{400}},
		},
	},
	Pass: fmt.Sprintf("a key of %d characters and one with a tab both got 400", malformedKeyLen),
}
