package idemhttp

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/iotest"
)

// TestReadBody checks the sized read of the request body against what
// io.ReadAll over an io.LimitReader gives, around the limit and with
// announced lengths that are right, unknown or wrong.
func TestReadBody(t *testing.T) {
	t.Parallel()
	const limit = 8
	tests := []struct {
		name          string
		body          io.Reader
		contentLength int64
		want          string
		tooLarge      bool
		err           bool
	}{
		{name: "empty, known", body: strings.NewReader(""), contentLength: 0, want: ""},
		{name: "short, known", body: strings.NewReader("abc"), contentLength: 3, want: "abc"},
		{name: "at the limit, known", body: strings.NewReader("12345678"), contentLength: 8, want: "12345678"},
		{name: "over the limit, known", body: strings.NewReader("123456789"), contentLength: 9, tooLarge: true},
		{name: "short, unknown", body: strings.NewReader("abc"), contentLength: -1, want: "abc"},
		{name: "at the limit, unknown", body: strings.NewReader("12345678"), contentLength: -1, want: "12345678"},
		{name: "over the limit, unknown", body: strings.NewReader("123456789"), contentLength: -1, tooLarge: true},
		{name: "longer than announced", body: strings.NewReader("abcdef"), contentLength: 2, want: "abcdef"},
		{name: "longer than announced, over the limit", body: strings.NewReader("123456789"), contentLength: 2, tooLarge: true},
		{name: "shorter than announced", body: strings.NewReader("ab"), contentLength: 5, want: "ab"},
		{name: "one byte at a time", body: iotest.OneByteReader(strings.NewReader("1234567")), contentLength: -1, want: "1234567"},
		{name: "read error", body: iotest.TimeoutReader(strings.NewReader("12345678")), contentLength: -1, err: true},
		// An error that comes with the byte past the limit is reported as
		// the error, as io.ReadAll does.
		{name: "read error past the limit", body: &dataThenErr{data: "123456789"}, contentLength: -1, err: true},
	}
	for _, tc := range tests {
		r := httptest.NewRequest(http.MethodPost, "/", nil)
		r.Body = io.NopCloser(tc.body)
		r.ContentLength = tc.contentLength
		got, tooLarge, err := readBody(r, limit)
		switch {
		case tc.err:
			if err == nil || !errors.Is(err, iotest.ErrTimeout) {
				t.Errorf("%s: err = %v, want a wrapped iotest.ErrTimeout", tc.name, err)
			}
		case err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tooLarge != tc.tooLarge:
			t.Errorf("%s: tooLarge = %v, want %v", tc.name, tooLarge, tc.tooLarge)
		case !tc.tooLarge && (got == nil || !bytes.Equal(got, []byte(tc.want))):
			t.Errorf("%s: body %q, want %q", tc.name, got, tc.want)
		}
	}
	if got, tooLarge, err := readBody(httptest.NewRequest(http.MethodPost, "/", http.NoBody), limit); got != nil || tooLarge || err != nil {
		t.Errorf("no body: %q, %v, %v", got, tooLarge, err)
	}
}

// dataThenErr returns all its data and iotest.ErrTimeout from one Read.
type dataThenErr struct{ data string }

func (r *dataThenErr) Read(p []byte) (int, error) {
	n := copy(p, r.data)
	r.data = r.data[n:]
	return n, iotest.ErrTimeout
}

// TestReplayedBody: the handler reads the body the middleware read, and
// can close it.
func TestReplayedBody(t *testing.T) {
	t.Parallel()
	var br bodyReader
	br.Reset([]byte("payload"))
	var rc io.ReadCloser = &br
	b, err := io.ReadAll(rc)
	if err != nil || string(b) != "payload" || rc.Close() != nil {
		t.Fatalf("read %q, %v", b, err)
	}
}
