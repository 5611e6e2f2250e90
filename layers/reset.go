package layers

import (
	"fmt"
	"os"
	"path/filepath"
)

// Reset discards every change of the sandbox: the upper layer is emptied,
// its root takes the original root's metadata again, and the journal
// starts anew. The caller makes sure no operation runs
// meanwhile (the mount is frozen). Used after a commit or rollback that
// keeps the sandbox mounted.
func (l *Layers) Reset() error {
	// The commit before changed the original: read it anew.
	l.dropHeldDirs()
	defer l.dropHeldDirs()
	defer l.dirGen.changed()
	ents, err := os.ReadDir(l.upper)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if err := os.RemoveAll(filepath.Join(l.upper, e.Name())); err != nil {
			return fmt.Errorf("empty the upper: %w", err)
		}
	}
	if err := os.RemoveAll(filepath.Join(l.work, originsDir)); err != nil {
		return fmt.Errorf("empty the upper: %w", err)
	}
	st, err := l.matchRoot()
	if err != nil {
		return fmt.Errorf("reset the root: %w", err)
	}
	if err := l.newJournal(); err != nil {
		return err
	}
	return l.noteBase(Origin{}, &st)
}

// newJournal replaces the journal with an empty one.
func (l *Layers) newJournal() error {
	l.jmu.Lock()
	defer l.jmu.Unlock()
	path := l.journal.path
	if err := l.journal.Close(); err != nil {
		return err
	}
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		return err
	}
	j, err := OpenJournal(path)
	if err != nil {
		return err
	}
	j.OnCompact(l.onCompact)
	j.ConfirmGone(l.goneFromUpper)
	l.journal = j
	l.bases.Clear()
	return nil
}
