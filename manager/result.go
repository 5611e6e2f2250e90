package manager

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/sbxfs/sbxfs/fsutil"
	"github.com/sbxfs/sbxfs/layers"
)

// Errors to match with errors.Is.
var (
	ErrLocked    = errors.New("another sbxfs manager uses this state root")
	ErrClosed    = errors.New("the manager is closed")
	ErrNotFound  = errors.New("no such sandbox")
	ErrInvalid   = errors.New("invalid argument")
	ErrNotActive = errors.New("the sandbox is not active")
	// ErrOverlap says two sandboxes of one plan change the same path of
	// the same original: applying both would silently keep only one.
	ErrOverlap = errors.New("sandboxes of the plan change the same path")
	// ErrInterrupted says a sandbox holds an interrupted commit that could
	// not be finished or undone: its undo log and backups are kept.
	ErrInterrupted = errors.New("the sandbox holds an interrupted commit")
	// ErrNested says an active sandbox is nested in this one (its original
	// is this sandbox's mount): unmounting or removing this one alone would
	// take its original away. Commit, roll back or destroy the plan, or
	// the nested sandbox first. Its code on the daemon socket is busy.
	ErrNested = errors.New("a sandbox nested in it is active")
	// ErrMounted says Mount found the sandbox mounted already (by this
	// manager, or by another process). Its code on the daemon socket is
	// busy.
	ErrMounted = errors.New("the sandbox is already mounted")
	// ErrParentUnmounted says Mount was asked for a nested sandbox whose
	// parent (the sandbox whose mount holds its original) is not mounted:
	// mount the parent first. Its code on the daemon socket is busy.
	ErrParentUnmounted = errors.New("the sandbox it is nested in is not mounted")
	// ErrOriginalMissing says a sandbox's original is not where it was
	// recorded (moved or removed): nothing is committed, the sandbox keeps
	// its changes. Its code on the daemon socket is original_missing.
	ErrOriginalMissing = errors.New("the sandbox's original is missing")
)

// Failure is one sandbox that an operation could not handle, and why.
type Failure struct {
	ID  string `json:"id"`
	Err error  `json:"-"`
}

func (f Failure) Error() string { return fmt.Sprintf("%s: %v", f.ID, f.Err) }

// Unwrap gives the cause.
func (f Failure) Unwrap() error { return f.Err }

// PlanResult is the outcome of a plan commit, the same shape whether it
// succeeded or failed.
//
//   - Committed: the sandboxes whose changes are in their originals, in
//     commit order. On failure it is empty, unless the failure came after
//     the plan's commit point (then Err says what was left to clean up).
//   - RolledBack: the sandboxes whose originals are as before: never
//     applied, or applied and undone. They stay Active with their changes,
//     so the commit can be retried once the cause is fixed.
//   - RollbackFailed: the sandboxes whose undo failed, each with its cause:
//     their originals may be partly changed; their undo logs and backups
//     are kept, and the next operation on the plan retries the undo.
//   - StillMounted: committed sandboxes whose mount was in use (a file
//     open, a working directory in it) and could not be unmounted: they
//     stay mounted and active over their new originals, with empty
//     sandboxes (as with Keep).
//   - Applied: on success, what each committed sandbox changed in its
//     original, in commit order: the sandboxes of the plan nested in
//     another are left out (what they brought is in their parent's).
//   - Err: nil on success, else the first cause.
type PlanResult struct {
	Plan           string    `json:"plan"`
	Committed      []string  `json:"committed"`
	RolledBack     []string  `json:"rolled_back"`
	RollbackFailed []Failure `json:"rollback_failed"`
	StillMounted   []string  `json:"still_mounted"`
	Applied        []Applied `json:"applied,omitempty"`
	Err            error     `json:"-"`
}

// Applied is what the commit of one sandbox changed in its original (for
// a git commit of exactly those paths: commit.GitPaths).
type Applied struct {
	ID       string          `json:"id"`
	Original string          `json:"original"`
	Changes  []layers.Change `json:"changes"`
}

// MarshalJSON writes a with original_b64 beside an original whose path is
// not valid UTF-8 (fsutil.B64IfInvalid).
func (a Applied) MarshalJSON() ([]byte, error) {
	type plain Applied
	return json.Marshal(struct {
		plain
		OriginalB64 string `json:"original_b64,omitempty"`
	}{plain(a), fsutil.B64IfInvalid(a.Original)})
}

// UnmarshalJSON reads what MarshalJSON writes, the exact path included.
func (a *Applied) UnmarshalJSON(b []byte) error {
	type plain Applied
	v := struct {
		*plain
		OriginalB64 string `json:"original_b64,omitempty"`
	}{plain: (*plain)(a)}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	return fsutil.DecodeB64Fields([]*string{&a.Original}, []string{v.OriginalB64})
}

// PlanError is a failed plan commit: the very same value as the
// PlanResult returned with it, as an error (errors.As).
type PlanError PlanResult

func (e *PlanError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "commit plan %s: %v", e.Plan, e.Err)
	if len(e.Committed) > 0 {
		fmt.Fprintf(&b, "; committed: %s", strings.Join(e.Committed, ", "))
	}
	if len(e.RolledBack) > 0 {
		fmt.Fprintf(&b, "; unchanged: %s", strings.Join(e.RolledBack, ", "))
	}
	for _, f := range e.RollbackFailed {
		fmt.Fprintf(&b, "; ROLLBACK FAILED for %s (its original may be partly changed, backups kept): %v", f.ID, f.Err)
	}
	return b.String()
}

func (e *PlanError) Unwrap() error { return e.Err }

// Result is the PlanResult this error is.
func (e *PlanError) Result() *PlanResult { return (*PlanResult)(e) }

// finish returns the result and, when it failed, the same value as a
// *PlanError: every caller gets both, whatever failed.
func (r *PlanResult) finish() (*PlanResult, error) {
	if r.Err == nil && len(r.RollbackFailed) > 0 {
		r.Err = r.RollbackFailed[0]
	}
	if r.Err == nil {
		return r, nil
	}
	return r, (*PlanError)(r)
}

// BatchResult is the outcome of an operation on several sandboxes that
// goes on past failures (rollback, destroy, gc).
type BatchResult struct {
	Op     string    `json:"op"`
	Done   []string  `json:"done"`
	Failed []Failure `json:"failed"`
	Err    error     `json:"-"`
}

// BatchError is a batch with failures: the same value as its BatchResult.
type BatchError BatchResult

func (e *BatchError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %v", e.Op, e.Err)
	for _, f := range e.Failed {
		fmt.Fprintf(&b, "; %v", f)
	}
	return b.String()
}

func (e *BatchError) Unwrap() error { return e.Err }

// Result is the BatchResult this error is.
func (e *BatchError) Result() *BatchResult { return (*BatchResult)(e) }

func (r *BatchResult) fail(id string, err error) {
	r.Failed = append(r.Failed, Failure{ID: id, Err: err})
}

func (r *BatchResult) finish() (*BatchResult, error) {
	if r.Err == nil && len(r.Failed) > 0 {
		r.Err = fmt.Errorf("%d of %d failed: %w", len(r.Failed), len(r.Failed)+len(r.Done), r.Failed[0])
	}
	if r.Err == nil {
		return r, nil
	}
	return r, (*BatchError)(r)
}
