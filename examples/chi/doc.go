// Package chi shows the idemhttp middleware on a chi router. keys.Handler is
// a plain func(http.Handler) http.Handler, which is what chi's middleware
// is: r.With(keys.Handler) protects one route, r.Use(keys.Handler) every
// route of a router or group (the middleware lets safe methods through
// untouched; it protects POST and PATCH unless Config.Methods says
// otherwise).
//
// The whole program is in Example. probe_test.go probes the same kind of
// router with idemprobe, each check a subtest, as a team's own go test
// would.
package chi
