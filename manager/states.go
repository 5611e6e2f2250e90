package manager

import (
	"errors"
	"fmt"
)

// State is where a sandbox is in its life. Every state and every legal
// move between states is listed here and nowhere else.
type State string

// The states of a sandbox.
const (
	// Pending: being created; its directories may be incomplete. A
	// pending record found by New is a creation that crashed: purged.
	Pending State = "pending"
	// Active: upper and work directories exist; it takes changes
	// (mounted when the manager mounts) and can be committed.
	Active State = "active"
	// Committed: its changes are in the original and its directories
	// are gone. A sandbox committed with Keep moves on to Active at once.
	Committed State = "committed"
	// RolledBack: its changes were discarded and its directories are
	// gone. A sandbox rolled back with keep moves on to Active at once.
	RolledBack State = "rolled-back"
	// CleanedUp: destroyed; nothing of it is left but its record.
	CleanedUp State = "cleaned-up"
	// Errored: its directories are missing or damaged; GC purges it.
	Errored State = "errored"
)

// transitions is the table of legal moves. A move to the same state is
// not a move and is illegal.
var transitions = map[State][]State{
	Pending:    {Active, Errored, CleanedUp},
	Active:     {Committed, RolledBack, Errored, CleanedUp},
	Committed:  {Active, Errored, CleanedUp}, // -> Active: kept and re-used
	RolledBack: {Active, Errored, CleanedUp}, // -> Active: kept and re-used
	Errored:    {CleanedUp},
	CleanedUp:  nil,
}

// States lists every state, in the order of a sandbox's life.
var States = []State{Pending, Active, Committed, RolledBack, CleanedUp, Errored}

// Valid reports whether s is a known state.
func (s State) Valid() bool {
	_, ok := transitions[s]
	return ok
}

// CanMove reports whether a sandbox in state s may move to state to.
func (s State) CanMove(to State) bool {
	for _, t := range transitions[s] {
		if t == to {
			return true
		}
	}
	return false
}

// NeedsDirs reports whether a sandbox in state s owns an upper and a work
// directory.
func (s State) NeedsDirs() bool { return s == Active }

// ErrIllegalMove is matched (errors.Is) by every *MoveError.
var ErrIllegalMove = errors.New("illegal state move")

// MoveError says a sandbox was asked to make a move the table forbids.
type MoveError struct {
	ID       string
	From, To State
}

func (e *MoveError) Error() string {
	return fmt.Sprintf("sandbox %s: %v from %s to %s", e.ID, ErrIllegalMove, e.From, e.To)
}

// Is makes errors.Is(err, ErrIllegalMove) true.
func (e *MoveError) Is(target error) bool { return target == ErrIllegalMove }

// move changes r's state to to, or says why it may not.
func (r *record) move(to State) error {
	if !r.State.CanMove(to) {
		return &MoveError{ID: r.ID, From: r.State, To: to}
	}
	r.State = to
	return nil
}
