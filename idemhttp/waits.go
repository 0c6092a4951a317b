package idemhttp

import "github.com/idem-go/idem/internal/keywait"

// waitKey names a key in its scope; the waits and gates on it are
// keywait's, shared with idemgrpc.
type waitKey = keywait.Key

// recentKeys are keywait's, shared with idemgrpc.
type recentKeys = keywait.Recent

var newRecentKeys = keywait.NewRecent
