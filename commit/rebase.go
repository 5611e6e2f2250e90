package commit

import (
	"errors"
	"maps"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/layers"
)

// rebaseName holds, per original path, the signature an undo left behind
// (moving an object away and back changes its ctime; without this a
// sandbox whose commit was undone would conflict with itself on retry),
// or the one Resolve recorded for a conflict settled in the sandbox's
// favour.
const rebaseName = "rebase.json"

// bases returns the signatures to check conflicts against: the journal's
// first sight of each path (journal, which stays as it is), replaced by
// what an undo restored.
func bases(cfg layers.Config, journal map[string]layers.Signature) map[string]layers.Signature {
	b := maps.Clone(journal)
	if b == nil {
		b = map[string]layers.Signature{}
	}
	over, _ := readRebase(cfg.Work) // unreadable: the journal's bases, which conflict more, never less
	for p, s := range over {
		b[p] = s
	}
	return b
}

// rebase records the signatures of the original paths of changes after an
// undo put them back.
func (x *Txn) rebase() error {
	over, err := readRebase(x.work)
	if err != nil {
		return err
	}
	recs, err := layers.Records(x.cfg)
	if err != nil {
		return err
	}
	seen := layers.Bases(recs)
	cs := layers.ChangeSet{Changes: x.changes}
	if cs.Changes == nil { // after a crash: the original is back, ask again
		if cs, err = layers.Changes(x.cfg); err != nil {
			return err
		}
	}
	r := newRenames(cs)
	restored := map[string]restoredObj{}
	for _, o := range x.restored {
		if o.moved {
			restored[o.path] = o
		} else {
			restored[r.original(o.path)] = o
		}
	}
	for _, c := range cs.Changes {
		p := conflictKey(r, c)
		base, ok := seen[p]
		if b, resolved := over[p]; resolved {
			base, ok = b, true // also a path Resolve recorded
		}
		if !ok || base == resolvedGone {
			continue
		}
		if o, ok := restored[p]; ok {
			// What the undo moved back is that object, but someone may
			// have written to it, or set an attribute or owner on it
			// (its ctime), while it was in the backups.
			if o.untouched && leftAlone(base, o.sig) {
				over[p] = o.sig
			}
		} else if there, st, err := x.orig.exists(p); err == nil && there && x.own.applied(stateOf(&st)) && undoLeftAlone(base, &st) {
			// A file the apply never changed has the base's ctime
			// still, unless someone else changed it: that stays a
			// conflict.
			over[p] = layers.SignatureOf(&st)
		}
	}
	return writeRebase(x.work, over)
}

// ForgetBases drops the signatures an undo recorded: after a successful
// commit, or when the sandbox is emptied, they describe nothing any more.
func ForgetBases(work string) error {
	err := os.Remove(filepath.Join(work, rebaseName))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

// sameObject reports whether st is the object base describes: the same
// inode, of the same type.
func sameObject(base layers.Signature, st *unix.Stat_t) bool {
	return base.Ino == st.Ino && base.Mode&unix.S_IFMT == st.Mode&unix.S_IFMT
}

// undoLeftAlone reports whether st is the object base describes with no
// change but those an apply and its undo make beside it: its ctime (an
// object renamed away and back), and a directory's mtime (entries moved
// out and back). Another object there (the original replaced, or
// swapped for a moment while the undo ran; a new file may reuse the
// inode number of the one it replaced), or other content, stays a
// conflict.
func undoLeftAlone(base layers.Signature, st *unix.Stat_t) bool {
	return leftAlone(base, layers.SignatureOf(st))
}

// leftAlone is undoLeftAlone on a signature.
func leftAlone(base, now layers.Signature) bool {
	if base.Ino != now.Ino || base.Mode != now.Mode {
		return false
	}
	return now.Mode&unix.S_IFMT == unix.S_IFDIR || base.Size == now.Size && base.Mtime == now.Mtime
}
