package commit

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/fsutil"
)

// stageObject puts the upper object at upper (whose lstat is ust) into txn
// at slot, and returns the staged object's lstat: a hard link
// when they share a filesystem (O(1), no data copied), else a copy with
// its metadata. Everything is made and set through descriptors beneath
// txn's (openTxnDir checked that nobody else can write in it): a
// transaction directory in the original's root that another process
// renames away or swaps for a symlink takes nothing of the sandbox's
// anywhere else. The overlay attributes must not reach the original: a
// linked object's are returned, to be removed just before it moves in
// (and put back by an undo: it shares its inode with the upper); a copy
// never gets them.
func stageObject(upper string, ust *unix.Stat_t, txn *tree, slot string, sameFS bool) (unix.Stat_t, map[string][]byte, error) {
	var st unix.Stat_t
	dfd, name, err := txn.parent(slot)
	if err != nil {
		return st, nil, fmt.Errorf("stage %s: %w", upper, err)
	}
	defer unix.Close(dfd)
	if !sameFS {
		if err := copyObject(upper, dfd, name, txn.isLayout); err != nil {
			return st, nil, fmt.Errorf("stage %s: %w", upper, err)
		}
		err = unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW)
		return st, nil, err
	}
	if err := unix.Linkat(unix.AT_FDCWD, upper, dfd, name, 0); err != nil {
		return st, nil, fmt.Errorf("stage %s: %w", upper, err)
	}
	strip, err := overlayAttrs(upper, txn.isLayout) // the staged object's own inode
	if err != nil {
		return st, strip, fmt.Errorf("stage %s: %w", upper, err)
	}
	return *ust, strip, nil // the upper's own inode: its ctime and link count aside, as it was
}

// openUpperObj opens (O_PATH, never following it) the object at rel in
// the upper directory upper, however deep (fsutil.ShortPath).
func openUpperObj(upper, rel string) (int, error) {
	up, err := fsutil.ShortPath(upper, rel)
	if err != nil {
		return -1, err
	}
	defer up.Close()
	return unix.Open(up.Path, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
}

func overlayAttrs(path string, layout func(name string) bool) (map[string][]byte, error) {
	names, err := fsutil.LListXattrs(path)
	if err != nil {
		if errors.Is(err, unix.ENOTSUP) {
			return nil, nil
		}
		return nil, err
	}
	var out map[string][]byte
	for _, n := range names {
		if !layout(n) {
			continue
		}
		v, err := fsutil.LGetXattr(path, n)
		if err != nil {
			continue
		}
		if out == nil {
			out = map[string][]byte{}
		}
		out[n] = v
	}
	return out, nil
}

// stripAttrs removes the overlay attributes of a staged object (a
// linked one, so in the private work directory).
func stripAttrs(txn *tree, s *step) error {
	p := filepath.Join(txn.root, s.staged())
	for n := range s.Strip {
		if err := unix.Lremovexattr(p, n); err != nil && !errors.Is(err, unix.ENODATA) {
			return err
		}
	}
	return nil
}

// restoreStripped puts the overlay attributes back on staged objects that
// are still in the transaction directory (they share the upper's inode).
func restoreStripped(txn *tree, steps []step) {
	if txn == nil {
		return
	}
	for _, s := range steps {
		if s.Kind != opInstall || len(s.Strip) == 0 {
			continue
		}
		// Moved back by an undo, or never moved: where it was staged.
		p := filepath.Join(txn.root, s.Slot)
		if _, err := os.Lstat(p); err != nil && s.In != "" {
			p = filepath.Join(txn.root, s.In)
		}
		for n, v := range s.Strip {
			_ = unix.Lsetxattr(p, n, v, 0)
		}
	}
}

// copyObject copies the upper object src to name in the directory dfd,
// on another filesystem, with owner, mode, user attributes and times.
// dfd is a directory only this process writes in (openTxnDir), so the
// name it just made is the object it made.
func copyObject(src string, dfd int, name string, layout func(name string) bool) error {
	var st unix.Stat_t
	if err := unix.Lstat(src, &st); err != nil {
		return err
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		if err := copyFile(src, dfd, name, layout); err != nil {
			return err
		}
	case unix.S_IFLNK:
		buf := make([]byte, unix.PathMax)
		n, err := unix.Readlink(src, buf)
		if err != nil {
			return err
		}
		if err := unix.Symlinkat(string(buf[:n]), dfd, name); err != nil {
			return err
		}
	default:
		if err := unix.Mknodat(dfd, name, st.Mode, int(st.Rdev)); err != nil {
			return err
		}
	}
	if err := unix.Fchownat(dfd, name, int(st.Uid), int(st.Gid), unix.AT_SYMLINK_NOFOLLOW); err != nil && !errors.Is(err, unix.EPERM) {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFLNK {
		if err := unix.Fchmodat(dfd, name, st.Mode&0o7777, 0); err != nil {
			return err
		}
	}
	ts := []unix.Timespec{st.Atim, st.Mtim}
	return unix.UtimesNanoAt(dfd, name, ts, unix.AT_SYMLINK_NOFOLLOW)
}

func copyFile(src string, dfd int, name string, layout func(name string) bool) error {
	in, err := unix.Open(src, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(in)
	out, err := unix.Openat(dfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	defer unix.Close(out)
	if err := fsutil.CopyData(out, in); err != nil {
		return err
	}
	fsutil.CopyFlags(out, in)
	return fsutil.CopyXattrs(out, in, layout)
}
