package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemredis"
	"github.com/redis/go-redis/v9"
)

const benchTTL = 24 * time.Hour

// storedAnswer is how the hand-written minimum keeps a response.
type storedAnswer struct {
	Status int    `json:"status"`
	Body   []byte `json:"body"`
}

func runRedis(ctx context.Context, o *Options) ([]Comparison, error) {
	ropts, err := redis.ParseURL(o.RedisURL)
	if err != nil {
		return nil, fmt.Errorf("bench: Redis URL: %w", err)
	}
	ropts.PoolSize = o.Concurrency + 2
	client := redis.NewClient(ropts)
	defer client.Close()
	prefix := "idembench:" + randomID()
	defer deleteRedisPrefix(context.WithoutCancel(ctx), client, prefix)

	store, err := idemredis.New(ctx, client, &idemredis.Config{Prefix: prefix + ":mw"})
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	defer store.Close()
	m, err := idemhttp.New(&idemhttp.Config{Store: store, TTL: benchTTL})
	if err != nil {
		return nil, err
	}
	h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { writeAnswer(w) }))
	body := `{"account_id":"acct_1","amount":1,"currency":"KRW"}`

	middlewareFirst := side{name: "middleware", do: func(ctx context.Context, round, i int) error {
		return serve(h, fmt.Sprintf("first-%d-%d", round, i), body, http.StatusCreated)
	}}
	minimumFirst := side{name: "minimum", do: func(ctx context.Context, round, i int) error {
		key := fmt.Sprintf("%s:min:%d-%d", prefix, round, i)
		ok, err := client.SetNX(ctx, key, "in-flight", benchTTL).Result()
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("key %s already claimed", key)
		}
		rr := httptest.NewRecorder()
		writeAnswer(rr)
		b, err := json.Marshal(storedAnswer{Status: rr.Code, Body: rr.Body.Bytes()})
		if err != nil {
			return err
		}
		return client.Set(ctx, key, b, benchTTL).Err()
	}}
	first, err := compare(ctx, o, "redis", "first", middlewareFirst, minimumFirst)
	if err != nil {
		return nil, err
	}

	if err := serve(h, "replayed", body, http.StatusCreated); err != nil {
		return nil, err
	}
	if err := minimumFirst.do(ctx, -1, 0); err != nil {
		return nil, err
	}
	replayKey := fmt.Sprintf("%s:min:%d-%d", prefix, -1, 0)
	middlewareReplay := side{name: "middleware", do: func(ctx context.Context, round, i int) error {
		return serve(h, "replayed", body, http.StatusCreated)
	}}
	minimumReplay := side{name: "minimum", do: func(ctx context.Context, round, i int) error {
		b, err := client.Get(ctx, replayKey).Bytes()
		if err != nil {
			return err
		}
		var a storedAnswer
		if err := json.Unmarshal(b, &a); err != nil {
			return err
		}
		rr := httptest.NewRecorder()
		rr.WriteHeader(a.Status)
		rr.Write(a.Body)
		return nil
	}}
	replay, err := compare(ctx, o, "redis", "replay", middlewareReplay, minimumReplay)
	if err != nil {
		return nil, err
	}
	return []Comparison{first, replay}, nil
}

func deleteRedisPrefix(ctx context.Context, client *redis.Client, prefix string) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	iter := client.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	var batch []string
	for iter.Next(ctx) {
		batch = append(batch, iter.Val())
		if len(batch) == 1000 {
			client.Unlink(ctx, batch...)
			batch = batch[:0]
		}
	}
	if len(batch) > 0 {
		client.Unlink(ctx, batch...)
	}
}
