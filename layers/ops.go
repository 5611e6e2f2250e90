package layers

import (
	"errors"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/fsutil"
)

// Open opens the object at rel for I/O and returns the descriptor and
// whether it is the upper copy. Opening for writing (or with O_TRUNC)
// copies the object up first; a lower file is only ever opened read-only,
// so no descriptor sbxfs hands out can write the original.
func (l *Layers) Open(rel string, o *Obj, flags int, c Caller) (int, bool, error) {
	write := flags&unix.O_ACCMODE != unix.O_RDONLY || flags&unix.O_TRUNC != 0
	if write {
		if err := o.mayWrite(); err != nil {
			return -1, false, err
		}
		op := OpWrite
		if flags&unix.O_TRUNC != 0 {
			op = OpTruncate
		}
		if err := l.record(op, rel, "", uint32(flags), c); err != nil {
			return -1, false, err
		}
		if err := l.copyUp(rel, o, flags&unix.O_TRUNC == 0); err != nil {
			return -1, false, err
		}
	}
	if !o.Upper && len(o.Lowers) > 0 && !l.inUpper(rel) {
		fd, err := l.lowerOpen(o.Lowers[0], unix.O_RDONLY)
		return fd, false, err
	}
	o.Upper = true
	var fd int
	err := l.UpperDo(rel, func(p string) (err error) {
		fd, err = openUpper(p, flags)
		return err
	})
	if err != nil {
		return -1, false, err
	}
	if flags&unix.O_TRUNC != 0 {
		if err := unix.Ftruncate(fd, 0); err != nil {
			unix.Close(fd)
			return -1, false, err
		}
	}
	return fd, true, nil
}

// openUpper opens an upper file read-write where it can, so that one
// descriptor can back every later open of the same file (FUSE passthrough
// keeps one backing file per inode), and never with O_APPEND: the kernel
// passes the caller's append flag per write.
func openUpper(path string, flags int) (int, error) {
	base := unix.O_NOFOLLOW | unix.O_CLOEXEC | flags&(unix.O_SYNC|unix.O_DSYNC)
	fd, err := unix.Open(path, base|unix.O_RDWR, 0)
	if err == nil {
		return fd, nil
	}
	if errors.Is(err, unix.EACCES) || errors.Is(err, unix.ETXTBSY) || errors.Is(err, unix.EROFS) || errors.Is(err, unix.EISDIR) {
		return unix.Open(path, base|flags&unix.O_ACCMODE, 0)
	}
	return -1, err
}

// Create makes a new regular file name in dirRel and opens it read-write.
func (l *Layers) Create(dirRel string, dir Obj, name string, mode uint32, c Caller) (int, Entry, error) {
	if err := dir.mayAdd(); err != nil {
		return -1, Entry{}, err
	}
	fd := -1
	e, err := l.newObject(Join(dirRel, name), OpCreate, "", mode, c, func(p string) error {
		var err error
		fd, err = unix.Open(p, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, mode&0o7777)
		return err
	})
	if err != nil && fd >= 0 {
		unix.Close(fd)
		fd = -1
	}
	return fd, e, err
}

// Mkdir makes a new directory. One made where a whiteout hid a lower
// directory is opaque, so the old contents stay hidden.
func (l *Layers) Mkdir(dirRel string, dir Obj, name string, mode uint32, c Caller) (Entry, error) {
	if err := dir.mayAdd(); err != nil {
		return Entry{}, err
	}
	return l.newObject(Join(dirRel, name), OpMkdir, "", mode|unix.S_IFDIR, c, func(p string) error {
		return unix.Mkdir(p, mode&0o7777)
	})
}

// Mknod makes a FIFO, socket or device node.
func (l *Layers) Mknod(dirRel string, dir Obj, name string, mode, dev uint32, c Caller) (Entry, error) {
	if mode&unix.S_IFMT == unix.S_IFCHR && dev == 0 {
		// A character device 0/0 is a whiteout in the upper: made,
		// it would read back as a removal. Kernel overlayfs refuses it
		// too.
		return Entry{}, unix.EPERM
	}
	if err := dir.mayAdd(); err != nil {
		return Entry{}, err
	}
	return l.newObject(Join(dirRel, name), OpMknod, "", mode, c, func(p string) error {
		return unix.Mknod(p, mode, int(dev))
	})
}

// Symlink makes a symbolic link name -> target.
func (l *Layers) Symlink(dirRel string, dir Obj, name, target string, c Caller) (Entry, error) {
	if err := dir.mayAdd(); err != nil {
		return Entry{}, err
	}
	return l.newObject(Join(dirRel, name), OpSymlink, target, unix.S_IFLNK|0o777, c, func(p string) error {
		return unix.Symlink(target, p)
	})
}

