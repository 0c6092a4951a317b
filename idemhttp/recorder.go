package idemhttp

import (
	"bytes"
	"net/http"
)

// recorder captures a handler's response so the middleware can decide what
// to keep before anything reaches the client.
//
// It buffers up to limit body bytes. Past the limit, what happens depends on
// whether streaming is allowed:
//   - streaming (a plain Store: the effect is not part of the key's
//     transaction and has already happened) switches to pass-through: what
//     was buffered and everything after goes to the client, and the kept
//     response records that its body was omitted;
//   - otherwise (a TxStore: nothing may reach the client before the commit)
//     the excess is discarded and overflow is set, and the middleware rolls
//     the transaction back instead of keeping a truncated answer.
//
// Flush follows the same rule: with streaming it starts pass-through and
// flushes; without, it is honoured once the response is sent after commit.
type recorder struct {
	w           http.ResponseWriter
	header      http.Header
	status      int
	wroteHeader bool
	wroteAny    bool
	buf         bytes.Buffer
	limit       int
	overflow    bool
	canStream   bool
	streaming   bool
	flushed     bool
}

func newRecorder(w http.ResponseWriter, limit int, canStream bool) *recorder {
	r := &recorder{}
	r.init(w, limit, canStream)
	return r
}

// init makes r ready to record a handler's answer to w.
func (r *recorder) init(w http.ResponseWriter, limit int, canStream bool) {
	*r = recorder{w: w, header: make(http.Header), limit: limit, canStream: canStream}
}

func (r *recorder) Header() http.Header {
	if r.streaming {
		return r.w.Header()
	}
	return r.header
}

func (r *recorder) WriteHeader(status int) {
	if r.wroteHeader {
		return
	}
	// 1xx informational responses are not the answer; pass them on only when
	// they cannot disclose anything before commit.
	if status >= 100 && status < 200 {
		return
	}
	r.wroteHeader = true
	r.wroteAny = true
	r.status = status
}

func (r *recorder) Write(p []byte) (int, error) {
	if !r.wroteHeader {
		r.WriteHeader(http.StatusOK)
	}
	r.wroteAny = true
	if r.streaming {
		return r.w.Write(p)
	}
	if r.buf.Len()+len(p) <= r.limit {
		return r.buf.Write(p)
	}
	r.overflow = true
	if r.canStream {
		r.startStreaming()
		return r.w.Write(p)
	}
	// Keep what fits so the handler sees no error; the middleware will not
	// keep or send a truncated answer.
	room := r.limit - r.buf.Len()
	if room > 0 {
		r.buf.Write(p[:room])
	}
	return len(p), nil
}

// Flush implements http.Flusher.
func (r *recorder) Flush() {
	r.flushed = true
	if !r.canStream {
		return
	}
	if !r.streaming {
		r.startStreaming()
	}
	http.NewResponseController(r.w).Flush()
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (r *recorder) Unwrap() http.ResponseWriter { return r.w }

// startStreaming sends the headers and the buffered body to the client and
// makes every later write go straight through.
func (r *recorder) startStreaming() {
	r.streaming = true
	dst := r.w.Header()
	for k, v := range r.header {
		dst[k] = v
	}
	dst.Del("Content-Length")
	r.w.WriteHeader(r.statusCode())
	r.w.Write(r.buf.Bytes())
}

func (r *recorder) statusCode() int {
	if r.status == 0 {
		return http.StatusOK
	}
	return r.status
}

// send writes the captured response to the client, unless streaming has
// already done so.
func (r *recorder) send(extra http.Header) {
	if r.streaming {
		return
	}
	dst := r.w.Header()
	for k, v := range r.header {
		dst[k] = v
	}
	for k, v := range extra {
		dst[k] = v
	}
	r.w.WriteHeader(r.statusCode())
	r.w.Write(r.buf.Bytes())
	if r.flushed {
		http.NewResponseController(r.w).Flush()
	}
}
