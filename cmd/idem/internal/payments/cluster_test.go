package payments_test

// The payment service under load while the node that leads its data is
// lost: the keys in a Redis Cluster (the money in PostgreSQL), or keys and
// money in a PostgreSQL primary with a streaming standby. Each logical
// payment is sent twice at once, the two retried until answered, and once
// more after the failover, as a client whose answer was lost retries; then
// the figures are counted from the database and reported as RESULT lines.
// IDEMTEST_CLUSTER_SCALE multiplies the payments.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idem-go/idem/cmd/idem/internal/payments"
	"github.com/idem-go/idem/idempg"
	"github.com/idem-go/idem/idemredis"
	"github.com/idem-go/idem/idemtest"
)

const (
	clusterAccounts = 8
	clusterBalance  = int64(1_000_000_000)
	clusterWorkers  = 8
	// clusterStall bounds how long a replica is stalled before its master
	// is lost; it ends sooner once enough requests were answered in it.
	clusterStall = time.Second
	// clusterPatience is how long a payment is retried while no payment of
	// the run is answered 201: a request gives up only when the run as a
	// whole stopped progressing, not after a time of its own, which a busy
	// machine's failover may outlast while the run goes on.
	clusterPatience = 90 * time.Second
)

// failoverRun drives one service and keeps what its clients were told.
type failoverRun struct {
	t       *testing.T
	url     string
	client  *http.Client
	amounts []int64
	accts   []string

	mu      sync.Mutex
	ids     []string // the payment id each logical payment was first answered with
	changed int      // answers naming another payment than the first answer did

	answered atomic.Int64 // requests answered, any status
	retried  atomic.Int64 // requests that had to be sent again
	// created is when a request of the run was last answered 201, in Unix
	// nanoseconds: the run's progress.
	created atomic.Int64
}

func newFailoverRun(t *testing.T, svc *payments.Service, n int) *failoverRun {
	srv := httptest.NewServer(svc.Handler())
	t.Cleanup(srv.Close)
	r := &failoverRun{t: t, url: srv.URL, client: &http.Client{Timeout: 20 * time.Second},
		amounts: make([]int64, n), ids: make([]string, n)}
	r.created.Store(time.Now().UnixNano())
	for i := range n {
		r.amounts[i] = int64(100 + i%17)
	}
	for i := range clusterAccounts {
		var a struct{ ID string }
		r.post("/v1/accounts", "acct-"+strconv.Itoa(i), map[string]any{"balance": clusterBalance, "currency": "KRW"}, &a)
		r.accts = append(r.accts, a.ID)
	}
	return r
}

// post sends body with key until it is answered 201, retrying what the
// failover makes fail (connection errors, 409 in flight, 5xx), and decodes
// the answer into out.
func (r *failoverRun) post(path, key string, body, out any) {
	b, err := json.Marshal(body)
	if err != nil {
		r.t.Fatal(err)
	}
	began := time.Now()
	backoff := 10 * time.Millisecond
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			r.retried.Add(1)
		}
		req, _ := http.NewRequest(http.MethodPost, r.url+path, bytes.NewReader(b))
		req.Header.Set("Authorization", "Bearer "+keyA)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		resp, err := r.client.Do(req)
		if err == nil {
			r.answered.Add(1)
			var buf bytes.Buffer
			_, _ = buf.ReadFrom(resp.Body)
			resp.Body.Close()
			switch {
			case resp.StatusCode == http.StatusCreated:
				r.created.Store(time.Now().UnixNano())
				if err := json.Unmarshal(buf.Bytes(), out); err != nil {
					r.t.Errorf("POST %s: %v", path, err)
				}
				return
			case resp.StatusCode != http.StatusConflict && resp.StatusCode < 500:
				r.t.Errorf("POST %s (key %s): %d %s", path, key, resp.StatusCode, buf.String())
				return
			}
		}
		if idle := time.Since(time.Unix(0, r.created.Load())); idle > clusterPatience && time.Since(began) > clusterPatience {
			r.t.Errorf("POST %s (key %s): not answered 201 in %s, and no request of the run was for %s (last: %v)",
				path, key, time.Since(began).Round(time.Second), idle.Round(time.Second), err)
			return
		}
		// The retry's pause: the client's, not a wait for the server.
		time.Sleep(backoff)
		backoff = min(2*backoff, 250*time.Millisecond)
	}
}

// pay sends logical payment i and records the answer.
func (r *failoverRun) pay(i int) {
	var p struct{ ID string }
	r.post("/v1/payments", "pay-"+strconv.Itoa(i),
		map[string]any{"account_id": r.accts[i%len(r.accts)], "amount": r.amounts[i], "currency": "KRW"}, &p)
	if p.ID == "" {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.ids[i] == "":
		r.ids[i] = p.ID
	case r.ids[i] != p.ID:
		r.changed++
	}
}

