package torture

import (
	"cmp"
	"context"
	crand "crypto/rand"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem"
	"github.com/idem-go/idem/idemsqlite"
)

// completerEvery is the replicas' completer interval (payments' default).
const completerEvery = time.Second

// completerBound is how long after the last kill the replicas' completers
// must have finished every abandoned payment: a lease for the holder's to
// end, a round, and a resume (bounded by nine tenths of a lease), twice
// over (a completer killed in the middle of a resume, its lease to end in
// turn), and time for a crashed replica to start again.
func (r *run) completerBound() time.Duration {
	one := r.cfg.KeyLease + completerEvery + r.cfg.KeyLease*9/10
	return 2*one + 10*time.Second
}

// finishBound is the completers' documented bound (keyed.Completer.Bound,
// with payments' defaults): a lease for the dead holder's to end, a round,
// and a resume (nine tenths of a lease). Every abandoned payment must be
// finished within it of its holder's death (when its client gave up: the
// try's replica SIGKILLed itself), or of the end of a completer's resume
// of it that failed or was cut off by its replica's death
// (lastHolderGone), as long as a completer runs: see finishDeadline.
func (r *run) finishBound() time.Duration {
	return r.cfg.KeyLease + completerEvery + r.cfg.KeyLease*9/10
}

// finishDeadline is when an abandoned payment whose holder died at died
// must be finished: its lease ends, then the first replica that is up for
// a round and a resume without a break finishes it by the end of them. The
// run's chaos can leave no replica up (every abandoned try crashes its
// replica); the bound counts from when one is. ok is false when none ever
// was up that long after the lease.
//
// A replica's round that gave up without holding a key (its listing
// failed or ran out of time, or it ran out of time before taking a key
// over) voids that replica's window it fell in, when the round began in
// it too: its bound counts again from then, for that replica alone
// (roundsGaveUp). Rounds overlap, one starting every interval whatever
// the others do, so a round begun before the window (before the key's
// lease ended, its listing could not have found it) says nothing of the
// window's own round by giving up within it: that one logs its own
// give-up if it fails. A line that does not say when its round began
// voids the window it fell in.
func (r *run) finishDeadline(died time.Time) (deadline time.Time, ok bool) {
	window := completerEvery + r.cfg.KeyLease*9/10
	from := died.Add(r.cfg.KeyLease)
	r.failedMu.Lock()
	gaveUp := make(map[int][]giveUp, len(r.roundsGaveUp))
	for i, gs := range r.roundsGaveUp {
		gaveUp[i] = slices.Clone(gs)
	}
	r.failedMu.Unlock()
	for i, rp := range r.replicas {
		t := from
		for {
			start, up := rp.upFor(t, window)
			if !up {
				break
			}
			end := start.Add(window)
			var last time.Time
			for _, g := range gaveUp[i] {
				// The log's times are to the millisecond: a round
				// logged as begun less than one before start may have
				// begun in the window.
				inWindow := g.began.IsZero() || g.began.Add(time.Millisecond).After(start)
				if g.at.After(start) && !g.at.After(end) && g.at.After(last) && inWindow {
					last = g.at
				}
			}
			if last.IsZero() {
				if !ok || end.Before(deadline) {
					deadline, ok = end, true
				}
				break
			}
			t = last
		}
	}
	return deadline, ok
}

// lastHolderGone is when the last holder of an abandoned payment's key let
// it go before the key was finished at done: the client's try, which gave
// up at died, or a completer whose resume failed after it, or whose
// replica died in the middle of it, at the latest of failed before done. The completers' bound counts from it: a resume
// whose outcome is unknown keeps the key in flight until the lease that
// completer took ends, and only then may the next round take it
// (keyed.Completer: "tried again after the lease the Completer took").
func lastHolderGone(died time.Time, failed []time.Time, done time.Time) time.Time {
	last := died
	for _, f := range failed {
		if f.After(last) && !f.After(done) {
			last = f
		}
	}
	return last
}

// completerFailed matches a replica's line saying a completer's resume
// ended with its outcome unknown, and the payment it was finishing (the
// payments' resume names it in its error).
var completerFailed = regexp.MustCompile(`^time=(\S+) level=ERROR msg="completer: outcome unknown;.*error="payments: payment (pay_[a-z0-9]+)[ "]`)

