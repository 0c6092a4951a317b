package main

import (
	"strings"
	"testing"
)

// bench messages --kafka private measures the Kafka consumer against the
// minimum on kfake started in the process, in one command.
func TestBenchMessagesKafkaPrivate(t *testing.T) {
	t.Parallel()
	code, out, errOut := runCmd(t, "bench", "messages", "--kafka", "private", "--only", "idem-consumer-kafka,minimum-consumer-kafka",
		"--messages", "300", "--keys", "10", "--rounds", "1")
	if code != exitOK {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	for _, want := range []string{"RESULT,idem-consumer-kafka,", "RESULT,minimum-consumer-kafka,"} {
		if !strings.Contains(out, want) {
			t.Errorf("no %s line in:\n%s", want, out)
		}
	}
	if code, _, errOut := runCmd(t, "bench", "messages", "--kafka", "nowhere:x:y"); code != exitUsage || !strings.Contains(errOut, "--kafka") {
		t.Errorf("--kafka nowhere:x:y: exit %d, %q; want a usage error naming --kafka", code, errOut)
	}
}
