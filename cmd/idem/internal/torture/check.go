package torture

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-go/idem/cmd/idem/internal/acquirer"
	"github.com/idem-go/idem/cmd/idem/internal/payments"
	"github.com/idem-go/idem/idemsqlite"
)

// maxViolationsShown bounds the violations a report lists one by one.
const maxViolationsShown = 50

// dbPayment is one payment row as the database has it.
type dbPayment struct {
	id, account, description string
	amount                   int64
	chargeID                 string // the card network's charge, with Config.Acquirer
}

// check verifies the promise from the database and from the API, and
// returns the report.
func (r *run) check(ctx context.Context, elapsed time.Duration) (*Report, error) {
	ctx, cancel := context.WithTimeout(ctx, phaseTimeout)
	defer cancel()
	rows, balances, err := r.readDB(ctx)
	if err != nil {
		return nil, err
	}
	rep := &Report{
		Name:            "torture-requests-" + r.label,
		Seed:            r.cfg.Seed,
		Replicas:        len(r.replicas),
		Dups:            r.cfg.Dups,
		LogicalPayments: len(r.payments),
		Attempts:        r.attempts.Load(),
		LostResponses:   r.lost(),
		NoAnswer:        r.noAnswer.Load(),
		Retried:         r.retried.Load(),
		Kills:           r.kills.Load(),
		StoreResets:     r.storeCount(func(p *storeProxy) int64 { return p.resets.Load() }),
		CommitCuts:      r.storeCount(func(p *storeProxy) int64 { return p.cuts.Load() }),
		StoreOutages:    r.storeCount(func(p *storeProxy) int64 { return p.outages.Load() }),
		StoreRestarts:   r.restarts.Load(),
		Crashes:         r.crashes.Load(),
		Payments:        len(rows),
		Elapsed:         elapsed,
	}
	violate := func(format string, args ...any) {
		rep.Violations = append(rep.Violations, fmt.Sprintf(format, args...))
	}
	if r.stall != "" {
		violate("the load stalled: %s (%s without a logical payment completing; seed %d)", r.stall, r.cfg.Timeout, r.cfg.Seed)
	}

	byKey := map[string][]dbPayment{}
	byID := map[string]dbPayment{}
	for _, p := range rows {
		byKey[p.description] = append(byKey[p.description], p)
		byID[p.id] = p
	}
	rep.CompleterWait = r.completerWait
	rep.SlowestFinish = r.slowestFinish
	if r.cfg.Abandon > 0 {
		rep.FinishBound = r.finishBound()
		r.failedMu.Lock()
		rep.FromFailedResume, rep.FromCutOffResume, rep.FromFailedClaim = r.fromFailed, r.fromCutOff, r.fromFailedClaim
		r.failedMu.Unlock()
	}
	if r.lateFinishes > 0 {
		violate("%d abandoned payments were finished more than the completers' bound (%s) after their last holder died (or a completer's resume or claim of them failed, or a replica's round gave up) and a replica was up; the slowest took %s%s",
			r.lateFinishes, r.finishBound(), r.slowestFinish.Round(time.Millisecond), r.lateTimelines())
	}
	r.exitsMu.Lock()
	if n := len(r.unexpectedExits); n > 0 {
		shown := r.unexpectedExits[:min(n, maxLateShown)]
		violate("%d replicas ended by themselves other than by a crash fault's SIGKILL (each was started again): %s",
			n, strings.Join(shown, "; "))
	}
	r.exitsMu.Unlock()
	if r.unfinished > 0 {
		violate("%d executions stopped after a recovery point were still unfinished %s after the load (the completers' bound)",
			r.unfinished, r.completerBound())
	}
	known := map[string]bool{}
	for _, lp := range r.payments {
		known[lp.key] = true
		if lp.abandoned {
			// Its client gave up after one try. The completer ends it:
			// charged once and recorded (it owes its amount then), or,
			// when the try stopped before its recovery point, neither
			// (checkCharges finds a charge without its payment).
			rep.Abandoned++
			if len(byKey[lp.key]) == 0 {
				continue
			}
			rep.AbandonedFinished++
			rep.MoneyOwed += lp.amount
			if ids := answeredIDs(lp); len(ids) == 1 && ids[0] != byKey[lp.key][0].id {
				violate("key %s: answered with payment %s, the database has %s", lp.key, ids[0], byKey[lp.key][0].id)
			}
			if len(byKey[lp.key]) > 1 {
				violate("key %s: %d payments in the database for one logical payment: %s", lp.key, len(byKey[lp.key]), paymentIDs(byKey[lp.key]))
			}
			continue
		}
		rep.MoneyOwed += lp.amount
		if len(lp.answers) == rep.Dups {
			rep.Answered++
		}
		for _, u := range lp.unexpected {
			violate("key %s: an attempt was answered %s", lp.key, u)
		}
		if n := len(lp.answers) + len(lp.unexpected); n < rep.Dups {
			violate("key %s: %d of its %d attempts got no 2xx answer before the timeout (%s without a logical payment completing)",
				lp.key, rep.Dups-len(lp.answers), rep.Dups, r.cfg.Timeout)
		}
		ids := answeredIDs(lp)
		if len(ids) > 1 {
			violate("key %s: its answers carry %d different payment ids: %s", lp.key, len(ids), shortList(ids))
		}
		switch stored := byKey[lp.key]; {
		case len(stored) > 1:
			violate("key %s: %d payments in the database for one logical payment: %s", lp.key, len(stored), paymentIDs(stored))
		case len(stored) == 0 && len(lp.answers) > 0:
			violate("key %s: answered 2xx, but no payment in the database", lp.key)
		}
		for _, id := range ids {
			p, ok := byID[id]
			switch {
			case !ok:
				violate("key %s: answered with payment %s, which the database does not have", lp.key, id)
			case p.description != lp.key || p.amount != lp.amount || p.account != lp.account:
				violate("key %s: answered with payment %s, which the database has for %q, account %s, amount %d (want account %s, amount %d)",
					lp.key, id, p.description, p.account, p.amount, lp.account, lp.amount)
			}
		}
	}
	for _, p := range rows {
		if !known[p.description] {
			violate("payment %s: not one of the run's logical payments (description %q)", p.id, p.description)
		}
	}
	for _, id := range r.accounts {
		rep.MoneyTaken += accountBalance - balances[id]
	}
	if rep.MoneyTaken != rep.MoneyOwed {
		violate("the accounts were charged %d in all, in the database; the logical payments owe %d", rep.MoneyTaken, rep.MoneyOwed)
	}

	if r.acquirer != nil {
		if err := r.checkCharges(ctx, rep, byKey, violate); err != nil {
			return nil, err
		}
		if err := r.reconcile(ctx, rep, violate); err != nil {
			return nil, err
		}
	}

	apiTaken, apiViolations, err := r.checkAPI(ctx)
	if err != nil {
		return nil, err
	}
	rep.MoneyTakenAPI = apiTaken
	rep.Violations = append(rep.Violations, apiViolations...)
	if apiTaken != rep.MoneyOwed {
		violate("the accounts were charged %d in all, by the API; the logical payments owe %d", apiTaken, rep.MoneyOwed)
	}
	return rep, nil
}

