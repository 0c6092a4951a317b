package echo_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"

	"github.com/labstack/echo/v4"

	"github.com/idem-go/idem/examples/internal/show"
	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemmem"
)

type order struct {
	ID   int64  `json:"id"`
	Item string `json:"item"`
}

// answerErrors writes the error a handler returns where it runs, so that
// keys.Handler, around it, keeps that answer: left to echo, the error would
// be written after the middleware had already kept and sent a blank 200.
func answerErrors(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if err := next(c); err != nil {
			c.Error(err)
		}
		return nil
	}
}

func Example() {
	var created atomic.Int64
	createOrder := func(c echo.Context) error {
		var o order
		if err := c.Bind(&o); err != nil {
			return err // a 400, kept and replayed like any answer
		}
		o.ID = created.Add(1)
		return c.JSON(http.StatusCreated, o)
	}

	keys, err := idemhttp.New(&idemhttp.Config{
		Store:       idemmem.NewStore(nil),
		SharedScope: true, // one caller here; a service with several gives Scope
	})
	if err != nil {
		panic(err)
	}
	e := echo.New()
	// Route middleware runs first to last: keys.Handler, then answerErrors
	// inside it, then the handler.
	e.POST("/orders", createOrder, echo.WrapMiddleware(keys.Handler), answerErrors)
	srv := httptest.NewServer(e)
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
