package torture

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/idem-go/idem/cmd/idem/internal/localserver"
	"github.com/idem-go/idem/idemhttp"
)

// Config configures Run. Executable is required; every other field's zero
// value means its default.
type Config struct {
	// Executable is the idem binary whose `serve` the replicas run.
	// Required.
	Executable string
	// Env is the replicas' environment; the run adds IDEM_API_KEYS, with the
	// run's own key. Defaults to nothing else.
	Env []string
	// BodyKeys are the body keys IDEM_BODY_KEYS in Env gives the
	// replicas, with which they seal the payments' descriptions: the
	// check reads the descriptions, which name the logical payments,
	// through them. Defaults to none: descriptions kept in clear, and a
	// sealed one is an error.
	BodyKeys []idemhttp.BodyKey
	// DB is the replicas' database: "" or "sqlite" for a SQLite file in a
	// temporary directory, deleted afterwards; a postgres:// URL, in
	// which the replicas share a schema of the run's own, dropped
	// afterwards; or Private, a PostgreSQL server of the run's own, which
	// it starts with its data in the temporary directory and may restart
	// (RestartStoresEvery). Defaults to "" (SQLite).
	DB string
	// Keys, a redis:// URL, puts the idempotency keys in Redis, under a key
	// prefix of the run's own, deleted afterwards; Private puts them in a
	// Redis server of the run's own, started like DB's; PrivateVolatile in
	// one that keeps nothing on disk, as a Redis run as a cache does, so
	// that each of its restarts forgets every key. Defaults to "": the keys
	// live in DB, and commit with each payment.
	Keys string
	// RestartStoresEvery is the time from a private store's return to the
	// next crash of one (DB or Keys Private), chosen at random: SIGKILLed,
	// started again on its port and data, and waited for, while no replica
	// restarts and no store outage is on. Each private store also crashes
	// once at a payment drawn from the seed, two crashes at least in all
	// (see scheduleFaults). Only the run's own servers are
	// ever restarted: one that others share is never touched. Defaults to
	// 0: none.
	RestartStoresEvery time.Duration
	// Payments is the number of logical payments. Defaults to 1000.
	Payments int
	// Dups is how many times each logical payment is attempted, with the
	// same key and body: half of them at once, the rest one after another
	// once those have their answers. Defaults to 8.
	Dups int
	// Replicas is the number of `idem serve` processes. Defaults to 3.
	Replicas int
	// Clients is the number of logical payments worked on at once.
	// Defaults to 16.
	Clients int
	// DropRate is the fraction of requests whose answer the fault proxies
	// drop after the replica sent it; with it, the run drops at least one,
	// at an answer drawn from the seed. Defaults to 0.1; negative means
	// none.
	DropRate float64
	// KillEvery is the time between two SIGKILLs of a random replica, each
	// started again at once. Defaults to 2s; negative means no kills.
	KillEvery time.Duration
	// Timeout bounds the load's stalls, not its length: the load ends
	// once no logical payment has completed (every attempt answered) for
	// Timeout, and each logical payment without its 2xx answers then is a
	// violation. A run on a slow or busy machine takes as long as it keeps
	// completing payments; a stuck one ends Timeout after its last. The
	// checks and the clean-up that follow have bounds of their own (a
	// minute each). Defaults to 2 minutes.
	Timeout time.Duration
	// KeyLease is the replicas' --key-lease: how long a killed execution
	// holds its key (in Redis, with Keys) before a retry takes it over.
	// Defaults to 3s.
	KeyLease time.Duration
	// Unsafe runs the replicas with --unsafe-no-idempotency: the run must
	// then find double charges. Defaults to false.
	Unsafe bool
	// ReplicaLog, when set, receives every line the replicas log, each
	// prefixed with its replica's number, and the replicas log warnings
	// too: what a person reads to find out how a violation came about.
	// Defaults to nil: the replicas log errors only (warnings too with
	// Abandon, where the completers' resumes are read from them), kept for
	// the message of a replica that fails to start. On SQLite, the
	// replicas then also run their writer watchdog (writerWatchdog).
	ReplicaLog io.Writer
	// StoreFaults puts faults between the replicas and their stores: see
	// StoreFaults. Only with a PostgreSQL DB or Redis Keys (a SQLite file
	// has no connection to cut). Defaults to nil: none.
	StoreFaults *StoreFaults
	// Seed seeds the run's choices (accounts, amounts, replicas, drops,
	// kills). Defaults to 0: a seed from crypto/rand. Either way it is
	// printed first (Progress) and in the report. The plan (each payment's
	// account, amount, abandonment) and the scheduled faults (the payment,
	// store and replica of each) follow from it alone; the draws made
	// under the load (drops, resets and cuts by rate, latencies, crashes
	// after a charge, the tickers' replicas and stores) come from the same
	// source in the order the load reaches them, so a replay meets those
	// at other moments.
	Seed uint64
	// Acquirer, as Private, puts a card network between the payments and
	// their money: the run starts `idem acquirer` (a child process of
	// Executable, its charges in the temporary directory) with its faults
	// on, and the replicas charge every payment there (serve --acquirer,
	// with --faults). The checks then count the network's charges: one per
	// logical payment, the one its payment records. Defaults to "": none.
	Acquirer string
	// AcquirerFaultRate is the acquirer's --fault-rate: the share of its
	// charges refused with 503 or whose answer it drops after charging.
	// Defaults to 0.1 with Acquirer; negative means none.
	AcquirerFaultRate float64
	// CrashAfterCharge is the share of attempts whose first try is sent
	// with Idem-Fault: crash-after-charge: the replica SIGKILLs itself after the network
	// charged and before the payment commits, and the run starts it again.
	// With Acquirer, the run meets at least one such crash: from a payment
	// drawn from the seed, the first tries carry one, in turn, until a
	// replica has crashed (scheduleFaults). Defaults to 0.05 with
	// Acquirer; negative means none.
	CrashAfterCharge float64
	// Abandon is the share of logical payments whose client sends one
	// attempt, asking for crash-after-charge, and never comes back, whatever
	// it got: no retry, no duplicate. Only the replicas' completers can
	// finish them. After the load the run waits for them (CompleterWait),
	// and the checks want each charged once and recorded, or neither.
	// Needs Acquirer, and the keys in DB (the completer needs recovery
	// points). With it, at least one payment is abandoned: one of the
	// first half drawn from the seed, whatever the share draws. With
	// CrashAfterCharge too, at least one abandoned try reaches its charge
	// and its replica dies before answering, so that a completer finishes
	// it: the drawn payment's try carries that order first, then, while
	// none has carried it out, the next abandoned payment handed out (one
	// whose client would stay, made abandoned, once none the share drew
	// is left to come) (scheduleFaults). Defaults to 0: every client retries.
	Abandon float64
	// Progress receives a line of progress every ProgressEvery. Defaults to
	// io.Discard.
	Progress io.Writer
	// ProgressEvery is the time between progress lines. Defaults to 2s.
	ProgressEvery time.Duration
}

// Defaults of Config.
const (
	DefaultPayments      = 1000
	DefaultDups          = 8
	DefaultReplicas      = 3
	DefaultClients       = 16
	DefaultDropRate      = 0.1
	DefaultKillEvery     = 2 * time.Second
	DefaultTimeout       = 2 * time.Minute
	DefaultKeyLease      = 3 * time.Second
	defaultProgressEvery = 2 * time.Second
	// DefaultAcquirerFaultRate and DefaultCrashAfterCharge are
	// Config.AcquirerFaultRate's and Config.CrashAfterCharge's defaults
	// with an Acquirer.
	DefaultAcquirerFaultRate = 0.1
	DefaultCrashAfterCharge  = 0.05
)

// Private, as Config.DB or Config.Keys, asks for a store of the run's own:
// a PostgreSQL or Redis server that the run starts on a free loopback
// port, with its data in the run's temporary directory, and stops and
// deletes afterwards.
const Private = "private"

// PrivateVolatile, as Config.Keys, asks for a Redis server of the run's
// own that keeps nothing on disk: restarted, it comes back empty, and the
// service must still charge each payment once (see payments' look-back
// for a payment made under the same key).
const PrivateVolatile = "private-volatile"

// privateKeys reports whether keys names a Redis server of the run's own.
func privateKeys(keys string) bool { return keys == Private || keys == PrivateVolatile }

// What the run creates: its tenant, its accounts and their balance, and the
// largest amount of a payment.
const (
	tenant         = "torture"
	accountCount   = 64
	accountBalance = int64(1) << 50
	maxAmount      = 10000
	currency       = "KRW"
	phaseTimeout   = time.Minute
)

