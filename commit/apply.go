package commit

import (
	"errors"
	"fmt"
	"path"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/layers"
)

// Apply changes the original, step by step. On an error the original is
// partly changed: call Undo.
func (x *Txn) Apply() (err error) {
	if len(x.log.Steps) == 0 {
		return nil
	}
	defer func() {
		if r := recover(); r != nil {
			err = &Error{Stage: StageApply, Err: fmt.Errorf("panic: %v", r)}
		}
	}()
	for i := range x.log.Steps {
		if i == len(x.log.Steps)/2 {
			x.fault("applying")
		}
		x.reached = i + 1
		if err := x.apply(i); err != nil {
			s := &x.log.Steps[i]
			var ce *Error
			if errors.As(err, &ce) && len(ce.Conflicts) > 0 {
				ce.Paths = []string{s.Path}
				return ce
			}
			if errors.Is(err, unix.ELOOP) {
				// A symlink on the way that the staging did not meet
				// (the replacedAbove case aside): the original
				// changing under the commit, as held.go and stage
				// take it. The undo sets back what came before.
				ce = conflictAt(StageApply, s.Path, ReasonChangedWhileRead)
				ce.Paths = []string{s.Path}
				return ce
			}
			return &Error{Stage: StageApply, Paths: []string{s.Path}, Err: fmt.Errorf("step %d (%s %s): %w", i, s.Kind, s.Path, err)}
		}
	}
	x.fault("applied")
	return nil
}

func (x *Txn) apply(i int) error {
	s := &x.log.Steps[i]
	if s.In != "" {
		return nil // moved in with the new directory it is staged in
	}
	switch s.Kind {
	case opDetach:
		ok, before, err := x.orig.exists(s.Path)
		if errors.Is(err, unix.ELOOP) && x.replacedAbove(i) {
			return nil // beneath a directory this commit replaced by a symlink
		}
		if err != nil || !ok {
			return err
		}
		h, backup := x.held[s.Slot] // else a directory moved aside to come back
		if backup {
			// A write, an attribute or a new object since the conflict
			// check would go with the backups: the top now, what is
			// beneath a directory by Sync.
			if reason := h.topChange(x.own, stateOf(&before)); reason != "" {
				x.reached = i // nothing done: nothing to undo
				return conflictAt(StageApply, s.Path, reason)
			}
		}
		if !backup && s.Ino != 0 && before.Ino != s.Ino {
			// A directory to move aside, renamed in the sandbox: another
			// object in its place (a symlink swapped in) must not come
			// back under the new name.
			x.reached = i
			return conflictAt(StageApply, s.Path, changedDuringCommit)
		}
		if err := move(x.orig, s.Path, x.txn, s.Slot); err != nil {
			return err
		}
		if !backup {
			if after, err := x.txn.lstat(s.Slot); err != nil || s.Ino == 0 || after.Ino == s.Ino {
				return err
			}
			// Swapped in between the look and the move: the undo
			// puts it back.
			return conflictAt(StageApply, s.Path, changedDuringCommit)
		}
		x.backups = append(x.backups, backupObj{path: s.Path, slot: s.Slot})
		after, err := x.txn.lstat(s.Slot)
		if err != nil {
			return err
		}
		if after.Mode&unix.S_IFMT != unix.S_IFDIR && !sameState(&before, &after) {
			// Written to between the look and the move.
			return conflictAt(StageApply, s.Path, changedDuringCommit)
		}
		return x.own.note(x.txn, s.Slot)
	case opInstall:
		if err := stripAttrs(x.txn, s); err != nil {
			return err
		}
		if err := move(x.txn, s.Slot, x.orig, s.Path); err != nil {
			return err
		}
		return x.own.note(x.orig, s.Path) // its undo checks nobody wrote to it

	case opAttach:
		return move(x.txn, s.Slot, x.orig, s.Path)
	case opMkdir:
		if s.Slot == "" { // an undo log of an older sbxfs
			return x.orig.mkdir(s.Path, s.Mode)
		}
		if err := x.stripWithin(i); err != nil {
			return err
		}
		return move(x.txn, s.Slot, x.orig, s.Path)
	case opMeta:
		if h, ok := x.held[metaKey(s.Path)]; ok && h.there {
			// The original's object (the commit put none there) must
			// be as the check saw it: the sandbox's metadata would
			// replace someone else's mode, owner or attributes, or go
			// on a file written or saved anew since (a directory: on
			// another directory).
			if st, err := x.orig.lstat(s.Path); err == nil && !unchanged(x.own.expect(h.st), stateOf(&st)) {
				x.reached = i // nothing done: its undo would set the old metadata over the other writer's
				return conflictAt(StageApply, s.Path, changedDuringCommit)
			}
		}
		// The object the step is for, as staged (a renamed directory
		// too, which the check does not hold): not a symlink or
		// another directory swapped in since.
		if err := x.orig.setMeta(s.Path, s.New, s.Ino); errors.Is(err, errNotTheObject) {
			x.reached = i
			return conflictAt(StageApply, s.Path, changedDuringCommit)
		} else if err != nil {
			return err
		}
		return x.own.note(x.orig, s.Path)
	}
	return fmt.Errorf("unknown step %q", s.Kind)
}