// completerUnknown matches a replica's line saying a completer's resume
// ended with its outcome unknown, whatever the error (its answer not kept,
// say), and the key's digest.
var completerUnknown = regexp.MustCompile(`^time=(\S+) level=ERROR msg="completer: (?:outcome unknown;|finished, but could not keep the answer;).* key=(hmac:[0-9a-f]{16})`)

// resumeStarted matches a replica's line saying it begins finishing a
// payment from its recovery point (payments' resume, at warning level),
// the payment and the key's digest.
var (
	resumeStarted = regexp.MustCompile(`^time=(\S+) level=WARN msg="payments: finishing a payment from its recovery point"`)
	paymentAttr   = regexp.MustCompile(` payment=(pay_[a-z0-9]+)`)
	keyAttr       = regexp.MustCompile(` key=(hmac:[0-9a-f]{16})`)
)

// completerTook matches a replica's line saying its completer took an
// abandoned key over (keyed's, at warning level, before the payments'
// resume names the payment), and the key's digest.
var completerTook = regexp.MustCompile(`^time=(\S+) level=WARN msg="completer: finishing an abandoned execution".* key=(hmac:[0-9a-f]{16})`)

// giveUp is a completer's round that gave up without holding a key: when,
// and when the round began (keyed's round_began; zero when the line does
// not say).
type giveUp struct{ at, began time.Time }

// roundBeganAttr is the round_began attribute of keyed's lines of a round
// that gave up.
var roundBeganAttr = regexp.MustCompile(` round_began=(\S+)`)

// completerTrouble matches a replica's line saying its completer's round
// gave up without holding a key: it could not list the abandoned keys
// (a store that did not answer, or the round's time ran out), or ran out
// of time before taking one over (its key named by digest).
var completerTrouble = regexp.MustCompile(`^time=(\S+) level=WARN msg="(completer: (?:could not list abandoned executions|the round ran out of time before it could take the abandoned execution over))"`)

// completerClaiming matches a replica's line saying its completer is
// sending a claim of an abandoned key (before the claim, so a replica
// killed once the claim committed has said so), and the key's digest.
// completerClaimed matches the lines that end such a claim without a
// take-over (another holder had the key; it had been released), and
// completerClaimFailed a claim that failed or ran out of the round's
// time, which may have taken the key all the same.
var (
	completerClaiming    = regexp.MustCompile(`^time=(\S+) level=WARN msg="completer: taking an abandoned execution over".* key=(hmac:[0-9a-f]{16})`)
	completerClaimed     = regexp.MustCompile(`^time=(\S+) level=WARN msg="completer: (?:another holder has the abandoned execution|gave back a key released since it was listed|could not give back a key it claimed anew)".* key=(hmac:[0-9a-f]{16})`)
	completerClaimFailed = regexp.MustCompile(`^time=(\S+) level=WARN msg="completer: could not take the abandoned execution over".* key=(hmac:[0-9a-f]{16})`)
)

// completerUnopenable matches a replica's line saying its completer's
// claim took an abandoned key and found its recovery point cannot be
// opened (no body key opens it): the claim was answered, the key given
// back (yielded) and left in flight, for no completer can go on from it.
var completerUnopenable = regexp.MustCompile(`^time=(\S+) level=ERROR msg="completer: the recovery point cannot be opened.*" .*key=(hmac:[0-9a-f]{16})`)

// restartedLeases matches a replica's line saying, as it starts, that it
// ended the leases its killed incarnation held (keyed's Restart), and how
// many: a key a killed completer had taken over, even one it died too
// soon to log, is free from then on.
var restartedLeases = regexp.MustCompile(`^time=(\S+) level=WARN msg="restarted: ended the leases an earlier incarnation of this replica held".* leases=(\d+)`)

// life names one process of one replica: its number and the count of its
// starts.
type life struct{ replica, n int }

func (l life) String() string { return fmt.Sprintf("replica %d (start %d)", l.replica, l.n) }

// event is one thing a replica's life did that a late finish's timeline
// shows: with a payment (its resume began, failed, was cut off) or
// without (a claim or a listing that failed, a resume of a key whose
// payment it never named, cut off).
type event struct {
	at   time.Time
	lf   life
	what string
}

// maxUnnamed bounds the events kept without a payment or a key (a
// listing that failed, a replica's restart): the last ones are kept.
const maxUnnamed = 2000

