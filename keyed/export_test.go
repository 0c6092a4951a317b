package keyed

// SetYieldHeldHook makes f run in every yieldHeld between the caller's
// reading of the held token and the forgetting of that hold, so that a
// test can take the key over in between.
func SetYieldHeldHook(c *Completer, f func()) { c.yieldHeldHook = f }
