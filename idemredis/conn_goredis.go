package idemredis

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// goredisConn is a conn on a go-redis client: a *redis.Client (standalone
// or Sentinel failover) or a *redis.ClusterClient.
type goredisConn struct {
	c redis.UniversalClient
}

func (g goredisConn) setNXGet(ctx context.Context, key, value string, ms int64) (string, bool, error) {
	cmd := redis.NewStringCmd(ctx, "set", key, value, "nx", "px", ms, "get")
	_ = g.c.Process(ctx, cmd)
	v, err := cmd.Result()
	switch {
	case errors.Is(err, redis.Nil):
		return "", false, nil
	case err != nil:
		return "", false, err
	}
	return v, true, nil
}

func (g goredisConn) setIfEq(ctx context.Context, key, value, old string) (bool, error) {
	cmd := redis.NewStatusCmd(ctx, "set", key, value, "ifeq", old, "keepttl")
	_ = g.c.Process(ctx, cmd)
	err := cmd.Err()
	if errors.Is(err, redis.Nil) {
		return false, nil
	}
	return err == nil, err
}

func (g goredisConn) get(ctx context.Context, key string) (string, bool, error) {
	v, err := g.c.Get(ctx, key).Result()
	switch {
	case errors.Is(err, redis.Nil):
		return "", false, nil
	case err != nil:
		return "", false, err
	}
	return v, true, nil
}

func (g goredisConn) serverTime(ctx context.Context) (time.Time, error) {
	return g.c.Time(ctx).Result()
}

// args boxes the scripts' arguments as go-redis takes them.
func args(a []string) []any {
	b := make([]any, len(a))
	for i, s := range a {
		b[i] = s
	}
	return b
}

func (g goredisConn) evalText(ctx context.Context, sc *script, keys []string, a ...string) (string, error) {
	v, err := sc.gr.Run(ctx, g.c, keys, args(a)...).Text()
	if errors.Is(err, redis.Nil) {
		return "", errNilReply
	}
	return v, err
}

func (g goredisConn) evalInt(ctx context.Context, sc *script, keys []string, a ...string) (int64, error) {
	v, err := sc.gr.Run(ctx, g.c, keys, args(a)...).Int64()
	if errors.Is(err, redis.Nil) {
		return 0, errNilReply
	}
	return v, err
}

func (g goredisConn) load(ctx context.Context, scripts []*script) error {
	for _, sc := range scripts {
		// On a ClusterClient, SCRIPT LOAD goes to every master.
		if err := sc.gr.Load(ctx, g.c).Err(); err != nil {
			return err
		}
	}
	return nil
}

func (g goredisConn) probeIfEq(ctx context.Context, key string) error {
	err := g.c.Do(ctx, "set", key, "", "ifeq", "-").Err()
	if errors.Is(err, redis.Nil) {
		return nil
	}
	return err
}

func (g goredisConn) scanners(ctx context.Context) ([]scanFunc, error) {
	scan := func(c redis.Cmdable) scanFunc {
		return func(ctx context.Context, cursor uint64, match string, count int64) ([]string, uint64, error) {
			return c.Scan(ctx, cursor, match, count).Result()
		}
	}
	cc, ok := g.c.(*redis.ClusterClient)
	if !ok {
		return []scanFunc{scan(g.c)}, nil
	}
	// A cluster client's own SCAN reaches only one node.
	var (
		mu    sync.Mutex
		nodes []scanFunc
	)
	err := cc.ForEachMaster(ctx, func(_ context.Context, c *redis.Client) error {
		mu.Lock()
		defer mu.Unlock()
		nodes = append(nodes, scan(c))
		return nil
	})
	return nodes, err
}

func (g goredisConn) getRanges(ctx context.Context, keys []string, end int64) ([]string, []error) {
	pipe := g.c.Pipeline()
	cmds := make([]*redis.StringCmd, len(keys))
	for i, k := range keys {
		cmds[i] = pipe.GetRange(ctx, k, 0, end)
	}
	// Exec reports the first failed command; each is returned below.
	_, _ = pipe.Exec(ctx)
	vals := make([]string, len(keys))
	errs := make([]error, len(keys))
	for i, cmd := range cmds {
		vals[i], errs[i] = cmd.Result()
	}
	return vals, errs
}

func (g goredisConn) subscribe(channel string, onSubscribed func(), onMessage func(string)) func() {
	// The subscription outlives any one caller, so it does not take the
	// caller's context. go-redis retries the connection on its own, pings
	// it, and resubscribes after a failure, confirming each time.
	ps := g.c.Subscribe(context.Background(), channel)
	msgs := ps.ChannelWithSubscriptions()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m := range msgs {
			switch m := m.(type) {
			case *redis.Subscription:
				if m.Kind == "subscribe" {
					onSubscribed()
				}
			case *redis.Message:
				onMessage(m.Payload)
			}
		}
	}()
	return func() {
		_ = ps.Close()
		<-done
	}
}

func (g goredisConn) replication(ctx context.Context) ([]nodeReplication, error) {
	read := func(ctx context.Context, c *redis.Client) (nodeReplication, error) {
		addr := c.Options().Addr
		info, err := c.Info(ctx, "replication").Result()
		if err != nil {
			return nodeReplication{}, fmt.Errorf("INFO replication on %s: %w", addr, err)
		}
		nr := nodeReplication{addr: addr, minReplicas: -1}
		nr.master, nr.replicas = parseReplication(info)
		kv, err := c.ConfigGet(ctx, "min-replicas-to-write").Result()
		switch {
		case err == nil:
			nr.minReplicas, _ = strconv.Atoi(kv["min-replicas-to-write"])
		case !isRedisError(err):
			return nodeReplication{}, fmt.Errorf("CONFIG GET on %s: %w", addr, err)
		}
		return nr, nil
	}
	cc, ok := g.c.(*redis.ClusterClient)
	if !ok {
		c, ok := g.c.(*redis.Client)
		if !ok {
			return nil, fmt.Errorf("a %T cannot be asked node by node", g.c)
		}
		nr, err := read(ctx, c)
		return []nodeReplication{nr}, err
	}
	var (
		mu  sync.Mutex
		out []nodeReplication
	)
	err := cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		nr, err := read(ctx, c)
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		out = append(out, nr)
		return nil
	})
	slices.SortFunc(out, func(a, b nodeReplication) int { return strings.Compare(a.addr, b.addr) })
	return out, err
}

func (g goredisConn) close() error { return g.c.Close() }