// noteLocked notes e in the timeline of payment, a payment's ID or a key's
// digest, or, with none, among the unnamed events.
func (r *run) noteLocked(payment string, e event) {
	if payment == "" {
		if len(r.unnamed) == maxUnnamed {
			r.unnamed = slices.Delete(r.unnamed, 0, 1)
		}
		r.unnamed = append(r.unnamed, e)
		return
	}
	if r.timeline == nil {
		r.timeline = map[string][]event{}
	}
	r.timeline[payment] = append(r.timeline[payment], e)
}

// completerLine notes, from one line of a replica's life (its errors are
// always logged, and its warnings in a run with Abandon), a completer's
// resume that began and one that failed: see lastHolderGone. A resume
// begun and not seen to fail stays open until the life ends
// (completerExit).
func (r *run) completerLine(replica, n int, line string) {
	at := func(s string) (time.Time, bool) {
		t, err := time.Parse(time.RFC3339Nano, s)
		return t, err == nil
	}
	lf := life{replica, n}
	if m := completerClaiming.FindStringSubmatch(line); m != nil {
		if t, ok := at(m[1]); ok {
			r.failedMu.Lock()
			if r.claiming == nil {
				r.claiming = map[life]map[string]time.Time{}
			}
			if r.claiming[lf] == nil {
				r.claiming[lf] = map[string]time.Time{}
			}
			r.claiming[lf][m[2]] = t
			r.failedMu.Unlock()
		}
		return
	}
	if m := completerClaimed.FindStringSubmatch(line); m != nil {
		r.failedMu.Lock()
		delete(r.claiming[lf], m[2])
		r.failedMu.Unlock()
		return
	}
	if m := completerClaimFailed.FindStringSubmatch(line); m != nil {
		if t, ok := at(m[1]); ok {
			r.failedMu.Lock()
			delete(r.claiming[lf], m[2])
			r.noteFailedClaimLocked(m[2], t, false)
			r.noteLocked(m[2], event{t, lf, "completer: could not take the abandoned execution over (key " + m[2] + "): it may have taken it all the same"})
			r.failedMu.Unlock()
		}
		return
	}
	if m := completerUnopenable.FindStringSubmatch(line); m != nil {
		r.failedMu.Lock()
		delete(r.claiming[lf], m[2])
		if t, ok := at(m[1]); ok {
			r.noteLocked(m[2], event{t, lf, "its completer took the key " + m[2] + " over, and its recovery point cannot be opened (no body key opens it): the key stays in flight"})
		}
		r.failedMu.Unlock()
		return
	}
	if m := completerTook.FindStringSubmatch(line); m != nil {
		t, ok := at(m[1])
		if !ok {
			return
		}
		r.failedMu.Lock()
		defer r.failedMu.Unlock()
		delete(r.claiming[lf], m[2])
		if r.took == nil {
			r.took = map[life]map[string]time.Time{}
		}
		if r.took[lf] == nil {
			r.took[lf] = map[string]time.Time{}
		}
		r.took[lf][m[2]] = t
		return
	}
	if m := completerTrouble.FindStringSubmatch(line); m != nil {
		if t, ok := at(m[1]); ok {
			what, digest := m[2], ""
			if k := keyAttr.FindStringSubmatch(line); k != nil {
				digest = k[1]
				what += " (key " + digest + ")"
			}
			g := giveUp{at: t}
			if b := roundBeganAttr.FindStringSubmatch(line); b != nil {
				g.began, _ = at(b[1])
			}
			r.failedMu.Lock()
			if r.roundsGaveUp == nil {
				r.roundsGaveUp = map[int][]giveUp{}
			}
			r.roundsGaveUp[replica] = append(r.roundsGaveUp[replica], g)
			// It delays every key that replica's completer would take:
			// shown in every late finish's timeline that it falls in.
			r.noteLocked("", event{t, lf, what + ": this replica's round gave up"})
			r.failedMu.Unlock()
		}
		return
	}
	if m := restartedLeases.FindStringSubmatch(line); m != nil {
		if t, ok := at(m[1]); ok {
			r.failedMu.Lock()
			r.noteLocked("", event{t, lf, "started, it ended the " + m[2] + " leases its killed start held"})
			r.failedMu.Unlock()
		}
		return
	}
	if m := resumeStarted.FindStringSubmatch(line); m != nil {
		p, k := paymentAttr.FindStringSubmatch(line), keyAttr.FindStringSubmatch(line)
		if p == nil || k == nil {
			return
		}
		r.failedMu.Lock()
		defer r.failedMu.Unlock()
		if r.resuming == nil {
			r.resuming = map[life]map[string]string{}
		}
		if r.resuming[lf] == nil {
			r.resuming[lf] = map[string]string{}
		}
		r.resuming[lf][k[1]] = p[1]
		if r.resumeDigests == nil {
			r.resumeDigests = map[string]string{}
		}
		r.resumeDigests[p[1]] = k[1]
		if took, ok := r.took[lf][k[1]]; ok {
			r.noteLocked(p[1], event{took, lf, "its completer took the key " + k[1] + " over"})
			delete(r.took[lf], k[1])
		}
		if t, ok := at(m[1]); ok {
			r.noteLocked(p[1], event{t, lf, "resume began"})
		}
		return
	}
	var t time.Time
	var payment, digest string
	if m := completerFailed.FindStringSubmatch(line); m != nil {
		var ok bool
		if t, ok = at(m[1]); !ok {
			return
		}
		payment = m[2]
	}
	if m := completerUnknown.FindStringSubmatch(line); m != nil {
		var ok bool
		if t, ok = at(m[1]); !ok {
			return
		}
		digest = m[2]
	}
	if payment == "" && digest == "" {
		return
	}
	r.failedMu.Lock()
	defer r.failedMu.Unlock()
	if digest != "" {
		if p, ok := r.resuming[lf][digest]; ok {
			if payment == "" {
				payment = p
			}
			delete(r.resuming[lf], digest)
		}
	}
	if payment != "" {
		r.noteFailedLocked(payment, t)
	}
	what := "resume failed, its outcome unknown"
	if digest != "" {
		what += " (key " + digest + ")"
	}
	r.noteLocked(payment, event{t, lf, what})
}