func (c *Config) withDefaults() (Config, error) {
	var o Config
	if c != nil {
		o = *c
	}
	if o.Payments == 0 {
		o.Payments = DefaultPayments
	}
	if o.Dups == 0 {
		o.Dups = DefaultDups
	}
	if o.Replicas == 0 {
		o.Replicas = DefaultReplicas
	}
	if o.Clients == 0 {
		o.Clients = DefaultClients
	}
	if o.DropRate == 0 {
		o.DropRate = DefaultDropRate
	} else if o.DropRate < 0 {
		o.DropRate = 0
	}
	if o.KillEvery == 0 {
		o.KillEvery = DefaultKillEvery
	}
	if o.Timeout == 0 {
		o.Timeout = DefaultTimeout
	}
	if o.KeyLease == 0 {
		o.KeyLease = DefaultKeyLease
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	if o.ProgressEvery == 0 {
		o.ProgressEvery = defaultProgressEvery
	}
	if o.Seed == 0 {
		o.Seed = randomSeed()
	}
	if o.Acquirer != "" {
		if o.AcquirerFaultRate == 0 {
			o.AcquirerFaultRate = DefaultAcquirerFaultRate
		}
		if o.CrashAfterCharge == 0 {
			o.CrashAfterCharge = DefaultCrashAfterCharge
		}
	}
	o.AcquirerFaultRate, o.CrashAfterCharge = max(o.AcquirerFaultRate, 0), max(o.CrashAfterCharge, 0)
	switch {
	case o.Executable == "":
		return o, errors.New("torture: Config.Executable is required")
	case o.Payments < 0 || o.Dups < 0 || o.Replicas < 0 || o.Clients < 0:
		return o, errors.New("torture: Payments, Dups, Replicas and Clients must be positive")
	case o.DropRate >= 1:
		return o, fmt.Errorf("torture: DropRate must be below 1 (every answer dropped, nothing would ever succeed), got %g", o.DropRate)
	case o.Timeout < 0 || o.KeyLease < 0 || o.ProgressEvery < 0 || o.RestartStoresEvery < 0:
		return o, errors.New("torture: Timeout, KeyLease, ProgressEvery and RestartStoresEvery must not be negative")
	case o.Acquirer != "" && o.Acquirer != Private:
		return o, errors.New(`torture: Acquirer must be "private" (a card network of the run's own) or empty`)
	case o.AcquirerFaultRate >= 1 || o.CrashAfterCharge >= 1:
		return o, errors.New("torture: AcquirerFaultRate and CrashAfterCharge must be below 1")
	case o.Abandon < 0 || o.Abandon > 1:
		return o, fmt.Errorf("torture: Abandon must be between 0 and 1, got %g", o.Abandon)
	case o.Abandon > 0 && (o.Acquirer == "" || o.Keys != ""):
		return o, errors.New("torture: Abandon needs Acquirer, and the keys in DB (no Keys): only a completer finishes an abandoned payment, and it needs the recovery points kept with the keys")
	case o.RestartStoresEvery > 0 && o.DB != Private && !privateKeys(o.Keys):
		return o, errors.New(`torture: RestartStoresEvery needs a private store, DB or Keys "private": the run restarts only servers of its own`)
	}
	if _, err := dbKind(o.DB); err != nil {
		return o, err
	}
	if o.Keys != "" && !privateKeys(o.Keys) && !strings.HasPrefix(o.Keys, "redis://") && !strings.HasPrefix(o.Keys, "rediss://") {
		return o, errors.New(`torture: Keys must be "private", "private-volatile" or a redis:// or rediss:// URL`)
	}
	if f := o.StoreFaults; f != nil {
		if kind, _ := dbKind(o.DB); kind != "pg" && o.Keys == "" {
			return o, errors.New("torture: StoreFaults need a postgres:// DB or Redis Keys: a SQLite file has no connection to cut")
		}
		if f.Latency < 0 || f.ResetRate < 0 || f.ResetRate >= 1 || f.CommitCutRate < 0 || f.CommitCutRate >= 1 || f.OutageEvery < 0 || f.OutageFor < 0 {
			return o, errors.New("torture: StoreFaults' Latency and outage times must not be negative, and its rates must be at least 0 and below 1")
		}
		if f.OutageEvery > 0 && f.OutageFor == 0 {
			sf := *f
			sf.OutageFor = time.Second
			o.StoreFaults = &sf
		}
	}
	return o, nil
}

// dbKind names the database of a Config.DB value: "sqlite" or "pg".
func dbKind(db string) (string, error) {
	switch {
	case db == "" || db == "sqlite":
		return "sqlite", nil
	case db == Private || strings.HasPrefix(db, "postgres://") || strings.HasPrefix(db, "postgresql://"):
		return "pg", nil
	}
	return "", errors.New(`torture: DB must be "sqlite", "private" or a postgres:// URL`)
}

// logical is one logical payment: its key, its body, and every 2xx answer
// its attempts got.
type logical struct {
	key     string
	account string
	amount  int64
	body    []byte
	// abandoned: its client sends one attempt and never comes back
	// (Config.Abandon).
	abandoned bool
	// gaveUpAt is when its client gave up (abandoned only).
	gaveUpAt time.Time
	// left, made for the abandoned payment scheduleFaults draws, is
	// closed once its client's one try has ended (pay): the load's last
	// quarter waits for it.
	left chan struct{}
	// carries says that its try carries the scheduled abandoned crash's
	// order (carryAbandon), and unanswered that its abandoned try got no
	// answer from its replica (its fault proxy said so; not an answer the
	// proxy dropped): both written by its client alone, or before the load.
	carries, unanswered bool
	// losesAnswer says that its first answer is the scheduled lost
	// response (scheduleFaults): it is never made abandoned. Written
	// before the load.
	losesAnswer bool
	// tried is set once its client (abandoned) began its one try, which
	// left closes once ended: a try the load's end cut off set tried
	// alone.
	tried atomic.Bool

	mu         sync.Mutex
	answers    []answer
	unexpected []string // answers that were neither 2xx nor retried
}

// answer is what one attempt ended with.
type answer struct {
	status    int
	paymentID string
}

// run is one torture run in progress.
type run struct {
	cfg    Config
	label  string
	rng    *lockedRand
	apiKey string
	token  string // names what the run makes: schema, key prefix, keys

	dir string // temporary directory (the SQLite file)
	// completerWait is how long the completers took, after the load, to
	// finish the abandoned payments; unfinished how many keys were still
	// in flight with a recovery point when the bound passed.
	completerWait time.Duration
	unfinished    int
	// slowestFinish is the longest an abandoned payment took to be
	// finished by a completer, from its client giving up to its key's
	// completion.
	slowestFinish time.Duration
	// lateFinishes is how many abandoned payments were finished later
	// than finishBound after their client gave up, or a completer's
	// resume of them failed (lastHolderGone).
	lateFinishes int
	// late are the late finishes, for their timelines.
	late []lateFinish
	// failedResumes are, by payment ID, when a replica's completer said a
	// resume of that payment's key failed, its outcome unknown (the
	// replicas' completerLine).
	failedMu      sync.Mutex
	failedResumes map[string][]time.Time
	// resuming are the resumes each replica's life has begun and not seen
	// end: by key digest, the payment (completerLine).
	resuming map[life]map[string]string
	// took are the keys each life's completer took over and the payments'
	// resume has not named yet: by key digest, when.
	took map[life]map[string]time.Time
	// timeline is, by payment ID, what the replicas did with its key
	// (completerLine), and unnamed what they did without naming a
	// payment: a late finish's violation shows them.
	timeline map[string][]event
	unnamed  []event
	// cutOff are, by payment ID, the deaths of replicas in the middle of
	// a resume of it (in failedResumes too); fromFailed and fromCutOff
	// count the abandoned payments whose bound counted from a failed
	// resume, seen to fail or cut off (Report.FromFailedResume).
	cutOff                 map[string][]time.Time
	fromFailed, fromCutOff int
	// claiming are the claims each life's completer logged it was sending
	// and has not logged the answer of: by key digest, when. failedClaims
	// are, by key digest, the claims that failed, ran out of their round's
	// time or were cut off by their replica's death (cutOffClaims): each
	// may have taken the key, which then waits out the lease it took.
	// fromFailedClaim counts the abandoned payments whose bound counted
	// from a failed claim (Report.FromFailedClaim).
	claiming map[life]map[string]time.Time
	// resumeDigests are, by payment ID, the key digest a replica's resume
	// named it under (checkDigest).
	resumeDigests   map[string]string
	failedClaims    map[string][]time.Time
	cutOffClaims    map[string][]time.Time
	fromFailedClaim int
	// roundsGaveUp are, by replica, when its completer's round gave up
	// without holding a key (its listing failed or ran out of time, or it
	// ran out of time before taking a key over), and when that round
	// began. That replica's completer's bound counts again from then,
	// when the round began in the window it gave up in (finishDeadline).
	roundsGaveUp map[int][]giveUp

	schema   string // PostgreSQL schema, with cfg.DB postgres://
	prefix   string // Redis key prefix, with cfg.Keys
	sqlite   string // the SQLite file's path
	replicas []*replica
	proxies  []*faultProxy
	// pgURL and redisURL are the stores themselves: cfg.DB and cfg.Keys,
	// or the private servers' URLs.
	pgURL, redisURL string
	// dbURL and keysURL are what the replicas connect to: the stores, or
	// the store proxies in front of them.
	dbURL, keysURL string
	stores         []*storeProxy
	// servers are the private stores, which the run restarts and, at the
	// end, stops.
	servers    []*localserver.Server
	replicaLog *lineWriter // cfg.ReplicaLog, shared by the replicas; nil for none
	// chaos keeps a replica's restart, a store's outage and a store's
	// restart apart.
	chaos  sync.Mutex
	client *http.Client

	// acquirer is the card network's process, with Config.Acquirer; its
	// URL and key are acquirerURL and acquirerKey.
	acquirer                 *replica
	acquirerURL, acquirerKey string

	accounts []string
	payments []*logical
	// scheduled are the faults each run meets whatever its rates and ticks
	// (see scheduleFaults), each at its payment.
	scheduled []scheduledFault

	attempts atomic.Int64
	noAnswer atomic.Int64
	retried  atomic.Int64
	// lossKey is the key of the payment whose first answer the fault
	// proxies drop whatever DropRate draws (scheduleFaults), lossAt its
	// number; lossCame says they dropped it (dropNow).
	lossKey  string
	lossAt   int
	lossCame atomic.Bool
	kills    atomic.Int64
	restarts atomic.Int64 // private stores restarted
	// restarted is when the last restart of a private store ended
	// (UnixNano): the next one of the restart loop comes
	// RestartStoresEvery after it.
	restarted atomic.Int64
	completed atomic.Int64
	// progressed is when a logical payment last completed (UnixNano), or
	// the load began: what Timeout is measured from.
	progressed atomic.Int64
	crashes    atomic.Int64 // replicas that killed themselves (crash-after-charge), started again, or found so by a kill
	// crashMu guards crashTold, closed at the next crash counted
	// (countCrash), and crashDue: with a scheduled crash after a charge
	// placed, the count of crashes the run must reach (scheduledCrashCame),
	// and crashDueAt its payment.
	crashMu    sync.Mutex
	crashTold  chan struct{}
	crashDue   int64
	crashDueAt int
	// crashOwed is the scheduled crash after a charge's order: crashFree
	// while a first try may take it, crashTaken while one carries it
	// (firstTryFault), 0 when none is owed.
	crashOwed atomic.Int32
	// unansweredCrashes are the exits (replica.exited) of the replicas
	// that a try asking for a crash after its charge got no answer from
	// (crashTryUnanswered): each may have died with that try, its exit
	// not yet observed. Guarded by crashMu. exitAwaited, when set, is
	// told when reviveExited waits on one not yet observed.
	unansweredCrashes []<-chan struct{}
	exitAwaited       func()
	// unexpectedExits are the replicas that ended by themselves other
	// than by a crash fault's SIGKILL (selfExit): each a violation.
	exitsMu         sync.Mutex
	unexpectedExits []string
	// stall is, for a load its Timeout ended, the watchdog's cause: the
	// scheduled faults it still awaited (stalled).
	stall string
	// abandonMu guards the scheduled abandoned crash's order
	// (awaitAbandonedCrash): abandonOwed is crashFree while the next
	// payment handed out may carry it, crashTaken while one's try
	// carries it, 0 once it came or was withdrawn; abandonCame says it
	// came; abandonTold is closed at its next change; abandonAhead counts
	// the payments the share abandoned not yet handed out (carryAbandon).
	abandonMu    sync.Mutex
	abandonOwed  int
	abandonCame  bool
	abandonTold  chan struct{}
	abandonAhead int
	// charged reports whether the card network holds a charge of lp's
	// key; nil means it asks the run's network (networkCharged).
	charged func(ctx context.Context, lp *logical) (bool, error)
}

// Run starts the replicas and the fault proxies, sends the load while it
// kills replicas, checks the promise, stops and deletes everything it
// started and made, and returns the report. An error means the run could
// not be carried out (a replica that does not start, a database that does
// not answer); a promise that was broken is in the report (Report.OK).
func Run(ctx context.Context, cfg *Config) (rep *Report, err error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	// The seed first, before anything that can fail or hang: a run that
	// aborts (a replica that never starts, a store that never comes back)
	// prints no report, and its seed is what replays it.
	printSeed(c.Progress, c.Seed)
	kind, _ := dbKind(c.DB)
	label := kind
	if c.Keys != "" {
		label += "-keys"
	}
	if c.Acquirer != "" {
		label += "-acquirer"
	}
	if c.Unsafe {
		label += "-unsafe"
	}
	token := strings.ToLower(crand.Text()[:16])
	r := &run{
		cfg:    c,
		label:  label,
		rng:    newLockedRand(c.Seed),
		apiKey: "torture_" + crand.Text(),
		token:  token,
		client: &http.Client{
			Transport: &http.Transport{MaxIdleConnsPerHost: 256, IdleConnTimeout: 30 * time.Second},
			// Longer than a replica's own request timeout (15s), so an
			// attempt ends with the replica's answer when there is one.
			Timeout: 30 * time.Second,
		},
	}
	if c.ReplicaLog != nil {
		r.replicaLog = &lineWriter{w: c.ReplicaLog}
	}
	defer func() { err = errors.Join(err, r.cleanup()) }()
	if err := r.prepare(ctx); err != nil {
		return nil, err
	}
	if err := r.startReplicas(ctx); err != nil {
		return nil, err
	}
	if err := r.createAccounts(ctx); err != nil {
		return nil, err
	}
	r.plan()
	r.scheduleFaults()
	for _, sp := range r.stores {
		sp.armed.Store(true)
	}
	started := time.Now()
	if err := r.load(ctx); err != nil {
		return nil, err
	}
	elapsed := time.Since(started)
	if ctx.Err() != nil {
		return nil, fmt.Errorf("torture: interrupted before the checks: %w", context.Cause(ctx))
	}
	if err := r.reviveExited(ctx); err != nil {
		return nil, err
	}
	if err := r.scheduledCrashCame(); err != nil {
		return nil, err
	}
	if c.Abandon > 0 {
		if r.completerWait, r.unfinished, err = r.awaitCompleters(ctx); err != nil {
			return nil, err
		}
		if r.slowestFinish, r.lateFinishes, err = r.slowestCompletion(ctx); err != nil {
			return nil, err
		}
	}
	return r.check(ctx, elapsed)
}

// prepare makes the run's place for data: a temporary directory, on
// PostgreSQL a schema name of its own (serve creates the schema), and the
// private stores.
func (r *run) prepare(ctx context.Context) error {
	dir, err := os.MkdirTemp("", "idem-torture-")
	if err != nil {
		return fmt.Errorf("torture: %w", err)
	}
	r.dir = dir
	if kind, _ := dbKind(r.cfg.DB); kind == "pg" {
		r.schema = "idem_torture_" + r.token
	} else {
		r.sqlite = filepath.Join(dir, "idem.db")
	}
	if r.cfg.Keys != "" {
		r.prefix = "idemtorture" + r.token
	}
	r.pgURL, r.redisURL = r.cfg.DB, r.cfg.Keys
	private := func(start func(context.Context, string) (*localserver.Server, error), name string) (string, error) {
		s, err := start(ctx, filepath.Join(dir, name))
		if err != nil {
			return "", fmt.Errorf("torture: starting a private %s: %w", name, err)
		}
		r.servers = append(r.servers, s)
		return s.URL(), nil
	}
	if r.cfg.DB == Private {
		if r.pgURL, err = private(localserver.StartPostgres, "postgres"); err != nil {
			return err
		}
	}
	switch r.cfg.Keys {
	case Private:
		if r.redisURL, err = private(localserver.StartRedis, "redis"); err != nil {
			return err
		}
	case PrivateVolatile:
		if r.redisURL, err = private(localserver.StartVolatileRedis, "redis"); err != nil {
			return err
		}
	}
	if len(r.servers) > 0 {
		fmt.Fprintf(r.cfg.Progress, "torture: private %s in %s\n", serverNames(r.servers), dir)
	}
	r.dbURL, r.keysURL = r.pgURL, r.redisURL
	if r.schema != "" {
		if r.dbURL, err = boundPool(r.dbURL); err != nil {
			return fmt.Errorf("torture: %w", err)
		}
	}
	if r.cfg.Acquirer != "" {
		if err := r.startAcquirer(ctx); err != nil {
			return err
		}
	}
	if !r.cfg.StoreFaults.any() {
		return nil
	}
	proxy := func(rawURL, defPort string, commits bool) (string, error) {
		target, err := targetOf(rawURL, defPort)
		if err != nil {
			return "", fmt.Errorf("torture: %w", err)
		}
		sp, err := newStoreProxy(target, *r.cfg.StoreFaults, commits, r.rng)
		if err != nil {
			return "", fmt.Errorf("torture: %w", err)
		}
		r.stores = append(r.stores, sp)
		return throughProxy(rawURL, sp.addr(), commits && r.cfg.StoreFaults.CommitCutRate > 0)
	}
	if r.schema != "" {
		if r.dbURL, err = proxy(r.pgURL, "5432", true); err != nil {
			return err
		}
		if r.dbURL, err = boundPool(r.dbURL); err != nil {
			return fmt.Errorf("torture: %w", err)
		}
	}
	if r.cfg.Keys != "" {
		if r.keysURL, err = proxy(r.redisURL, "6379", false); err != nil {
			return err
		}
	}
	return nil
}

// serverNames lists the servers' names, "postgres and redis".
func serverNames(servers []*localserver.Server) string {
	names := make([]string, len(servers))
	for i, s := range servers {
		names[i] = s.Name()
	}
	return strings.Join(names, " and ")
}

// serveArgs is the command line of every replica.
func (r *run) serveArgs() []string {
	level := "error"
	if r.cfg.ReplicaLog != nil || r.cfg.Abandon > 0 {
		// With Abandon, the completers' resumes begin at warning level
		// (completerLine).
		level = "warn"
	}
	args := []string{"serve", "--addr", "127.0.0.1:0", "--log-level", level,
		"--key-lease", r.cfg.KeyLease.String()}
	if r.schema != "" {
		args = append(args, "--db", r.dbURL, "--pg-schema", r.schema)
	} else {
		args = append(args, "--db", "sqlite:"+r.sqlite)
	}
	if r.prefix != "" {
		args = append(args, "--keys", r.keysURL, "--keys-prefix", r.prefix)
	}
	if r.cfg.Unsafe {
		args = append(args, "--unsafe-no-idempotency")
	}
	if r.acquirerURL != "" {
		args = append(args, "--acquirer", r.acquirerURL, "--faults")
	}
	return args
}

// acquirerReady starts the line `idem acquirer` prints once it listens.
const acquirerReady = "idem: acquirer listening on "

// startAcquirer starts the run's card network, its charges in the
// temporary directory, its random faults on.
func (r *run) startAcquirer(ctx context.Context) error {
	r.acquirerKey = "torture_net_" + crand.Text()
	r.acquirer = &replica{what: "acquirer", ready: acquirerReady, exe: r.cfg.Executable,
		args: []string{"acquirer", "--addr", "127.0.0.1:0", "--db", "sqlite:" + filepath.Join(r.dir, "acquirer.db"),
			"--faults", "--fault-rate", strconv.FormatFloat(r.cfg.AcquirerFaultRate, 'g', -1, 64),
			"--seed", strconv.FormatUint(r.cfg.Seed, 10), "--log-level", "error"},
		env: append(slices.Clone(r.cfg.Env), envAcquirerKey+"="+r.acquirerKey), log: r.replicaLog}
	if err := r.acquirer.start(ctx); err != nil {
		return fmt.Errorf("torture: %w", err)
	}
	r.acquirerURL = r.acquirer.baseURL()
	return nil
}

// envAcquirerKey is the environment variable of the card network's key,
// for the acquirer and the replicas.
const envAcquirerKey = "IDEM_ACQUIRER_KEY"

// envKeyDigestSecret is the environment variable of the replicas' key
// digest secret (digestSecret).
const envKeyDigestSecret = "IDEM_KEY_DIGEST_SECRET"

// envWriterWatchdog is serve's SQLite writer watchdog: past this duration
// of one transaction's turn of the writer, a replica logs every
// goroutine's stack (see serve).
const envWriterWatchdog = "IDEM_SQLITE_WRITER_WATCHDOG"

// writerWatchdog is the limit a run with a ReplicaLog gives its SQLite
// replicas' writer watchdog, unless Env sets one: a turn of the single
// writer held this long stalls every write of its replica (the longest
// seen in healthy runs beside a loaded machine's other work was under a
// second), and the stacks, written into the log while the holder is still
// at it, name what holds it.
const writerWatchdog = 5 * time.Second

// reviveLoop starts again, until stop is closed, every replica that
// ended by itself: one that a crash-after-charge fault made SIGKILL
// itself. It returns an error when one does not come back.
func (r *run) reviveLoop(ctx context.Context, stop <-chan struct{}) error {
	if r.cfg.CrashAfterCharge == 0 && r.cfg.Abandon == 0 {
		<-stop
		return nil
	}
	type exit struct {
		i    int
		done <-chan struct{}
	}
	ended := make(chan exit, len(r.replicas))
	watch := func(i int, done <-chan struct{}) {
		go func() {
			select {
			case <-done:
				ended <- exit{i, done}
			case <-stop:
			}
		}()
	}
	for i, rp := range r.replicas {
		watch(i, rp.exited())
	}
	for {
		select {
		case <-stop:
			return nil
		case <-ctx.Done():
			return nil
		case e := <-ended:
			i, rp := e.i, r.replicas[e.i]
			r.chaos.Lock()
			if rp.exited() != e.done {
				// The kill loop killed it and has started it again (it
				// holds the chaos lock meanwhile): watch the new one.
				r.chaos.Unlock()
				watch(i, rp.exited())
				continue
			}
			r.proxies[i].setUpstream("")
			r.selfExit(rp)
			var err error
			for range 3 {
				if err = rp.start(ctx); err == nil {
					break
				}
			}
			r.chaos.Unlock()
			if err != nil {
				return fmt.Errorf("torture: restarting after a crash: %w", err)
			}
			r.proxies[i].setUpstream(rp.baseURL())
			watch(i, rp.exited())
		}
	}
}

// startReplicas starts the first replica alone, so that it creates the
// tables, then the others at once, and a fault proxy in front of each.
func (r *run) startReplicas(ctx context.Context) error {
	// The key goes in the environment, not on the command line, where
	// every user of the machine could read it.
	env := append(slices.Clone(r.cfg.Env), "IDEM_API_KEYS="+tenant+":"+r.apiKey, envKeyDigestSecret+"="+digestSecret())
	if r.acquirerKey != "" {
		env = append(env, envAcquirerKey+"="+r.acquirerKey)
	}
	if r.sqlite != "" && r.replicaLog != nil && !slices.ContainsFunc(env, func(kv string) bool { return strings.HasPrefix(kv, envWriterWatchdog+"=") }) {
		env = append(env, envWriterWatchdog+"="+writerWatchdog.String())
	}
	for i := range r.cfg.Replicas {
		// Each replica keeps its name across its restarts (its port is
		// new each time), so that a restarted one ends at once the leases
		// its killed run held.
		args := append(r.serveArgs(), "--replica-id", "torture-replica-"+strconv.Itoa(i))
		r.replicas = append(r.replicas, &replica{n: i, exe: r.cfg.Executable, args: args, env: env, log: r.replicaLog,
			onLine: func(n int, line string) { r.completerLine(i, n, line) },
			onExit: func(n int, at time.Time) { r.completerExit(i, n, at) }})
		p, err := newFaultProxy(r.dropNow)
		if err != nil {
			return err
		}
		p.onCrashTry(r.replicas[i].crashTry)
		r.proxies = append(r.proxies, p)
	}
	if err := r.replicas[0].start(ctx); err != nil {
		return err
	}
	errs := make([]error, len(r.replicas))
	var wg sync.WaitGroup
	for i, rp := range r.replicas[1:] {
		wg.Go(func() { errs[i+1] = rp.start(ctx) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	for i, rp := range r.replicas {
		r.proxies[i].setUpstream(rp.baseURL())
	}
	fmt.Fprintf(r.cfg.Progress, "torture: %d replicas of idem serve on %s, each behind a fault proxy dropping %.0f%% of answers\n",
		len(r.replicas), r.label, 100*r.cfg.DropRate)
	return nil
}

// dropNow says whether a fault proxy drops the answer it holds, to a try
// of the payment of key: the first answer of the payment r.lossKey names
// (scheduleFaults), and others at DropRate.
func (r *run) dropNow(key string) bool {
	if r.cfg.DropRate <= 0 {
		return false
	}
	if r.lossKey != "" && key == r.lossKey && r.lossCame.CompareAndSwap(false, true) {
		return true
	}
	return r.rng.Float64() < r.cfg.DropRate
}

// createAccounts creates the accounts, with a balance no run exhausts, on
// the first replica directly.
func (r *run) createAccounts(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, phaseTimeout)
	defer cancel()
	body := fmt.Appendf(nil, `{"balance":%d,"currency":%q}`, accountBalance, currency)
	for i := range accountCount {
		key := fmt.Sprintf("torture-%s-account-%d", r.token, i)
		status, resp, err := r.post(ctx, r.replicas[0].baseURL(), "/v1/accounts", key, "", body)
		if err != nil {
			return fmt.Errorf("torture: creating account %d: %w", i, err)
		}
		var acct struct {
			ID      string `json:"id"`
			Balance int64  `json:"balance"`
		}
		if status != http.StatusCreated || json.Unmarshal(resp, &acct) != nil || acct.ID == "" || acct.Balance != accountBalance {
			return fmt.Errorf("torture: creating account %d: answered %d %s", i, status, bytes.TrimSpace(resp))
		}
		r.accounts = append(r.accounts, acct.ID)
	}
	return nil
}

// plan draws the logical payments: a key, an account and an amount each.
// The key is also the payment's description, so the database tells which
// logical payment every row belongs to, even in unsafe mode, which keeps no
// keys.
func (r *run) plan() {
	for i := range r.cfg.Payments {
		lp := &logical{
			key:     fmt.Sprintf("torture-%s-%d", r.token, i),
			account: r.accounts[r.rng.IntN(len(r.accounts))],
			amount:  1 + r.rng.Int64N(maxAmount),
		}
		lp.abandoned = r.cfg.Abandon > 0 && r.rng.Float64() < r.cfg.Abandon
		lp.body = fmt.Appendf(nil, `{"account_id":%q,"amount":%d,"currency":%q,"description":%q}`,
			lp.account, lp.amount, currency, lp.key)
		r.payments = append(r.payments, lp)
	}
}

// scheduledFault is a fault a run orders when it hands payment at to its
// clients: a store fault, a replica's SIGKILL or a private store's
// restart.
type scheduledFault struct {
	at     int
	kind   string // "reset", "commit cut", "outage", "kill", "restart", "abandon" or "crash after charge"
	store  *storeProxy
	server *localserver.Server // "restart"
	// replica is the replica a "kill" SIGKILLs (or the next live one),
	// drawn with the rest of the schedule: a draw at the kill itself would
	// come from the run's source after whatever the load drew meanwhile,
	// and the same seed would kill another replica.
	replica int
	// payment is the payment an "abandon" makes abandoned; crash says
	// that its try carries the order of an abandoned try that crashes its
	// replica after the charge (Config.abandonsCrash).
	payment *logical
	crash   bool
}

// The states of run.crashOwed.
const (
	crashFree  = 1
	crashTaken = 2
)

// faultCrashAfterCharge is the Idem-Fault that makes a replica SIGKILL
// itself after the card network charged, before the payment commits.
const faultCrashAfterCharge = "crash-after-charge"

// chaos reports whether the fault is a kill or a restart: one that needs no
// traffic to happen, and that the load waits for before its last quarter.
func (sf scheduledFault) chaos() bool { return sf.kind == "kill" || sf.kind == "restart" }

// faultGate is what the load's last quarter waits for: the scheduled
// faults, each until it has happened (or failed, or was withdrawn at the
// load's end, which run.force makes an error). A store fault whose order
// stands until the load's traffic carries it out (a COMMIT's cut, which
// needs a COMMIT only the load makes; a reset when no connection is open)
// opens the gate while it stands: it holds the chaos lock, so the other
// faults wait behind it, and only the payments handed out meanwhile, each
// committed through the store before it is answered, carry it out: the
// load cannot end with such an order standing unmet.
type faultGate struct {
	mu       sync.Mutex
	pending  int // scheduled faults not yet happened
	awaiting int // of these, orders standing that the load's traffic carries out
	changed  chan struct{}
	// names are the scheduled faults not yet happened, in the order the
	// load ordered them, and whether each one's order stands
	// (stillAwaited).
	names []*gateFault
}

type gateFault struct {
	name  string
	stood bool
}

func newFaultGate(scheduled int) *faultGate {
	return &faultGate{pending: scheduled, changed: make(chan struct{})}
}

// open says whether the load may hand out a payment of its last quarter,
// and, when not, returns a channel closed at the gate's next change.
func (g *faultGate) open() (bool, <-chan struct{}) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.pending == 0 || g.awaiting > 0, g.changed
}

// fault returns, for one of the scheduled faults, named name,
// standing, to call when its order stands until the load's traffic
// carries it out, and happened, to call once it has happened, failed or
// was withdrawn.
func (g *faultGate) fault(name string) (standing, happened func()) {
	f := &gateFault{name: name}
	g.mu.Lock()
	g.names = append(g.names, f)
	g.mu.Unlock()
	standing = func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		if !f.stood {
			f.stood = true
			g.awaiting++
			g.tell()
		}
	}
	happened = func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		g.pending--
		if f.stood {
			g.awaiting--
		}
		g.names = slices.DeleteFunc(g.names, func(o *gateFault) bool { return o == f })
		g.tell()
	}
	return standing, happened
}

