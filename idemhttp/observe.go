package idemhttp

import "github.com/idem-go/idem/keyed"

// The Observer's vocabulary is the engine's (package keyed), the same on
// every face: these names are kept so that observers written for idemhttp
// compile unchanged.

// Phase is a step of a protected request, as an Observer sees it.
type Phase = keyed.Phase

// Phases (see keyed.Phase).
const (
	PhaseRequest  = keyed.PhaseRequest
	PhaseClaim    = keyed.PhaseClaim
	PhaseHandler  = keyed.PhaseHandler
	PhaseComplete = keyed.PhaseComplete
	PhaseReplay   = keyed.PhaseReplay
)

// StoreOp names one round trip to the idem.Store, as Observer.Store sees it.
type StoreOp = keyed.StoreOp

// Store operations (see keyed.StoreOp).
const (
	StoreClaim    = keyed.StoreClaim
	StoreComplete = keyed.StoreComplete
	StoreRelease  = keyed.StoreRelease
	StoreGet      = keyed.StoreGet
	StoreReplay   = keyed.StoreReplay
)

// Claim results, as Event.Claim reports them at the end of PhaseClaim.
const (
	ClaimAcquired  = keyed.ClaimAcquired
	ClaimCompleted = keyed.ClaimCompleted
	ClaimMismatch  = keyed.ClaimMismatch
	ClaimInFlight  = keyed.ClaimInFlight
	ClaimError     = keyed.ClaimError
)

// Event describes a phase of a protected request to an Observer; its
// Request is the request itself.
type Event = keyed.Event

// Observer sees the phases of every protected request and every round trip
// to the store (see keyed.Observer).
type Observer = keyed.Observer

// Observers returns an Observer that calls each of obs in turn (see
// keyed.Observers).
func Observers(obs ...Observer) Observer { return keyed.Observers(obs...) }
