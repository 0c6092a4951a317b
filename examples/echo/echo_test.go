package echo_test

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idem-go/idem/idemhttp"
	"github.com/idem-go/idem/idemmem"
	"github.com/labstack/echo/v4"
)

// serve starts an echo server with h on POST /orders, mounted as in the
// example, behind a fresh in-memory store.
func serve(t *testing.T, h echo.HandlerFunc) string {
	t.Helper()
	keys, err := idemhttp.New(&idemhttp.Config{Store: idemmem.NewStore(nil), SharedScope: true})
	if err != nil {
		t.Fatal(err)
	}
	e := echo.New()
	e.POST("/orders", h, echo.WrapMiddleware(keys.Handler), answerErrors)
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	return srv.URL + "/orders"
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
	return answer{resp.StatusCode, resp.Header.Get(idemhttp.HeaderReplayed), strings.TrimSpace(string(body))}
}

// A 4xx returned as an error is the answer the client gets and the one
// replayed, not a blank 200.
func TestReturnedErrorIsKept(t *testing.T) {
	runs := 0
	url := serve(t, func(c echo.Context) error {
		runs++
		return echo.NewHTTPError(http.StatusConflict, "out of stock")
	})
	want := `{"message":"out of stock"}`
	if got := send(t, url, "order-1"); got != (answer{http.StatusConflict, "", want}) {
		t.Errorf("first answer %+v, want 409 %s", got, want)
	}
	if got := send(t, url, "order-1"); got != (answer{http.StatusConflict, "true", want}) {
		t.Errorf("second answer %+v, want 409 %s replayed", got, want)
	}
	if runs != 1 {
		t.Errorf("handler ran %d times, want 1", runs)
	}
}

// Any other error is a 500, which is not kept: the retry runs again.
func TestReturnedFailureRunsAgain(t *testing.T) {
	runs := 0
	url := serve(t, func(c echo.Context) error {
		runs++
		if runs == 1 {
			return errors.New("database unreachable")
		}
		return c.JSON(http.StatusCreated, map[string]int{"attempt": runs})
	})
	if got := send(t, url, "order-1"); got.status != http.StatusInternalServerError || got.replayed != "" {
		t.Errorf("first answer %+v, want 500", got)
	}
	if got := send(t, url, "order-1"); got != (answer{http.StatusCreated, "", `{"attempt":2}`}) {
		t.Errorf("retry answered %+v, want a new 201", got)
	}
}
