package idem

import (
	"context"
	"errors"
	"time"
)

// DeadLetterClass says why a message was dead-lettered.
type DeadLetterClass string

const (
	// DeadPermanent: an attempt failed with a permanent error.
	DeadPermanent DeadLetterClass = "permanent"
	// DeadExhausted: every attempt the retry policy allows failed.
	DeadExhausted DeadLetterClass = "exhausted"
)

// LetterState is where a dead letter is in its life.
type LetterState string

const (
	// LetterDead: out of the processing flow, waiting for a person.
	LetterDead LetterState = "dead"
	// LetterRedriven: sent back to its consumer (possibly edited).
	LetterRedriven LetterState = "redriven"
	// LetterDiscarded: given up on, on purpose, with a reason.
	LetterDiscarded LetterState = "discarded"
)

// Attempt is one failed attempt to process a message.
type Attempt struct {
	// Number counts attempts from 1.
	Number int
	At     time.Time
	Class  ErrorClass
	// Error is the error's text.
	Error string
}

// LetterEvent is one entry of a dead letter's history: who did what, when
// and why.
type LetterEvent struct {
	At     time.Time
	Actor  string
	Action string // "dead-lettered", "redriven", "edited and redriven", "discarded"
	Reason string
	// State is the state the letter entered.
	State LetterState
}

// DeadLetter is a message taken out of the processing flow, with everything
// a person needs to decide what to do with it.
type DeadLetter struct {
	ID       string
	Consumer string
	// Message is the original message: bytes, headers, topic and key as
	// they arrived.
	Message Message
	Class   DeadLetterClass
	// Attempts is every attempt, oldest first.
	Attempts      []Attempt
	FirstFailedAt time.Time
	LastFailedAt  time.Time
	State         LetterState
	// History is every state change, oldest first.
	History []LetterEvent
}

// LastError is the text of the last attempt's error.
func (d DeadLetter) LastError() string {
	if len(d.Attempts) == 0 {
		return ""
	}
	return d.Attempts[len(d.Attempts)-1].Error
}

// DeadLetterFilter selects dead letters. Zero fields select everything.
type DeadLetterFilter struct {
	Consumer string
	Class    DeadLetterClass
	State    LetterState
	// Since keeps letters whose last failure is at or after it.
	Since time.Time
	// Limit bounds the result. Zero means no bound.
	Limit int
}

// DeadLetterStats summarises one consumer's dead letters in state dead.
type DeadLetterStats struct {
	Consumer string
	Count    int
	// Oldest is the first failure of the oldest dead letter.
	Oldest time.Time
}

// ErrInvalidTransition is returned when a dead letter cannot move to the
// requested state (it is no longer dead, say).
var ErrInvalidTransition = errors.New("idem: invalid dead-letter transition")

// DeadLetters keeps dead letters. Nothing is ever evicted silently.
type DeadLetters interface {
	// Add records dl (ID, State and History are set by the store) in the
	// transaction carried by ctx, or one of its own, and returns its ID.
	Add(ctx context.Context, dl DeadLetter) (string, error)
	// Get returns one. Returns ErrNotFound when there is none.
	Get(ctx context.Context, id string) (DeadLetter, error)
	// List returns those f selects, most recent failure first.
	List(ctx context.Context, f DeadLetterFilter) ([]DeadLetter, error)
	// Resolve moves a dead letter from LetterDead to to (LetterRedriven or
	// LetterDiscarded), appending an event. Returns ErrNotFound, or
	// ErrInvalidTransition having changed nothing.
	Resolve(ctx context.Context, id string, to LetterState, ev LetterEvent) (DeadLetter, error)
	// Stats summarises the letters in state dead, per consumer.
	Stats(ctx context.Context) ([]DeadLetterStats, error)
}
