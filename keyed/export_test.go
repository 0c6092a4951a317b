package keyed

// SetLetGoHook makes f run in every LetGo between its reading of the held
// token and its wait for the key, so that a test can take the key over in
// between.
func SetLetGoHook(c *Completer, f func()) { c.letGoHook = f }

// SetWaitHook makes f run each time an action on a key finds a resume or
// another action of that key under way, as it starts to wait for it to end.
func SetWaitHook(c *Completer, f func()) { c.waitHook = f }