// stillAwaited names the scheduled faults ordered and not yet happened,
// each whose order stands (the load's traffic carries it out) saying so.
func (g *faultGate) stillAwaited() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []string
	for _, f := range g.names {
		if f.stood {
			out = append(out, f.name+" (its order standing, for the load's traffic to carry out)")
		} else {
			out = append(out, f.name)
		}
	}
	return out
}

func (g *faultGate) tell() {
	close(g.changed)
	g.changed = make(chan struct{})
}

// scheduleFaults draws, from the seed, when the run meets the first fault
// of each kind its StoreFaults ask for: a reset (ResetRate), a cut COMMIT
// answer (CommitCutRate), an outage (OutageEvery), each at a payment of
// the first half of the load and on a store drawn too. A rate alone leaves
// a run to chance: where replicas are killed faster than a connection's
// grace, almost no connection lives to meet a fault. The rates and the
// outages' ticks go on as before, beside these.
//
// With DropRate, one lost response is scheduled too: the fault proxies
// drop the first answer of a payment whose client stays, drawn among
// them, whatever their rate draws, so a run meets at least one; that
// payment is never made abandoned (carryAbandon), so its client tries
// until an answer comes.
//
// With Abandon, one payment of the first half, drawn first, is abandoned
// whatever the share draws, and the load's last quarter waits until its
// client's one try has ended. With CrashAfterCharge too (abandonsCrash),
// that try carries the order of an abandoned try that crashes its replica
// after its charge: one the network charged that got no answer is the
// fault come; one refused before its charge, or answered, gives the order
// to the next payment handed out (one the share abandoned, or, when none
// is left to come, one made abandoned), and so on while the last quarter
// goes on; one never carried out by the
// load's end is the run's error naming the payment and the seed
// (awaitAbandonedCrash). With an Acquirer and CrashAfterCharge, a
// crash after a charge is owed from a payment of the first half: from
// then on the first tries of the payments whose clients stay carry it,
// one at a time, each giving it back with its answer (refused before its
// charge, or a replay, it crashed nothing), until a replica's crash is
// counted; while it is owed the last quarter goes on, since only the
// load's tries carry it out, and one that never came by the load's end
// is the run's error, naming the seed (scheduledCrashCame). A try whose
// replica crashed gives it back before the crash is counted, so the next
// may crash another replica: a crash or two more than the rate's.
//
// Kills and restarts are scheduled too, for the same reason: a ticker
// alone leaves a short or fast run without them. With KillEvery, the first
// SIGKILL of a replica comes at a payment of the first half; with
// RestartStoresEvery, each private store is restarted once, and at least
// two restarts in all, each at a payment of the first half. The load
// hands out its last quarter only once these have happened, so each is
// met while payments are still being made. The tickers go on beside them.
func (r *run) scheduleFaults() {
	half := max(1, len(r.payments)/2)
	if r.cfg.Abandon > 0 && len(r.payments) > 0 {
		at := r.rng.IntN(half)
		lp := r.payments[at]
		lp.abandoned, lp.left = true, make(chan struct{})
		crash := r.cfg.abandonsCrash()
		if crash {
			lp.carries, r.abandonOwed = true, crashTaken
			for _, o := range r.payments {
				if o.abandoned && o != lp {
					r.abandonAhead++
				}
			}
		}
		r.scheduled = append(r.scheduled, scheduledFault{at: at, kind: "abandon", payment: lp, crash: crash})
	}
	if r.cfg.Acquirer != "" && r.cfg.CrashAfterCharge > 0 {
		r.scheduled = append(r.scheduled, scheduledFault{at: r.rng.IntN(half), kind: "crash after charge"})
	}
	if r.cfg.KillEvery > 0 {
		at := r.rng.IntN(half)
		r.scheduled = append(r.scheduled, scheduledFault{at: at, kind: "kill", replica: r.rng.IntN(max(1, len(r.replicas)))})
	}
	if r.cfg.RestartStoresEvery > 0 && len(r.servers) > 0 {
		for i := range max(2, len(r.servers)) {
			s := r.servers[i%len(r.servers)]
			r.scheduled = append(r.scheduled, scheduledFault{at: r.rng.IntN(half), kind: "restart", server: s})
		}
	}
	r.scheduleStoreFaults(half)
	staying := 0
	for _, lp := range r.payments {
		if !lp.abandoned {
			staying++
		}
	}
	if r.cfg.DropRate > 0 && staying > 0 {
		// Each attempt of a payment whose client stays ends with an
		// answer through a fault proxy (an abandoned payment's one
		// attempt may get none: it crashes its replica), so the first
		// answer of the payment drawn among them comes: it is never made
		// abandoned during the load (carryAbandon), however many others
		// are. A number of answers drawn within their count could come
		// past the last, the payments made abandoned answering nothing.
		k := r.rng.Int64N(int64(staying))
		for i, lp := range r.payments {
			if lp.abandoned {
				continue
			}
			if k == 0 {
				lp.losesAnswer, r.lossKey, r.lossAt = true, lp.key, i
				break
			}
			k--
		}
		fmt.Fprintf(r.cfg.Progress, "torture: a lost response: payment %d's first answer\n", r.lossAt+1)
	}
	for _, sf := range r.scheduled {
		fmt.Fprintf(r.cfg.Progress, "torture: %s\n", sf)
	}
}

