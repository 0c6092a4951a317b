package idemredis

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
)

// rueidisConn is a conn on a rueidis client (standalone, Sentinel or
// cluster). rueidis pipelines the commands of concurrent callers on shared
// connections by itself, which is what makes it the faster client for a
// store many goroutines use at once (see doc.go, "Clients").
type rueidisConn struct {
	c     rueidis.Client
	route *router // nil: every command goes as the client would send it
}

// router sends a command on a connection of its own while few of the
// store's commands are in flight, and on rueidis's shared pipeline beyond
// that. A command alone on a connection is written and read by the calling
// goroutine; one on the pipeline is handed to a writing goroutine and its
// reply back from a reading one, two more wake-ups per round trip, which
// only pay for themselves once many commands share each system call (see
// doc.go, "Clients"). It routes only on a client made with
// DisableAutoPipelining, as Open makes it: on any other client every
// command is pipelined whatever the router says.
type router struct {
	inflight atomic.Int32
	// direct is how many commands may be in flight on connections of
	// their own; more go on the pipeline.
	direct int32
	// routed, when set (by tests), is told each command's route.
	routed func(piped bool)
}

// directInFlight is the router's direct for the stores NewRueidisStore
// and Open make. In idem bench (the middleware on Open's store, first
// executions, on two cores), connections of their own made the store 5 to
// 10 points faster relative to the minimum than the pipeline did from 4 up
// to 16 requests in flight, the two were level at 32, and the pipeline was
// ahead at 64.
const directInFlight = 16

// do sends cmd by the route its number in flight calls for.
func (r rueidisConn) do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	if r.route == nil {
		return r.c.Do(ctx, cmd)
	}
	n := r.route.inflight.Add(1)
	defer r.route.inflight.Add(-1)
	piped := n > r.route.direct
	if piped {
		cmd = cmd.ToPipe()
	}
	if r.route.routed != nil {
		r.route.routed(piped)
	}
	return r.c.Do(ctx, cmd)
}

// eval runs sc by EVALSHA, and by EVAL when Redis has lost it (a SCRIPT
// FLUSH, a restart without persistence, a failover to a node that never
// loaded it).
func (r rueidisConn) eval(ctx context.Context, sc *script, keys, args []string) rueidis.RedisResult {
	res := r.do(ctx, r.evalsha(sc, keys, args))
	if isNoScript(res.Error()) {
		res = r.do(ctx, r.evalSource(sc, keys, args))
	}
	return res
}

// evalsha is the EVALSHA of sc, and evalSource its EVAL, which sends the
// script's source.
func (r rueidisConn) evalsha(sc *script, keys, args []string) rueidis.Completed {
	return r.c.B().Evalsha().Sha1(sc.sha).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()
}

func (r rueidisConn) evalSource(sc *script, keys, args []string) rueidis.Completed {
	return r.c.B().Eval().Script(sc.src).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build()
}

// isNoScript reports Redis's NOSCRIPT reply: the script is not loaded.
func isNoScript(err error) bool {
	rerr, ok := rueidis.IsRedisErr(err)
	return ok && rerr.IsNoScript()
}

func (r rueidisConn) setNXGet(ctx context.Context, key, value string, ms int64) (string, bool, error) {
	v, err := r.do(ctx, r.c.B().Set().Key(key).Value(value).Nx().Get().PxMilliseconds(ms).Build()).ToString()
	switch {
	case rueidis.IsRedisNil(err):
		return "", false, nil
	case err != nil:
		return "", false, err
	}
	return v, true, nil
}

func (r rueidisConn) setIfEq(ctx context.Context, key, value, old string) (bool, error) {
	err := r.do(ctx, r.c.B().Set().Key(key).Value(value).Ifeq(old).Keepttl().Build()).Error()
	if rueidis.IsRedisNil(err) {
		return false, nil
	}
	return err == nil, err
}

func (r rueidisConn) get(ctx context.Context, key string) (string, bool, error) {
	v, err := r.do(ctx, r.c.B().Get().Key(key).Build()).ToString()
	switch {
	case rueidis.IsRedisNil(err):
		return "", false, nil
	case err != nil:
		return "", false, err
	}
	return v, true, nil
}

func (r rueidisConn) serverTime(ctx context.Context) (time.Time, error) {
	return parseTime(r.c.Do(ctx, r.c.B().Time().Build()).AsStrSlice())
}

// parseTime decodes TIME's reply: seconds and microseconds, as strings.
func parseTime(v []string, err error) (time.Time, error) {
	if err != nil {
		return time.Time{}, err
	}
	if len(v) != 2 {
		return time.Time{}, errors.New("TIME replied with other than two fields")
	}
	sec, err1 := strconv.ParseInt(v[0], 10, 64)
	us, err2 := strconv.ParseInt(v[1], 10, 64)
	if err1 != nil || err2 != nil {
		return time.Time{}, errors.New("TIME replied with other than integers")
	}
	return time.Unix(sec, us*1000), nil
}

func (r rueidisConn) evalText(ctx context.Context, sc *script, keys []string, a ...string) (string, error) {
	v, err := r.eval(ctx, sc, keys, a).ToString()
	if rueidis.IsRedisNil(err) {
		return "", errNilReply
	}
	return v, err
}