// stripWithin removes the overlay attributes of the objects staged inside
// the new directory of step i (the steps right after it, parents first),
// before its rename brings them in.
func (x *Txn) stripWithin(i int) error {
	steps := x.log.Steps
	for j := i + 1; j < len(steps) && under(steps[j].Path, steps[i].Path); j++ {
		if s := &steps[j]; s.In != "" && s.Kind == opInstall && len(s.Strip) > 0 {
			if err := stripAttrs(x.txn, s); err != nil {
				return err
			}
		}
	}
	return nil
}

// replacedAbove reports whether an earlier step of this transaction
// installed an object at an ancestor of step i's path: a symlink met on
// the way there is the commit's own, not the original changing under it.
func (x *Txn) replacedAbove(i int) bool {
	p := x.log.Steps[i].Path
	for _, s := range x.log.Steps[:i] {
		if s.Kind == opInstall && p != s.Path && under(p, s.Path) {
			return true
		}
	}
	return false
}

// Undo puts the original back as it was before Apply, in reverse order,
// checking each step against what it finds, so it is safe after a partial
// Apply, after a crash, and when run twice. In the process that prepared
// the transaction it skips the steps Apply never reached (all of them
// when Apply never ran). It goes on past a failed step;
// when any fails, the transaction directory (with the backups) is kept and
// the error lists what could not be restored.
func (x *Txn) Undo() error {
	if len(x.log.Steps) == 0 {
		x.close()
		return removeUndoLog(x.work)
	}
	failed, errs := x.undoPass(true)
	for _, wait := range undoRetries {
		if len(failed) == 0 || !allLoops(errs) {
			break
		}
		// A symlink on the way, every time: another process swapped a
		// directory for one for a moment. Once it is back, the steps
		// left undone go through (each checks what it finds).
		time.Sleep(wait)
		failed, errs = x.undoPass(false)
	}
	if len(failed) > 0 {
		return &Error{Stage: StageUndo, Paths: failed, Kept: x.log.Txn, Err: errors.Join(errs...)}
	}
	if err := x.rebase(); err != nil {
		return &Error{Stage: StageUndo, Err: fmt.Errorf("record the restored state: %w", err)}
	}
	// The original as it was must be on disk before the backups and the
	// undo log go: else a crash could leave it as the apply left it (made
	// durable by Sync) with nothing to undo it from. The transaction
	// directory is on the original's mount.
	if err := x.orig.syncfs(); err != nil {
		return &Error{Stage: StageUndo, Kept: x.log.Txn, Err: fmt.Errorf("sync the original: %w", err)}
	}
	x.discardStage()
	x.close()
	if err := removeUndoLog(x.work); err != nil {
		return &Error{Stage: StageUndo, Err: err}
	}
	return nil
}

// undoPass undoes every step Apply reached, in reverse order, going on
// past a failed one; first says to call the fault point.
func (x *Txn) undoPass(first bool) (failed []string, errs []error) {
	for i := len(x.log.Steps) - 1; i >= 0; i-- {
		if first && i == len(x.log.Steps)/2 {
			x.fault("undoing")
		}
		if x.reached >= 0 && i >= x.reached {
			continue // never reached by this process's Apply
		}
		s := &x.log.Steps[i]
		if err := x.undo(s); err != nil {
			failed = append(failed, s.Path)
			errs = append(errs, fmt.Errorf("%s %s: %w", s.Kind, s.Path, err))
		}
	}
	return failed, errs
}

// undoRetries are the waits before an undo whose every failure met a
// symlink on the way tries again.
var undoRetries = []time.Duration{5 * time.Millisecond, 50 * time.Millisecond, 250 * time.Millisecond}

func allLoops(errs []error) bool {
	for _, err := range errs {
		if !errors.Is(err, unix.ELOOP) {
			return false
		}
	}
	return true
}