// String names the fault and its payment, as the progress lines and a
// stalled load's cause do.
func (sf scheduledFault) String() string {
	what := "a store " + sf.kind
	switch sf.kind {
	case "kill":
		what = fmt.Sprintf("a SIGKILL of replica %d", sf.replica)
	case "restart":
		what = "a restart of the private " + sf.server.Name()
	case "abandon":
		what = "a client that gives up after one try"
		if sf.crash {
			what += ", which crashes its replica after the charge,"
		}
	case "crash after charge":
		what = "a crash after a charge owed"
	}
	return fmt.Sprintf("%s at payment %d", what, sf.at+1)
}

// scheduleStoreFaults draws the store faults of scheduleFaults, each at a
// payment below half.
func (r *run) scheduleStoreFaults(half int) {
	f := r.cfg.StoreFaults
	if !f.any() || len(r.stores) == 0 {
		return
	}
	add := func(kind string, stores []*storeProxy) {
		if len(stores) > 0 {
			r.scheduled = append(r.scheduled, scheduledFault{at: r.rng.IntN(half), kind: kind, store: stores[r.rng.IntN(len(stores))]})
		}
	}
	if f.ResetRate > 0 {
		add("reset", r.stores)
	}
	if f.CommitCutRate > 0 {
		var pg []*storeProxy
		for _, sp := range r.stores {
			if sp.commits {
				pg = append(pg, sp)
			}
		}
		add("commit cut", pg)
	}
	if f.OutageEvery > 0 {
		add("outage", r.stores)
	}
}

