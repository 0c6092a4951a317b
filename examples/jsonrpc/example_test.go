package jsonrpc_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/idem-go/idem/examples/jsonrpc"
	"github.com/idem-go/idem/idemmem"
	"github.com/idem-go/idem/keyed"
)

// A JSON-RPC server whose transfer method runs once per key: the retry,
// with another id, gets the first answer under its own id, marked as a
// replay; the key sent with other params is refused; a call without a key
// is refused before anything runs.
func Example() {
	transfers := 0
	srv, err := jsonrpc.New(&jsonrpc.Config{Engine: keyed.Config{Store: idemmem.NewStore(nil)}, SharedScope: true,
		Methods: map[string]jsonrpc.Method{"transfer": func(ctx context.Context, params json.RawMessage) (any, error) {
			var p struct{ Amount int }
			if err := json.Unmarshal(params, &p); err != nil || p.Amount <= 0 {
				return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "amount must be positive"}
			}
			transfers++
			return map[string]int{"transfer": transfers, "amount": p.Amount}, nil
		}}})
	if err != nil {
		panic(err)
	}
	ts := httptest.NewServer(srv)
	defer ts.Close()

	send := func(key, body string) {
		req, _ := http.NewRequest("POST", ts.URL, strings.NewReader(body))
		if key != "" {
			req.Header.Set(jsonrpc.HeaderKey, key)
		}
		resp, err := ts.Client().Do(req)
		if err != nil {
			panic(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		fmt.Printf("replayed=%q %s\n", resp.Header.Get(jsonrpc.HeaderReplayed), b)
	}
	send("t-1", `{"jsonrpc":"2.0","method":"transfer","params":{"amount":10},"id":1}`)
	send("t-1", `{"jsonrpc":"2.0","method":"transfer","params":{"amount":10},"id":2}`)
	send("t-1", `{"jsonrpc":"2.0","method":"transfer","params":{"amount":99},"id":3}`)
	send("", `{"jsonrpc":"2.0","method":"transfer","params":{"amount":10},"id":4}`)
	fmt.Println("transfers made:", transfers)
	// Output:
	// replayed="" {"jsonrpc":"2.0","id":1,"result":{"amount":10,"transfer":1}}
	// replayed="true" {"jsonrpc":"2.0","id":2,"result":{"amount":10,"transfer":1}}
	// replayed="" {"jsonrpc":"2.0","id":3,"error":{"code":-32001,"message":"this key was used with another call (method or params); use a new key for a new operation"}}
	// replayed="" {"jsonrpc":"2.0","id":4,"error":{"code":-32600,"message":"every call carries an Idempotency-Key header, one key per operation: invalid idempotency key: empty"}}
	// transfers made: 1
}
