package startwatch

import (
	"os"
	"strconv"
	"strings"
	"time"
)

// CPUTime is the CPU time the process pid has used, all its threads
// together (not its children), and whether it could be read. It sums the
// threads' run times the scheduler keeps (/proc/PID/task/TID/schedstat,
// in nanoseconds): /proc/PID/stat's are sampled at each clock tick (10ms),
// so that a process given a few milliseconds between two ticks, as a
// loaded machine gives, may be charged none.
func CPUTime(pid int) (time.Duration, bool) {
	dir := "/proc/" + strconv.Itoa(pid) + "/task"
	tasks, err := os.ReadDir(dir)
	if err != nil || len(tasks) == 0 {
		return 0, false
	}
	var sum time.Duration
	read := false
	for _, task := range tasks {
		b, err := os.ReadFile(dir + "/" + task.Name() + "/schedstat")
		if err != nil {
			continue // a thread that ended meanwhile
		}
		f := strings.Fields(string(b))
		if len(f) == 0 {
			continue
		}
		ns, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			continue
		}
		sum += time.Duration(ns)
		read = true
	}
	return sum, read
}
