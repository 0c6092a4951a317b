package keywait

import (
	"testing"

	"github.com/idem-go/idem"
)

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// TestLocalWakesEveryWatcher protects Local's contract: Notify wakes every
// watcher of its key and no other key's, and only the next Notify: a watch
// begun after it waits for the one after.
func TestLocalWakesEveryWatcher(t *testing.T) {
	t.Parallel()
	var l Local
	k, other := Key{Scope: "s", Key: "k"}, Key{Scope: "s", Key: "other"}
	a, stopA := l.Watch(k)
	defer stopA()
	b, stopB := l.Watch(k)
	defer stopB()
	o, stopO := l.Watch(other)
	defer stopO()
	if closed(a) || closed(b) {
		t.Fatal("a watch is woken before any Notify")
	}
	l.Notify(k)
	if !closed(a) || !closed(b) {
		t.Fatal("Notify did not wake both watchers of the key")
	}
	if closed(o) {
		t.Fatal("Notify of one key woke a watcher of another")
	}
	c, stopC := l.Watch(k)
	defer stopC()
	if closed(c) {
		t.Fatal("a watch begun after Notify is woken by it")
	}
	l.Notify(k)
	if !closed(c) {
		t.Fatal("the second Notify did not wake the watch begun after the first")
	}
	l.Notify(Key{Scope: "s", Key: "nobody"}) // no watcher: nothing to do
}

// TestLocalForgetsUnwatchedKeys protects Local's memory: a key stays
// recorded only while someone watches it, so a process that watched many
// keys once does not keep them; one watcher stopping leaves the others
// woken by the next Notify; and a watcher of an earlier round, stopping
// late, does not drop the round that replaced it.
func TestLocalForgetsUnwatchedKeys(t *testing.T) {
	t.Parallel()
	var l Local
	k := Key{Scope: "s", Key: "k"}
	a, stopA := l.Watch(k)
	b, stopB := l.Watch(k)
	stopA()
	if len(l.m) != 1 {
		t.Fatalf("after one of two watchers stopped, %d keys recorded, want 1", len(l.m))
	}
	l.Notify(k)
	if !closed(b) {
		t.Fatal("the remaining watcher was not woken")
	}
	_ = a
	stopB()
	if len(l.m) != 0 {
		t.Fatalf("%d keys recorded after every watcher stopped, want 0", len(l.m))
	}

	// Watchers that all stop without a Notify leave nothing either.
	_, stop1 := l.Watch(k)
	_, stop2 := l.Watch(k)
	stop1()
	if len(l.m) != 1 {
		t.Fatalf("after one of two watchers stopped, %d keys recorded, want 1", len(l.m))
	}
	stop2()
	if len(l.m) != 0 {
		t.Fatalf("%d keys recorded after both watchers stopped without a Notify, want 0", len(l.m))
	}

	old, stopOld := l.Watch(k)
	l.Notify(k) // ends the round old watched
	next, stopNext := l.Watch(k)
	stopOld() // late: must not drop next's round
	if !closed(old) {
		t.Fatal("Notify did not wake the first round")
	}
	l.Notify(k)
	if !closed(next) {
		t.Fatal("a late stop of an earlier watcher dropped the next round's watch")
	}
	stopNext()
	if len(l.m) != 0 {
		t.Fatalf("%d keys recorded at the end, want 0", len(l.m))
	}
}

// TestGates protects the gates: a key not executing here passes freely
// (nil channel); one executing shows its fingerprint and a channel closed
// when it ends; Waiting counts the requests waiting at the gate until each
// says it is done; a second Begin of a key held changes nothing.
func TestGates(t *testing.T) {
	t.Parallel()
	var g Gates
	k := Key{Scope: "s", Key: "k"}
	if ended, fp, done := g.Executing(k); ended != nil || fp != "" || done != nil {
		t.Fatalf("Executing of a key no one executes = %v, %q, done set %v; want nils", ended, fp, done != nil)
	}
	if n := g.Waiting(k); n != 0 {
		t.Fatalf("Waiting of a key no one executes = %d", n)
	}
	end := g.Begin(k, idem.Fingerprint("fp-1"))
	endAgain := g.Begin(k, idem.Fingerprint("fp-2"))
	ended1, fp, done1 := g.Executing(k)
	if ended1 == nil || fp != "fp-1" {
		t.Fatalf("Executing while executing = %v, %q; want a channel and fp-1 (the first Begin's)", ended1, fp)
	}
	ended2, _, done2 := g.Executing(k)
	if n := g.Waiting(k); n != 2 {
		t.Fatalf("Waiting = %d with two requests at the gate, want 2", n)
	}
	done1()
	if n := g.Waiting(k); n != 1 {
		t.Fatalf("Waiting = %d after one request stopped waiting, want 1", n)
	}
	endAgain() // the second Begin recorded nothing: the gate stays
	if closed(ended1) {
		t.Fatal("the end of a second Begin closed the first's gate")
	}
	if other, _, _ := g.Executing(Key{Scope: "s", Key: "other"}); other != nil {
		t.Fatal("another key is gated")
	}
	end()
	if !closed(ended1) || !closed(ended2) {
		t.Fatal("the end of the execution did not open the gate")
	}
	done2()
	if ended, _, _ := g.Executing(k); ended != nil {
		t.Fatal("a key whose execution ended is still gated")
	}
	end2 := g.Begin(k, idem.Fingerprint("fp-3"))
	defer end2()
	if _, fp, done := g.Executing(k); fp != "fp-3" {
		t.Fatalf("a new execution of the key shows fingerprint %q, want fp-3", fp)
	} else {
		done()
	}
}
