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

	// The store on the client idemredis.Open chooses (rueidis, whose
	// pipelining measured faster); the minimum stays on go-redis, as a user
	// would write it.
	store, err := idemredis.Open(ctx, o.RedisURL, &idemredis.Config{Prefix: prefix + ":mw"})
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	defer store.Close()
	m, err := idemhttp.New(o.middlewareConfig(store))
	if err != nil {
		return nil, err
	}
	h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { writeAnswer(w) }))
	body := `{"account_id":"acct_1","amount":1,"currency":"KRW"}`

	middlewareFirst := side{name: "middleware", do: func(ctx context.Context, round, i int) error {
		return serve(h, fmt.Sprintf("first-%d-%d", round, i), body, http.StatusCreated)
	}}
	// The minimum is served through the same in-process HTTP path as the
	// middleware, so both sides pay the same request scaffolding.
	minimumHandler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := prefix + ":min:" + r.Header.Get(idemhttp.HeaderKey)
		ok, err := client.SetNX(r.Context(), key, "in-flight", benchTTL).Result()
		if err != nil || !ok {
			http.Error(w, fmt.Sprintf("claim %s: %v, %v", key, ok, err), http.StatusConflict)
			return
		}
		rr := httptest.NewRecorder()
		writeAnswer(rr)
		b, err := json.Marshal(storedAnswer{Status: rr.Code, Body: rr.Body.Bytes()})
		if err == nil {
			err = client.Set(r.Context(), key, b, benchTTL).Err()
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(rr.Code)
		w.Write(rr.Body.Bytes())
	})
	minimumFirst := side{name: "minimum", do: func(ctx context.Context, round, i int) error {
		return serve(minimumHandler, fmt.Sprintf("%d-%d", round, i), body, http.StatusCreated)
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
	middlewareReplay := side{name: "middleware", do: func(ctx context.Context, round, i int) error {
		return serve(h, "replayed", body, http.StatusCreated)
	}}
	minimumReplayHandler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := client.Get(r.Context(), prefix+":min:"+r.Header.Get(idemhttp.HeaderKey)).Bytes()
		var a storedAnswer
		if err == nil {
			err = json.Unmarshal(b, &a)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(a.Status)
		w.Write(a.Body)
	})
	minimumReplay := side{name: "minimum", do: func(ctx context.Context, round, i int) error {
		return serve(minimumReplayHandler, "-1-0", body, http.StatusCreated)
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
