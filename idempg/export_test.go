package idempg

// MaxClaimTxAttempts is how often ClaimTx begins again after a
// serialization failure, for the tests that count its attempts.
const MaxClaimTxAttempts = maxClaimTxAttempts

// Listening returns a channel that receives the backend's pid each time the
// store's listener has started listening and then woken every waiter it
// had. A waiter that registers after a receive is woken by a change of its
// key, its lease's end or its context, and by nothing else until the
// listener starts again (which sends again). Call it before the store's
// first WaitChange.
func Listening(s *Store) <-chan uint32 {
	ch := make(chan uint32, 16)
	s.waits.onListen = func(pid uint32) {
		select {
		case ch <- pid:
		default:
		}
	}
	return ch
}
