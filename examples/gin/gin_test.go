package gin_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemmem"
)

// serve starts an engine whose routes are set by routes, behind a fresh
// in-memory store.
func serve(t *testing.T, routes func(r *gin.Engine, keys *idemhttp.Middleware)) string {
	t.Helper()
	keys, err := idemhttp.New(&idemhttp.Config{Store: idemmem.NewStore(nil), SharedScope: true})
	if err != nil {
		t.Fatal(err)
	}
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	routes(r, keys)
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	return srv.URL
}

type answer struct {
	status   int
	replayed string
	body     string
}

func send(t *testing.T, url, key string) answer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"item":"book"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(idemhttp.HeaderKey, key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return answer{resp.StatusCode, resp.Header.Get(idemhttp.HeaderReplayed), string(body)}
}

// A status set without a body is written by gin only after the chain, on
// its own writer: the adapter must hand it to the middleware, or the
// middleware keeps (and replays) 200.
func TestStatusWithoutBodyIsKept(t *testing.T) {
	runs := 0
	url := serve(t, func(r *gin.Engine, keys *idemhttp.Middleware) {
		r.POST("/jobs", idempotent(keys), func(c *gin.Context) {
			runs++
			c.Header("Location", "/jobs/1")
			c.Status(http.StatusAccepted)
		})
	})
	first, second := send(t, url+"/jobs", "job-1"), send(t, url+"/jobs", "job-1")
	if first != (answer{http.StatusAccepted, "", ""}) {
		t.Errorf("first answer %+v, want 202", first)
	}
	if second != (answer{http.StatusAccepted, "true", ""}) {
		t.Errorf("second answer %+v, want 202 replayed", second)
	}
	if runs != 1 {
		t.Errorf("handler ran %d times, want 1", runs)
	}
}

// Every handler after the adapter runs inside the middleware, once per key,
// with the execution in its request's context; a replay runs none of them;
// middleware before the adapter sees the status sent, both times.
func TestChainRunsOnceInsideTheMiddleware(t *testing.T) {
	var seen []int
	var checks, creates int
	url := serve(t, func(r *gin.Engine, keys *idemhttp.Middleware) {
		r.Use(func(c *gin.Context) {
			c.Next()
			seen = append(seen, c.Writer.Status())
		})
		r.POST("/orders", idempotent(keys), func(c *gin.Context) {
			checks++
			if _, key, ok := idemhttp.KeyFromContext(c.Request.Context()); !ok || key != "order-1" {
				c.AbortWithStatus(http.StatusTeapot)
			}
		}, func(c *gin.Context) {
			creates++
			c.JSON(http.StatusCreated, gin.H{"id": creates})
		})
	})
	first, second := send(t, url+"/orders", "order-1"), send(t, url+"/orders", "order-1")
	if first != (answer{http.StatusCreated, "", `{"id":1}`}) {
		t.Errorf("first answer %+v", first)
	}
	if second != (answer{http.StatusCreated, "true", `{"id":1}`}) {
		t.Errorf("second answer %+v", second)
	}
	if checks != 1 || creates != 1 {
		t.Errorf("handlers ran %d and %d times, want once each", checks, creates)
	}
	if len(seen) != 2 || seen[0] != http.StatusCreated || seen[1] != http.StatusCreated {
		t.Errorf("the outer middleware saw statuses %v, want [201 201]", seen)
	}
}

// A panic stops the chain where it happened: the middleware answers 500 and
// frees the key, gin runs no handler after it, and the retry runs again.
func TestPanicStopsTheChainAndFreesTheKey(t *testing.T) {
	calls, after := 0, 0
	url := serve(t, func(r *gin.Engine, keys *idemhttp.Middleware) {
		r.POST("/orders", idempotent(keys), func(c *gin.Context) {
			calls++
			if calls == 1 {
				panic("first attempt fails")
			}
			c.JSON(http.StatusCreated, gin.H{"attempt": calls})
		}, func(c *gin.Context) {
			after++
		})
	})
	if got := send(t, url+"/orders", "order-1"); got.status != http.StatusInternalServerError {
		t.Errorf("first answer %+v, want 500", got)
	}
	if after != 0 {
		t.Errorf("a handler after the panic ran %d times", after)
	}
	if got := send(t, url+"/orders", "order-1"); got != (answer{http.StatusCreated, "", `{"attempt":2}`}) {
		t.Errorf("retry answered %+v, want a new 201", got)
	}
}
