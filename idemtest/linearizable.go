package idemtest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/idem-go/idem"
)

// The linearizability check records a concurrent history of Claim,
// Complete, Release and Get against a store, and asks Porcupine (a checker
// written apart from idem) whether some order of those calls, each taking
// effect at one instant between its call and its return, explains every
// answer by the sequential model of a key's life below. The clock moves
// only between rounds, while no call is running: a call reads the
// injected clock once, so it takes effect at the time it read.

// LinearizabilityScaleEnv names the environment variable that lengthens
// the check: its value (a positive integer) multiplies the rounds of
// concurrent calls. Unset, the check runs rounds enough for CI in seconds.
const LinearizabilityScaleEnv = "IDEMTEST_LINEARIZABILITY_SCALE"

// linKind is what one call of the history does.
type linKind int

const (
	linClaim linKind = iota
	linComplete
	linRelease
	linGet
	linAdvance
	linClaimTx // TxClaimer.ClaimTx: the claim, the work and the completion at once
)

// linInput is one call: its kind and arguments.
type linInput struct {
	kind  linKind
	key   string
	fp    string        // Claim, ClaimTx
	token idem.Token    // Complete, Release
	body  string        // Complete, ClaimTx: the answer, unique to the call
	keep  bool          // ClaimTx: whether the work keeps its answer
	by    time.Duration // Advance
}

// linOutput is what a call returned.
type linOutput struct {
	err      string // "", "lease lost" or "not found"
	outcome  idem.Outcome
	token    idem.Token
	tookOver bool
	kept     bool // ClaimTx
	// The record the call returned (Claim, Get).
	state               idem.State
	fp                  string
	recToken            idem.Token
	body                string
	hasResponse         bool
	leaseEnd, expiresAt time.Duration // since Start
}

// keyLife is the model's state of one key, and the clock. It is a
// comparable value, so states compare with ==.
type keyLife struct {
	now       time.Duration // since Start
	present   bool
	completed bool
	fp        string
	token     idem.Token
	leaseEnd  time.Duration
	expiresAt time.Duration
	body      string
}

// live reports whether the record counts at the model's time: its TTL has
// not passed, or a live lease holds it.
func (k keyLife) live() bool {
	return k.present && (k.now < k.expiresAt || (!k.completed && k.now < k.leaseEnd))
}

// keyLifeModel is the sequential specification of one key, partitioned by
// key (every partition sees every clock move).
var keyLifeModel = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		var advances []porcupine.Operation
		for _, op := range history {
			in := op.Input.(linInput)
			if in.kind == linAdvance {
				advances = append(advances, op)
				continue
			}
			byKey[in.key] = append(byKey[in.key], op)
		}
		var out [][]porcupine.Operation
		for _, ops := range byKey {
			out = append(out, append(append([]porcupine.Operation(nil), ops...), advances...))
		}
		return out
	},
	Init: func() any { return keyLife{} },
	Step: func(state, input, output any) (bool, any) {
		return stepKeyLife(state.(keyLife), input.(linInput), output.(linOutput))
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(linInput), output.(linOutput)
		switch in.kind {
		case linClaim:
			return fmt.Sprintf("Claim(%s, %s) → %v token %d took over %v", in.key, in.fp, out.outcome, out.token, out.tookOver)
		case linClaimTx:
			return fmt.Sprintf("ClaimTx(%s, %s, keep %v %s) → %v token %d took over %v kept %v", in.key, in.fp, in.keep, in.body,
				out.outcome, out.token, out.tookOver, out.kept)
		case linComplete:
			return fmt.Sprintf("Complete(%s, token %d, %s) → %q", in.key, in.token, in.body, out.err)
		case linRelease:
			return fmt.Sprintf("Release(%s, token %d) → %q", in.key, in.token, out.err)
		case linGet:
			if out.err != "" {
				return fmt.Sprintf("Get(%s) → %s", in.key, out.err)
			}
			return fmt.Sprintf("Get(%s) → %v %s token %d %q", in.key, out.state, out.fp, out.recToken, out.body)
		}
		return fmt.Sprintf("Advance(%v)", in.by)
	},
	DescribeState: func(state any) string {
		k := state.(keyLife)
		if !k.present {
			return fmt.Sprintf("t=%v absent", k.now)
		}
		s := "in flight"
		if k.completed {
			s = "completed " + strconv.Quote(k.body)
		}
		return fmt.Sprintf("t=%v %s %s token %d lease to %v expires %v", k.now, s, k.fp, k.token, k.leaseEnd, k.expiresAt)
	},
}

