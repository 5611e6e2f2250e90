package layers

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/fsutil"
)

// CopyUp makes the object at rel present in the upper layer, with its
// content, mode, owner, times and xattrs; o is updated. It is a no-op for an
// object already there. The copy is built under a temporary name in the work
// directory, made durable and then renamed into place, so a crash leaves
// either no copy or a whole one (see makeDurable).
func (l *Layers) CopyUp(rel string, o *Obj) error {
	return l.copyUp(rel, o, true)
}

func (l *Layers) copyUp(rel string, o *Obj, data bool) error {
	return l.copyUpAs(rel, o, data, false)
}

// copyUpForMeta is CopyUp for a change of the object's attributes alone,
// which a commit makes in place: a file of the original in an immutable
// or append-only directory may be copied up for it (protect.go).
func (l *Layers) copyUpForMeta(rel string, o *Obj) error {
	return l.copyUpAs(rel, o, true, true)
}

func (l *Layers) copyUpAs(rel string, o *Obj, data, meta bool) error {
	if o.Upper {
		return nil
	}
	if l.inUpper(rel) {
		o.Upper = true
		return nil
	}
	if len(o.Lowers) == 0 {
		return fmt.Errorf("copy up %q: %w", rel, unix.ENOENT)
	}
	if err := l.ensureParents(rel); err != nil {
		return err
	}
	if err := l.copyUpOne(rel, o.Lowers[0], data, meta); err != nil {
		return fmt.Errorf("copy up %q: %w", rel, err)
	}
	o.Upper = true
	return nil
}

// ensureParents creates every missing ancestor directory of rel in the upper
// layer, copied up from the lower directories they merge.
func (l *Layers) ensureParents(rel string) error {
	parent := filepath.Dir(rel)
	if parent == "." || l.inUpper(parent) {
		return nil
	}
	comps := splitRel(parent)
	cur := ""
	for _, name := range comps {
		next := Join(cur, name)
		if !l.inUpper(next) {
			lowers := l.lowerDirsOf(next)
			if len(lowers) == 0 {
				return fmt.Errorf("copy up parent %q: %w", next, unix.ENOENT)
			}
			if err := l.copyUpOne(next, lowers[0], false, false); err != nil {
				return fmt.Errorf("copy up parent %q: %w", next, err)
			}
		}
		cur = next
	}
	return nil
}

// ensureParentsStat is ensureParents that also gives the attributes of
// rel's upper parent directory: one lstat(2) when it is there already.
func (l *Layers) ensureParentsStat(rel string, pst *unix.Stat_t) error {
	parent := filepath.Dir(rel)
	err := l.UpperDo(parent, func(p string) error { return unix.Lstat(p, pst) })
	if err == nil && pst.Mode&unix.S_IFMT == unix.S_IFDIR {
		return nil
	}
	if err := l.ensureParents(rel); err != nil {
		return err
	}
	return l.UpperDo(parent, func(p string) error { return unix.Stat(p, pst) })
}

// copyUpOne copies the single lower object src to rel in the upper layer;
// meta says the copy is for a change of attributes alone (copyUpForMeta).
func (l *Layers) copyUpOne(rel string, src Origin, data, meta bool) error {
	var st unix.Stat_t
	tmp := filepath.Join(l.work, fsutil.TempName(".copyup-"))
	made := false
	err := l.lowerDo(src, func(spath string) error {
		prot, err := fsutil.Lstatx(unix.AT_FDCWD, spath, &st)
		if err != nil {
			return err
		}
		isDir := st.Mode&unix.S_IFMT == unix.S_IFDIR
		if !isDir && (prot != 0 || (!meta && l.lowerParentProt(src) != 0)) {
			return unix.EPERM // protect.go
		}
		if l.Journal() != nil {
			if err := l.noteBase(src, &st); err != nil {
				return err
			}
		}
		og := origin{layer: src.Layer, path: src.Path}
		if st.Mode&unix.S_IFMT == unix.S_IFDIR || st.Nlink == 1 {
			og.ino = l.stableIno(st.Dev, st.Ino)
		}
		made = true
		if err := l.buildCopy(tmp, spath, &st, og, data); err != nil {
			return err
		}
		if prot != 0 {
			// Copied up as the parent of a change deeper down: the
			// copy keeps the original's protection (protect.go).
			return unix.Lsetxattr(tmp, l.ns.protattr, protattr(prot), 0)
		}
		return nil
	})
	if err != nil {
		if made {
			removeTemp(tmp)
		}
		return err
	}
	err = l.UpperDo(rel, func(upath string) error { return l.moveCopyIn(tmp, upath, &st) })
	if err != nil {
		removeTemp(tmp)
		if errors.Is(err, errCopyRaced) {
			return nil // a concurrent copy-up won; its copy is as good
		}
	}
	return err
}