// Link makes name in dirRel a hard link to the object at srcRel, copying it
// up first (links are made between upper copies).
func (l *Layers) Link(srcRel string, src *Obj, dirRel string, dir Obj, name string, c Caller) (Entry, error) {
	rel := Join(dirRel, name)
	if err := src.mayWrite(); err != nil {
		return Entry{}, err
	}
	if err := dir.mayAdd(); err != nil {
		return Entry{}, err
	}
	if err := l.record(OpLink, rel, srcRel, 0, c); err != nil {
		return Entry{}, err
	}
	if err := l.CopyUp(srcRel, src); err != nil {
		return Entry{}, err
	}
	if err := l.ensureParents(rel); err != nil {
		return Entry{}, err
	}
	link := func(p string) error {
		return l.UpperDo(srcRel, func(src string) error { return unix.Link(src, p) })
	}
	if err := l.place(rel, false, link); err != nil {
		return Entry{}, err
	}
	e := Entry{Obj: Obj{Upper: true, Lowers: src.Lowers}}
	return e, l.upperEntry(rel, &e)
}

// upperEntry fills e with the attributes of the upper object at rel.
func (l *Layers) upperEntry(rel string, e *Entry) error {
	return l.UpperDo(rel, func(p string) error {
		if err := unix.Lstat(p, &e.Stat); err != nil {
			return err
		}
		l.upperAttrs(p, e)
		return nil
	})
}

// newObject records op, makes the object with mk (directly, or aside and
// moved over a whiteout), gives it to the caller and returns its entry.
func (l *Layers) newObject(rel string, op Op, path2 string, mode uint32, c Caller, mk func(string) error) (Entry, error) {
	if err := l.record(op, rel, path2, mode, c); err != nil {
		return Entry{}, err
	}
	var pst unix.Stat_t // the upper parent, for settle
	if err := l.ensureParentsStat(rel, &pst); err != nil {
		return Entry{}, err
	}
	isDir := mode&unix.S_IFMT == unix.S_IFDIR
	if err := l.place(rel, isDir, mk); err != nil {
		return Entry{}, err
	}
	e := Entry{Obj: Obj{Upper: true}}
	if err := l.UpperDo(rel, func(upath string) error {
		return l.settle(upath, &pst, mode, isDir, c, &e.Stat)
	}); err != nil {
		return Entry{}, err
	}
	e.Stat.Ino = l.stableIno(e.Stat.Dev, e.Stat.Ino)
	return e, nil
}

// settle gives a new upper object to the caller and the permissions it
// gets from the mode asked for, the caller's umask and the default ACL of
// its parent (newPerms), and returns its attributes. It sets them all
// itself: the object may have been made elsewhere and moved in (place),
// and the server's own umask must not apply. pst is its upper parent.
func (l *Layers) settle(upath string, pst *unix.Stat_t, mode uint32, isDir bool, c Caller, st *unix.Stat_t) error {
	// A setgid directory hands its group down, and to a new directory its
	// setgid bit too.
	parent := filepath.Dir(upath)
	setgidParent := pst.Mode&unix.S_ISGID != 0
	if l.root {
		gid := int(c.Gid)
		if setgidParent {
			gid = int(pst.Gid)
		}
		if err := unix.Lchown(upath, int(c.Uid), gid); err != nil {
			return err
		}
	}
	if mode&unix.S_IFMT == unix.S_IFLNK {
		return unix.Lstat(upath, st)
	}
	p, err := newPerms(parent, mode, c)
	if err != nil {
		return err
	}
	if err := p.setACLs(upath); err != nil {
		return err
	}
	if err := unix.Lstat(upath, st); err != nil {
		return err
	}
	want := p.mode
	if isDir && (setgidParent || st.Mode&unix.S_ISGID != 0) {
		want |= unix.S_ISGID
	}
	if st.Mode&0o7777 != want {
		if err := unix.Chmod(upath, want); err != nil {
			return err
		}
		st.Mode = st.Mode&^0o7777 | want
	}
	return nil
}

// place makes a new object at rel with mk: directly when the upper name is
// free, otherwise (a whiteout) under a temporary name and then swapped in,
// so the whiteout never disappears before its replacement exists. mk must
// fail with EEXIST where the name is taken (O_EXCL, mkdir, mknod, symlink
// and link all do): the name is tried first and looked at only then.
func (l *Layers) place(rel string, isDir bool, mk func(string) error) error {
	if isDir {
		defer l.dirGen.changed()
	}
	return l.UpperDo(rel, func(upath string) error { return l.placeAt(upath, isDir, mk) })
}

