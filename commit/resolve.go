package commit

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/fsutil"
	"github.com/sbxfs/sbxfs/layers"
)

// ErrNotAConflict says a path given to Resolve names no conflict.
var ErrNotAConflict = errors.New("not a conflict of this sandbox")

// ErrUnresolvable says a conflict cannot be resolved by keeping the
// sandbox's side: a symlink stands on the way to it (the commit never
// follows one), or the original could not be read there.
var ErrUnresolvable = errors.New("cannot be resolved by keeping the sandbox's version")

// Resolve settles conflicts of the sandbox cfg in the sandbox's favour:
// at each path (as a Conflict names it) the next commit replaces what the
// original has there now, as --force would for every path. It records
// that state as the base the commit checks against, so a change the
// original makes after this is a conflict again. To keep the original's
// change as well, merge it into the sandbox first. It returns the
// conflicts resolved and those left; nothing is recorded when a path
// names no conflict, or one that keeping the sandbox's version cannot
// settle.
func Resolve(cfg layers.Config, paths []string) (resolved, left []Conflict, err error) {
	if len(cfg.Lowers) > 1 {
		return nil, nil, ErrSeveralLowers
	}
	lock, err := lockSandbox(cfg.Work)
	if err != nil {
		return nil, nil, err
	}
	defer unix.Close(lock)
	if _, err := os.Stat(filepath.Join(cfg.Work, UndoLogName)); err == nil {
		return nil, nil, ErrInterrupted
	}
	if err := layers.CheckJournalIntact(journalPath(cfg)); err != nil {
		return nil, nil, err
	}
	found, err := currentConflicts(cfg)
	if err != nil {
		return nil, nil, err
	}
	over, err := readRebase(cfg.Work)
	if err != nil {
		return nil, nil, err
	}
	orig, err := openTree(cfg.Lowers[0])
	if err != nil {
		return nil, nil, err
	}
	orig.layout = cfg.LayoutXattr
	defer orig.close()
	for _, p := range paths {
		n := 0
		for _, c := range found {
			if c.Path != p {
				continue
			}
			n++
			if c.key == unresolvable {
				return nil, nil, fmt.Errorf("%s (%s): %w (a symlink is on the way to it, or the original could not be read); put the original back as it was, use --force, or roll the sandbox back", shownPath(p), c.Reason, ErrUnresolvable)
			}
			there, st, err := orig.inTree(c.key)
			switch {
			case err != nil:
				return nil, nil, fmt.Errorf("%s: %w", shownPath(p), err)
			case there:
				over[c.key] = layers.SignatureOf(&st)
			default:
				over[c.key] = resolvedGone
			}
			resolved = append(resolved, c.Conflict)
		}
		if n == 0 {
			return nil, nil, fmt.Errorf("%s: %w", shownPath(p), ErrNotAConflict)
		}
	}
	if err := writeRebase(cfg.Work, over); err != nil {
		return nil, nil, err
	}
	rest, err := currentConflicts(cfg)
	for _, c := range rest {
		left = append(left, c.Conflict)
	}
	return resolved, left, err
}

// Conflicts lists the conflicts a commit of the sandbox cfg would refuse
// on now.
func Conflicts(cfg layers.Config) ([]Conflict, error) {
	cs, err := layers.Changes(cfg)
	if err != nil {
		return nil, err
	}
	return ConflictsOf(cfg, cs)
}

// ConflictsOf is Conflicts for the changes cs, read from cfg already.
func ConflictsOf(cfg layers.Config, cs layers.ChangeSet) ([]Conflict, error) {
	found, err := conflictsOf(cfg, cs)
	var out []Conflict
	for _, c := range found {
		out = append(out, c.Conflict)
	}
	return out, err
}

func currentConflicts(cfg layers.Config) ([]conflict, error) {
	cs, err := layers.Changes(cfg)
	if err != nil {
		return nil, err
	}
	return conflictsOf(cfg, cs)
}

func conflictsOf(cfg layers.Config, cs layers.ChangeSet) ([]conflict, error) {
	if len(cs.Changes) == 0 || len(cfg.Lowers) > 1 { // nothing to commit to (ErrSeveralLowers)
		return nil, nil
	}
	journal := cs.Bases()
	if journal == nil { // a change set made by hand
		recs, err := layers.Records(cfg)
		if err != nil {
			return nil, err
		}
		journal = layers.Bases(recs)
	}
	orig, err := openTree(cfg.Lowers[0])
	if err != nil {
		return nil, err
	}
	orig.layout = cfg.LayoutXattr
	defer orig.close()
	return findConflicts(orig, cfg.Upper, cs, bases(cfg, journal), journal), nil
}

// readRebase reads the bases recorded over the journal's (by an undo, or
// by Resolve).
func readRebase(work string) (map[string]layers.Signature, error) {
	over := map[string]layers.Signature{}
	data, err := os.ReadFile(filepath.Join(work, rebaseName))
	if errors.Is(err, os.ErrNotExist) {
		return over, nil
	}
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(data, &over); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(work, rebaseName), err)
	}
	if over, err = fsutil.DecodeKeys(over); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(work, rebaseName), err)
	}
	return over, nil
}

func writeRebase(work string, over map[string]layers.Signature) error {
	b, err := json.Marshal(fsutil.EncodeKeys(over)) // paths byte for byte
	if err != nil {
		return err
	}
	return fsutil.WriteFileAtomic(filepath.Join(work, rebaseName), b, 0o600)
}
