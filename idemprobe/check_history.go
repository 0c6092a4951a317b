package idemprobe

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http/httptrace"
	"os"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
)

// needsHistory makes check 12 not applicable without Config.History.
func needsHistory(p *prober) string {
	if p.cfg.History == 0 {
		return "no --history given: no concurrent history was recorded"
	}
	return ""
}

// The history's operations. A request under a key is a duplicate of the
// key's operation, or a mismatched body under that key, and may be lost:
// the client hangs up once it has written the request, as one whose
// network failed would, so that its answer is never known.
const (
	historyLostOneIn     = 10
	historyMismatchOneIn = 10
	// historyCheckTimeout bounds Porcupine's search: per key the histories
	// are short, so a search that takes longer says something is amiss.
	historyCheckTimeout = 30 * time.Second
)

// historyInput is one request of the history: its key (an index), whether
// it carried the key's other body, and whether the client hung up.
type historyInput struct {
	key      int
	mismatch bool
	lost     bool
}

// historyOutput is what the request was answered. unknown is set for a
// request whose answer was lost, on purpose or not: it may have run or not.
type historyOutput struct {
	unknown bool
	status  int
	id      string
	digest  string // of the body, canonical when JSON
}

// historyState is the model's state of one key: whether it ran, and its
// first execution's body and answer. It is comparable, so states compare
// with ==.
type historyState struct {
	ran      bool
	mismatch bool
	status   int
	id       string
	digest   string
}

// historyModel is the sequential specification an idempotent endpoint
// meets under each key: the key runs once, with the body of the request
// that ran it; every later success under it is that execution's answer
// again, for that same body; a refusal (any status but 2xx: 409 in flight,
// 422 for the other body, a 5xx that keeps nothing) changes nothing and is
// always allowed; a request whose answer is unknown may have been the one
// that ran, which the next answer shows, so it changes nothing either.
var historyModel = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[int][]porcupine.Operation{}
		var keys []int
		for _, op := range history {
			k := op.Input.(historyInput).key
			if _, ok := byKey[k]; !ok {
				keys = append(keys, k)
			}
			byKey[k] = append(byKey[k], op)
		}
		out := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			out = append(out, byKey[k])
		}
		return out
	},
	Init: func() any { return historyState{} },
	Step: func(state, input, output any) (bool, any) {
		return stepHistory(state.(historyState), input.(historyInput), output.(historyOutput))
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(historyInput), output.(historyOutput)
		// Only executions are checked (see checkHistory), so every
		// operation shown has an answer.
		what := fmt.Sprintf("key %d", in.key)
		if in.mismatch {
			what += " (other body)"
		}
		return fmt.Sprintf("%s → %d %s %.8s", what, out.status, out.id, out.digest)
	},
	DescribeState: func(state any) string {
		s := state.(historyState)
		if !s.ran {
			return "not run"
		}
		body := "its body"
		if s.mismatch {
			body = "the other body"
		}
		return fmt.Sprintf("ran with %s: %d %s %.8s", body, s.status, s.id, s.digest)
	},
}

// stepHistory is the model: whether a request in state s could have been
// answered out, and the state it leaves.
func stepHistory(s historyState, in historyInput, out historyOutput) (bool, any) {
	switch {
	case out.unknown:
		return true, s
	case out.status < 200 || out.status > 299:
		return true, s
	case !s.ran:
		return true, historyState{ran: true, mismatch: in.mismatch, status: out.status, id: out.id, digest: out.digest}
	}
	return in.mismatch == s.mismatch && out.status == s.status && out.id == s.id && out.digest == s.digest, s
}

// historyRequest is one planned request and, once sent, its record.
type historyRequest struct {
	in     historyInput
	call   int64
	ret    int64
	out    historyOutput
	errMsg string
}