// placeAt is place at the upper path upath (upperAt).
func (l *Layers) placeAt(upath string, isDir bool, mk func(string) error) error {
	err := mk(upath)
	if !errors.Is(err, unix.EEXIST) {
		return err
	}
	var st unix.Stat_t
	if err := unix.Lstat(upath, &st); err != nil {
		return err
	}
	if !fsutil.IsWhiteout(&st) {
		return unix.EEXIST
	}
	tmp := filepath.Join(l.work, fsutil.TempName(".new-"))
	if err := mk(tmp); err != nil {
		removeTemp(tmp)
		return err
	}
	if !isDir {
		if err := unix.Rename(tmp, upath); err != nil {
			removeTemp(tmp)
			return err
		}
		return nil
	}
	if err := unix.Lsetxattr(tmp, l.ns.opaque, []byte("y"), 0); err != nil {
		removeTemp(tmp)
		return err
	}
	if err := unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, upath, unix.RENAME_EXCHANGE); err != nil {
		removeTemp(tmp)
		return err
	}
	return unix.Unlink(tmp) // the whiteout, now at the temporary name
}

// Unlink removes the non-directory name from dirRel.
func (l *Layers) Unlink(dirRel string, dir Obj, name string, c Caller) error {
	rel := Join(dirRel, name)
	if err := dir.mayRemove(); err != nil {
		return err
	}
	if err := l.record(OpUnlink, rel, "", 0, c); err != nil {
		return err
	}
	return l.remove(rel, dir, name)
}

// Rmdir removes the directory name from dirRel; it must be empty in the
// merged view (upper and lower entries alike).
func (l *Layers) Rmdir(dirRel string, dir Obj, name string, c Caller) error {
	rel := Join(dirRel, name)
	e, err := l.Lookup(dirRel, dir, name)
	if err != nil {
		return err
	}
	if !e.IsDir() {
		return unix.ENOTDIR
	}
	if err := dir.mayRemove(); err != nil {
		return err
	}
	if err := e.mayChange(); err != nil {
		return err
	}
	ents, err := l.ReadDir(rel, e.Obj)
	if err != nil {
		return err
	}
	if len(ents) > 0 {
		return unix.ENOTEMPTY
	}
	if err := l.record(OpRmdir, rel, "", 0, c); err != nil {
		return err
	}
	return l.remove(rel, dir, name)
}

// remove takes rel out of the merged view: the upper object goes, and a
// whiteout stays where a lower object would otherwise show through.
func (l *Layers) remove(rel string, dir Obj, name string) error {
	first, dirs, err := l.stepLowers(dir.Lowers, name, false)
	if err != nil {
		return err
	}
	need := first != nil || len(dirs) > 0
	if first != nil && first.prot != 0 && !first.isDir() {
		return unix.EPERM // protect.go (a directory's was checked by Rmdir)
	}
	if first != nil {
		if err := l.noteBase(first.origin, &first.st); err != nil {
			return err
		}
	}
	if !l.inUpper(rel) {
		if !need {
			return unix.ENOENT
		}
		if err := l.ensureParents(rel); err != nil {
			return err
		}
		return l.UpperDo(rel, mkWhiteout)
	}
	return l.UpperDo(rel, func(upath string) error { return l.removeUpper(upath, need) })
}

// removeUpper takes the upper object at upath (upperAt) away, leaving a
// whiteout when need says a lower object would show through.
func (l *Layers) removeUpper(upath string, need bool) error {
	if !need {
		err := unix.Unlink(upath)
		if errors.Is(err, unix.EISDIR) {
			err = unix.Rmdir(upath)
		}
		if !errors.Is(err, unix.ENOTEMPTY) && !errors.Is(err, unix.EEXIST) {
			return err
		}
	}
	// Move the upper object aside, leaving a whiteout in one step, then
	// drop it (a directory may still hold whiteouts of its own).
	tmp := filepath.Join(l.work, fsutil.TempName(".del-"))
	flags := uint(unix.RENAME_WHITEOUT)
	if !need {
		flags = 0
	}
	if err := unix.Renameat2(unix.AT_FDCWD, upath, unix.AT_FDCWD, tmp, flags); err != nil {
		return err
	}
	return os.RemoveAll(tmp)
}

func mkWhiteout(path string) error {
	return unix.Mknod(path, unix.S_IFCHR, 0)
}