// answeredIDs is the distinct payment ids of a logical payment's 2xx
// answers, sorted.
func answeredIDs(lp *logical) []string {
	var ids []string
	for _, a := range lp.answers {
		ids = append(ids, a.paymentID)
	}
	slices.Sort(ids)
	return slices.Compact(ids)
}

func paymentIDs(ps []dbPayment) string {
	var ids []string
	for _, p := range ps {
		ids = append(ids, p.id)
	}
	sort.Strings(ids)
	return shortList(ids)
}

// shortList joins ids, the first few of them: a broken run can make
// hundreds per key.
func shortList(ids []string) string {
	const shown = 4
	if len(ids) > shown {
		return strings.Join(ids[:shown], ", ") + fmt.Sprintf(" and %d more", len(ids)-shown)
	}
	return strings.Join(ids, ", ")
}

// readDB reads the tenant's payments and account balances from the
// database itself, not through the service.
func (r *run) readDB(ctx context.Context) ([]dbPayment, map[string]int64, error) {
	const (
		paymentsQuery = `SELECT id, account_id, description, amount, coalesce(charge_id, '') FROM %spayments WHERE tenant = $1`
		accountsQuery = `SELECT id, balance FROM %saccounts WHERE tenant = $1`
	)
	var rows []dbPayment
	balances := map[string]int64{}
	if r.schema != "" {
		conn, err := pgx.Connect(ctx, r.pgURL)
		if err != nil {
			return nil, nil, fmt.Errorf("torture: reading the database: %w", err)
		}
		defer conn.Close(context.WithoutCancel(ctx))
		q := pgx.Identifier{r.schema}.Sanitize() + "."
		pr, err := conn.Query(ctx, fmt.Sprintf(paymentsQuery, q), tenant)
		if err != nil {
			return nil, nil, fmt.Errorf("torture: reading the payments: %w", err)
		}
		for pr.Next() {
			var p dbPayment
			if err := pr.Scan(&p.id, &p.account, &p.description, &p.amount, &p.chargeID); err != nil {
				return nil, nil, fmt.Errorf("torture: reading the payments: %w", err)
			}
			if p.description, err = payments.OpenDescription(r.cfg.BodyKeys, tenant, p.id, p.description); err != nil {
				return nil, nil, fmt.Errorf("torture: reading the payments: %w", err)
			}
			rows = append(rows, p)
		}
		if err := pr.Err(); err != nil {
			return nil, nil, fmt.Errorf("torture: reading the payments: %w", err)
		}
		ar, err := conn.Query(ctx, fmt.Sprintf(accountsQuery, q), tenant)
		if err != nil {
			return nil, nil, fmt.Errorf("torture: reading the accounts: %w", err)
		}
		for ar.Next() {
			var id string
			var balance int64
			if err := ar.Scan(&id, &balance); err != nil {
				return nil, nil, fmt.Errorf("torture: reading the accounts: %w", err)
			}
			balances[id] = balance
		}
		if err := ar.Err(); err != nil {
			return nil, nil, fmt.Errorf("torture: reading the accounts: %w", err)
		}
		return rows, balances, nil
	}

	db, err := idemsqlite.Open(r.sqlite, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("torture: reading the database: %w", err)
	}
	defer db.Close()
	pr, err := db.Reader().QueryContext(ctx, fmt.Sprintf(paymentsQuery, ""), tenant)
	if err != nil {
		return nil, nil, fmt.Errorf("torture: reading the payments: %w", err)
	}
	defer pr.Close()
	for pr.Next() {
		var p dbPayment
		if err := pr.Scan(&p.id, &p.account, &p.description, &p.amount, &p.chargeID); err != nil {
			return nil, nil, fmt.Errorf("torture: reading the payments: %w", err)
		}
		if p.description, err = payments.OpenDescription(r.cfg.BodyKeys, tenant, p.id, p.description); err != nil {
			return nil, nil, fmt.Errorf("torture: reading the payments: %w", err)
		}
		rows = append(rows, p)
	}
	if err := pr.Err(); err != nil {
		return nil, nil, fmt.Errorf("torture: reading the payments: %w", err)
	}
	ar, err := db.Reader().QueryContext(ctx, fmt.Sprintf(accountsQuery, ""), tenant)
	if err != nil {
		return nil, nil, fmt.Errorf("torture: reading the accounts: %w", err)
	}
	defer ar.Close()
	for ar.Next() {
		var id string
		var balance int64
		if err := ar.Scan(&id, &balance); err != nil {
			return nil, nil, fmt.Errorf("torture: reading the accounts: %w", err)
		}
		balances[id] = balance
	}
	if err := ar.Err(); err != nil {
		return nil, nil, fmt.Errorf("torture: reading the accounts: %w", err)
	}
	return rows, balances, nil
}