// stepKeyLife is the model: whether a call with input could have returned
// output on a key in state k, and the state it leaves.
func stepKeyLife(k keyLife, in linInput, out linOutput) (bool, any) {
	switch in.kind {
	case linAdvance:
		k.now += in.by
		return true, k
	case linClaim, linClaimTx:
		acquire := func(tookOver bool, expiresAt time.Duration) (bool, any) {
			if out.outcome != idem.Acquired || out.tookOver != tookOver || out.token == 0 ||
				(k.present && out.token == k.token) || out.leaseEnd != k.now+lease || out.expiresAt != expiresAt {
				return false, k
			}
			claimed := keyLife{now: k.now, present: true, fp: in.fp, token: out.token,
				leaseEnd: out.leaseEnd, expiresAt: out.expiresAt}
			switch {
			case in.kind == linClaim:
				return true, claimed
			case out.kept != in.keep:
				return false, k
			case !in.keep:
				return true, k // rolled back, the claim with it: as it was
			}
			claimed.completed, claimed.body = true, in.body
			return true, claimed
		}
		if in.kind == linClaimTx && out.outcome != idem.Acquired && out.kept {
			return false, k
		}
		switch {
		case !k.live():
			return acquire(false, k.now+ttl)
		case k.fp != in.fp:
			return out.outcome == idem.Mismatch, k
		case k.completed:
			return out.outcome == idem.Completed && out.hasResponse && out.body == k.body, k
		case k.now < k.leaseEnd:
			return out.outcome == idem.InFlight, k
		}
		// An ended lease, taken over by the same request: the record
		// keeps its expiry.
		return acquire(true, k.expiresAt)
	case linComplete:
		switch {
		case k.present && k.token == in.token && !k.completed:
			if out.err != "" {
				return false, k
			}
			k.completed, k.body = true, in.body
			return true, k
		case k.present && k.token == in.token:
			return out.err == "", k // completing again changes nothing
		}
		return out.err == "lease lost", k
	case linRelease:
		switch {
		case !k.present:
			return out.err == "", k
		case k.token == in.token && !k.completed:
			if out.err != "" {
				return false, k
			}
			return true, keyLife{now: k.now}
		case !k.live():
			// Another holder's record past its TTL: gone to a caller,
			// still there to the store. The contract allows either
			// answer; the record stays as it is either way.
			return out.err == "" || out.err == "lease lost", k
		}
		return out.err == "lease lost", k
	case linGet:
		if !k.live() {
			return out.err == "not found", k
		}
		want := idem.StateInFlight
		if k.completed {
			want = idem.StateCompleted
		}
		ok := out.err == "" && out.state == want && out.fp == k.fp && out.recToken == k.token &&
			out.hasResponse == k.completed && (!k.completed || out.body == k.body)
		return ok, k
	}
	return false, k
}

