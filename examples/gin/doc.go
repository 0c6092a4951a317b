// Package gin shows the idemhttp middleware on a gin engine, through a
// small adapter that turns keys.Handler into a gin.HandlerFunc.
//
// Wrapping a net/http middleware for gin takes more than calling c.Next
// inside it, because gin's handlers do not write to the http.ResponseWriter
// the middleware hands on: they write to c.Writer, which goes straight to
// the client. The middleware would then keep what it saw, nothing, and
// replay a blank 200. So the adapter, while the rest of the chain runs
// inside keys.Handler:
//
//   - points c.Writer at the middleware's writer, keeping gin's own rules (a
//     status is written with the first byte of the body or by
//     WriteHeaderNow, which gin calls only after the whole chain, on its
//     own writer: the adapter calls it on the middleware's);
//   - points c.Request at the middleware's request, whose body it has read
//     and put back and whose context names the execution
//     (idemhttp.ExecutionFromContext);
//   - gives both back afterwards, so that middleware outside the adapter
//     (a logger) sees the status that was sent;
//   - stops the chain (c.Abort) when the rest of it did not run to the
//     end: a replay or a refusal, which the middleware answered without
//     running the handlers, or a panic, which it answered with 500.
//
// The whole program is in Example.
package gin
