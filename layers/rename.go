package layers

import (
	"errors"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/fsutil"
)

// Rename moves oldName in oldDir to newName in newDir with renameat2 flags
// (RENAME_NOREPLACE, RENAME_EXCHANGE). A directory that came from a lower
// layer moves without copying its children: its upper copy records where
// its lower contents live (the overlay redirect), as kernel overlayfs does
// with redirect_dir=on. src is the moved object's Obj and is updated.
func (l *Layers) Rename(oldDir string, od Obj, oldName string, src *Obj, newDir string, nd Obj, newName string, flags uint32, c Caller) error {
	defer l.dirGen.changed() // it may move upper directories, and the nodes below
	oldRel, newRel := Join(oldDir, oldName), Join(newDir, newName)
	se, err := l.Lookup(oldDir, od, oldName)
	if err != nil {
		return err
	}
	te, terr := l.Lookup(newDir, nd, newName)
	exists := terr == nil
	if terr != nil && !errors.Is(terr, unix.ENOENT) {
		return terr
	}
	if err := checkRename(l, newRel, &se, &te, exists, flags); err != nil {
		return err
	}
	if err := mayRename(&od, &nd, &se, &te, exists, flags); err != nil {
		return err
	}
	if tooLongToRedirect(&se) || (flags&unix.RENAME_EXCHANGE != 0 && tooLongToRedirect(&te)) {
		return unix.EXDEV
	}
	if exists && flags&unix.RENAME_EXCHANGE == 0 && !l.inUpper(newRel) && len(te.Lowers) > 0 {
		// An original object replaced: a commit checks it is still the
		// one the sandbox saw.
		var st unix.Stat_t
		if err := l.lowerLstat(te.Lowers[0], &st); err != nil {
			return err
		}
		if err := l.noteBase(te.Lowers[0], &st); err != nil {
			return err
		}
	}
	recFlags := flags
	if !exists {
		// The record says the rename replaced nothing, as a rename
		// asked with RENAME_NOREPLACE does: the replay may take the
		// new name for fresh (touched.move).
		recFlags |= unix.RENAME_NOREPLACE
	}
	if err := l.record(OpRename, oldRel, newRel, recFlags, c); err != nil {
		return err
	}
	if err := l.prepareMove(oldRel, &se); err != nil {
		return err
	}
	if err := l.ensureParents(newRel); err != nil {
		return err
	}
	if flags&unix.RENAME_EXCHANGE != 0 {
		if err := l.prepareMove(newRel, &te); err != nil {
			return err
		}
		if err := l.upperRename(oldRel, newRel, unix.RENAME_EXCHANGE); err != nil {
			return err
		}
		src.Upper = true
		return nil
	}
	if exists {
		if err := l.clearTarget(newRel, &te); err != nil {
			return err
		}
	}
	need, err := l.lowerHas(od.Lowers, oldName)
	if err != nil {
		return err
	}
	if !exists && se.IsDir() && l.isWhiteout(newRel) {
		return l.moveDirOverWhiteout(oldRel, newRel, need, src)
	}
	rflags := uint(0)
	if need {
		rflags = unix.RENAME_WHITEOUT
	}
	if err := l.upperRename(oldRel, newRel, rflags); err != nil {
		return err
	}
	src.Upper = true
	return nil
}

// redirectMax bounds the redirect a renamed directory gets ("/" and the
// path of its original directory): all of an inode's attributes share one
// block on ext4. Kernel overlayfs has the same answer with a smaller bound
// (its redirect_max, 256 by default): a directory of the original whose
// path is longer is not renamed but refused with EXDEV, and mv(1) copies
// it and removes the old one instead.
const redirectMax = 2048

// tooLongToRedirect reports whether the directory e, which a rename would
// give a redirect, has a path in the original longer than redirectMax.
func tooLongToRedirect(e *Entry) bool {
	return e.IsDir() && len(e.Lowers) > 0 && 1+len(e.Lowers[0].Path) > redirectMax
}

