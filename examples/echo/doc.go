// Package echo shows the idemhttp middleware on an echo server, mounted
// with echo.WrapMiddleware(keys.Handler) on the route it protects.
//
// One thing needs care: an echo handler may return an error instead of
// writing its answer, and echo writes that error (its HTTPErrorHandler)
// only once the whole chain has returned, outside the middleware, after
// the middleware has already sent, and kept, whatever the handler wrote:
// nothing, a blank 200. So the route puts a small middleware inside
// keys.Handler that answers a returned error right there (echo.Context's
// Error), and the answer the middleware keeps is the error's: a 4xx kept
// and replayed, a 5xx not kept, so that a retry runs again.
//
// The whole program is in Example.
package echo