// checkHistory sends Config.History requests under Config.HistoryKeys
// keys from Config.HistoryClients clients at once, records when each was
// sent and answered, and asks Porcupine whether some order of them, each
// taking effect at one instant between its sending and its answer,
// explains every answer by historyModel; only the answers of executions
// (2xx) are given to it, and to the visualisation of a history it rejects. A server that runs a key twice
// now and then, under concurrency only, passes every check made one
// request at a time; a long history of overlapping duplicates is where it
// shows. With Config.CountURL the effect is counted before and after, and
// must have grown once per key that ran.
func checkHistory(ctx context.Context, p *prober, c *Check) error {
	cfg := &p.cfg
	n, nkeys, clients := cfg.History, min(cfg.HistoryKeys, cfg.History), cfg.HistoryClients
	rng := rand.New(rand.NewPCG(cfg.HistorySeed, 0x9e3779b97f4a7c15))
	keys := make([]string, nkeys)
	ops := make([]operation, nkeys)
	others := make([]operation, nkeys)
	canMismatch := true
	for i := range keys {
		keys[i], ops[i] = cfg.NewKey(), p.newOperation()
		others[i], canMismatch = p.variant(ops[i])
	}
	// A key's requests are next to each other in the queue, so that the
	// clients send them together: overlapping duplicates are the point.
	plan := make([]historyRequest, n)
	var lost, mismatched int
	for i := range plan {
		in := historyInput{key: i * nkeys / n}
		in.lost = rng.IntN(historyLostOneIn) == 0
		in.mismatch = canMismatch && rng.IntN(historyMismatchOneIn) == 0
		if in.lost {
			lost++
		}
		if in.mismatch {
			mismatched++
		}
		plan[i].in = in
	}
	k := p.startCount(ctx, c)
	if k.err != nil {
		c.errorf("%s", k.err)
		return nil
	}
	if err := p.reserve(n); err != nil {
		c.errorf("%s", err)
		return nil
	}
	start := time.Now()
	stamp := func() int64 { return int64(time.Since(start)) }
	queue := make(chan *historyRequest)
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for r := range queue {
				op := ops[r.in.key]
				if r.in.mismatch {
					op = others[r.in.key]
				}
				p.historySend(ctx, r, op, keys[r.in.key], stamp)
			}
		})
	}
	for i := range plan {
		queue <- &plan[i]
	}
	close(queue)
	wg.Wait()
	history := make([]porcupine.Operation, 0, n)
	ran := map[int]bool{}
	unknown := map[int]bool{}
	var noAnswer, refused int
	for i, r := range plan {
		switch {
		case r.out.unknown:
			// It may or may not have run: the next answer under its key
			// tells, not this one.
			unknown[r.in.key] = true
			if !r.in.lost {
				noAnswer++
			}
		case r.out.status >= 200 && r.out.status <= 299:
			ran[r.in.key] = true
			// Only answers of an execution go to Porcupine. The model
			// allows a refusal or an unknown answer at any point and
			// changes nothing for it, so leaving those out changes no
			// verdict (each can always be ordered just after the requests
			// that ended before it was sent), whereas a search over where
			// many of them fall, an unknown one anywhere after it was
			// sent, grows exponentially with them, in time and memory,
			// and ran out of time on a history that went wrong late.
			history = append(history, porcupine.Operation{ClientId: i % clients, Input: r.in, Call: r.call, Output: r.out, Return: r.ret})
		default:
			refused++
			if r.out.status >= 500 {
				unknown[r.in.key] = true // a 5xx may come after a commit
			}
		}
	}
	summary := fmt.Sprintf("%d requests under %d keys from %d clients (seed %d): %d hung up, %d with the other body, %d refused, %d unanswered",
		n, nkeys, clients, cfg.HistorySeed, lost, mismatched, refused, noAnswer)
	if noAnswer > n/2 {
		c.errorf("%s: most requests got no answer, the first being %s", summary, firstError(plan))
		return nil
	}
	res, info := porcupine.CheckOperationsVerbose(historyModel, history, historyCheckTimeout)
	switch res {
	case porcupine.Unknown:
		c.errorf("%s: Porcupine did not finish within %s", summary, historyCheckTimeout)
		return nil
	case porcupine.Illegal:
		c.failf("%s: not linearizable: some key ran twice, or answered what its first execution did not",
			summary)
		c.Artifact = p.saveVisualisation(info, c)
		return nil
	}
	d, counted, err := k.delta(ctx, c)
	if err != nil {
		c.errorf("%s", err)
		return nil
	}
	// Keys whose fate is unknown (only lost requests or 5xx answers) may
	// or may not have run. A lost request the server finishes after this
	// count is read escapes it: the bound can miss a second execution only
	// a lost request made, never blame a server that ran each key once.
	maybe := 0
	for key := range unknown {
		if !ran[key] {
			maybe++
		}
	}
	switch {
	case counted && (d < int64(len(ran)) || d > int64(len(ran)+maybe)):
		c.failf("%s: linearizable by the answers, but the effect grew by %d for %d keys that ran (and %d that may have)",
			summary, d, len(ran), maybe)
	case counted:
		c.passf("%s: linearizable, and the effect grew by %d for %d keys that ran", summary, d, len(ran))
	default:
		c.passf("%s: linearizable (%d keys ran)", summary, len(ran))
	}
	return nil
}