// completerExit notes the end of a replica's life at at: each resume it
// had begun and not seen end failed then, its outcome unknown. A replica
// SIGKILLed in the middle of a resume logs nothing more, and the key waits
// for the next holder from its death, not from its client's try.
func (r *run) completerExit(replica, n int, at time.Time) {
	lf := life{replica, n}
	r.failedMu.Lock()
	defer r.failedMu.Unlock()
	for _, payment := range r.resuming[lf] {
		r.noteFailedLocked(payment, at)
		r.noteLocked(payment, event{at, lf, "resume cut off: its replica died"})
		if r.cutOff == nil {
			r.cutOff = map[string][]time.Time{}
		}
		r.cutOff[payment] = append(r.cutOff[payment], at)
	}
	delete(r.resuming, lf)
	// A key taken over and not yet named by the payments' resume, or whose
	// claim this life said it was sending and never said the answer of:
	// it may hold the key, which waits out its lease from the death.
	for digest, took := range r.took[lf] {
		r.noteFailedClaimLocked(digest, at, true)
		r.noteLocked(digest, event{at, lf, fmt.Sprintf("its replica died holding key %s, taken over at %s, its payment not named yet",
			digest, took.Format("15:04:05.000"))})
	}
	delete(r.took, lf)
	for digest, sent := range r.claiming[lf] {
		r.noteFailedClaimLocked(digest, at, true)
		r.noteLocked(digest, event{at, lf, fmt.Sprintf("claim cut off: its replica died with its claim of key %s, sent at %s, unanswered in its log",
			digest, sent.Format("15:04:05.000"))})
	}
	delete(r.claiming, lf)
}

// noteFailedClaimLocked notes a claim of the key digest that may have
// taken it and let it go unfinished at at: one that failed, or, cutOff,
// whose replica died before logging its answer or its resume.
func (r *run) noteFailedClaimLocked(digest string, at time.Time, cutOff bool) {
	if r.failedClaims == nil {
		r.failedClaims, r.cutOffClaims = map[string][]time.Time{}, map[string][]time.Time{}
	}
	r.failedClaims[digest] = append(r.failedClaims[digest], at)
	if cutOff {
		r.cutOffClaims[digest] = append(r.cutOffClaims[digest], at)
	}
}

