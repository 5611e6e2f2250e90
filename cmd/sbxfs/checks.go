package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/fsutil"
)

// resolveDir returns the absolute path of the existing directory p with
// every symlink resolved. role names p in messages ("original"); missing
// says what to do when p does not exist.
func resolveDir(role, p, missing string) (string, error) {
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", failf(exitBadPath, "%s %q: %v; give an absolute path", role, p, err)
	}
	st, err := os.Stat(abs)
	switch {
	case errors.Is(err, unix.ENOTCONN), errors.Is(err, unix.ECONNABORTED): // ECONNABORTED: manager/mounts.go isStale
		return "", failf(exitBusy, "%s %q is a mount whose server is gone; run 'sbxfs unmount %s' first", role, abs, abs)
	case errors.Is(err, os.ErrNotExist):
		return "", failf(exitBadPath, "%s %q does not exist; %s", role, p, missing)
	case err != nil:
		return "", failf(exitBadPath, "%s %q: %v; check the path and its permissions", role, p, err)
	case !st.IsDir():
		return "", failf(exitBadPath, "%s %q is not a directory; give a directory", role, p)
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return "", failf(exitBadPath, "%s %q: %v; check the path and its permissions", role, p, err)
	}
	return real, nil
}

// resolvePath returns the absolute form of p, which need not exist, with
// the symlinks of its longest existing prefix resolved.
func resolvePath(p string) (string, error) {
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", err
	}
	var rest []string
	for dir := abs; ; {
		real, err := filepath.EvalSymlinks(dir)
		if err == nil {
			return filepath.Join(append([]string{real}, rest...)...), nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return abs, nil
		}
		rest = append([]string{filepath.Base(dir)}, rest...)
		dir = parent
	}
}

// resolveMountpoint returns the absolute path of a mountpoint that may be a
// stale FUSE mount (stat fails with ENOTCONN): when the path itself cannot
// be resolved, only its parent is.
func resolveMountpoint(p string) (string, error) {
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", err
	}
	if real, err := filepath.EvalSymlinks(abs); err == nil {
		return real, nil
	}
	parent, err := filepath.EvalSymlinks(filepath.Dir(abs))
	if err != nil {
		return abs, nil
	}
	return filepath.Join(parent, filepath.Base(abs)), nil
}

// within reports whether p is dir or lies beneath it. Both are clean and
// absolute.
func within(p, dir string) bool {
	if p == dir || dir == "/" {
		return true
	}
	return strings.HasPrefix(p, dir+"/")
}

// checkEmptyDir refuses a mountpoint that holds entries: they would be
// hidden by the mount.
func checkEmptyDir(mnt string) error {
	f, err := os.Open(mnt)
	if err != nil {
		return failf(exitBadPath, "mountpoint %q: %v; check its permissions", mnt, err)
	}
	defer f.Close()
	if _, err := f.Readdirnames(1); err != io.EOF {
		if err != nil {
			return failf(exitBadPath, "mountpoint %q: %v; check its permissions", mnt, err)
		}
		return failf(exitBadPath, "mountpoint %q is not empty; give an empty directory", mnt)
	}
	return nil
}

// rolePath is a resolved directory with the name messages use for it.
type rolePath struct {
	role, path string
}

// layout is every directory one mount involves, all resolved.
type layout struct {
	mountpoint string
	lowers     []string // lowers[0] is the original
	upper      string
	work       string
}

func (l *layout) paths() []rolePath {
	out := []rolePath{{"mountpoint", l.mountpoint}}
	for i, d := range l.lowers {
		role := "original"
		if i > 0 {
			role = fmt.Sprintf("lower layer %d", i+1)
		}
		out = append(out, rolePath{role, d})
	}
	return append(out, rolePath{"upper directory", l.upper}, rolePath{"work directory", l.work})
}

// check refuses directories nested in one another: a mountpoint inside a
// layer (the server would read its own mount), a layer inside the
// mountpoint (hidden by the mount), the upper or work directory inside a
// lower layer, upper and work directories inside one another.
func (l *layout) check() error {
	ps := l.paths()
	for i, a := range ps {
		for j, b := range ps {
			if i == j || (isLower(a.role) && isLower(b.role)) {
				continue
			}
			if a.path == b.path {
				return failf(exitBadPath, "%s %q is also the %s; give distinct directories", a.role, a.path, b.role)
			}
			if within(a.path, b.path) {
				return failf(exitBadPath, "%s %q is inside the %s %q; pick one outside the %s", a.role, a.path, b.role, b.path, b.role)
			}
		}
	}
	return nil
}

func isLower(role string) bool {
	return role == "original" || strings.HasPrefix(role, "lower layer")
}

// detachStale detaches the mounts of the sandbox whose work directory is
// work that no server serves any more (it was killed), saying so on w:
// mounting the sandbox again replaces them, as the daemon does. It
// returns the mount table as it is afterwards.
func detachStale(mounts []fsutil.MountEntry, work string, w io.Writer) ([]fsutil.MountEntry, error) {
	detached := false
	for _, e := range mounts {
		if isSbxfs(&e) && e.Source == work && fsutil.IsStaleMount(e.Mountpoint) {
			if err := lazyDetach(e.Mountpoint); err != nil {
				return nil, failf(exitBusy, "%s is a mount of this sandbox whose server is gone, and detaching it failed: %v; run 'sbxfs unmount %s'", e.Mountpoint, err, e.Mountpoint)
			}
			fmt.Fprintf(w, "sbxfs: detached %s, a mount of this sandbox whose server was gone\n", e.Mountpoint)
			detached = true
		}
	}
	if !detached {
		return mounts, nil
	}
	return fsutil.ReadMountinfo()
}

// checkMountpointFree refuses a mountpoint that already is one.
func checkMountpointFree(mounts []fsutil.MountEntry, mnt string) error {
	e := fsutil.MountAt(mounts, mnt)
	if e == nil {
		return nil
	}
	if isSbxfs(e) {
		return failf(exitBusy, "%q is already an sbxfs mount (work directory %s); run 'sbxfs unmount %s' first or choose another mountpoint", mnt, e.Source, mnt)
	}
	return failf(exitBusy, "%q is already a mount point (%s from %s); unmount it first or choose another mountpoint", mnt, e.FSType, e.Source)
}

// checkSandboxFree refuses a work directory that a mount already uses.
func checkSandboxFree(mounts []fsutil.MountEntry, work string) error {
	if e := sbxfsMountOf(mounts, work); e != nil {
		return failf(exitBusy, "sandbox %s is already mounted at %s; use that mount, or run 'sbxfs unmount %s' first", filepath.Dir(work), e.Mountpoint, e.Mountpoint)
	}
	return nil
}

// checkMountpoint resolves mnt and refuses it when it is missing, not a
// directory, already a mount point or not empty.
func checkMountpoint(mounts []fsutil.MountEntry, mnt string) (string, error) {
	if real, err := resolveMountpoint(mnt); err == nil {
		if err := checkMountpointFree(mounts, real); err != nil {
			return "", err
		}
	}
	real, err := resolveDir("mountpoint", mnt, fmt.Sprintf("create it with 'mkdir -p %s'", mnt))
	if err != nil {
		return "", err
	}
	if err := checkMountpointFree(mounts, real); err != nil {
		return "", err
	}
	return real, checkEmptyDir(real)
}