// force carries out a scheduled fault, under the chaos lock so that no
// replica is starting meanwhile (a fault in its migrations would only
// stop it): it returns once the fault has happened, or at stop. standing
// (when not nil) is called once a store fault's order stands until the
// load's traffic carries it out (storeProxy.force). A reset or
// a COMMIT cut withdrawn at stop, never carried out, is an error naming
// the seed: the load ended without the fault the run promised.
func (r *run) force(ctx context.Context, sf scheduledFault, stop <-chan struct{}, standing func()) error {
	switch sf.kind {
	case "kill":
		// The replica drawn may be down, crashed by itself: the kill
		// is owed to a live one, the next that is.
		for j := range len(r.replicas) {
			killed, err := r.killOne(ctx, (sf.replica+j)%len(r.replicas))
			if killed || err != nil {
				return err
			}
		}
		return nil
	case "restart":
		return r.restartOne(ctx, sf.server)
	case "abandon":
		if sf.crash {
			return r.awaitAbandonedCrash(sf.at, stop, standing)
		}
		select {
		case <-sf.payment.left:
			return nil
		case <-stop:
		}
		select {
		case <-sf.payment.left:
			return nil
		default:
			if sf.payment.tried.Load() {
				return fmt.Errorf("torture: the abandoned client scheduled at payment %d sent its try, and the load's end cut it off (seed %d)", sf.at+1, r.cfg.Seed)
			}
			return fmt.Errorf("torture: the abandoned client scheduled at payment %d never sent its try before the load ended (seed %d)", sf.at+1, r.cfg.Seed)
		}
	case "crash after charge":
		r.orderCrash(sf.at, stop, standing)
		return nil
	}
	r.chaos.Lock()
	defer r.chaos.Unlock()
	switch sf.kind {
	case "outage":
		sf.store.outage(r.cfg.StoreFaults.OutageFor, stop)
	default:
		if !sf.store.force(sf.kind == "commit cut", standing, stop) {
			return fmt.Errorf("torture: the store %s scheduled at payment %d never came: no traffic of the load's through the store met its order before the load ended (seed %d)", sf.kind, sf.at+1, r.cfg.Seed)
		}
	}
	return nil
}