func (r rueidisConn) evalInt(ctx context.Context, sc *script, keys []string, a ...string) (int64, error) {
	v, err := r.eval(ctx, sc, keys, a).AsInt64()
	if rueidis.IsRedisNil(err) {
		return 0, errNilReply
	}
	return v, err
}

func (r rueidisConn) load(ctx context.Context, scripts []*script) error {
	for _, n := range r.c.Nodes() {
		for _, sc := range scripts {
			if err := n.Do(ctx, n.B().ScriptLoad().Script(sc.src).Build()).Error(); err != nil {
				return err
			}
		}
	}
	return nil
}

func (r rueidisConn) probeIfEq(ctx context.Context, key string) error {
	err := r.c.Do(ctx, r.c.B().Set().Key(key).Value("").Ifeq("-").Build()).Error()
	if rueidis.IsRedisNil(err) {
		return nil
	}
	return err
}

func (r rueidisConn) scanners(ctx context.Context) ([]scanFunc, error) {
	scan := func(c rueidis.Client) scanFunc {
		return func(ctx context.Context, cursor uint64, match string, count int64) ([]string, uint64, error) {
			e, err := c.Do(ctx, c.B().Scan().Cursor(cursor).Match(match).Count(count).Build()).AsScanEntry()
			return e.Elements, e.Cursor, err
		}
	}
	if r.c.Mode() != rueidis.ClientModeCluster {
		return []scanFunc{scan(r.c)}, nil
	}
	// Nodes lists replicas too; each key is scanned once, on its master.
	var nodes []scanFunc
	for _, n := range r.c.Nodes() {
		role, err := n.Do(ctx, n.B().Role().Build()).ToArray()
		if err != nil {
			return nil, err
		}
		if len(role) > 0 {
			if kind, _ := role[0].ToString(); kind == "master" {
				nodes = append(nodes, scan(n))
			}
		}
	}
	return nodes, nil
}

func (r rueidisConn) getRanges(ctx context.Context, keys []string, end int64) ([]string, []error) {
	cmds := make(rueidis.Commands, len(keys))
	for i, k := range keys {
		cmds[i] = r.c.B().Getrange().Key(k).Start(0).End(end).Build()
	}
	vals := make([]string, len(keys))
	errs := make([]error, len(keys))
	for i, res := range r.c.DoMulti(ctx, cmds...) {
		vals[i], errs[i] = res.ToString()
	}
	return vals, errs
}

// Back-off between attempts to subscribe again after the subscription's
// connection failed: quick at first, never hammering a Redis that is down.
const (
	resubscribeMin = 50 * time.Millisecond
	resubscribeMax = 2 * time.Second
)

func (r rueidisConn) subscribe(channel string, onSubscribed func(), onMessage func(string)) func() {
	stop := make(chan struct{})
	done := make(chan struct{})
	var (
		mu  sync.Mutex
		cur rueidis.DedicatedClient
	)
	go func() {
		defer close(done)
		backoff := resubscribeMin
		for {
			// A dedicated connection per subscription: rueidis reports its
			// loss on the hooks' channel, and a new one is subscribed.
			dc, release := r.c.Dedicate()
			mu.Lock()
			select {
			case <-stop:
				mu.Unlock()
				release()
				return
			default:
			}
			cur = dc
			mu.Unlock()
			lost := dc.SetPubSubHooks(rueidis.PubSubHooks{
				OnMessage: func(m rueidis.PubSubMessage) { onMessage(m.Message) },
				OnSubscription: func(s rueidis.PubSubSubscription) {
					if s.Kind == "subscribe" {
						onSubscribed()
					}
				},
			})
			err := dc.Do(context.Background(), dc.B().Subscribe().Channel(channel).Build()).Error()
			if err == nil {
				backoff = resubscribeMin
				<-lost
			}
			mu.Lock()
			cur = nil
			mu.Unlock()
			dc.Close()
			release()
			t := time.NewTimer(backoff)
			select {
			case <-stop:
				t.Stop()
				return
			case <-t.C:
			}
			backoff = min(2*backoff, resubscribeMax)
		}
	}()
	return func() {
		mu.Lock()
		close(stop)
		if cur != nil {
			// Closing the dedicated connection ends the hooks, so the
			// loop sees the loss and then the stop.
			cur.Close()
		}
		mu.Unlock()
		<-done
	}
}

func (r rueidisConn) replication(ctx context.Context) ([]nodeReplication, error) {
	var out []nodeReplication
	for addr, n := range r.c.Nodes() {
		info, err := n.Do(ctx, n.B().Info().Section("replication").Build()).ToString()
		if err != nil {
			return nil, fmt.Errorf("INFO replication on %s: %w", addr, err)
		}
		nr := nodeReplication{addr: addr, minReplicas: -1}
		nr.master, nr.replicas = parseReplication(info)
		kv, err := n.Do(ctx, n.B().ConfigGet().Parameter("min-replicas-to-write").Build()).AsStrMap()
		switch {
		case err == nil:
			nr.minReplicas, _ = strconv.Atoi(kv["min-replicas-to-write"])
		case !isRedisError(err):
			return nil, fmt.Errorf("CONFIG GET on %s: %w", addr, err)
		}
		out = append(out, nr)
	}
	slices.SortFunc(out, func(a, b nodeReplication) int { return strings.Compare(a.addr, b.addr) })
	return out, nil
}

func (r rueidisConn) close() error {
	r.c.Close()
	return nil
}
