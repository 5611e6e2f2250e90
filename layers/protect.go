package layers

import (
	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/fsutil"
)

// Immutable and append-only originals (chattr +i, +a). A commit cannot
// apply a change to such an object: it would replace, remove or rename
// it, which both flags forbid. So the sandbox refuses the change at once,
// with ext4's EPERM, as kernel overlayfs does (which copies the two flags
// to its inode): a change of the object's content or attributes, its
// removal or renaming, a hard link to it; for a directory, any entry
// added (immutable) or removed (both). Entries may still be added to an
// append-only directory: the commit can. An append to an append-only
// file is refused too, where ext4 allows it (the commit could not
// replace the file), and so is a change of the content of a file in a
// protected directory (the commit puts a changed file in place by a
// rename there, which the directory's flag forbids). A change of such a
// file's attributes alone (chmod, chown, times, extended attributes,
// flags) is made, as on ext4: the commit makes it in place
// (copyUpForMeta); its copy stays marked (inProtected) so that its
// content still cannot change.
//
// The protection is learnt from statx at lookup (Obj.prot). A directory
// copied up as the parent of a change deeper down keeps it in an
// attribute of its copy (protattr, kernel overlayfs's name and letters),
// which lookups of the copy read back. A file is never copied up while
// its original is protected, nor for a change of content while its
// original directory is (copyUpOne checks again).

// inProtected marks (in Obj.prot) a file of the original that is in an
// immutable or append-only directory of the original: its attributes may
// change, its content may not.
const inProtected fsutil.Protection = 1 << 7

// mayChange refuses a change of the object itself (its attributes).
func (o *Obj) mayChange() error {
	if o.prot&^inProtected != 0 {
		return unix.EPERM
	}
	return nil
}

// mayWrite refuses a change of the object's content, or one the commit
// makes by putting a new copy in its place (a hard link to it).
func (o *Obj) mayWrite() error {
	if o.prot != 0 {
		return unix.EPERM
	}
	return nil
}

// markInProtected sets inProtected on e, found in the directory dir, when
// e is a file of the original that is in dir's protected original
// directory: its origin is one of dir's lower directories' entries.
func markInProtected(e *Entry, dir *Obj) {
	if dir.prot == 0 || e.IsDir() || len(e.Lowers) == 0 {
		return
	}
	parent, _ := Split(e.Lowers[0].Path)
	for _, d := range dir.Lowers {
		if d.Layer == e.Lowers[0].Layer && d.Path == parent {
			e.prot |= inProtected
			return
		}
	}
}

// mayAdd refuses a new entry in the directory.
func (o *Obj) mayAdd() error {
	if o.prot&fsutil.Immutable != 0 {
		return unix.EPERM
	}
	return nil
}

// mayRemove refuses taking an entry out of the directory.
func (o *Obj) mayRemove() error {
	if o.prot != 0 {
		return unix.EPERM
	}
	return nil
}

// lowerParentProt is the protection of the lower directory that holds o.
func (l *Layers) lowerParentProt(o Origin) fsutil.Protection {
	dir, name, err := l.lowerDir(o)
	if err != nil || name == "." {
		return 0
	}
	defer l.releaseDir(dir)
	var st unix.Stat_t
	prot, _ := fsutil.Lstatx(dir.fd, "", &st)
	return prot
}

// protattr encodes p as kernel overlayfs does: 'a' for append-only, 'i'
// for immutable.
func protattr(p fsutil.Protection) []byte {
	var b []byte
	if p&fsutil.AppendOnly != 0 {
		b = append(b, 'a')
	}
	if p&fsutil.Immutable != 0 {
		b = append(b, 'i')
	}
	return b
}

// readProtattr reads the protection kept on the upper copy at path.
func (l *Layers) readProtattr(path string) fsutil.Protection {
	v, err := fsutil.LGetXattr(path, l.ns.protattr)
	if err != nil {
		return 0
	}
	var p fsutil.Protection
	for _, c := range v {
		switch c {
		case 'a':
			p |= fsutil.AppendOnly
		case 'i':
			p |= fsutil.Immutable
		}
	}
	return p
}

// mayRename refuses a rename the protection of the directories (od, nd)
// or the objects (se, te when exists) forbids: the source leaves od and
// enters nd; a replaced target leaves nd; an exchange does both ways.
func mayRename(od, nd *Obj, se, te *Entry, exists bool, flags uint32) error {
	checks := []error{od.mayRemove(), nd.mayAdd(), se.mayChange()}
	if exists {
		checks = append(checks, nd.mayRemove(), te.mayChange())
	}
	if flags&unix.RENAME_EXCHANGE != 0 {
		checks = append(checks, od.mayAdd())
	}
	for _, err := range checks {
		if err != nil {
			return err
		}
	}
	return nil
}