// placeCrash places the scheduled crash after a charge's order, made at
// payment at, once: from then on the first tries of the payments whose
// clients stay carry it, one at a time (firstTryFault), until a replica
// has crashed. It returns the count of crashes the run must reach. load
// places it before it hands that payment to the clients, so that the
// payment's own first tries may carry it: placed by orderCrash's
// goroutine alone, it could come after them, the last payment's (a run's
// only one) included.
func (r *run) placeCrash(at int) (due int64) {
	r.crashMu.Lock()
	defer r.crashMu.Unlock()
	if r.crashDue == 0 {
		r.crashDue, r.crashDueAt = r.crashes.Load()+1, at
		r.crashOwed.Store(crashFree)
	}
	return r.crashDue
}

// orderCrash places the order (placeCrash) if it is not yet, and calls
// standing once it stands (only the load's traffic carries it out). It
// returns once a crash has been counted, or at stop, withdrawing the
// order; scheduledCrashCame says, once the replicas still down after the
// load are counted, whether one came.
func (r *run) orderCrash(at int, stop <-chan struct{}, standing func()) {
	due := r.placeCrash(at)
	if standing != nil {
		standing()
	}
	defer r.crashOwed.Store(0)
	for {
		told := r.crashWait()
		if r.crashes.Load() >= due {
			return
		}
		select {
		case <-told:
		case <-stop:
			return
		}
	}
}

// crashWait returns a channel closed at the next crash counted.
func (r *run) crashWait() <-chan struct{} {
	r.crashMu.Lock()
	defer r.crashMu.Unlock()
	if r.crashTold == nil {
		r.crashTold = make(chan struct{})
	}
	return r.crashTold
}

// countCrash counts a replica's crash and tells orderCrash.
func (r *run) countCrash() {
	r.crashes.Add(1)
	r.crashMu.Lock()
	defer r.crashMu.Unlock()
	if r.crashTold != nil {
		close(r.crashTold)
		r.crashTold = nil
	}
}

// scheduledCrashCame is the run's error when the scheduled crash after a
// charge was ordered and no crash came after it, the replicas still down
// at the load's end counted (reviveExited): the run promised one. A load
// that stalled is a violation the report gives (r.stall), as loadError
// has it: the crash that never came is given in it, beside the stall, not
// as the run's error, which Run would return in place of the report.
func (r *run) scheduledCrashCame() error {
	r.crashMu.Lock()
	defer r.crashMu.Unlock()
	if r.crashDue > 0 && r.crashes.Load() < r.crashDue {
		err := fmt.Errorf("torture: the crash after a charge owed from payment %d never came: no try carrying it crashed its replica before the load ended (seed %d)", r.crashDueAt+1, r.cfg.Seed)
		if r.stall != "" {
			r.stall += "; still awaited once the replicas down after the load were counted: " + err.Error()
			return nil
		}
		return err
	}
	return nil
}

// crashTryUnanswered notes that a try asking for a crash after its
// charge, sent through replica i's proxy, got no answer from the replica:
// the replica's running process may have died with it, and reviveExited
// waits on its exit before the verdict counts the crashes.
func (r *run) crashTryUnanswered(i int) {
	if i >= len(r.replicas) {
		return
	}
	done := r.replicas[i].exited()
	if done == nil {
		return
	}
	r.crashMu.Lock()
	defer r.crashMu.Unlock()
	r.unansweredCrashes = append(r.unansweredCrashes, done)
}

// awaitUnansweredCrashes waits, once the load is over, until the exit of
// every process a try asking for a crash got no answer from has been
// observed (its Wait returned, crashTryUnanswered), so that the verdict
// counts each crash that came before it: the client can see the crash (its
// connection cut) before the run has reaped the process. A process that
// is still up after stopTimeout died of nothing (its answer was lost
// otherwise) and is not waited on longer.
func (r *run) awaitUnansweredCrashes(ctx context.Context) {
	r.crashMu.Lock()
	pending := r.unansweredCrashes
	r.unansweredCrashes = nil
	r.crashMu.Unlock()
	expired := make(chan struct{}) // closed at stopTimeout, for every wait left
	bound := time.AfterFunc(stopTimeout, func() { close(expired) })
	defer bound.Stop()
	for _, done := range pending {
		select {
		case <-done:
			continue
		default:
		}
		if r.exitAwaited != nil {
			r.exitAwaited()
		}
		select {
		case <-done:
		case <-expired:
		case <-ctx.Done():
			return
		}
	}
}

// firstTryFault is the Idem-Fault of an attempt's first try: an abandoned
// payment's asks for a crash after the charge; one whose client stays
// carries the scheduled crash's order while it is owed and no other try
// carries it (carries: give it back with crashTryEnded), or asks for one
// at CrashAfterCharge.
func (r *run) firstTryFault(lp *logical) (fault string, carries bool) {
	switch {
	case lp.abandoned:
		return faultCrashAfterCharge, false
	case r.crashOwed.CompareAndSwap(crashFree, crashTaken):
		return faultCrashAfterCharge, true
	case r.cfg.CrashAfterCharge > 0 && r.rng.Float64() < r.cfg.CrashAfterCharge:
		return faultCrashAfterCharge, false
	}
	return "", false
}

// crashTryEnded gives the scheduled crash's order back once the try that
// carried it has its answer, for the next first try to carry, unless the
// order has meanwhile been carried out: a try refused before the charge,
// or run on a key already completed, crashed nothing.
func (r *run) crashTryEnded(carried bool) {
	if carried {
		r.crashOwed.CompareAndSwap(crashTaken, crashFree)
	}
}

// load sends every logical payment's attempts while it kills replicas, and
// returns once each has its answers or no logical payment has completed
// for Timeout.
func (r *run) load(ctx context.Context) error {
	loadCtx, abort := context.WithCancelCause(ctx)
	defer abort(nil)
	// The scheduled faults are all drawn below half the payments; the
	// last quarter waits for them (scheduleFaults, faultGate), and a stall
	// names those still awaited.
	gate := newFaultGate(len(r.scheduled))
	r.progressed.Store(time.Now().UnixNano())
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		tick := time.NewTicker(min(max(r.cfg.Timeout/4, time.Millisecond), time.Second))
		defer tick.Stop()
		watchProgress(loadCtx, tick.C, r.cfg.Timeout, time.Now, func() time.Time { return time.Unix(0, r.progressed.Load()) }, gate.stillAwaited, abort)
	}()
	defer func() { abort(nil); <-watchDone }()

	stopKills := make(chan struct{})
	// The chaos loops return early only when they fail (a replica or a
	// store that does not come back) or ctx ends.
	const chaosLoops = 3
	chaosDone := make(chan error, chaosLoops)
	go func() { chaosDone <- r.killLoop(ctx, stopKills) }()
	go func() { chaosDone <- r.reviveLoop(ctx, stopKills) }()
	go func() { chaosDone <- r.restartLoop(ctx, stopKills) }()
	outagesDone := make(chan struct{})
	go func() { defer close(outagesDone); r.outageLoop(ctx, stopKills) }()
	stopProgress := make(chan struct{})
	progressDone := make(chan struct{})
	go func() { defer close(progressDone); r.progressLoop(stopProgress) }()

	work := make(chan *logical)
	var wg sync.WaitGroup
	for range r.cfg.Clients {
		wg.Go(func() {
			for lp := range work {
				r.pay(loadCtx, lp)
			}
		})
	}
	var chaosErr error
	received := 0
	var forcing sync.WaitGroup
	var forcedMu sync.Mutex
	var forcedErr error
	// At least the first payment is sent before the wait: the faults are
	// drawn below max(1, half) of them (scheduleFaults), and an abandoned
	// client's is carried out by its payment's try alone, which a wait
	// before it would hold back until the Timeout.
	waitAt := max(1, len(r.payments)*3/4)