// historySend sends one request of the history and records its times and
// answer in r. A lost one is cancelled as soon as it is written.
func (p *prober) historySend(ctx context.Context, r *historyRequest, op operation, key string, stamp func() int64) {
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if r.in.lost {
		rctx = httptrace.WithClientTrace(rctx, &httptrace.ClientTrace{
			WroteRequest: func(httptrace.WroteRequestInfo) { cancel() },
		})
	}
	req, err := p.newRequest(rctx, op, key, false)
	r.call = stamp()
	if err != nil {
		r.out, r.errMsg, r.ret = historyOutput{unknown: true}, err.Error(), stamp()
		return
	}
	var ex Exchange
	p.do(req, &ex, nil)
	r.ret = stamp()
	switch {
	case ex.Error != "":
		r.out, r.errMsg = historyOutput{unknown: true}, ex.Error
	case r.in.lost:
		// Answered before the hang-up took: the answer is known after all,
		// but a lost request stays unknown, as it was meant to be.
		r.out = historyOutput{unknown: true}
	default:
		a := ex.Response
		r.out = historyOutput{status: a.Status, id: a.ID, digest: digest(a.body)}
	}
}

// digest is a short hash of a body, of its canonical form when it is JSON.
func digest(b []byte) string {
	var v any
	if json.Unmarshal(b, &v) == nil {
		if c, err := json.Marshal(v); err == nil {
			b = c
		}
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

func firstError(plan []historyRequest) string {
	for _, r := range plan {
		if r.errMsg != "" && !r.in.lost {
			return r.errMsg
		}
	}
	return "none"
}

// saveVisualisation writes Porcupine's view of a history it rejected, for
// a browser, and returns the file's name ("" when it could not be saved,
// which the reason then says).
func (p *prober) saveVisualisation(info porcupine.LinearizationInfo, c *Check) string {
	dir := p.cfg.HistoryDir
	if dir == "" {
		dir = os.TempDir()
	}
	f, err := os.CreateTemp(dir, "idem-probe-history-*.html")
	if err != nil {
		c.Reason += fmt.Sprintf(" (saving the visualisation failed: %v)", err)
		return ""
	}
	verr := porcupine.Visualize(historyModel, info, f)
	if cerr := f.Close(); verr == nil {
		verr = cerr
	}
	if verr != nil {
		c.Reason += fmt.Sprintf(" (writing the visualisation failed: %v)", verr)
	}
	c.Reason += "; open " + f.Name() + " in a browser to see the requests and where no order explains them"
	return f.Name()
}