// checkAPI asks the replicas, directly, for every account's balance and
// every answered payment, and returns the money the accounts lost by their
// balances and what disagrees with the run's own record.
func (r *run) checkAPI(ctx context.Context) (taken int64, violations []string, err error) {
	type job struct {
		path string
		lp   *logical // nil for an account
		id   string
	}
	var jobs []job
	for _, id := range r.accounts {
		jobs = append(jobs, job{path: "/v1/accounts/" + id, id: id})
	}
	for _, lp := range r.payments {
		for _, id := range answeredIDs(lp) {
			if id != "" {
				jobs = append(jobs, job{path: "/v1/payments/" + id, lp: lp, id: id})
			}
		}
	}
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
		next = make(chan job)
	)
	for w := range 8 {
		wg.Go(func() {
			for j := range next {
				base := r.replicas[w%len(r.replicas)].baseURL()
				status, body, err := r.get(ctx, base+j.path)
				var got struct {
					ID          string `json:"id"`
					Balance     int64  `json:"balance"`
					AccountID   string `json:"account_id"`
					Amount      int64  `json:"amount"`
					Description string `json:"description"`
				}
				if err == nil && status == http.StatusOK {
					err = json.Unmarshal(body, &got)
				}
				mu.Lock()
				switch {
				case err != nil:
					errs = append(errs, fmt.Errorf("torture: GET %s: %w", j.path, err))
				case status != http.StatusOK:
					violations = append(violations, fmt.Sprintf("GET %s answered %d %s", j.path, status, oneLine(body)))
				case j.lp == nil:
					taken += accountBalance - got.Balance
				case got.Amount != j.lp.amount || got.AccountID != j.lp.account || got.Description != j.lp.key:
					violations = append(violations, fmt.Sprintf("key %s: the API has payment %s for %q, account %s, amount %d (want account %s, amount %d)",
						j.lp.key, j.id, got.Description, got.AccountID, got.Amount, j.lp.account, j.lp.amount))
				}
				mu.Unlock()
			}
		})
	}
	for _, j := range jobs {
		next <- j
	}
	close(next)
	wg.Wait()
	if len(errs) > 0 {
		return 0, nil, errs[0]
	}
	return taken, violations, nil
}