func (x *Txn) undo(s *step) error {
	switch s.Kind {
	case opMeta:
		if s.Old == nil {
			return nil
		}
		ok, st, err := x.orig.exists(s.Path)
		if err != nil || !ok {
			return err
		}
		if s.Ino != 0 && st.Ino != s.Ino {
			// Another object is there: the step never reached the
			// object it was for (an apply that stopped before the
			// rename bringing it here). Old is that object's
			// metadata, not this one's.
			return nil
		}
		cur, err := x.orig.metaAt(s.Path)
		if err != nil {
			return err
		}
		if back := revertMeta(cur, s.Old, s.New); back != nil {
			if err := x.orig.setMeta(s.Path, back, st.Ino); !errors.Is(err, errNotTheObject) {
				return err
			}
			return fmt.Errorf("not set back: %w since the look", errNotTheObject)
		}
		return nil
	case opMkdir:
		ok, st, err := x.orig.exists(s.Path)
		if err != nil || !ok || st.Mode&unix.S_IFMT != unix.S_IFDIR {
			return err
		}
		if s.Slot == "" { // an undo log of an older sbxfs
			return x.orig.rmdir(s.Path)
		}
		if st.Ino != s.Ino {
			return nil // not ours: never made, or an original directory restored
		}
		// Everything the commit put in it is undone by now: what is left
		// another process made during the commit, and must not go with
		// the transaction directory.
		names, err := x.orig.names(s.Path)
		if err != nil {
			return err
		}
		if len(names) > 0 {
			return fmt.Errorf("left in place: it holds %q, made in it by another process during the commit (to keep them, move them away, then run sbxfs recover)", names)
		}
		if busy, _, _ := x.txn.exists(s.Slot); busy {
			return fmt.Errorf("slot %s is taken", s.Slot)
		}
		return move(x.orig, s.Path, x.txn, s.Slot)
	case opInstall, opAttach:
		ok, st, err := x.orig.exists(s.Path)
		if err != nil || !ok || st.Ino != s.Ino {
			return err // not ours, or never moved
		}
		if s.Kind == opInstall && (s.Staged.writtenSince(&st) || !x.own.untouched(stateOf(&st))) {
			// Another process wrote to the sandbox's object while the
			// commit ran: moved back to the transaction directory, the
			// write would go with it.
			return fmt.Errorf("left in place: another process wrote to it during the commit (to keep that version, move it away, then run sbxfs recover)")
		}
		if busy, _, _ := x.txn.exists(s.Slot); busy {
			return fmt.Errorf("slot %s is taken", s.Slot)
		}
		if err := move(x.orig, s.Path, x.txn, s.Slot); err != nil {
			return err
		}
		if x.own.noted(&st) {
			return x.own.note(x.txn, s.Slot) // the move changed its ctime, seen at its other names too
		}
		return nil
	case opDetach:
		ok, _, err := x.txn.exists(s.Slot)
		if err != nil || !ok {
			return err
		}
		if there, _, _ := x.orig.exists(s.Path); there {
			return fmt.Errorf("cannot put the backup back: %w", unix.EEXIST)
		}
		// The restored object's signature (its ctime moves with the
		// rename), taken through a descriptor: the retry's conflict check
		// compares against it, whatever happens to the path meanwhile.
		fd, err := x.txn.openObj(s.Slot)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		var was unix.Stat_t
		untouched := unix.Fstat(fd, &was) == nil && x.own.untouched(stateOf(&was))
		if err := move(x.txn, s.Slot, x.orig, s.Path); err != nil {
			return err
		}
		var st unix.Stat_t
		if unix.Fstat(fd, &st) == nil {
			x.restored = append(x.restored, restoredObj{path: s.Path, moved: strings.HasPrefix(s.Slot, "m/"), sig: layers.SignatureOf(&st), untouched: untouched})
		}
		return nil
	}
	return nil
}

// Close releases the transaction's descriptors and its sandbox lock. Undo
// and Finish do so themselves on success; after a failed Undo the caller
// may retry Undo, or Close and leave the rest to Recover.
func (x *Txn) Close() { x.close() }

// Sync makes an applied transaction durable in the original (syncfs of
// its filesystem), then checks that the backups hold what the original
// held right after the conflict check, and nothing more: a process that
// held an object open may have written to it, or made an entry in a
// directory, during the commit, and the backups go at the commit point. Such a write is a conflict, and the caller undoes the commit
// (which puts the object back with the write). It comes before the
// commit point: MarkCommitted calls it, and a plan commit calls it for
// every sandbox before its own.
func (x *Txn) Sync() error {
	if err := x.SyncOriginal(); err != nil {
		return err
	}
	return x.CheckBackups()
}

