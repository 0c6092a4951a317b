package gin_test

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"

	"github.com/gin-gonic/gin"

	"github.com/idem-go/idem/examples/internal/show"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemmem"
)

type order struct {
	ID   int64  `json:"id"`
	Item string `json:"item"`
}

// idempotent runs the rest of the gin chain inside keys.Handler, writing
// through the middleware so that it keeps, and replays, what the handlers
// answered.
func idempotent(keys *idemhttp.Middleware) gin.HandlerFunc {
	return func(c *gin.Context) {
		finished := false
		keys.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			gw, req := c.Writer, c.Request
			defer func() { c.Writer, c.Request = gw, req }() // for the middleware outside this one
			rw := &responseWriter{ResponseWriter: gw, w: w, status: http.StatusOK, size: -1}
			c.Writer, c.Request = rw, r
			c.Next()
			rw.WriteHeaderNow() // gin writes a bare c.Status only after the chain, and to its own writer
			finished = true
		})).ServeHTTP(c.Writer, c.Request)
		if !finished {
			c.Abort() // a replay or a refusal, answered without the handlers, or a panic
		}
	}
}

// responseWriter is the gin.ResponseWriter the handlers see inside the
// middleware: what they write goes to w, the middleware's writer.
type responseWriter struct {
	gin.ResponseWriter // gin's own, for CloseNotify and Pusher
	w                  http.ResponseWriter
	status, size       int
}

func (rw *responseWriter) Header() http.Header { return rw.w.Header() }
func (rw *responseWriter) Status() int         { return rw.status }
func (rw *responseWriter) Size() int           { return rw.size }
func (rw *responseWriter) Written() bool       { return rw.size != -1 }

func (rw *responseWriter) WriteHeader(code int) {
	if code > 0 && !rw.Written() {
		rw.status = code
	}
}

func (rw *responseWriter) WriteHeaderNow() {
	if !rw.Written() {
		rw.size = 0
		rw.w.WriteHeader(rw.status)
	}
}

func (rw *responseWriter) Write(b []byte) (int, error) {
	rw.WriteHeaderNow()
	n, err := rw.w.Write(b)
	rw.size += n
	return n, err
}

func (rw *responseWriter) WriteString(s string) (int, error) { return rw.Write([]byte(s)) }

func (rw *responseWriter) Flush() {
	rw.WriteHeaderNow()
	http.NewResponseController(rw.w).Flush()
}

// Hijack is refused: a hijacked connection would bypass the middleware.
func (rw *responseWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return nil, nil, http.ErrNotSupported
}

func (rw *responseWriter) Unwrap() http.ResponseWriter { return rw.w }

func Example() {
	var created atomic.Int64
	createOrder := func(c *gin.Context) {
		var o order
		if err := c.ShouldBindJSON(&o); err != nil {
			c.String(http.StatusBadRequest, "not an order") // a 4xx is kept and replayed too
			return
		}
		o.ID = created.Add(1)
		c.JSON(http.StatusCreated, o)
	}

	keys, err := idemhttp.New(&idemhttp.Config{
		Store:       idemmem.NewStore(nil),
		SharedScope: true, // one caller here; a service with several gives Scope
	})
	if err != nil {
		panic(err)
	}
	gin.SetMode(gin.ReleaseMode) // no debug lines on standard output
	r := gin.New()
	r.POST("/orders", idempotent(keys), createOrder) // or r.Group("/v1", idempotent(keys)) for every route of a group
	srv := httptest.NewServer(r)
	defer srv.Close()

	const key = "3f1c2b9e-7d4a-4c52-9b1e-0a6f8d2c4e71"
	show.Post(srv.URL+"/orders", key, `{"item":"book"}`)
	show.Post(srv.URL+"/orders", key, `{"item":"book"}`) // a retry
	show.Post(srv.URL+"/orders", key, `{"item":"lamp"}`) // the key reused for another order
	fmt.Println("orders created:", created.Load())
	// Output:
	// 201 replayed="" {"id":1,"item":"book"}
	// 201 replayed="true" {"id":1,"item":"book"}
	// 422 replayed="" urn:idem:problem:idempotency-key-mismatch
	// orders created: 1
}