// load sends every logical payment twice at once on clusterWorkers
// workers, calls failover once a share of them is answered, waits for
// both, then sends every payment once more.
func (r *failoverRun) load(failover func()) {
	n := len(r.amounts)
	var next, done atomic.Int64
	trigger := make(chan struct{})
	var once sync.Once
	var wg sync.WaitGroup
	for range clusterWorkers {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				var copies sync.WaitGroup
				copies.Go(func() { r.pay(i) })
				r.pay(i)
				copies.Wait()
				if done.Add(1) >= int64(n*2/5) {
					once.Do(func() { close(trigger) })
				}
			}
		})
	}
	failed := make(chan struct{})
	go func() {
		defer close(failed)
		<-trigger
		failover()
	}()
	wg.Wait()
	once.Do(func() { close(trigger) })
	<-failed
	next.Store(0)
	for range clusterWorkers {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				r.pay(i)
			}
		})
	}
	wg.Wait()
}

// stallFor waits until n more requests were answered, or clusterStall.
func (r *failoverRun) stallFor(n int64) {
	from := r.answered.Load()
	deadline := time.Now().Add(clusterStall)
	for r.answered.Load() < from+n && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
}

// report counts the run from the database and reports it; strict demands
// that nothing was lost or charged twice.
func (r *failoverRun) report(engine string, pool *pgxpool.Pool, schema string, strict bool) {
	t := r.t
	ctx := context.Background()
	var rows, keys, taken, held int64
	q := fmt.Sprintf(`SELECT count(*), count(DISTINCT idempotency_key), coalesce(sum(amount), 0),
		(SELECT sum(balance) FROM %[1]s.accounts WHERE tenant = $1)
		FROM %[1]s.payments WHERE tenant = $1`, schema)
	if err := pool.QueryRow(ctx, q, tenantA).Scan(&rows, &keys, &taken, &held); err != nil {
		t.Fatalf("counting: %v", err)
	}
	r.mu.Lock()
	ids := append([]string(nil), r.ids...)
	changed := r.changed
	r.mu.Unlock()
	var lost int64
	if err := pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM unnest($1::text[]) AS a(id)
		WHERE NOT EXISTS (SELECT 1 FROM %s.payments p WHERE p.id = a.id)`, schema), ids).Scan(&lost); err != nil {
		t.Fatalf("counting lost payments: %v", err)
	}
	var owed int64
	for _, a := range r.amounts {
		owed += a
	}
	debited := int64(clusterAccounts)*clusterBalance - held
	logical := int64(len(r.amounts))
	idemtest.ClusterResult(t, engine, "logical_payments", logical, "payments")
	idemtest.ClusterResult(t, engine, "payments", rows, "payments")
	idemtest.ClusterResult(t, engine, "duplicate_payments", rows-keys, "payments")
	idemtest.ClusterResult(t, engine, "money_owed", owed, "KRW")
	idemtest.ClusterResult(t, engine, "money_taken", debited, "KRW")
	idemtest.ClusterResult(t, engine, "acknowledged_then_lost", lost, "payments")
	idemtest.ClusterResult(t, engine, "answers_changed", changed, "answers")
	idemtest.ClusterResult(t, engine, "requests_retried", r.retried.Load(), "requests")
	// What holds whatever the replication: the balances are the payments'
	// sum (they commit together), and every logical payment exists, since
	// each was answered 201 after the failover.
	if debited != taken {
		t.Errorf("money taken from the balances %d, the payments' sum %d: they commit together", debited, taken)
	}
	if keys != logical {
		t.Errorf("%d logical payments with a payment, want %d", keys, logical)
	}
	if strict && (rows != logical || debited != owed || lost != 0 || changed != 0) {
		t.Errorf("with the closing configuration: %d payments of %d logical, %d taken of %d owed, %d acknowledged then lost, %d answers changed; want none lost or twice",
			rows, logical, debited, owed, lost, changed)
	}
}

// The keys in a Redis Cluster, the money in the machine's PostgreSQL. The
// replica of the master holding the busy scope's slot is stalled and its
// link cut (or not), as across a network fault, while the master
// acknowledges claims;
// the master is then killed (SIGKILL), the replica resumes and takes over,
// and the killed node comes back as its replica. Without replica acks a
// claim the master acknowledged can be missing on the new master; with
// OpenReplicated (WAIT after every write) and min-replicas-to-write 1 none
// is.
func TestClusterRedisFailover(t *testing.T) {
	t.Parallel()
	// After every subtest, whose clients are closed by then.
	t.Cleanup(func() { waitRueidisGone(t) })
	for _, tc := range []struct {
		name   string
		stall  bool
		closed bool
	}{
		{"async-kill", false, false},
		{"async-cut-replica", true, false},
		{"replica-acks-cut-replica", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var settings [][2]string
			if tc.closed {
				settings = [][2]string{{"min-replicas-to-write", "1"}}
			}
			rc := idemtest.StartRedisCluster(t, &idemtest.RedisClusterConfig{Settings: settings})
			cfg := &idemredis.Config{Prefix: "pay"}
			var (
				keys *idemredis.Store
				err  error
			)
			if tc.closed {
				keys, err = idemredis.OpenReplicated(t.Context(), rc.URL(), cfg, &idemredis.ReplicaConfig{Replicas: 1, Timeout: 100 * time.Millisecond})
			} else {
				keys, err = idemredis.Open(t.Context(), rc.URL(), cfg)
			}
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { keys.Close() })
			db := payments.OpenPostgresForTest(t, nil)
			svc := newClusterService(t, &payments.Config{Postgres: db, Keys: keys})
			r := newFailoverRun(t, svc, 150*idemtest.ClusterScale(t))
			slot := "{" + tenantA + "}"
			engine := "redis-" + tc.name
			r.load(func() {
				master, replicas := rc.MasterOf(slot, nil)
				if master == nil || len(replicas) != 1 {
					t.Errorf("the busy slot's master %v has replicas %v, want one", master, replicas)
					return
				}
				if tc.stall {
					// Stalled, the replica would still find in its
					// socket what the master sent meanwhile; cut off, it
					// gets nothing more.
					replicas[0].Pause()
					rc.DropReplicas(master)
					r.stallFor(40)
				}
				start := time.Now()
				master.Kill()
				if tc.stall {
					replicas[0].Resume()
				}
				rc.WaitMasterOf(slot, master, 30*time.Second)
				idemtest.ClusterResult(t, engine, "failover_s", fmt.Sprintf("%.2f", time.Since(start).Seconds()), "s")
				master.Restart()
				rc.WaitHealthy(30 * time.Second)
			})
			// Strict in every case: a claim the key store lost comes back
			// as a new claim of the key, and the payment service finds the
			// payment the lost claim made (origin.since) instead of paying
			// again.
			r.report(engine, db.Pool(), db.Schema(), true)
		})
	}
}

// Keys and money in a PostgreSQL primary streaming to a standby; the
// service connects through a URL that lists both with
// target_session_attrs=read-write. The standby's WAL receiver is stalled
// (or not), the primary stopped at once (immediate), the standby
// promoted. Asynchronously, a payment the primary acknowledged can be
// missing after the promotion (with its key: they commit together);
// with synchronous_standby_names none is.
func TestClusterPostgresFailover(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		stall bool
		sync  bool
	}{
		{"async-stop", false, false},
		{"async-stalled-standby", true, false},
		{"sync-stalled-standby", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pair := idemtest.StartPostgresPair(t, &idemtest.PostgresPairConfig{Synchronous: tc.sync})
			db, err := idempg.Open(t.Context(), pair.URL("postgres"), &idempg.Config{Schema: "payments", MaxConns: 8})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(db.Close)
			ws, err := db.Warnings(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if tc.sync != (len(ws) == 0) {
				t.Errorf("Warnings = %v with synchronous %v", ws, tc.sync)
			}
			svc := newClusterService(t, &payments.Config{Postgres: db})
			r := newFailoverRun(t, svc, 150*idemtest.ClusterScale(t))
			engine := "pg-" + tc.name
			r.load(func() {
				if tc.stall {
					resume := pair.PauseReceiver()
					r.stallFor(40)
					start := time.Now()
					pair.Primary.Stop("immediate")
					resume()
					pair.Promote()
					idemtest.ClusterResult(t, engine, "failover_s", fmt.Sprintf("%.2f", time.Since(start).Seconds()), "s")
					return
				}
				start := time.Now()
				pair.Primary.Stop("immediate")
				pair.Promote()
				idemtest.ClusterResult(t, engine, "failover_s", fmt.Sprintf("%.2f", time.Since(start).Seconds()), "s")
			})
			r.report(engine, db.Pool(), db.Schema(), tc.sync)
		})
	}
}

// waitRueidisGone waits for the goroutines a closed rueidis cluster client
// leaves behind (a delayed slot refresh, the closing of the connections of
// nodes that left its view, five seconds later) to end, so that the
// package's leak check does not take them for leaks.
func waitRueidisGone(t *testing.T) {
	idemtest.Eventually(t, 15*time.Second, "the rueidis client's goroutines to end", func() bool {
		buf := make([]byte, 1<<20)
		return !bytes.Contains(buf[:runtime.Stack(buf, true)], []byte("github.com/redis/rueidis."))
	})
}

// newClusterService starts a service on cfg's stores with short leases,
// so that a key left in flight by the failover is taken over within the
// test, and without the event pipeline.
func newClusterService(t *testing.T, cfg *payments.Config) *payments.Service {
	cfg.APIKeys = map[string]string{keyA: tenantA}
	cfg.KeyLease = 2 * time.Second
	cfg.InflightWait = 500 * time.Millisecond
	// A failover to an asynchronous standby may lose a completion the
	// service acknowledged; its retry must then read the keys anew and pay
	// again (every logical payment exists at the end), not be answered
	// from the answer this process kept in memory.
	cfg.MemoryReplayFor = -1
	cfg.RequestsOnly = true
	svc, err := payments.New(context.Background(), cfg)
	if err != nil {
		t.Fatalf("payments.New: %v", err)
	}
	t.Cleanup(func() {
		if err := svc.Close(); err != nil {
			t.Errorf("close service: %v", err)
		}
	})
	return svc
}