// checkDigest refuses a run whose replicas named a payment's key (in
// their resume's line) under another digest than the run's: the claims,
// named by digest alone, would then be read as nobody's.
func (r *run) checkDigest(ids []string, digest string) error {
	r.failedMu.Lock()
	defer r.failedMu.Unlock()
	for _, id := range ids {
		if d, ok := r.resumeDigests[id]; ok && d != digest {
			return fmt.Errorf("torture: a replica named payment %s's key %s, the run %s: its %s did not reach the replicas", id, d, digest, envKeyDigestSecret)
		}
	}
	return nil
}

// failedClaimsOf returns when the claims of the key digest failed or were
// cut off (noteFailedClaimLocked).
func (r *run) failedClaimsOf(digest string) []time.Time {
	r.failedMu.Lock()
	defer r.failedMu.Unlock()
	return slices.Clone(r.failedClaims[digest])
}

// keyDigest is the digest under which the replicas' logs name the
// logical payment key (they share the run's digest secret:
// digestSecret).
func keyDigest(key string) string {
	digestSecret()
	return idem.KeyDigest(idem.Scope(tenant), idem.Key(key))
}

// digestSecret is the secret of the digests under which the replicas'
// logs name keys ($IDEM_KEY_DIGEST_SECRET), this process's too, so that a
// claim's line, which names its key by digest alone, is read as the
// logical payment's. One for the process: the secret is the process's.
var digestSecret = sync.OnceValue(func() string {
	s := "torture_digest_" + crand.Text()
	if err := idem.SetKeyDigestSecret([]byte(s)); err != nil {
		panic(err) // a fixed prefix and 26 random characters: long enough
	}
	return s
})

func (r *run) noteFailedLocked(payment string, at time.Time) {
	if r.failedResumes == nil {
		r.failedResumes = map[string][]time.Time{}
	}
	r.failedResumes[payment] = append(r.failedResumes[payment], at)
}

// countFrom counts an abandoned payment whose bound counted from last, a
// failed resume of one of its payments ids or a failed claim of its key
// (digest): one seen to fail, or one cut off by its replica's death
// (Report.FromFailedResume).
func (r *run) countFrom(ids []string, digest string, last time.Time) {
	r.failedMu.Lock()
	defer r.failedMu.Unlock()
	for _, id := range ids {
		for _, at := range r.cutOff[id] {
			if at.Equal(last) {
				r.fromCutOff++
				return
			}
		}
	}
	for _, at := range r.cutOffClaims[digest] {
		if at.Equal(last) {
			r.fromCutOff++
			return
		}
	}
	for _, at := range r.failedClaims[digest] {
		if at.Equal(last) {
			r.fromFailedClaim++
			return
		}
	}
	r.fromFailed++
}

// failedResumesOf returns when the completers' resumes of the payments
// ids failed.
func (r *run) failedResumesOf(ids []string) []time.Time {
	r.failedMu.Lock()
	defer r.failedMu.Unlock()
	var out []time.Time
	for _, id := range ids {
		out = append(out, r.failedResumes[id]...)
	}
	return out
}

// reviveExited starts again every replica that ended by itself and is
// still down once the load is over: one that a crash-after-charge fault
// made SIGKILL itself in the load's last moments, which the revive loop,
// stopped with the load, left down. It first waits on the exit of each
// replica a try asking for a crash got no answer from
// (awaitUnansweredCrashes), so that a process that died before the
// load's end is counted even when its exit is observed after it. The
// checks ask every replica.
func (r *run) reviveExited(ctx context.Context) error {
	r.awaitUnansweredCrashes(ctx)
	r.chaos.Lock()
	defer r.chaos.Unlock()
	for i, rp := range r.replicas {
		select {
		case <-rp.exited():
		default:
			continue
		}
		r.selfExit(rp)
		r.proxies[i].setUpstream("")
		if err := rp.start(ctx); err != nil {
			return fmt.Errorf("torture: restarting after a crash: %w", err)
		}
		r.proxies[i].setUpstream(rp.baseURL())
	}
	return nil
}