// testLinearizable runs rounds of concurrent calls on a few keys, moving
// the clock between rounds, and checks the history with Porcupine.
func testLinearizable(t *testing.T, e *env) {
	const (
		clients      = 6
		callsPerTurn = 12
		keys         = 3
	)
	rounds := 8 * linearizabilityScale(t)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d, %d rounds", seed, rounds)
	start := time.Now()
	stamp := func() int64 { return int64(time.Since(start)) }
	since := func(tm time.Time) time.Duration { return tm.Sub(Start) }

	var (
		mu      sync.Mutex
		history []porcupine.Operation
	)
	record := func(client int, in linInput, call int64, out linOutput) {
		mu.Lock()
		defer mu.Unlock()
		history = append(history, porcupine.Operation{ClientId: client, Input: in, Call: call, Output: out, Return: stamp()})
	}
	fromRecord := func(out *linOutput, r idem.Record) {
		out.state, out.fp, out.recToken = r.State, string(r.Fingerprint), r.Token
		out.leaseEnd, out.expiresAt = since(r.LeaseExpiresAt), since(r.ExpiresAt)
		if r.Response != nil {
			out.hasResponse, out.body = true, string(r.Response.Body)
		}
	}
	errText := func(err error) (string, bool) {
		switch {
		case err == nil:
			return "", true
		case errors.Is(err, idem.ErrLeaseLost):
			return "lease lost", true
		case errors.Is(err, idem.ErrNotFound):
			return "not found", true
		}
		return "", false
	}
	// held is, per client and key, the last token the client acquired.
	held := make([]map[string]idem.Token, clients)
	for c := range held {
		held[c] = map[string]idem.Token{}
	}
	call := func(client int, rng *rand.Rand, n int) {
		key := "lin-" + strconv.Itoa(rng.IntN(keys))
		fp := "fp-a"
		if rng.IntN(5) == 0 {
			fp = "fp-b"
		}
		token := held[client][key]
		if token == 0 || rng.IntN(8) == 0 {
			token = idem.Token(1 + rng.IntN(3)) // a token nobody holds
		}
		var in linInput
		var out linOutput
		var err error
		begin := stamp()
		r := rng.IntN(100)
		if txc, ok := e.store.(idem.TxClaimer); ok && r < 15 {
			in = linInput{kind: linClaimTx, key: key, fp: fp, body: fmt.Sprintf("tx-answer-%d-%d", client, n), keep: rng.IntN(4) != 0}
			req := e.req(key, fp)
			req.Scope = "lin"
			var c idem.Claim
			// A duplicate waits for the transaction that holds the key as
			// long as it takes: the model has no transaction in progress
			// to answer InFlight from.
			c, out.kept, err = txc.ClaimTx(e.ctx, req, time.Minute, func(context.Context, idem.Claim) (idem.Response, bool, error) {
				return idem.Response{Status: 201, Body: []byte(in.body)}, in.keep, nil
			})
			out.outcome, out.token, out.tookOver = c.Outcome, c.Token, c.TookOver
			fromRecord(&out, c.Record)
			if err == nil && c.Outcome == idem.Acquired && in.keep {
				held[client][key] = c.Token
			}
			r = -1
		}
		switch {
		case r < 0:
		case r < 50:
			in = linInput{kind: linClaim, key: key, fp: fp}
			var c idem.Claim
			req := e.req(key, fp)
			req.Scope = "lin"
			c, err = e.store.Claim(e.ctx, req)
			out.outcome, out.token, out.tookOver = c.Outcome, c.Token, c.TookOver
			fromRecord(&out, c.Record)
			if err == nil && c.Outcome == idem.Acquired {
				held[client][key] = c.Token
			}
		case r < 70:
			in = linInput{kind: linComplete, key: key, token: token, body: fmt.Sprintf("answer-%d-%d", client, n)}
			err = e.store.Complete(e.ctx, idem.Ref{Scope: "lin", Key: idem.Key(key), Token: token},
				idem.Response{Status: 201, Body: []byte(in.body)})
		case r < 80:
			in = linInput{kind: linRelease, key: key, token: token}
			err = e.store.Release(e.ctx, idem.Ref{Scope: "lin", Key: idem.Key(key), Token: token})
		default:
			in = linInput{kind: linGet, key: key}
			var rec idem.Record
			rec, err = e.store.Get(e.ctx, "lin", idem.Key(key))
			if err == nil {
				fromRecord(&out, rec)
			}
		}
		text, known := errText(err)
		if !known {
			t.Errorf("%s: unexpected error: %v", keyLifeModel.DescribeOperation(in, out), err)
			return
		}
		out.err = text
		record(client, in, begin, out)
	}

	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	moves := []time.Duration{0, time.Millisecond, lease / 2, lease + time.Millisecond, ttl + time.Millisecond}
	for round := range rounds {
		var wg sync.WaitGroup
		for c := range clients {
			crng := rand.New(rand.NewPCG(rng.Uint64(), uint64(c)))
			wg.Go(func() {
				for n := range callsPerTurn {
					call(c, crng, round*callsPerTurn+n)
				}
			})
		}
		wg.Wait()
		if t.Failed() {
			return
		}
		by := moves[rng.IntN(len(moves))]
		begin := stamp()
		e.clock.Advance(by)
		record(clients, linInput{kind: linAdvance, by: by}, begin, linOutput{})
	}

	var kinds [linClaimTx + 1]int
	for _, op := range history {
		kinds[op.Input.(linInput).kind]++
	}
	t.Logf("%d calls: %d Claim, %d ClaimTx, %d Complete, %d Release, %d Get, %d clock moves",
		len(history), kinds[linClaim], kinds[linClaimTx], kinds[linComplete], kinds[linRelease], kinds[linGet], kinds[linAdvance])
	checkLinearizable(t, keyLifeModel, history, "calls", "the model of a key's life", seed)
}

// linearizabilityScale is LinearizabilityScaleEnv's value, 1 when unset.
func linearizabilityScale(t *testing.T) int {
	t.Helper()
	v := os.Getenv(LinearizabilityScaleEnv)
	if v == "" {
		return 1
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a positive integer", LinearizabilityScaleEnv, v)
	}
	return n
}

// checkLinearizable asks Porcupine whether history is linearizable against
// model, and reports whether it is (or the check ran out of time). A
// history it rejects fails the test and is saved as Porcupine's HTML
// visualisation in a temporary file, which the failure names. what names
// the history's operations, against the model.
func checkLinearizable(t *testing.T, model porcupine.Model, history []porcupine.Operation, what, against string, seed uint64) bool {
	t.Helper()
	res, info := porcupine.CheckOperationsVerbose(model, history, time.Minute)
	switch res {
	case porcupine.Ok:
		return true
	case porcupine.Unknown:
		t.Logf("the check of %d %s did not finish within a minute; no violation found", len(history), what)
		return true
	}
	f, err := os.CreateTemp("", "idem-linearizability-*.html")
	if err != nil {
		t.Errorf("the history of %d %s is not linearizable against %s (seed %d), and saving it failed: %v", len(history), what, against, seed, err)
		return false
	}
	verr := porcupine.Visualize(model, info, f)
	f.Close()
	t.Errorf("the history of %d %s is not linearizable against %s (seed %d); "+
		"open %s in a browser to see the operations and where no order explains them (visualisation error: %v)",
		len(history), what, against, seed, f.Name(), verr)
	return false
}