// SyncOriginal is the first half of Sync: the original's filesystem
// synced. A plan commit syncs every original first and then checks
// every sandbox's backups, so that the checks come right before its
// commit point, not seconds of syncs earlier.
func (x *Txn) SyncOriginal() error {
	if len(x.log.Steps) == 0 {
		return nil
	}
	if err := x.orig.syncfs(); err != nil {
		return &Error{Stage: StageApply, Err: fmt.Errorf("sync the original: %w", err)}
	}
	return nil
}

// CheckBackups is the second half of Sync: every backup holds what the
// original held, and nothing more.
func (x *Txn) CheckBackups() error {
	if len(x.log.Steps) == 0 {
		return nil
	}
	var cf []Conflict
	for _, b := range x.backups {
		rel, reason, err := x.held[b.slot].changedSince(x.txn, b.slot, x.own)
		if err != nil {
			return &Error{Stage: StageApply, Paths: []string{b.path}, Err: fmt.Errorf("the backup of %s: %w", b.path, err)}
		}
		if reason != "" {
			cf = append(cf, Conflict{Path: path.Join(b.path, rel), Reason: reason})
		}
	}
	if len(cf) > 0 {
		return &Error{Stage: StageApply, Conflicts: cf, Err: ErrConflict}
	}
	return nil
}

const changedDuringCommit = "changed in the original during the commit"

// conflictAt is the error of one conflict found at path in stage.
func conflictAt(stage Stage, path, reason string) *Error {
	return &Error{Stage: stage, Conflicts: []Conflict{{Path: path, Reason: reason}}, Err: ErrConflict}
}

// sameState reports whether now is the object was describes, with the
// same content as far as its inode, mode, owner, size and mtime tell (a
// rename changes only its ctime, which an attribute set moves too).
func sameState(was, now *unix.Stat_t) bool {
	return was.Ino == now.Ino && was.Mode == now.Mode && was.Uid == now.Uid && was.Gid == now.Gid &&
		was.Size == now.Size && was.Mtim == now.Mtim
}

// renames is the renames of the transaction's changes.
func (x *Txn) renames() renames {
	if x.r == nil {
		r := newRenames(layers.ChangeSet{Changes: x.changes})
		x.r = &r
	}
	return *x.r
}

// MarkCommitted is the commit point: Sync, then the undo log says
// "committed". After it, recovery finishes the transaction instead of
// undoing it.
func (x *Txn) MarkCommitted() error {
	if len(x.log.Steps) == 0 {
		return nil
	}
	if err := x.Sync(); err != nil {
		return err
	}
	x.log.State = stateCommitted
	if err := writeUndoLog(x.work, &x.log); err != nil {
		return &Error{Stage: StageApply, Err: fmt.Errorf("mark committed: %w", err)}
	}
	x.fault("committed")
	return nil
}

// Finish drops the backups and the transaction directory of a committed
// transaction, then its undo log.
func (x *Txn) Finish() error {
	defer x.close()
	if err := x.removeStage(); err != nil {
		return &Error{Stage: StageFinish, Kept: x.log.Txn, Err: err}
	}
	if x.log.Txn != "" && x.log.Txn != txnDirFor(x.cfg, x.log.ID, true) && x.orig != nil {
		// In the original: its removal must be on disk before the undo
		// log, which names it, goes; else a power cut could bring the
		// old versions back there with nothing left to clean them up.
		if err := x.orig.syncfs(); err != nil {
			return &Error{Stage: StageFinish, Err: fmt.Errorf("sync the original: %w", err)}
		}
	}
	x.fault("cleaned")
	if err := ForgetBases(x.work); err != nil {
		return &Error{Stage: StageFinish, Err: err}
	}
	if err := removeUndoLog(x.work); err != nil {
		return &Error{Stage: StageFinish, Err: err}
	}
	return nil
}

// Commit runs a whole single-sandbox commit: prepare, apply, commit point,
// cleanup; a failure after Prepare undoes what was applied.
func Commit(x *Txn) error {
	if err := x.Apply(); err != nil {
		return x.undoAfter(err)
	}
	if err := x.MarkCommitted(); err != nil {
		return x.undoAfter(err)
	}
	return x.Finish()
}

// undoAfter undoes the transaction after err: err, marked rolled back,
// or the undo's own failure with err as its cause.
func (x *Txn) undoAfter(err error) error {
	if uerr := x.Undo(); uerr != nil {
		var ue *Error
		if errors.As(uerr, &ue) {
			ue.Cause = err
			return ue
		}
		return errors.Join(err, uerr)
	}
	var ae *Error
	if errors.As(err, &ae) {
		ae.RolledBack = true
	}
	return err
}