// awaitCompleters waits, once the load is over, until no key is in flight
// with a recovery point: every execution that stopped after its point
// (the abandoned payments, whose clients never came back) has been finished
// by a replica's completer. It returns how long the wait took, and how
// many keys were still unfinished when completerBound passed.
func (r *run) awaitCompleters(ctx context.Context) (time.Duration, int, error) {
	db, err := r.openRunDB(ctx)
	if err != nil {
		return 0, 0, err
	}
	defer db.close(ctx)
	const pending = `SELECT count(*) FROM %sidem_keys WHERE state = 'in_flight' AND recovery_point IS NOT NULL`
	started := time.Now()
	deadline := started.Add(r.completerBound())
	for {
		var n int
		if err := db.each(ctx, pending, func(scan func(...any) error) error { return scan(&n) }); err != nil {
			return 0, 0, err
		}
		if n == 0 || time.Now().After(deadline) {
			return time.Since(started), n, nil
		}
		t := time.NewTimer(100 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return 0, 0, ctx.Err()
		case <-t.C:
		}
	}
}

// slowestCompletion is the longest time from an abandoned payment's client
// giving up to its key's completion (by a completer, since nobody else
// asked), among those completed, and how many were finished after their
// finishDeadline, counted from the key's last holder's end
// (lastHolderGone).
func (r *run) slowestCompletion(ctx context.Context) (slowest time.Duration, late int, err error) {
	gaveUp := map[string]time.Time{}
	for _, lp := range r.payments {
		lp.mu.Lock()
		if lp.abandoned && !lp.gaveUpAt.IsZero() {
			gaveUp[lp.key] = lp.gaveUpAt
		}
		lp.mu.Unlock()
	}
	// The payments' IDs by key, which the completers' failures name.
	rows, _, err := r.readDB(ctx)
	if err != nil {
		return 0, 0, err
	}
	ids := map[string][]string{}
	for _, p := range rows {
		ids[p.description] = append(ids[p.description], p.id)
	}
	db, err := r.openRunDB(ctx)
	if err != nil {
		return 0, 0, err
	}
	defer db.close(ctx)
	var mismatch error
	err = db.each(ctx, `SELECT key, completed_at FROM %sidem_keys WHERE scope = $1 AND state = 'completed'`,
		func(scan func(...any) error) error {
			var key string
			var at time.Time
			if db.pg != nil {
				if err := scan(&key, &at); err != nil {
					return err
				}
			} else {
				var nanos int64 // SQLite keeps unix nanoseconds
				if err := scan(&key, &nanos); err != nil {
					return err
				}
				at = time.Unix(0, nanos)
			}
			if t, ok := gaveUp[key]; ok {
				slowest = max(slowest, at.Sub(t))
				digest := keyDigest(key)
				if err := r.checkDigest(ids[key], digest); err != nil && mismatch == nil {
					mismatch = err
				}
				gone := lastHolderGone(t, append(r.failedResumesOf(ids[key]), r.failedClaimsOf(digest)...), at)
				if gone.After(t) {
					r.countFrom(ids[key], digest, gone)
				}
				if d, ok := r.finishDeadline(gone); ok && at.After(d) {
					late++
					r.late = append(r.late, lateFinish{key: key, digest: digest, payments: ids[key], died: t, gone: gone, deadline: d, done: at})
				}
			}
			return nil
		}, tenant)
	if err == nil {
		err = mismatch
	}
	return slowest, late, err
}

// runDB reads the run's database, PostgreSQL or SQLite, over one
// connection for as long as it is open.
type runDB struct {
	pg     *pgx.Conn
	lite   *idemsqlite.DB
	prefix string // the tables' schema, with its dot, on PostgreSQL
}

func (r *run) openRunDB(ctx context.Context) (*runDB, error) {
	if r.schema != "" {
		conn, err := pgx.Connect(ctx, r.pgURL)
		if err != nil {
			return nil, fmt.Errorf("torture: reading the database: %w", err)
		}
		return &runDB{pg: conn, prefix: pgx.Identifier{r.schema}.Sanitize() + "."}, nil
	}
	db, err := idemsqlite.Open(r.sqlite, nil)
	if err != nil {
		return nil, fmt.Errorf("torture: reading the database: %w", err)
	}
	return &runDB{lite: db}, nil
}

func (d *runDB) close(ctx context.Context) {
	if d.pg != nil {
		d.pg.Close(context.WithoutCancel(ctx))
		return
	}
	d.lite.Close()
}