// errCopyRaced says another copy-up of the object came first.
var errCopyRaced = errors.New("copied up already")

// moveCopyIn renames the copy tmp of an object with the attributes st to
// the upper path upath (upperAt), keeping the times of the parent.
func (l *Layers) moveCopyIn(tmp, upath string, st *unix.Stat_t) error {
	// A copy-up is no change of the parent: keep its times (as overlayfs).
	parent := filepath.Dir(upath)
	var pst unix.Stat_t
	if err := unix.Lstat(parent, &pst); err != nil {
		return err
	}
	moveIn := func() error {
		return unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, upath, unix.RENAME_NOREPLACE)
	}
	dirs := []ownDir{{path: parent}}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		dirs = append(dirs, ownDir{path: tmp, after: upath}) // its ".." changes
	}
	err := l.asOwner(moveIn, dirs...)
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		l.dirGen.changed()
	}
	if errors.Is(err, unix.EEXIST) {
		return errCopyRaced
	}
	if err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		// Moving a directory to another parent rewrites its ".." entry,
		// which moves its mtime: put the original's times back.
		ts := []unix.Timespec{st.Atim, st.Mtim}
		if err := unix.UtimesNanoAt(unix.AT_FDCWD, upath, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return err
		}
	}
	return unix.UtimesNanoAt(unix.AT_FDCWD, parent, []unix.Timespec{pst.Atim, pst.Mtim}, unix.AT_SYMLINK_NOFOLLOW)
}

func removeTemp(path string) {
	if unix.Unlink(path) != nil {
		_ = unix.Rmdir(path)
	}
}

// buildCopy makes the copy of the lower object spath (attributes st) at tmp.
func (l *Layers) buildCopy(tmp, spath string, st *unix.Stat_t, og origin, data bool) error {
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		return l.copyFile(tmp, spath, st, og, data)
	case unix.S_IFDIR:
		if err := unix.Mkdir(tmp, 0o700); err != nil {
			return err
		}
		copyDirFlags(tmp, spath)
	case unix.S_IFLNK:
		target, err := readlink(spath)
		if err != nil {
			return err
		}
		if err := unix.Symlink(target, tmp); err != nil {
			return err
		}
	default: // fifo, socket, device
		if err := unix.Mknod(tmp, st.Mode, int(st.Rdev)); err != nil {
			return err
		}
	}
	return l.copyMeta(tmp, spath, st, og)
}

func (l *Layers) copyFile(tmp, spath string, st *unix.Stat_t, og origin, data bool) error {
	src, err := unix.Open(spath, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return err
	}
	defer unix.Close(src)
	dst, err := unix.Open(tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	defer unix.Close(dst)
	if data {
		if err := fsutil.CopyData(dst, src); err != nil {
			return err
		}
	}
	fsutil.CopyFlags(dst, src)
	if err := fsutil.CopyXattrs(dst, src, l.Private); err != nil {
		return err
	}
	if err := l.setOrigin(dst, og); err != nil {
		return err
	}
	if l.root {
		if err := unix.Fchown(dst, int(st.Uid), int(st.Gid)); err != nil {
			return err
		}
	}
	if err := unix.Fchmod(dst, st.Mode&0o7777); err != nil {
		return err
	}
	ts := []unix.Timespec{st.Atim, st.Mtim}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, tmp, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return err
	}
	return l.makeDurable(dst)
}

// makeDurable makes the copy at fd reach the disk no later than the rename
// that will put it in place, so that after a crash the name shows either
// the original or the whole copy, never an empty or partial file. Where
// the upper's filesystem orders data before a later rename (ext4 with a
// journal, data=ordered: see fsutil.OrdersDataBeforeRename), starting
// writeback is enough and the copy-up does not wait for the disk (the
// fsync took three quarters of a small file's copy-up); elsewhere the
// copy is fsynced, as kernel overlayfs does.
func (l *Layers) makeDurable(fd int) error {
	if l.ordered {
		return fsutil.StartWriteback(fd)
	}
	return unix.Fsync(fd)
}

