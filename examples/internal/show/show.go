// Package show is what the examples send and print: a POST under an
// Idempotency-Key and the answer it got, one line each, so that every
// example's output reads the same and its code shows only the mounting.
package show

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/idem-go/idem/idemhttp"
)

// Post sends body as JSON with the Idempotency-Key key and prints the
// answer: its status, whether it was replayed, and its body (a problem's
// type, for a refusal).
func Post(url, key, body string) {
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		panic(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(idemhttp.HeaderKey, key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	got, _ := io.ReadAll(resp.Body)
	if resp.Header.Get("Content-Type") == idemhttp.ProblemContentType {
		var problem struct{ Type string }
		json.Unmarshal(got, &problem)
		got = []byte(problem.Type)
	}
	fmt.Printf("%d replayed=%q %s\n", resp.StatusCode, resp.Header.Get(idemhttp.HeaderReplayed), strings.TrimSpace(string(got)))
}