feed:
	for i, lp := range r.payments {
		for _, sf := range r.scheduled {
			if sf.at != i {
				continue
			}
			if sf.kind == "crash after charge" {
				r.placeCrash(sf.at)
			}
			standing, happened := gate.fault(sf.String())
			forcing.Go(func() {
				defer happened()
				if err := r.force(ctx, sf, stopKills, standing); err != nil {
					forcedMu.Lock()
					forcedErr = errors.Join(forcedErr, err)
					forcedMu.Unlock()
					abort(err)
				}
			})
		}
		for i >= waitAt {
			open, changed := gate.open()
			if open {
				break
			}
			select {
			case <-changed:
			case <-loadCtx.Done():
				break feed
			case chaosErr = <-chaosDone:
				received++
				abort(chaosErr)
				break feed
			}
		}
		select {
		case work <- lp:
		case <-loadCtx.Done():
			break feed
		case chaosErr = <-chaosDone:
			// A chaos loop stopped: a replica or a store did not come
			// back.
			received++
			abort(chaosErr)
			break feed
		}
	}
	close(work)
	wg.Wait()
	if s := (*stalled)(nil); errors.As(context.Cause(loadCtx), &s) {
		// Before the faults awaited are withdrawn at stopKills.
		r.stall = s.Error()
		fmt.Fprintf(r.cfg.Progress, "torture: the load stalled: %s\n", r.stall)
	}
	close(stopKills)
	forcing.Wait()
	chaosErr = r.loadError(chaosErr, forcedErr)
	for ; received < chaosLoops; received++ {
		chaosErr = errors.Join(chaosErr, <-chaosDone)
	}
	if r.stall != "" {
		r.quitForStacks()
	}
	<-outagesDone
	close(stopProgress)
	<-progressDone
	r.printProgress()
	return chaosErr
}

// quitForStacks asks every replica for its goroutines' stacks (SIGQUIT),
// once a load has stalled and no chaos loop restarts replicas any more:
// with a ReplicaLog, they are there, each line under its replica's name,
// and name what every replica was waiting for when nothing completed. The
// replicas are started again before the checks (reviveExited). Without a
// ReplicaLog the stacks would go nowhere, and the replicas are left be.
func (r *run) quitForStacks() {
	if r.replicaLog == nil {
		return
	}
	fmt.Fprintf(r.cfg.Progress, "torture: the load stalled: every replica is asked for its goroutines' stacks (SIGQUIT), which the replicas' log keeps\n")
	var wg sync.WaitGroup
	for _, rp := range r.replicas {
		wg.Go(func() { rp.quit() })
	}
	wg.Wait()
}

// loadError is the load's error once it ended, of chaosErr (a replica or
// a store that did not come back) and forcedErr (scheduled faults that
// never came). A load that stalled is a violation the report gives
// (r.stall): the faults its end withdrew are given in it, beside the
// stall, not as the run's error, which Run would return in place of the
// report, hiding the stall.
func (r *run) loadError(chaosErr, forcedErr error) error {
	if r.stall == "" || forcedErr == nil {
		return errors.Join(chaosErr, forcedErr)
	}
	r.stall += "; withdrawn at the load's end: " + strings.ReplaceAll(forcedErr.Error(), "\n", "; ")
	return chaosErr
}

// pay attempts one logical payment Dups times: half at once, the rest in
// turn after them. An abandoned one, or one that carries the scheduled
// abandoned crash's order (carryAbandon), sends one try and gives up.
func (r *run) pay(ctx context.Context, lp *logical) {
	r.carryAbandon(lp)
	if lp.abandoned {
		lp.tried.Store(true)
		r.attempt(ctx, lp)
		r.abandonedTryEnded(ctx, lp)
		if lp.left != nil && ctx.Err() == nil {
			close(lp.left)
		}
		r.done(ctx)
		return
	}
	atOnce := (r.cfg.Dups + 1) / 2
	var wg sync.WaitGroup
	for range atOnce {
		wg.Go(func() { r.attempt(ctx, lp) })
	}
	wg.Wait()
	for range r.cfg.Dups - atOnce {
		r.attempt(ctx, lp)
	}
	r.done(ctx)
}

// done counts a logical payment done once its attempts returned, unless
// the end of the load (ctx) cut them off: then it is not done, and no
// progress.
func (r *run) done(ctx context.Context) {
	if ctx.Err() != nil {
		return
	}
	r.completed.Add(1)
	r.progressed.Store(time.Now().UnixNano())
}

// errStalled is the cause of a load ended by its Timeout: a stalled,
// which names the scheduled faults the load still awaited.
var errStalled = errors.New("no logical payment completed within the timeout")

// stalled is a stalled load's cause: errStalled, and the scheduled faults
// ordered and not yet happened then (faultGate.stillAwaited), which a load
// held at its last quarter was waiting for.
type stalled struct{ awaited []string }

func (s *stalled) Error() string {
	if len(s.awaited) == 0 {
		return errStalled.Error() + ", no scheduled fault awaited"
	}
	return errStalled.Error() + ", the load still awaiting the scheduled " + strings.Join(s.awaited, "; ")
}

func (s *stalled) Unwrap() error { return errStalled }

// watchProgress ends the load, through abort with a stalled naming what
// awaited (when not nil) returns, once last (when a logical payment last
// completed) is more than timeout before now, looking at each tick; it
// returns then or when ctx ends.
func watchProgress(ctx context.Context, tick <-chan time.Time, timeout time.Duration, now, last func() time.Time, awaited func() []string, abort context.CancelCauseFunc) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick:
		}
		if now().Sub(last()) > timeout {
			s := &stalled{}
			if awaited != nil {
				s.awaited = awaited()
			}
			abort(s)
			return
		}
	}
}

// attempt sends the logical payment through a random replica's proxy until
// it gets a 2xx, retrying, with the same key and body, every request that
// got no answer, a 409 or a 5xx.
func (r *run) attempt(ctx context.Context, lp *logical) {
	for failures := 0; ; failures++ {
		if failures > 0 && !r.backoff(ctx, failures) {
			return
		}
		pi := r.rng.IntN(len(r.proxies))
		p := r.proxies[pi]
		r.attempts.Add(1)
		// Only an attempt's first try asks for the crash: its retries, sent
		// while the crashed replica restarts, asking again would crash
		// the others in turn.
		fault, carries := "", false
		if failures == 0 {
			fault, carries = r.firstTryFault(lp)
		}
		status, resp, err := r.post(ctx, p.url(), "/v1/payments", lp.key, fault, lp.body)
		r.crashTryEnded(carries)
		// Only the proxy's word says the replica gave no answer: an error
		// of the client's own is an answer the proxy dropped (the replica
		// answered it, so did not die of it) or a client that stopped
		// waiting, which says nothing of the replica.
		replicaSilent := err == nil && status == http.StatusBadGateway && bytes.HasPrefix(resp, []byte(proxyNoAnswer))
		if fault == faultCrashAfterCharge && replicaSilent {
			r.crashTryUnanswered(pi)
		}
		if lp.abandoned && !(status >= 200 && status < 300) {
			// The client gives up for good, whatever happened.
			lp.mu.Lock()
			lp.gaveUpAt = time.Now()
			lp.unanswered = replicaSilent
			lp.mu.Unlock()
			return
		}
		switch {
		case err != nil:
			if ctx.Err() != nil {
				return
			}
			r.noAnswer.Add(1)
			continue
		case status == http.StatusConflict || status >= 500:
			r.retried.Add(1)
			continue
		case status >= 200 && status < 300:
			var pay struct {
				ID string `json:"id"`
			}
			_ = json.Unmarshal(resp, &pay)
			lp.mu.Lock()
			lp.answers = append(lp.answers, answer{status: status, paymentID: pay.ID})
			lp.mu.Unlock()
			return
		default:
			lp.mu.Lock()
			lp.unexpected = append(lp.unexpected, fmt.Sprintf("%d %s", status, oneLine(resp)))
			lp.mu.Unlock()
			return
		}
	}
}

// backoff waits a jittered delay growing with failures, and reports false
// when ctx ended first.
func (r *run) backoff(ctx context.Context, failures int) bool {
	ceiling := min(250*time.Millisecond, 5*time.Millisecond<<min(failures, 10))
	t := time.NewTimer(time.Duration(r.rng.Int64N(int64(ceiling)) + 1))
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// post sends one POST with an Idempotency-Key (and an Idem-Fault header,
// unless fault is empty) and returns the answer.
func (r *run) post(ctx context.Context, base, path, key, fault string, body []byte) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+path, oneShot(body))
	if err != nil {
		return 0, nil, err
	}
	req.ContentLength = int64(len(body))
	req.Header.Set("Authorization", "Bearer "+r.apiKey)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	if fault != "" {
		req.Header.Set("Idem-Fault", fault)
	}
	return r.do(req)
}