// get reads one resource, retrying a transient failure a few times: the
// checks run without faults, but a replica may still be warming up.
func (r *run) get(ctx context.Context, url string) (status int, body []byte, err error) {
	for try := 0; try < 5; try++ {
		if try > 0 && !r.backoff(ctx, try+3) {
			break
		}
		req, rerr := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if rerr != nil {
			return 0, nil, rerr
		}
		req.Header.Set("Authorization", "Bearer "+r.apiKey)
		status, body, err = r.do(req)
		if err == nil && status < 500 {
			return status, body, nil
		}
	}
	if err == nil {
		err = fmt.Errorf("answered %d %s", status, oneLine(body))
	}
	return status, body, err
}

// storeCount sums a count over the store proxies.
func (r *run) storeCount(count func(*storeProxy) int64) int64 {
	var n int64
	for _, p := range r.stores {
		n += count(p)
	}
	return n
}

// checkCharges counts the card network's charges: each logical payment
// must have been charged once (not counting charges refunded in full),
// with the charge its payment records, and the network must hold no
// charge of anything else.
func (r *run) checkCharges(ctx context.Context, rep *Report, byKey map[string][]dbPayment, violate func(string, ...any)) error {
	net, err := acquirer.NewClient(acquirer.ClientConfig{URL: r.acquirerURL, APIKey: r.acquirerKey, Timeout: phaseTimeout})
	if err != nil {
		return fmt.Errorf("torture: %w", err)
	}
	charges, err := net.Charges(ctx, "")
	if err != nil {
		return fmt.Errorf("torture: reading the card network's charges: %w", err)
	}
	rep.Charges = len(charges)
	charged := map[string][]acquirer.Charge{}
	for _, c := range charges {
		if c.AmountRefunded == c.Amount {
			rep.ChargesRefunded++
			continue
		}
		charged[c.Metadata[payments.MetaKeyDigest]] = append(charged[c.Metadata[payments.MetaKeyDigest]], c)
	}
	known := map[string]bool{}
	for _, lp := range r.payments {
		digest := payments.ClientKeyDigest(tenant, lp.key)
		known[digest] = true
		cs := charged[digest]
		stored := byKey[lp.key]
		switch {
		case len(cs) > 1:
			ids := make([]string, len(cs))
			for i, c := range cs {
				ids[i] = c.ID
			}
			violate("key %s: the card network charged it %d times: %s", lp.key, len(cs), shortList(ids))
		case len(cs) == 0 && len(stored) > 0:
			violate("key %s: payment %s was recorded, but the card network has no charge for it", lp.key, stored[0].id)
		case len(cs) == 1 && len(stored) == 0:
			violate("key %s: the card network charged %d (%s), and no payment records it", lp.key, cs[0].Amount, cs[0].ID)
		case len(cs) == 1 && (stored[0].chargeID != cs[0].ID || cs[0].Amount != lp.amount):
			violate("key %s: payment %s records charge %q; the network charged %d as %s (want %d)",
				lp.key, stored[0].id, stored[0].chargeID, cs[0].Amount, cs[0].ID, lp.amount)
		}
	}
	for key, cs := range charged {
		if !known[key] {
			violate("charge %s: not one of the run's logical payments (idempotency key digest %q)", cs[0].ID, key)
		}
	}
	return nil
}

// reconcile runs `idem reconcile` on the run's database and card network,
// as an operator would, and wants it to find the books in agreement.
func (r *run) reconcile(ctx context.Context, rep *Report, violate func(string, ...any)) error {
	args := []string{"reconcile", "--acquirer", r.acquirerURL}
	if r.schema != "" {
		args = append(args, "--db", r.dbURL, "--pg-schema", r.schema)
	} else {
		args = append(args, "--db", "sqlite:"+r.sqlite)
	}
	cmd := exec.CommandContext(ctx, r.cfg.Executable, args...)
	cmd.Env = append(slices.Clone(r.cfg.Env), envAcquirerKey+"="+r.acquirerKey)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	switch {
	case err == nil:
		rep.Reconciled = true
	case errors.As(err, &exit) && exit.ExitCode() == 1 && bytes.Contains(out, []byte("the books do not agree")):
		rep.Reconciled = true
		rep.Differences = bytes.Count(out, []byte("DIFFERENCE "))
		violate("idem reconcile found %d differences between the payments and the card network's charges: %s",
			rep.Differences, oneLine(out))
	default:
		return fmt.Errorf("torture: idem reconcile: %w: %s", err, oneLine(out))
	}
	return nil
}
