package idempgsql

// SetBlockedHook has f called whenever a call of idem's blocks, waiting for
// another to close its savepoint, until restore is called: the external
// tests learn from it that a wait has begun. A test that sets it must not
// run in parallel with others that may block.
func SetBlockedHook(f func()) (restore func()) {
	old := testHookBlocked
	testHookBlocked = f
	return func() { testHookBlocked = old }
}
