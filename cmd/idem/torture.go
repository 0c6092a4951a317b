package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/idem-go/idem/cmd/idem/internal/torture"
)

func (a *app) tortureCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "torture",
		Short: "Put idem's promise under load and faults, and check it held",
		Long: `Put idem's promise under load and faults, and check from the database and the
API that it held. 'idem torture requests' tortures the request half, 'idem
torture messages' the message half.`,
		Args: cobra.NoArgs,
	}
	cmd.AddCommand(a.tortureRequestsCmd(), a.tortureMessagesCmd(), a.tortureMessagesWorkerCmd())
	return cmd
}

func (a *app) tortureRequestsCmd() *cobra.Command {
	var c torture.Config
	var dropRate float64
	cmd := &cobra.Command{
		Use:   "requests",
		Short: "Duplicate payments through lost responses and killed replicas: exactly one charge each?",
		Long: `Start --replicas replicas of 'idem serve' (child processes of this binary) on
one database, each behind a fault proxy of its own that drops --drop of the
answers after the replica sent them. Clients send --payments logical
payments, each attempted --dups times with one Idempotency-Key (half of them
at once, the rest after), to random replicas, and retry every attempt that
got no answer, a 409 or a 5xx; every --kill-every a random replica is
SIGKILLed and started again. The load lasts until every logical payment has
its answers, or until none has completed for --timeout: a slow or busy
machine makes a run longer, not failed, and a stuck one still ends.

Then it checks, from the database itself and from the API, that there is one
payment per logical payment, that the accounts were charged exactly the sum
of the logical payments, that every attempt got a 2xx and that every answer
for one key carries the same payment. It prints the figures as a table and
as lines RESULT,torture-requests-<db>,<metric>,<value>,<unit>, lists every
violation by key and payment, and exits 0 only when the promise held.

--db is a SQLite file in a temporary directory by default, or a PostgreSQL
URL, in which the run uses a fresh schema; --keys redis://… puts the keys in
Redis under a prefix of the run's own. --db private and --keys private start
a PostgreSQL and a Redis server of the run's own instead (initdb and postgres,
redis-server), on free ports, with their data in the temporary directory;
--keys private-volatile starts a Redis that keeps nothing on disk, as one run
as a cache does. With them, --restart-stores-every SIGKILLs one of them, at
random, that long after the last came back, and starts it again on the
same data (a volatile Redis comes back empty), never while a replica
restarts or a store outage lasts; each private store is also restarted
once (two restarts at least), and a replica killed once, at a payment of
the first half drawn from the seed. Only these private servers are ever restarted, never one
that others share. All of it is deleted afterwards, and every replica and
server stopped, on failure and Ctrl-C too. Everything listens on 127.0.0.1
only.

  idem torture requests --payments 12500 --dups 8 --replicas 3
  idem torture requests --db postgres://postgres@127.0.0.1:5432/test --keys redis://127.0.0.1:6379/0
  idem torture requests --db postgres://postgres@127.0.0.1:5432/test --commit-cuts 0.05 --store-resets 0.001 --store-latency 2ms
  idem torture requests --db private --keys private --restart-stores-every 10s
  idem torture requests --acquirer private --payments 10000

--acquirer private starts a card network of the run's own (idem acquirer,
refusing or dropping --acquirer-fault-rate of its answers at random); the
replicas charge every payment there, --crash-after-charge of the attempts
make their replica SIGKILL itself between the network's charge and the
payment's commit, and the checks count the network's charges: exactly one
per logical payment, the one its payment records. With --abandon, a share
of the payments' clients send one attempt, which crashes its replica after
the charge, and never come back: the replicas' completers must finish each
(charged once and recorded) within their bound after the load, with no
client asking.

  idem torture requests --acquirer private --abandon 0.5 --payments 2000`,
		Args: cobra.NoArgs,
	}
	fl := cmd.Flags()
	fl.StringVar(&c.DB, "db", "sqlite", "database: sqlite (a temporary file), postgres://USER@HOST/DB (a fresh schema) or private (a PostgreSQL server of the run's own)")
	fl.StringVar(&c.Keys, "keys", "", "keep the idempotency keys in Redis: redis://HOST:PORT/DB (a prefix of the run's own), private (a Redis server of the run's own) or private-volatile (one that keeps nothing on disk, and forgets every key when restarted); default: in --db")
	fl.DurationVar(&c.RestartStoresEvery, "restart-stores-every", 0, "SIGKILL a random private store (--db private, --keys private) this long after the last came back, and start it again; each is also restarted once at a payment drawn from the seed (0 for never)")
	fl.IntVar(&c.Payments, "payments", torture.DefaultPayments, "logical payments")
	fl.IntVar(&c.Dups, "dups", torture.DefaultDups, "attempts of each logical payment, with the same key and body")
	fl.IntVar(&c.Replicas, "replicas", torture.DefaultReplicas, "replicas of idem serve")
	fl.IntVar(&c.Clients, "clients", torture.DefaultClients, "logical payments worked on at once")
	fl.Float64Var(&dropRate, "drop", torture.DefaultDropRate, "fraction of answers the fault proxies drop after the replica sent them (0 for none)")
	fl.DurationVar(&c.KillEvery, "kill-every", torture.DefaultKillEvery, "time between two SIGKILLs of a random replica (0 for none)")
	fl.DurationVar(&c.Timeout, "timeout", torture.DefaultTimeout, "longest the load may go without a logical payment completing (all its attempts answered): it ends then, and every logical payment still unanswered is a violation; a slow run that keeps completing payments may take longer")
	fl.DurationVar(&c.KeyLease, "key-lease", torture.DefaultKeyLease, "the replicas' --key-lease: how long a killed execution holds its key in Redis")
	fl.StringVar(&c.Acquirer, "acquirer", "", "private: put a card network of the run's own (idem acquirer, faults on) between the payments and their money, and count its charges: one per logical payment")
	fl.Float64Var(&c.AcquirerFaultRate, "acquirer-fault-rate", torture.DefaultAcquirerFaultRate, "with --acquirer, the share of charges the network refuses (503) or whose answer it drops after charging (negative for none)")
	fl.Float64Var(&c.CrashAfterCharge, "crash-after-charge", torture.DefaultCrashAfterCharge, "with --acquirer, the share of attempts that make their replica SIGKILL itself after the charge, before the commit (negative for none)")
	fl.Float64Var(&c.Abandon, "abandon", 0, "with --acquirer, the share of logical payments whose client sends one attempt asking for crash-after-charge and never comes back: only the replicas' completers finish them, and the run waits for that")
	fl.Uint64Var(&c.Seed, "seed", 0, "seed of the run's choices (0 for a random one, printed first and in the report)")
	var replicaLog string
	fl.StringVar(&replicaLog, "replica-log", "", "write every line the replicas log, warnings included, to this file")
	var sf torture.StoreFaults
	fl.DurationVar(&sf.Latency, "store-latency", 0, "delay each chunk between the replicas and their stores by up to this (through a proxy of the run's own)")
	fl.Float64Var(&sf.ResetRate, "store-resets", 0, "chance that a chunk between a replica and its store resets the connection instead")
	fl.DurationVar(&sf.OutageEvery, "store-outage-every", 0, "take a random store down (every connection reset, new ones refused) this often; no replica restarts meanwhile")
	fl.DurationVar(&sf.OutageFor, "store-outage-for", time.Second, "how long each store outage lasts")
	fl.Float64Var(&sf.CommitCutRate, "commit-cuts", 0, "chance that a COMMIT is passed on to PostgreSQL and the replica's connection then cut before the answer: the ambiguous commit")
	fl.BoolVar(&c.Unsafe, "unsafe-no-idempotency", false, "run the replicas in unsafe mode, which must fail the check (the torture's own test)")
	cmd.RunE = a.action(func(cmd *cobra.Command, _ []string) error {
		switch {
		case c.Payments < 1 || c.Dups < 1 || c.Replicas < 1 || c.Clients < 1:
			return &usageError{errors.New("--payments, --dups, --replicas and --clients must be positive")}
		case dropRate < 0 || dropRate >= 1:
			return &usageError{fmt.Errorf("--drop must be at least 0 and below 1, got %g", dropRate)}
		case c.KillEvery < 0 || c.Timeout <= 0 || c.KeyLease <= 0 || c.RestartStoresEvery < 0:
			return &usageError{errors.New("--kill-every and --restart-stores-every must not be negative; --timeout and --key-lease must be positive")}
		case c.RestartStoresEvery > 0 && c.DB != torture.Private && c.Keys != torture.Private && c.Keys != torture.PrivateVolatile:
			return &usageError{errors.New("--restart-stores-every needs --db private or --keys private: the run restarts only servers it started itself, never one that others share")}
		}
		if c.DB != "sqlite" && c.DB != torture.Private {
			if t, err := parseDB(c.DB); err != nil || !t.postgres {
				return &usageError{errors.New("--db must be sqlite, private or postgres://USER@HOST/DB")}
			}
		}
		if c.Keys != "" && c.Keys != torture.Private && c.Keys != torture.PrivateVolatile {
			if _, err := parseKeys(c.Keys); err != nil {
				return &usageError{err}
			}
		}
		if sf.Latency < 0 || sf.ResetRate < 0 || sf.ResetRate >= 1 || sf.CommitCutRate < 0 || sf.CommitCutRate >= 1 || sf.OutageEvery < 0 || sf.OutageFor <= 0 {
			return &usageError{errors.New("--store-latency and --store-outage-every must not be negative, --store-outage-for must be positive; --store-resets and --commit-cuts must be at least 0 and below 1")}
		}
		if sf.OutageEvery == 0 {
			sf.OutageFor = 0
		}
		if sf != (torture.StoreFaults{}) {
			if c.DB == "sqlite" && c.Keys == "" {
				return &usageError{errors.New("--store-latency, --store-resets and --commit-cuts need --db postgres://… or private, or --keys: a SQLite file has no connection to cut")}
			}
			c.StoreFaults = &sf
		}
		// Zero means the default in Config; on the command line it means none.
		c.DropRate = dropRate
		if dropRate == 0 {
			c.DropRate = -1
		}
		if c.KillEvery == 0 {
			c.KillEvery = -1
		}
		if replicaLog != "" {
			f, err := os.Create(replicaLog)
			if err != nil {
				return fmt.Errorf("--replica-log: %w", err)
			}
			defer f.Close()
			c.ReplicaLog = f
		}
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("finding this binary to start the replicas: %w", err)
		}
		c.Executable = exe
		c.Env = os.Environ()
		// The replicas seal the descriptions with the body keys of this
		// environment; the check reads them as the service does.
		rest, err := a.atRestFromEnv()
		if err != nil {
			return err
		}
		c.BodyKeys = rest.bodyKeys
		c.Progress = a.stderr
		// The seed is drawn here, so that an error ending the run names
		// it as well as the progress line that opens it.
		if c.Seed == 0 {
			c.Seed = torture.NewSeed()
		}
		rep, err := torture.Run(cmd.Context(), &c)
		if err != nil {
			return scrubURLs(withSeed(err, c.Seed), c.DB, c.Keys)
		}
		return a.tortureVerdict(rep, len(rep.Violations))
	})
	return cmd
}

// withSeed adds to the error that ended a torture run its seed, and what
// the seed replays (torture.SeedReplays): a run that aborts prints no
// report, which would name it.
func withSeed(err error, seed uint64) error {
	return fmt.Errorf("%w (seed %d: the same arguments and --seed %d %s)", err, seed, seed, torture.SeedReplays)
}

// tortureReport is what either torture reports.
type tortureReport interface {
	Print(io.Writer)
	PrintResults(io.Writer)
	OK() bool
}

// tortureVerdict prints a torture's report and fails, with exit status 1,
// when the promise was broken.
func (a *app) tortureVerdict(rep tortureReport, violations int) error {
	fmt.Fprintln(a.stdout)
	rep.Print(a.stdout)
	rep.PrintResults(a.stdout)
	if !rep.OK() {
		return &silentError{fmt.Errorf("the promise was broken: %d violations", violations)}
	}
	return nil
}
