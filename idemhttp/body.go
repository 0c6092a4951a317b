package idemhttp

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
)

// bodyReader hands the handler the body the middleware read: a
// bytes.Reader that closes, in one allocation rather than the two of
// io.NopCloser(bytes.NewReader(body)).
type bodyReader struct{ bytes.Reader }

func (*bodyReader) Close() error { return nil }

// readBody reads at most limit bytes; tooLarge reports a longer body.
func readBody(r *http.Request, limit int64) (body []byte, tooLarge bool, err error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, false, nil
	}
	if r.ContentLength > limit {
		return nil, true, nil
	}
	// A body of announced length is read into one buffer of that size
	// (and a byte more, to see the end without growing it); one of
	// unknown length starts as io.ReadAll would.
	size := int64(512)
	if r.ContentLength >= 0 {
		size = r.ContentLength + 1
	}
	body = make([]byte, 0, min(size, limit+1))
	for {
		if len(body) == cap(body) {
			body = append(body, 0)[:len(body)]
		}
		// Never read more than a byte past the limit: enough to tell
		// that the body is too large.
		room := min(int64(cap(body)-len(body)), limit+1-int64(len(body)))
		n, rerr := r.Body.Read(body[len(body) : len(body)+int(room)])
		body = body[:len(body)+n]
		switch {
		case rerr != nil && rerr != io.EOF:
			return nil, false, fmt.Errorf("reading the request body: %w", rerr)
		case int64(len(body)) > limit:
			return nil, true, nil
		case rerr == io.EOF:
			return body, false, nil
		}
	}
}
