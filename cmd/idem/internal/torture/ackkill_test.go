package torture

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
)

// The scheduled kill between commit and ack is the first consumer's to
// process ackKillAt messages: of the consumers sharing a mark, only the
// one that creates it kills itself then, and none once the run made it
// (after a kill at the rate came first). Without a mark, the kill at at is
// the consumer's own.
func TestScheduledAckKillIsTheFirstConsumers(t *testing.T) {
	t.Parallel()
	mark := filepath.Join(t.TempDir(), "killed")
	a := &ackKiller{at: 3, mark: mark, rng: rand.New(rand.NewPCG(1, 1))}
	b := &ackKiller{at: 3, mark: mark, rng: rand.New(rand.NewPCG(1, 2))}
	if !a.first() {
		t.Fatal("the first consumer to reach its count: not its kill; want it")
	}
	if b.first() {
		t.Fatal("a second consumer reaching its count: its kill too; want only the first's")
	}
	other := filepath.Join(t.TempDir(), "killed")
	if err := os.WriteFile(other, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if (&ackKiller{at: 3, mark: other}).first() {
		t.Fatal("a consumer reaching its count after the run made the mark: its kill; want none")
	}
	if !(&ackKiller{at: 3}).first() {
		t.Fatal("a consumer without a mark reaching its count: not its kill; want it")
	}
}

// Until the scheduled kill between commit and ack happened, the run kills
// and stops no consumer, so that each lives on until one has processed
// ackKillAt messages; after it, or with none scheduled, any.
func TestVictimWaitsForTheScheduledAckKill(t *testing.T) {
	t.Parallel()
	r := &messagesRun{rng: newLockedRand(1), consumers: []*replica{{n: 0}, {n: 1}, {n: 2}}}
	if r.victim() == nil {
		t.Fatal("no ack kill scheduled: no victim; want one")
	}
	r.ackKillAt = 5
	for range 20 {
		if c := r.victim(); c != nil {
			t.Fatalf("before the scheduled ack kill: victim consumer %d; want none", c.n)
		}
	}
	r.ackKillerDone.Store(true)
	if r.victim() == nil {
		t.Fatal("after the scheduled ack kill: no victim; want one")
	}
}