// checkRename applies the rules a plain filesystem enforces, against the
// merged view (the upper alone could not tell).
func checkRename(l *Layers, newRel string, se, te *Entry, exists bool, flags uint32) error {
	switch {
	case flags&^uint32(unix.RENAME_EXCHANGE|unix.RENAME_NOREPLACE) != 0:
		// RENAME_WHITEOUT among them: a whiteout left through the mount
		// would be the upper's own, a removal (as Mknod). Kernel
		// overlayfs refuses it too.
		return unix.EINVAL
	case flags&unix.RENAME_EXCHANGE != 0 && flags&unix.RENAME_NOREPLACE != 0:
		return unix.EINVAL
	case flags&unix.RENAME_EXCHANGE != 0:
		if !exists {
			return unix.ENOENT
		}
		return nil
	case !exists:
		return nil
	case flags&unix.RENAME_NOREPLACE != 0:
		return unix.EEXIST
	case se.IsDir() && !te.IsDir():
		return unix.ENOTDIR
	case !se.IsDir() && te.IsDir():
		return unix.EISDIR
	case te.IsDir():
		ents, err := l.ReadDir(newRel, te.Obj)
		if err != nil {
			return err
		}
		if len(ents) > 0 {
			return unix.ENOTEMPTY
		}
	}
	return nil
}

// prepareMove puts the object at rel into the upper layer so it can be
// renamed there. A directory is marked so that its lower view does not
// depend on its name: a redirect to its lower directory, or opaque when it
// has none.
func (l *Layers) prepareMove(rel string, e *Entry) error {
	if !e.IsDir() {
		return l.CopyUp(rel, &e.Obj)
	}
	if !l.inUpper(rel) {
		if err := l.ensureParents(rel); err != nil {
			return err
		}
		if err := l.copyUpOne(rel, e.Lowers[0], false, false); err != nil {
			return err
		}
	}
	return l.UpperDo(rel, func(upath string) error {
		if len(e.Lowers) == 0 {
			if l.isOpaque(upath) {
				return nil
			}
			return unix.Lsetxattr(upath, l.ns.opaque, []byte("y"), 0)
		}
		return unix.Lsetxattr(upath, l.ns.redirect, []byte("/"+e.Lowers[0].Path), 0)
	})
}

// clearTarget makes the upper name of an existing rename target replaceable:
// a whiteout goes (a directory cannot replace it in one rename), and a
// directory that hid lower entries is emptied of its whiteouts after being
// marked opaque, so nothing reappears if we stop half-way.
func (l *Layers) clearTarget(rel string, te *Entry) error {
	err := l.UpperDo(rel, func(upath string) error { return l.clearTargetAt(upath, te) })
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	return err
}

// clearTargetAt is clearTarget at the upper path upath (upperAt).
func (l *Layers) clearTargetAt(upath string, te *Entry) error {
	var st unix.Stat_t
	if err := unix.Lstat(upath, &st); err != nil {
		return err
	}
	if fsutil.IsWhiteout(&st) {
		return unix.Unlink(upath)
	}
	if !te.IsDir() {
		return nil
	}
	ents, err := readDirents(upath)
	if err != nil || len(ents) == 0 {
		return err
	}
	if err := unix.Lsetxattr(upath, l.ns.opaque, []byte("y"), 0); err != nil {
		return err
	}
	for _, d := range ents {
		if err := os.RemoveAll(filepath.Join(upath, d.name)); err != nil {
			return err
		}
	}
	return nil
}

func (l *Layers) isWhiteout(rel string) bool {
	var st unix.Stat_t
	return l.upperLstat(rel, &st) == nil && fsutil.IsWhiteout(&st)
}

// moveDirOverWhiteout moves a directory to a name whose lower entry was
// deleted: one exchange puts the directory there and the whiteout at the
// old name, where it stays if a lower entry needs hiding.
func (l *Layers) moveDirOverWhiteout(oldRel, newRel string, need bool, src *Obj) error {
	if err := l.upperRename(oldRel, newRel, unix.RENAME_EXCHANGE); err != nil {
		return err
	}
	src.Upper = true
	if need {
		return nil
	}
	return l.UpperDo(oldRel, unix.Unlink)
}

// upperRename is renameat2 of oldRel to newRel in the upper (upperAt).
func (l *Layers) upperRename(oldRel, newRel string, flags uint) error {
	return l.UpperDo(oldRel, func(oldPath string) error {
		return l.UpperDo(newRel, func(newPath string) error {
			return unix.Renameat2(unix.AT_FDCWD, oldPath, unix.AT_FDCWD, newPath, flags)
		})
	})
}