func (r *run) do(req *http.Request) (int, []byte, error) {
	resp, err := r.client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return 0, nil, err
	}
	return resp.StatusCode, b, nil
}

// killLoop SIGKILLs a random replica every KillEvery and starts it again,
// until stop is closed. It returns an error when a replica does not come
// back.
func (r *run) killLoop(ctx context.Context, stop <-chan struct{}) error {
	if r.cfg.KillEvery < 0 {
		<-stop
		return nil
	}
	t := time.NewTicker(r.cfg.KillEvery)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return nil
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if _, err := r.killOne(ctx, r.rng.IntN(len(r.replicas))); err != nil {
			return err
		}
	}
}

// selfExit counts the end of rp's process, which ended by itself: a
// SIGKILL while a try asking for a crash after its charge (CrashAfterCharge,
// and each abandoned try's) was forwarded to it and unanswered
// (replica.crashAsked) is the crash the run ordered; any other end (an
// exit status, a panic, another signal, or a SIGKILL no try of the run's
// asked for, such as the OOM killer's) is a replica that failed, which the
// report gives as a violation with its last lines.
func (r *run) selfExit(rp *replica) {
	byRun, exit := rp.ended()
	if byRun {
		return // quit for its stacks (quitForStacks): not its own end
	}
	if err := unexpectedExit(exit, rp.crashAsked()); err != nil {
		r.exitsMu.Lock()
		r.unexpectedExits = append(r.unexpectedExits, fmt.Sprintf("%s %v; its last lines: %s", rp.name(), err, rp.lastLines()))
		r.exitsMu.Unlock()
		return
	}
	r.countCrash()
}

// unexpectedExit says why a process's end (its Wait's error, exit) is not
// the crash of a crash fault: nil for a SIGKILL when asked, a try asking
// it for that crash being forwarded to it unanswered (or, where a process
// cannot SIGKILL itself, the exit status 137 it uses instead).
func unexpectedExit(exit error, asked bool) error {
	var ee *exec.ExitError
	if !errors.As(exit, &ee) {
		if exit == nil {
			return errors.New("exited with status 0")
		}
		return fmt.Errorf("ended: %w", exit)
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	if (ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL) || ee.ExitCode() == 137 {
		if asked {
			return nil
		}
		return errors.New("was SIGKILLed while no try of the run's asked it to crash (the OOM killer, or another process)")
	}
	return fmt.Errorf("ended by itself: %v", ee)
}

// killOne SIGKILLs replica i and starts it again. It returns an error when
// the replica does not come back. killed says whether the signal met a
// live replica: one found already down had crashed by itself, and is
// counted as the crash it was (the revive loop, which sees it started
// again meanwhile, leaves it), not as a kill.
func (r *run) killOne(ctx context.Context, i int) (killed bool, err error) {
	// A replica restarted during a store's outage could not migrate.
	r.chaos.Lock()
	r.proxies[i].setUpstream("")
	if killed = r.replicas[i].kill(); killed {
		r.kills.Add(1)
	} else {
		r.selfExit(r.replicas[i])
	}
	for range 3 {
		if err = r.replicas[i].start(ctx); err == nil {
			break
		}
	}
	r.chaos.Unlock()
	if err != nil {
		return killed, fmt.Errorf("torture: restarting after a kill: %w", err)
	}
	r.proxies[i].setUpstream(r.replicas[i].baseURL())
	return killed, nil
}

// outageLoop takes a random store down every StoreFaults.OutageEvery, for
// OutageFor, until stop.
func (r *run) outageLoop(ctx context.Context, stop <-chan struct{}) {
	f := r.cfg.StoreFaults
	if f == nil || f.OutageEvery <= 0 || len(r.stores) == 0 {
		return
	}
	t := time.NewTicker(f.OutageEvery)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		case <-t.C:
		}
		r.chaos.Lock()
		r.stores[r.rng.IntN(len(r.stores))].outage(f.OutageFor, stop)
		r.chaos.Unlock()
	}
}

// restartLoop SIGKILLs a random private store every RestartStoresEvery
// and starts it again, until stop is closed. It returns an error when a
// store does not come back.
func (r *run) restartLoop(ctx context.Context, stop <-chan struct{}) error {
	if r.cfg.RestartStoresEvery <= 0 || len(r.servers) == 0 {
		<-stop
		return nil
	}
	// The interval runs from the end of the last restart (the loop's or a
	// scheduled one), not from a tick: on a busy machine a restart takes
	// seconds, and restarts on a ticker would follow each other with the
	// stores hardly up in between, the load stalling on the machine's
	// speed rather than on a fault.
	r.restarted.Store(time.Now().UnixNano())
	for {
		next := time.Unix(0, r.restarted.Load()).Add(r.cfg.RestartStoresEvery)
		t := time.NewTimer(time.Until(next))
		select {
		case <-stop:
			t.Stop()
			return nil
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		if time.Since(time.Unix(0, r.restarted.Load())) < r.cfg.RestartStoresEvery {
			continue // a scheduled restart came meanwhile
		}
		if err := r.restartOne(ctx, r.servers[r.rng.IntN(len(r.servers))]); err != nil {
			return err
		}
	}
}

// restartOne SIGKILLs the private store s and starts it again. It returns
// an error when the store does not come back.
func (r *run) restartOne(ctx context.Context, s *localserver.Server) error {
	// A replica restarted while its store is down could not migrate,
	// and an outage on top of a restart would only hide it.
	r.chaos.Lock()
	err := s.Restart(ctx, true)
	r.restarted.Store(time.Now().UnixNano())
	r.chaos.Unlock()
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("torture: restarting the private %s: %w", s.Name(), err)
	}
	r.restarts.Add(1)
	return nil
}

func (r *run) progressLoop(stop <-chan struct{}) {
	t := time.NewTicker(r.cfg.ProgressEvery)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			r.printProgress()
		}
	}
}

func (r *run) printProgress() {
	fmt.Fprintf(r.cfg.Progress, "torture: %d/%d logical payments done, %d attempts, %d lost responses, %d without an answer, %d retried on 409/5xx, %d kills, %d store restarts\n",
		r.completed.Load(), len(r.payments), r.attempts.Load(), r.lost(), r.noAnswer.Load(), r.retried.Load(), r.kills.Load(), r.restarts.Load())
}

// lost is the number of answers the proxies dropped.
func (r *run) lost() int64 {
	var n int64
	for _, p := range r.proxies {
		n += p.dropped.Load()
	}
	return n
}

// cleanup stops every replica and proxy and deletes what the run made:
// the temporary directory, the PostgreSQL schema, the Redis keys; a
// private store is stopped, and goes with the directory.
func (r *run) cleanup() error {
	var wg sync.WaitGroup
	for _, rp := range r.replicas {
		wg.Go(rp.stop)
	}
	wg.Wait()
	if r.acquirer != nil {
		r.acquirer.stop()
	}
	for _, p := range r.proxies {
		p.close()
	}
	for _, p := range r.stores {
		p.close()
	}
	r.client.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), phaseTimeout)
	defer cancel()
	var errs []error
	if r.schema != "" && r.cfg.DB != Private {
		errs = append(errs, dropSchema(ctx, r.pgURL, r.schema))
	}
	if r.prefix != "" && !privateKeys(r.cfg.Keys) {
		errs = append(errs, deleteKeys(ctx, r.redisURL, r.prefix))
	}
	for _, s := range r.servers {
		if err := s.Close(); err != nil {
			errs = append(errs, fmt.Errorf("torture: stopping the private %s: %w", s.Name(), err))
		}
	}
	if r.dir != "" {
		if err := os.RemoveAll(r.dir); err != nil {
			errs = append(errs, fmt.Errorf("torture: removing %s: %w", r.dir, err))
		}
	}
	return errors.Join(errs...)
}

func dropSchema(ctx context.Context, url, schema string) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return fmt.Errorf("torture: dropping schema %s: %w", schema, err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
		return fmt.Errorf("torture: dropping schema %s: %w", schema, err)
	}
	return nil
}

func deleteKeys(ctx context.Context, url, prefix string) error {
	opts, err := redis.ParseURL(url)
	if err != nil {
		return fmt.Errorf("torture: deleting the Redis keys %s:*: %w", prefix, err)
	}
	client := redis.NewClient(opts)
	defer client.Close()
	iter := client.Scan(ctx, 0, prefix+":*", 1000).Iterator()
	for iter.Next(ctx) {
		if err := client.Unlink(ctx, iter.Val()).Err(); err != nil {
			return fmt.Errorf("torture: deleting the Redis keys %s:*: %w", prefix, err)
		}
	}
	if err := iter.Err(); err != nil {
		return fmt.Errorf("torture: deleting the Redis keys %s:*: %w", prefix, err)
	}
	return nil
}

// lockedRand is a seeded source safe for the run's goroutines.
type lockedRand struct {
	mu sync.Mutex
	r  *rand.Rand
}

func newLockedRand(seed uint64) *lockedRand {
	return &lockedRand{r: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

func (l *lockedRand) IntN(n int) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.r.IntN(n)
}

func (l *lockedRand) Int64N(n int64) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.r.Int64N(n)
}

func (l *lockedRand) Float64() float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.r.Float64()
}

// oneLine is b on one line, bounded, for a violation's message.
func oneLine(b []byte) string {
	s := strings.Join(strings.Fields(string(b)), " ")
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}
