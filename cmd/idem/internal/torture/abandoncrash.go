package torture

import (
	"context"
	"fmt"

	"github.com/idem-go/idem/cmd/idem/internal/acquirer"
	"github.com/idem-go/idem/cmd/idem/internal/payments"
)

// abandonsCrash says whether the run promises an abandoned payment that
// only a completer can finish: with an acquirer, Abandon (whose replicas
// run completers) and CrashAfterCharge, the scheduled abandoned payment's
// try carries the crash after its charge, and while no abandoned try has
// carried it out, the next payment handed out carries it, abandoned in
// turn (scheduleFaults).
//
// The scheduled crash after a charge cannot be that order: it is carried
// by the first tries of payments whose clients stay, given back when the
// try's answer arrives, and met by any replica's crash. An abandoned
// payment's one try that was refused before its charge (its replica down,
// killed, or the network refusing) leaves nothing for a completer, and its
// client never tries again: only another abandoned payment can carry the
// order on.
func (c *Config) abandonsCrash() bool {
	return c.Abandon > 0 && c.Acquirer != "" && c.CrashAfterCharge > 0
}

// awaitAbandonedCrash waits, for the abandoned client scheduled at payment
// at, until an abandoned try reached its charge and its replica died
// before answering (abandonedTryEnded). The scheduled payment's try
// carries the order first, and the load's last quarter waits for it; once
// a try gives it back, standing is called: the order stands for the
// load's traffic, the next payment handed out carrying it. At stop it
// withdraws the order, and one not carried out is an error naming the
// payment and the seed.
func (r *run) awaitAbandonedCrash(at int, stop <-chan struct{}, standing func()) error {
	stood := false
	for {
		r.abandonMu.Lock()
		came, free, told := r.abandonCame, r.abandonOwed == crashFree, r.abandonChanged()
		r.abandonMu.Unlock()
		if came {
			return nil
		}
		if free && !stood && standing != nil {
			stood = true
			standing()
		}
		select {
		case <-told:
			continue
		case <-stop:
		}
		r.abandonMu.Lock()
		came, r.abandonOwed = r.abandonCame, 0
		r.abandonMu.Unlock()
		if came {
			return nil
		}
		return fmt.Errorf("torture: the abandoned client scheduled at payment %d never crashed its replica after the charge: no abandoned try carrying the order reached its charge with its replica dying before answering before the load ended (seed %d)", at+1, r.cfg.Seed)
	}
}

// abandonChanged returns a channel closed at the order's next change
// (abandonTell). The caller holds abandonMu.
func (r *run) abandonChanged() <-chan struct{} {
	if r.abandonTold == nil {
		r.abandonTold = make(chan struct{})
	}
	return r.abandonTold
}

// abandonTell tells awaitAbandonedCrash of a change. The caller holds
// abandonMu.
func (r *run) abandonTell() {
	if r.abandonTold != nil {
		close(r.abandonTold)
		r.abandonTold = nil
	}
}

// carryAbandon makes lp, handed out while the scheduled abandoned crash's
// order is free, carry it: its client sends one try asking for the crash
// after the charge, and gives up. A payment the share abandoned carries it
// as it is; one whose client stays is made abandoned only when none the
// share abandoned is still to be handed out (abandonAhead), so that the
// order changes the share no more than it must, and never the one whose
// first answer is the scheduled lost response (losesAnswer), which its
// client must go on trying for. It reports whether lp carries the order.
func (r *run) carryAbandon(lp *logical) bool {
	if !r.cfg.abandonsCrash() {
		return false
	}
	r.abandonMu.Lock()
	defer r.abandonMu.Unlock()
	if lp.carries {
		return true
	}
	if lp.abandoned {
		r.abandonAhead--
	}
	if r.abandonOwed != crashFree || !lp.abandoned && (r.abandonAhead > 0 || lp.losesAnswer) {
		return false
	}
	r.abandonOwed = crashTaken
	lp.carries, lp.abandoned = true, true
	r.abandonTell()
	return true
}

// abandonedTryEnded settles the order lp's try carried, once its client
// gave up: carried out when its replica gave the try no answer (its fault
// proxy said so) and the network holds a charge of its key (it reached
// its charge, and its replica died before answering, so only a completer
// finishes it), given back otherwise for the next payment handed out
// (refused before its charge, or answered, its answer dropped or not, it
// left nothing for a completer).
func (r *run) abandonedTryEnded(ctx context.Context, lp *logical) {
	if !lp.carries {
		return
	}
	came := lp.unanswered && ctx.Err() == nil && r.chargedNow(ctx, lp)
	r.abandonMu.Lock()
	defer r.abandonMu.Unlock()
	switch {
	case came:
		r.abandonCame, r.abandonOwed = true, 0
	case r.abandonOwed == crashTaken:
		r.abandonOwed = crashFree
	}
	r.abandonTell()
}

// chargedNow reports whether the card network holds a charge of lp's key,
// asking it up to three times: one it could not tell is reported false,
// so that the order goes on to the next payment.
func (r *run) chargedNow(ctx context.Context, lp *logical) bool {
	charged := r.charged
	if charged == nil {
		charged = r.networkCharged
	}
	var err error
	for failures := range 3 {
		if failures > 0 && !r.backoff(ctx, failures) {
			return false
		}
		var ok bool
		if ok, err = charged(ctx, lp); err == nil {
			return ok
		}
	}
	fmt.Fprintf(r.cfg.Progress, "torture: the card network did not tell whether the abandoned payment %s was charged (%v); the next payment carries its order\n", lp.key, err)
	return false
}

// networkCharged asks the run's card network whether it holds a charge of
// lp's key: among its account's charges, one whose key digest is lp's.
func (r *run) networkCharged(ctx context.Context, lp *logical) (bool, error) {
	net, err := acquirer.NewClient(acquirer.ClientConfig{URL: r.acquirerURL, APIKey: r.acquirerKey, Timeout: phaseTimeout})
	if err != nil {
		return false, err
	}
	charges, err := net.Charges(ctx, lp.account)
	if err != nil {
		return false, err
	}
	digest := payments.ClientKeyDigest(tenant, lp.key)
	for _, c := range charges {
		if c.Metadata[payments.MetaKeyDigest] == digest {
			return true, nil
		}
	}
	return false, nil
}
