package manager

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/commit"
	"github.com/sbxfs/sbxfs/fsutil"
)

// The checks below follow cmd/sbxfs/checks.go (which the manager must not
// import): every path resolved, no directory of a sandbox inside another.

// resolveDir returns the absolute path of the existing directory p with
// every symlink resolved.
func resolveDir(role, p string) (string, error) {
	if p == "" {
		return "", fmt.Errorf("%w: no %s given", ErrInvalid, role)
	}
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", fmt.Errorf("%w: %s %q: %v", ErrInvalid, role, p, err)
	}
	st, err := os.Stat(abs)
	switch {
	case errors.Is(err, unix.ENOTCONN), errors.Is(err, unix.ECONNABORTED): // ECONNABORTED: manager/mounts.go isStale
		return "", fmt.Errorf("%w: %s %q is a mount whose server is gone; unmount it first", ErrInvalid, role, abs)
	case err != nil:
		return "", fmt.Errorf("%w: %s: %v", ErrInvalid, role, err)
	case !st.IsDir():
		return "", fmt.Errorf("%w: %s %q is not a directory", ErrInvalid, role, abs)
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return "", fmt.Errorf("%w: %s: %v", ErrInvalid, role, err)
	}
	return real, nil
}

// within reports whether p is dir or lies beneath it (both clean and
// absolute).
func within(p, dir string) bool {
	return p == dir || dir == "/" || strings.HasPrefix(p, dir+"/")
}

// checkMountpoint refuses a given mountpoint that is already a mount
// point or holds entries (the mount would hide them).
func checkMountpoint(mnt string) error {
	mounts, err := fsutil.ReadMountinfo()
	if err != nil {
		return err
	}
	for _, e := range mounts {
		if e.Mountpoint == mnt {
			return fmt.Errorf("%w: mountpoint %q is already a mount point (%s from %s)", ErrInvalid, mnt, e.FSType, e.Source)
		}
	}
	f, err := os.Open(mnt)
	if err != nil {
		return fmt.Errorf("%w: mountpoint: %v", ErrInvalid, err)
	}
	defer f.Close()
	if _, err := f.Readdirnames(1); err != io.EOF {
		if err != nil {
			return fmt.Errorf("%w: mountpoint: %v", ErrInvalid, err)
		}
		return fmt.Errorf("%w: mountpoint %q is not empty", ErrInvalid, mnt)
	}
	return nil
}

// checkPlacement refuses a new sandbox whose directories collide with
// each other, with the state root or with a live sandbox. A sandbox whose
// original lies inside another sandbox's mountpoint is allowed in that
// sandbox's plan: it is nested, and commits before its parent. Call with
// the registry locked.
func (m *Manager) checkPlacement(r *record) error {
	switch {
	case within(r.Mountpoint, r.Original):
		return fmt.Errorf("%w: the mountpoint %q is inside the original %q", ErrInvalid, r.Mountpoint, r.Original)
	case within(r.Original, r.Mountpoint):
		return fmt.Errorf("%w: the original %q is inside the mountpoint %q", ErrInvalid, r.Original, r.Mountpoint)
	case within(m.root, r.Original):
		return fmt.Errorf("%w: the state root %q is inside the original %q: the sandbox would see its own upper", ErrInvalid, m.root, r.Original)
	case !r.OwnMount && within(r.Mountpoint, m.root):
		return fmt.Errorf("%w: the mountpoint %q is inside the state root %q", ErrInvalid, r.Mountpoint, m.root)
	}
	nested := false
	for _, o := range m.recs {
		if o.ID == r.ID || o.State != Active && o.State != Pending {
			continue // itself (Moved checks a new place of its original)
		}
		switch {
		case r.Mountpoint == o.Mountpoint:
			return fmt.Errorf("%w: mountpoint %q is used by sandbox %s", ErrInvalid, r.Mountpoint, o.ID)
		case within(r.Mountpoint, o.Mountpoint), within(r.Mountpoint, o.Original):
			return fmt.Errorf("%w: mountpoint %q is inside sandbox %s (%s over %s)", ErrInvalid, r.Mountpoint, o.ID, o.Mountpoint, o.Original)
		case within(o.Mountpoint, r.Original) && o.Mountpoint != r.Original:
			return fmt.Errorf("%w: original %q holds the mountpoint of sandbox %s (%s)", ErrInvalid, r.Original, o.ID, o.Mountpoint)
		case within(r.Original, o.Mountpoint) && o.Plan != r.Plan:
			// Its commit stages in the parent's mount, which a commit of
			// another plan could take for the parent's own change.
			return fmt.Errorf("%w: original %q is inside the mount of sandbox %s of plan %s: a nested sandbox must be in its parent's plan", ErrInvalid, r.Original, o.ID, o.Plan)
		case within(r.Original, o.Mountpoint):
			nested = true
		}
	}
	if within(r.Original, m.root) && !nested {
		return fmt.Errorf("%w: the original %q is inside the state root %q", ErrInvalid, r.Original, m.root)
	}
	return nil
}

// InPlaceView is the directory in a sandbox's directory where the mount
// namespace of a command of 'sbxfs run --in-place' shows the original the
// sandbox covers there (read-only). Elsewhere it is an empty directory:
// the manager removes it with rmdir only, never through a mount.
const InPlaceView = "original-in-place"

// hasUndoLog reports whether the work directory holds an interrupted
// commit's undo log.
func hasUndoLog(work string) bool {
	_, err := os.Lstat(filepath.Join(work, commit.UndoLogName))
	return err == nil
}

// noSymlinkTo refuses a mountpoint a symlink now leads to. Recorded
// resolved, it has none on the way unless someone put one there since (a
// user who may write a directory on the way, pointing it at /etc); and
// mount(2) follows it: the daemon's next mount of the sandbox, at its
// restart, covered whatever the symlink named (found by review). What
// another process swaps in between this look and the mount is not seen.
func noSymlinkTo(mnt string) error {
	root, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(root)
	fd, err := fsutil.OpenBeneath(root, strings.TrimPrefix(mnt, "/"), unix.O_PATH|unix.O_DIRECTORY, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil // made afresh by the mount, where the manager makes it
	}
	if err != nil {
		return fmt.Errorf("%w: mountpoint %s: a symlink on the way, or not a directory (%v); the sandbox mounts only at the directory it was made with: put that back, or destroy the sandbox", ErrInvalid, mnt, err)
	}
	unix.Close(fd)
	return nil
}

// mkdirPrivate creates d with mode 0700 whatever the umask.
func mkdirPrivate(d string) error {
	if err := os.Mkdir(d, 0o700); err != nil {
		return err
	}
	return os.Chmod(d, 0o700)
}
