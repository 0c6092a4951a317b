package idempg

// MaxClaimTxAttempts is how often ClaimTx begins again after a
// serialization failure, for the tests that count its attempts.
const MaxClaimTxAttempts = maxClaimTxAttempts
