package commit

import (
	"errors"
	"fmt"
	"os"
	"path"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/fsutil"
)

// tree is a directory written only through descriptors opened beneath it
// with RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS: a symlink planted anywhere in a
// path makes the step fail; it is never followed.
type tree struct {
	root string
	fd   int // O_PATH|O_DIRECTORY
	// layout says which attributes are the upper layout's
	// (layers.Config.LayoutXattr of the sandbox): they never reach the
	// original, and the commit never removes them from it. Nil: both
	// overlay namespaces.
	layout func(name string) bool
}

func (t *tree) isLayout(name string) bool {
	if t.layout == nil {
		return strings.HasPrefix(name, "trusted.overlay.") || strings.HasPrefix(name, "user.overlay.")
	}
	return t.layout(name)
}

func openTree(root string) (*tree, error) {
	fd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", root, err)
	}
	return &tree{root: root, fd: fd}, nil
}

func (t *tree) close() { unix.Close(t.fd) }

// parent opens the directory holding rel and returns it with rel's last
// component. The caller closes the descriptor.
func (t *tree) parent(rel string) (int, string, error) {
	rel, err := fsutil.CleanRel(rel)
	if err != nil {
		return -1, "", err
	}
	if rel == "" {
		return -1, "", fmt.Errorf("the root itself: %w", unix.EINVAL)
	}
	dir, name := path.Split(rel)
	if dir == "" {
		fd, err := fsutil.Dup(t.fd)
		return fd, name, err
	}
	fd, err := fsutil.OpenBeneath(t.fd, dir, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		return -1, "", fmt.Errorf("%s: %w", path.Join(t.root, dir), err)
	}
	return fd, name, nil
}

// lstat stats rel without following a symlink at its end.
func (t *tree) lstat(rel string) (unix.Stat_t, error) {
	var st unix.Stat_t
	if rel == "" {
		err := unix.Fstat(t.fd, &st)
		return st, err
	}
	dfd, name, err := t.parent(rel)
	if err != nil {
		return st, err
	}
	defer unix.Close(dfd)
	err = unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW)
	return st, err
}

// exists reports whether rel names something (ENOENT and ENOTDIR say no).
// A symlink on the way is an error (ELOOP): an undo must not take a path
// it cannot reach for one that is not there.
func (t *tree) exists(rel string) (bool, unix.Stat_t, error) {
	st, err := t.lstat(rel)
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
		return false, st, nil
	}
	return err == nil, st, err
}

// inTree is exists for what the original's own tree holds: a symlink on
// the way, never followed, means nothing is at rel (a directory the
// sandbox replaced by a symlink has no children left to delete).
func (t *tree) inTree(rel string) (bool, unix.Stat_t, error) {
	ok, st, err := t.exists(rel)
	if errors.Is(err, unix.ELOOP) {
		return false, st, nil
	}
	return ok, st, err
}

// move renames from (in tree a) to to (in tree b), never replacing an
// existing entry at to.
func move(a *tree, from string, b *tree, to string) error {
	sfd, sname, err := a.parent(from)
	if err != nil {
		return err
	}
	defer unix.Close(sfd)
	dfd, dname, err := b.parent(to)
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	if err := unix.Renameat2(sfd, sname, dfd, dname, unix.RENAME_NOREPLACE); err != nil {
		return fmt.Errorf("rename %s to %s: %w", path.Join(a.root, from), path.Join(b.root, to), err)
	}
	return nil
}

// mkdir makes the directory rel with mode.
func (t *tree) mkdir(rel string, mode uint32) error {
	dfd, name, err := t.parent(rel)
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	return unix.Mkdirat(dfd, name, mode&0o7777)
}

// rmdir removes the empty directory rel.
func (t *tree) rmdir(rel string) error {
	dfd, name, err := t.parent(rel)
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	return unix.Unlinkat(dfd, name, unix.AT_REMOVEDIR)
}

// openObj opens rel itself (O_PATH, never following a symlink); "" is
// the root.
func (t *tree) openObj(rel string) (int, error) {
	if rel == "" {
		return fsutil.Dup(t.fd)
	}
	dfd, name, err := t.parent(rel)
	if err != nil {
		return -1, err
	}
	defer unix.Close(dfd)
	return unix.Openat(dfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
}

// syncfs flushes the whole filesystem holding t (one call, whatever the
// number of files staged or moved).
func (t *tree) syncfs() error {
	fd, err := unix.Openat(t.fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Syncfs(fd)
}

// mountOf returns the mount id (fsutil.MountID) of the directory rel, or
// of its deepest ancestor that is a directory: the mount a new object at
// rel would be made on, and the one the directory rel itself is. A
// symlink on the way counts as no directory (the steps that meet it
// refuse it).
func (t *tree) mountOf(rel string) (uint64, error) {
	for {
		id, err := t.dirMount(rel)
		if rel == "" || !noDir(err) {
			return id, err
		}
		rel = parentRel(rel)
	}
}

// dirMount returns the mount id of the directory rel; noDir(err) when rel
// is not one.
func (t *tree) dirMount(rel string) (uint64, error) {
	var fd int
	var err error
	if rel == "" {
		fd, err = fsutil.Dup(t.fd)
	} else {
		fd, err = fsutil.OpenBeneath(t.fd, rel, unix.O_PATH|unix.O_DIRECTORY, 0)
	}
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	return fsutil.MountID(fd)
}

// noDir reports whether err says a path names no directory: missing, not
// one, or a symlink on the way.
func noDir(err error) bool {
	return errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP)
}

// parentRel is the parent of a relative path ("" for a top-level name).
func parentRel(rel string) string {
	dir, _ := path.Split(rel)
	return strings.TrimSuffix(dir, "/")
}

// openDir opens the directory rel for reading (never following a
// symlink).
func (t *tree) openDir(rel string) (int, error) {
	if rel == "" {
		return unix.Openat(t.fd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	}
	return fsutil.OpenBeneath(t.fd, rel, unix.O_RDONLY|unix.O_DIRECTORY, 0)
}

// names lists the directory rel (never following a symlink).
func (t *tree) names(rel string) ([]string, error) {
	fd, err := t.openDir(rel)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), path.Join(t.root, rel))
	defer f.Close()
	return f.Readdirnames(-1)
}

// firstSymlink returns the first component of rel (rel itself included)
// that is a symlink, or "".
func (t *tree) firstSymlink(rel string) string {
	for q, rest := "", rel; rest != ""; {
		name, tail, _ := strings.Cut(rest, "/")
		q, rest = path.Join(q, name), tail
		st, err := t.lstat(q)
		if err != nil {
			return ""
		}
		if st.Mode&unix.S_IFMT == unix.S_IFLNK {
			return q
		}
	}
	return ""
}