// each runs q, whose %s is the tables' prefix, and calls row for every row
// with the row's Scan.
func (d *runDB) each(ctx context.Context, q string, row func(scan func(...any) error) error, args ...any) error {
	q = fmt.Sprintf(q, d.prefix)
	if d.pg != nil {
		rows, err := d.pg.Query(ctx, q, args...)
		if err != nil {
			return fmt.Errorf("torture: reading the database: %w", err)
		}
		defer rows.Close()
		for rows.Next() {
			if err := row(rows.Scan); err != nil {
				return fmt.Errorf("torture: reading the database: %w", err)
			}
		}
		if err := rows.Err(); err != nil {
			return fmt.Errorf("torture: reading the database: %w", err)
		}
		return nil
	}
	rows, err := d.lite.Reader().QueryContext(ctx, q, args...)
	if err != nil {
		return fmt.Errorf("torture: reading the database: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		if err := row(rows.Scan); err != nil {
			return fmt.Errorf("torture: reading the database: %w", err)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("torture: reading the database: %w", err)
	}
	return nil
}

// lateFinish is an abandoned payment finished after its finishDeadline.
type lateFinish struct {
	key, digest string
	payments    []string
	// died is when its client's try gave up, gone its last holder's end
	// (lastHolderGone), deadline when it had to be finished by, done when
	// it was.
	died, gone, deadline, done time.Time
}

// Bounds on what a late finish's violation shows.
const (
	maxLateShown     = 3
	maxTimelineLines = 40
)

// lateTimelines tells, for the latest of the late finishes (at most
// maxLateShown), what happened to each from its client's try's death to
// its finish: the lease's end, each replica's lives, and its completers'
// resumes and troubles, in time order, relative to the death.
func (r *run) lateTimelines() string {
	late := slices.Clone(r.late)
	slices.SortFunc(late, func(a, b lateFinish) int {
		return cmp.Compare(b.done.Sub(b.deadline), a.done.Sub(a.deadline))
	})
	var b strings.Builder
	for i, lf := range late {
		if i == maxLateShown {
			fmt.Fprintf(&b, "\n(and %d more late)", len(late)-i)
			break
		}
		b.WriteString("\n")
		b.WriteString(r.lateTimeline(lf))
	}
	return b.String()
}

func (r *run) lateTimeline(lf lateFinish) string {
	rel := func(t time.Time) string {
		d := t.Sub(lf.died).Round(time.Millisecond)
		if d < 0 {
			return d.String()
		}
		return "+" + d.String()
	}
	var evs []event
	add := func(at time.Time, what string) { evs = append(evs, event{at: at, what: what}) }
	add(lf.died, "its client's try gave up (its replica SIGKILLed itself)")
	add(lf.died.Add(r.cfg.KeyLease), "its holder's lease ended, at the latest")
	add(lf.gone, "its last holder's end, which the bound counts from")
	add(lf.deadline, "its deadline")
	add(lf.done, "finished")
	from, to := lf.died.Add(-completerEvery), lf.done
	for _, rp := range r.replicas {
		rp.mu.Lock()
		for _, u := range rp.ups {
			if !u.from.Before(from) && !u.from.After(to) {
				add(u.from, rp.name()+" up")
			}
			if !u.to.IsZero() && !u.to.Before(from) && !u.to.After(to) {
				add(u.to, rp.name()+" down")
			}
		}
		rp.mu.Unlock()
	}
	r.failedMu.Lock()
	for _, id := range lf.payments {
		for _, e := range r.timeline[id] {
			add(e.at, e.lf.String()+": "+id+": "+e.what)
		}
	}
	for _, e := range r.timeline[lf.digest] {
		if lf.digest != "" {
			add(e.at, e.lf.String()+": "+e.what)
		}
	}
	for _, e := range r.unnamed {
		if !e.at.Before(from) && !e.at.After(to) {
			add(e.at, e.lf.String()+": "+e.what)
		}
	}
	r.failedMu.Unlock()
	slices.SortStableFunc(evs, func(a, b event) int { return a.at.Compare(b.at) })
	var b strings.Builder
	fmt.Fprintf(&b, "payment %s (key %s): finished %s after its client's try gave up at %s, %s past its deadline:",
		strings.Join(lf.payments, ", "), lf.key, lf.done.Sub(lf.died).Round(time.Millisecond),
		lf.died.Format("15:04:05.000"), lf.done.Sub(lf.deadline).Round(time.Millisecond))
	for i, e := range evs {
		if i == maxTimelineLines {
			fmt.Fprintf(&b, "\n  (%d more)", len(evs)-i)
			break
		}
		fmt.Fprintf(&b, "\n  %9s %s", rel(e.at), e.what)
	}
	return b.String()
}
