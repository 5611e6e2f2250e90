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
// its metadata. The overlay attributes must not reach the original: they
// are returned, to be removed just before the object moves in (and put
// back by an undo: a linked object shares its inode with the upper).
func stageObject(upper string, ust *unix.Stat_t, txn *tree, slot string, sameFS bool) (unix.Stat_t, map[string][]byte, error) {
	dst := filepath.Join(txn.root, slot)
	var st unix.Stat_t
	var err error
	if sameFS {
		err = unix.Linkat(unix.AT_FDCWD, upper, unix.AT_FDCWD, dst, 0)
	} else {
		err = copyObject(upper, dst)
	}
	if err != nil {
		return st, nil, fmt.Errorf("stage %s: %w", upper, err)
	}
	strip, err := overlayAttrs(dst)
	if err != nil {
		return st, strip, fmt.Errorf("stage %s: %w", upper, err)
	}
	if sameFS {
		return *ust, strip, nil // the upper's own inode: its ctime and link count aside, as it was
	}
	err = unix.Lstat(dst, &st)
	return st, strip, err
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

func overlayAttrs(path string) (map[string][]byte, error) {
	names, err := fsutil.LListXattrs(path)
	if err != nil {
		if errors.Is(err, unix.ENOTSUP) {
			return nil, nil
		}
		return nil, err
	}
	var out map[string][]byte
	for _, n := range names {
		if !isOverlayAttr(n) {
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

// stripAttrs removes the overlay attributes of a staged object.
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

// copyObject copies the upper object src to dst on another filesystem,
// with owner, mode, user attributes and times.
func copyObject(src, dst string) error {
	var st unix.Stat_t
	if err := unix.Lstat(src, &st); err != nil {
		return err
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		if err := copyFile(src, dst, &st); err != nil {
			return err
		}
	case unix.S_IFLNK:
		buf := make([]byte, unix.PathMax)
		n, err := unix.Readlink(src, buf)
		if err != nil {
			return err
		}
		if err := unix.Symlink(string(buf[:n]), dst); err != nil {
			return err
		}
	default:
		if err := unix.Mknod(dst, st.Mode, int(st.Rdev)); err != nil {
			return err
		}
	}
	if err := unix.Lchown(dst, int(st.Uid), int(st.Gid)); err != nil && !errors.Is(err, unix.EPERM) {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFLNK {
		if err := unix.Chmod(dst, st.Mode&0o7777); err != nil {
			return err
		}
	}
	ts := []unix.Timespec{st.Atim, st.Mtim}
	return unix.UtimesNanoAt(unix.AT_FDCWD, dst, ts, unix.AT_SYMLINK_NOFOLLOW)
}

func copyFile(src, dst string, st *unix.Stat_t) error {
	in, err := unix.Open(src, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(in)
	out, err := unix.Open(dst, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	defer unix.Close(out)
	if err := fsutil.CopyData(out, in); err != nil {
		return err
	}
	fsutil.CopyFlags(out, in)
	return fsutil.CopyXattrs(out, in, isOverlayAttr)
}
