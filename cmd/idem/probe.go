package main

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/idem-go/idem/idemprobe"
)

func (a *app) probeCmd() *cobra.Command {
	var (
		cfg     idemprobe.Config
		body    string
		headers []string
		asJSON  bool
		junit   string
		draft   bool
	)
	cmd := &cobra.Command{
		Use:   "probe URL",
		Short: "Check from outside whether any endpoint honours idempotency keys",
		Long: `Send an endpoint the requests that tell whether its idempotency keys work, and
print a report card: one line per check (✓ pass, ✗ fail, – not applicable,
! could not run), each naming where its rule comes from, then the requests
and answers of every check that did not pass.

  1 concurrent duplicates (--concurrency at once, one key) run once
  2 sequential duplicates are replayed
  3 the same key with another body is refused with 422
  4 a missing key is refused with 400 (not applicable when the endpoint does
    not require keys); a malformed key is refused with 400
  5 a retry after a lost response gets the first execution's answer
  6 replays carry no Set-Cookie
  7 a 5xx is not kept, the retry with its key runs again: one the probe
    causes with --fault-header (which must make the endpoint answer 5xx), or
    one met on the way
  8 with --slow-header (which must hold the request in flight): a duplicate
    waits for the first's answer or gets 409 with Retry-After
  9 with --as-other (a second credential): a key the first credential used
    never gives the other one its answer
 10 with --revocable and --revoke (a credential, and the request that revokes
    it): after the revocation, the key's replay is refused with 401 or 403
 11 with --ttl (how long the endpoint keeps a key): after it, the key runs
    anew or is refused, and the report says which
 12 with --history N: N requests under --history-keys keys from
    --history-clients clients at once, with duplicates, hung-up connections
    and mismatched bodies; Porcupine checks that every key ran once and
    every answer under it is its first execution's or a refusal. A history
    that is not linearizable is saved as Porcupine's HTML view, and named

When the first request is refused, the probe sends it again with the same
key, then with a fresh one, and reports what it saw: a 5xx replayed to the
retry fails check 7 even without --fault-header; an endpoint that accepts
none of them leaves the other checks not run. Check 7 also retries, with its
key, a 5xx any other check met on the way.

Each check names its source: the sections of the IETF draft
draft-ietf-httpapi-idempotency-key-header-07, Stripe's or Adyen's documented
behaviour, or idem's contract. Where idem differs from the draft (a duplicate
in flight waits for the first answer, within a bound, before 409; the draft
says 409), checks 1 and 8 accept either; --strict holds a duplicate in
flight to the draft's 409 (check 8, and --draft's). --draft adds the draft's core behaviours as checks 13 to 20,
each citing its section. --replay-header names the header that marks a
replay, for a server that sends another than Idempotent-Replayed.

The checks are those of the Go package github.com/idem-go/idem/idemprobe,
whose Test runs each as a subtest of a go test, against a handler served
in-process.

Executions are told apart by the answers (a top-level "id" in the JSON body,
or Location) and, with --count URL, by reading the effect before and after
each check: a GET answering a JSON list, an object with a "data" list, or a
number. --body takes a string or @file; every {{n}} in it becomes a counter,
one value per logical operation, for APIs that refuse two operations with the
same content.

The probe sends at most --max-requests requests in all (200, plus
--history's) and ends within --timeout. It refuses a host that is not
loopback (127.0.0.0/8, ::1, localhost) unless --allow-remote. It never prints
a credential: the values of Authorization, Cookie, --as-other, --revocable
and every --secret-header are shown as xxxxx.

  idem probe --body @payment.json --header "Authorization: Bearer KEY" \
      --count 'http://127.0.0.1:8080/v1/accounts/ACCT/payments?limit=1000' \
      --fault-header 'Idem-Fault: fail-before-commit' --slow-header 'Idem-Fault: delay=2s' \
      http://127.0.0.1:8080/v1/payments

--json prints the report as JSON instead of text; --junit FILE also writes
it as JUnit XML, one test case per check (failed: <failure>; could not
finish: <error>; not applicable or not run: <skipped>), for a CI pipeline.

Exit status: 0 when every applicable check passes; 1 when a check fails;
2 when the probe could not run (a usage error, a target refused, an endpoint
that accepts none of its requests, a check that could not finish) and none
failed.`,
		Args: cobra.ExactArgs(1),
	}
	fl := cmd.Flags()
	fl.StringVar(&cfg.Method, "method", http.MethodPost, "the request's method")
	fl.StringVar(&body, "body", "", "the request body, or @FILE to read it from FILE; {{n}} becomes a counter per operation")
	fl.StringArrayVar(&headers, "header", nil, "a header sent with every request, 'Name: value' (repeatable)")
	fl.StringArrayVar(&cfg.SecretHeaders, "secret-header", nil, "a header whose value is never printed, besides Authorization and Cookie (repeatable)")
	fl.StringVar(&cfg.KeyHeader, "key-header", "Idempotency-Key", "the idempotency key's header")
	fl.StringVar(&cfg.CountURL, "count", "", "a URL whose GET counts the effect (a JSON list, an object with a \"data\" list, or a number)")
	fl.StringVar(&cfg.FaultHeader, "fault-header", "", "a header, 'Name: value', that makes the endpoint answer 5xx with no effect (enables check 7)")
	fl.StringVar(&cfg.SlowHeader, "slow-header", "", "a header, 'Name: value', that holds the request in flight (enables check 8)")
	fl.DurationVar(&cfg.HeadStart, "head-start", 200*time.Millisecond, "how long check 8's slow request runs before its duplicate is sent")
	fl.IntVar(&cfg.Concurrency, "concurrency", 8, "duplicates sent at once by check 1")
	fl.StringVar(&cfg.OtherHeader, "as-other", "", "a second credential, 'Name: value', sent instead of the --header of the same name (enables check 9)")
	fl.StringVar(&cfg.RevocableHeader, "revocable", "", "a credential, 'Name: value', that --revoke revokes (with --revoke, enables check 10)")
	fl.StringVar(&cfg.Revoke, "revoke", "", "the request, 'METHOD URL', that revokes the credential it is sent with (--revocable)")
	fl.DurationVar(&cfg.TTL, "ttl", 0, "how long the endpoint keeps a key; the probe waits it out (enables check 11)")
	fl.IntVar(&cfg.History, "history", 0, "requests in a concurrent history checked by Porcupine (enables check 12)")
	fl.IntVar(&cfg.HistoryKeys, "history-keys", 0, "keys the history's requests share (default --history/4)")
	fl.IntVar(&cfg.HistoryClients, "history-clients", 8, "clients sending the history's requests at once")
	fl.Uint64Var(&cfg.HistorySeed, "history-seed", 0, "seed of the history's choices, to send a failing one again (default random, printed)")
	fl.StringVar(&cfg.HistoryDir, "history-dir", "", "where a history that is not linearizable is saved (default the temporary directory)")
	fl.IntVar(&cfg.MaxRequests, "max-requests", 0, "the most requests sent in all, count reads included (default 200, plus --history and two count reads)")
	fl.DurationVar(&cfg.Timeout, "timeout", 60*time.Second, "the longest the whole probe may take")
	fl.BoolVar(&cfg.AllowRemote, "allow-remote", false, "probe a host that is not loopback")
	fl.StringVar(&cfg.ReplayHeader, "replay-header", "Idempotent-Replayed", "the response header that marks a replay when it is \"true\"")
	fl.BoolVar(&cfg.Strict, "strict", false, "a duplicate in flight must get 409, as the draft words it, not wait for the first's answer")
	fl.BoolVar(&draft, "draft", false, "also run the IETF draft's core behaviours, each citing its section (checks 13 to 20)")
	fl.BoolVar(&asJSON, "json", false, "print the report as JSON")
	fl.StringVar(&junit, "junit", "", "also write the report as JUnit XML to FILE")
	cmd.RunE = a.action(func(cmd *cobra.Command, args []string) error {
		cfg.URL = args[0]
		if cfg.Concurrency < 2 || cfg.MaxRequests < 0 || (cmd.Flags().Changed("max-requests") && cfg.MaxRequests < 1) ||
			cfg.Timeout <= 0 || cfg.HeadStart <= 0 {
			return &usageError{errors.New("--concurrency must be at least 2, and --max-requests, --timeout and --head-start positive")}
		}
		if cfg.TTL < 0 || cfg.History < 0 || cfg.HistoryKeys < 0 || cfg.HistoryClients < 1 {
			return &usageError{errors.New("--ttl, --history and --history-keys must not be negative, and --history-clients must be positive")}
		}
		if (cfg.RevocableHeader == "") != (cfg.Revoke == "") {
			return &usageError{errors.New("--revocable and --revoke go together")}
		}
		if file, ok := strings.CutPrefix(body, "@"); ok {
			b, err := os.ReadFile(file)
			if err != nil {
				return &usageError{fmt.Errorf("--body: %w", err)}
			}
			body = string(b)
		}
		cfg.Body = body
		if draft {
			cfg.Cases = idemprobe.DraftCases()
		}
		cfg.Header = http.Header{}
		for _, h := range headers {
			name, value, err := idemprobe.ParseHeader(h)
			if err != nil {
				return &usageError{fmt.Errorf("--header: %w", err)}
			}
			cfg.Header.Add(name, value)
		}
		rep, err := idemprobe.Run(cmd.Context(), &cfg)
		switch {
		case errors.Is(err, idemprobe.ErrRemote):
			return &usageError{fmt.Errorf("%w; give --allow-remote to probe it", err)}
		case errors.Is(err, idemprobe.ErrInvalidConfig):
			return &usageError{err}
		case err != nil:
			return err
		}
		if asJSON {
			err = rep.WriteJSON(a.stdout)
		} else {
			err = rep.WriteText(a.stdout)
		}
		if err != nil {
			return err
		}
		if junit != "" {
			if err := writeJUnit(junit, rep); err != nil {
				return err
			}
		}
		switch rep.Outcome() {
		case idemprobe.OutcomeFail:
			return &silentError{errors.New("a check did not pass")}
		case idemprobe.OutcomeNotRun:
			// Not the endpoint's fault as far as anyone can tell: the
			// exit status a pipeline reads as "could not run", not "broken".
			return &statusError{exitUsage, errors.New("the probe could not run every check: see the report")}
		}
		return nil
	})
	return cmd
}

// writeJUnit writes rep as JUnit XML to file.
func writeJUnit(file string, rep *idemprobe.Report) error {
	f, err := os.Create(file)
	if err != nil {
		return fmt.Errorf("--junit: %w", err)
	}
	if err := rep.WriteJUnit(f); err != nil {
		f.Close()
		return fmt.Errorf("--junit: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("--junit: %w", err)
	}
	return nil
}