// copyDirFlags gives the new directory tmp the flags of the directory
// spath that a copy keeps (fsutil.CopyFlags): what is made in the copy
// inherits them, as it would in the original.
func copyDirFlags(tmp, spath string) {
	const dirFlags = unix.O_RDONLY | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC
	src, err := unix.Open(spath, dirFlags, 0)
	if err != nil {
		return
	}
	defer unix.Close(src)
	dst, err := unix.Open(tmp, dirFlags, 0)
	if err != nil {
		return
	}
	defer unix.Close(dst)
	fsutil.CopyFlags(dst, src)
}

// copyMeta copies owner, mode, xattrs and times from spath to the new
// non-regular object at tmp, and records its origin where the filesystem
// allows an attribute on that kind of object.
func (l *Layers) copyMeta(tmp, spath string, st *unix.Stat_t, og origin) error {
	isLink := st.Mode&unix.S_IFMT == unix.S_IFLNK
	if names, err := fsutil.LListXattrs(spath); err == nil {
		for _, n := range names {
			if l.Private(n) {
				continue
			}
			v, err := fsutil.LGetXattr(spath, n)
			if err != nil {
				continue
			}
			if err := unix.Lsetxattr(tmp, n, v, 0); err != nil && !permissionLike(err) {
				return err
			}
		}
	}
	ov, err := l.originValue(og)
	if err != nil {
		return err
	}
	if err := unix.Lsetxattr(tmp, l.ns.origin, ov, 0); err != nil && !permissionLike(err) {
		return err
	}
	if l.root {
		if err := unix.Lchown(tmp, int(st.Uid), int(st.Gid)); err != nil {
			return err
		}
	}
	if !isLink {
		if err := unix.Chmod(tmp, st.Mode&0o7777); err != nil {
			return err
		}
	}
	ts := []unix.Timespec{st.Atim, st.Mtim}
	return unix.UtimesNanoAt(unix.AT_FDCWD, tmp, ts, unix.AT_SYMLINK_NOFOLLOW)
}

// permissionLike reports errors that mean "this kind of object or namespace
// takes no such attribute here" (user.* on a symlink, trusted.* unprivileged).
func permissionLike(err error) bool {
	return errors.Is(err, unix.EPERM) || errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EACCES)
}

func readlink(path string) (string, error) {
	buf := make([]byte, unix.PathMax)
	n, err := unix.Readlink(path, buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}

// ownDir is an upper directory asOwner may open up: path now, after once
// the operation moved it ("" when it stays).
type ownDir struct{ path, after string }

// asOwner runs op; when it fails with EACCES and the server is not root,
// it runs op again with the owner's write and search bits added to dirs
// (upper directories the server made, whose modes are the original's),
// then puts their modes back. An unprivileged server can then copy a
// writable file up out of a directory its owner may not write (0555),
// as root can; the caller's own permission was checked by the kernel
// against the mode the mount shows.
func (l *Layers) asOwner(op func() error, dirs ...ownDir) error {
	err := op()
	if !errors.Is(err, unix.EACCES) || l.root {
		return err
	}
	l.permMu.Lock()
	defer l.permMu.Unlock()
	euid := uint32(os.Geteuid())
	type saved struct {
		d    ownDir
		mode uint32
	}
	var opened []saved
	for _, d := range dirs {
		var st unix.Stat_t
		if unix.Lstat(d.path, &st) != nil || st.Mode&unix.S_IFMT != unix.S_IFDIR || st.Uid != euid || st.Mode&0o300 == 0o300 {
			continue
		}
		if unix.Chmod(d.path, st.Mode&0o7777|0o300) == nil {
			opened = append(opened, saved{d, st.Mode & 0o7777})
		}
	}
	if len(opened) == 0 {
		return err
	}
	err = op()
	for _, o := range opened {
		p := o.d.path
		if err == nil && o.d.after != "" {
			p = o.d.after
		}
		if cerr := unix.Chmod(p, o.mode); cerr != nil && err == nil {
			err = cerr
		}
	}
	return err
}
