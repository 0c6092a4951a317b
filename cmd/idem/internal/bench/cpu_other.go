//go:build !unix

package bench

import "time"

// processCPU and machineCPU are not measured here: Result's CPU figures
// stay zero.
func processCPU() time.Duration { return 0 }
func machineCPU() time.Duration { return 0 }
