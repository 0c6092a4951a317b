//go:build !linux

package startwatch

import "time"

// CPUTime cannot read a process's CPU time outside Linux: a start is then
// bounded by the wall clock alone.
func CPUTime(int) (time.Duration, bool) { return 0, false }
