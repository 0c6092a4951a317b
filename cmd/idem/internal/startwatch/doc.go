// Package startwatch bounds a child process's start by its progress rather
// than by the wall clock.
//
// On a loaded machine (in CI, 37 runnable threads on 2 cores) a start that
// keeps working can take longer than any bound fit for an idle one, while a
// start that waits for what never comes (a lock, a connection) should still
// fail at the bound. Working is using CPU time, read from the system
// ([CPUTime]): at least 1/[MinWork] of the bound's length within each bound,
// which a start that waits does not use (an idle `idem serve` uses 0.2 %),
// and one starved on a loaded machine still does (37 threads on 2 cores
// give each 5 %). Where the CPU time cannot be read (outside Linux), the
// bound is on the wall clock. A start that keeps working but never gets
// ready ends at [MaxBounds] bounds.
//
// The torture's replicas and consumers and the end-to-end tests' replicas
// are watched with it.
package startwatch
