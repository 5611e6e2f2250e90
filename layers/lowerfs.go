package layers

import (
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/fsutil"
)

// The original belongs to other processes, which may change it while
// sbxfs reads it. sbxfs holds lower objects by path (kernel overlayfs
// holds dentries): a directory of the original swapped for a symlink
// after sbxfs looked it up would lead a read by path out of the
// original, to whatever the serving process may read (a server run as
// root would show root's files through the mount). So every access to a
// lower object resolves the path of its directory beneath its layer's
// root, following no symlink on the way (openat2 with RESOLVE_BENEATH
// and RESOLVE_NO_SYMLINKS, fsutil.OpenBeneathRaw), and acts on the object
// by name in that directory without following it. A symlink on the way
// reads as ENOTDIR: the path leads to no object of the original
// (TestLowerReadsFollowNoSymlinkSwappedIn).

// lowerRoot returns the directory of layer i, opened once (O_PATH). The
// caller holds rootsMu for reading while it uses it: Close must not let
// its number go to another file meanwhile.
func (l *Layers) lowerRoot(i int) (int, error) {
	l.rootsOnce.Do(func() {
		l.rootFds = make([]int, len(l.lowers))
		for j, d := range l.lowers {
			fd, err := unix.Open(d, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
			if err != nil {
				l.rootsErr = fmt.Errorf("lower %q: %w", d, err)
				for _, f := range l.rootFds[:j] {
					unix.Close(f)
				}
				l.rootFds = nil
				return
			}
			l.rootFds[j] = fd
		}
	})
	if l.rootsErr != nil {
		return -1, l.rootsErr
	}
	return l.rootFds[i], nil
}

// closeLowerRoots closes the layers' directories, if opened.
func (l *Layers) closeLowerRoots() {
	l.rootsOnce.Do(func() {}) // none opened from now on
	if l.held != nil {
		l.held.drop(true)
	}
	l.rootsMu.Lock()
	defer l.rootsMu.Unlock()
	for _, fd := range l.rootFds {
		unix.Close(fd)
	}
	l.rootFds, l.rootsErr = nil, errClosed
}

var errClosed = errors.New("layers: closed")

// lowerDir opens (O_PATH) the directory that holds the lower object o,
// beneath o's layer, or lends one held (lowerdirs.go), and returns it
// with o's name in it ("." for the layer's root). The caller releases
// dir (releaseDir).
func (l *Layers) lowerDir(o Origin) (dir dirRef, name string, err error) {
	parent, name := "", "."
	if p := o.layerPath(); p != "" {
		parent, name = Split(p)
	}
	if parent == "" {
		parent = "."
	}
	k := heldDirKey{o.Layer, parent}
	if l.held != nil {
		if h := l.held.get(k); h != nil {
			return dirRef{fd: h.fd, h: h}, name, nil
		}
	}
	l.rootsMu.RLock()
	defer l.rootsMu.RUnlock()
	root, err := l.lowerRoot(o.Layer)
	if err != nil {
		return dirRef{fd: -1}, "", err
	}
	fd, err := fsutil.OpenBeneathRaw(root, parent, unix.O_PATH|unix.O_DIRECTORY)
	if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.EXDEV) {
		err = unix.ENOTDIR // a symlink on the way: no object of the original there
	}
	if err != nil {
		return dirRef{fd: -1}, "", err
	}
	if l.held != nil {
		if h := l.held.put(k, fd); h != nil {
			return dirRef{fd: fd, h: h}, name, nil
		}
	}
	return dirRef{fd: fd}, name, nil
}

// releaseDir gives back a directory lowerDir lent.
func (l *Layers) releaseDir(d dirRef) {
	if d.h != nil {
		l.held.release(d.h)
	} else {
		unix.Close(d.fd)
	}
}

// lowerLstat is lstat of the lower object o.
func (l *Layers) lowerLstat(o Origin, st *unix.Stat_t) error {
	dir, name, err := l.lowerDir(o)
	if err != nil {
		return err
	}
	err = unix.Fstatat(dir.fd, name, st, unix.AT_SYMLINK_NOFOLLOW)
	l.releaseDir(dir)
	return err
}

// lowerLstatx is lowerLstat that also gives o's protection.
func (l *Layers) lowerLstatx(o Origin, st *unix.Stat_t) (fsutil.Protection, error) {
	dir, name, err := l.lowerDir(o)
	if err != nil {
		return 0, err
	}
	prot, err := fsutil.Lstatx(dir.fd, name, st)
	l.releaseDir(dir)
	return prot, err
}

// lowerOpen opens the lower object o (flags gain O_NOFOLLOW|O_CLOEXEC).
func (l *Layers) lowerOpen(o Origin, flags int) (int, error) {
	dir, name, err := l.lowerDir(o)
	if err != nil {
		return -1, err
	}
	defer l.releaseDir(dir)
	for {
		fd, err := unix.Openat(dir.fd, name, flags|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if !errors.Is(err, unix.EINTR) {
			return fd, err
		}
	}
}

// OpenLowerChild opens name in the lower directory dir, as lowerOpen.
func (l *Layers) OpenLowerChild(dir Origin, name string, flags int) (int, error) {
	return l.lowerOpen(dir.child(name), flags)
}

// lowerReadlink reads the lower symlink o.
func (l *Layers) lowerReadlink(o Origin) (string, error) {
	dir, name, err := l.lowerDir(o)
	if err != nil {
		return "", err
	}
	defer l.releaseDir(dir)
	buf := make([]byte, unix.PathMax)
	n, err := unix.Readlinkat(dir.fd, name, buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}

// lowerGetxattr reads the attribute attr of the lower object o (as
// lgetxattr): getxattrat(2) in its directory, or before Linux 6.13 the
// path lowerDo gives.
func (l *Layers) lowerGetxattr(o Origin, attr string, dest []byte) (int, error) {
	if !noXattrAt.Load() {
		dir, name, err := l.lowerDir(o)
		if err != nil {
			return 0, err
		}
		n, err := fsutil.GetxattrAt(dir.fd, name, attr, dest)
		l.releaseDir(dir)
		if !errors.Is(err, unix.ENOSYS) {
			return n, err
		}
		noXattrAt.Store(true)
	}
	var n int
	err := l.lowerDo(o, func(p string) (err error) {
		n, err = unix.Lgetxattr(p, attr, dest)
		return err
	})
	return n, err
}

// lowerListxattrs lists the attribute names of the lower object o (as
// lowerGetxattr).
func (l *Layers) lowerListxattrs(o Origin) ([]string, error) {
	if !noXattrAt.Load() {
		dir, name, err := l.lowerDir(o)
		if err != nil {
			return nil, err
		}
		names, err := fsutil.LListXattrsAt(dir.fd, name)
		l.releaseDir(dir)
		if !errors.Is(err, unix.ENOSYS) {
			return names, err
		}
		noXattrAt.Store(true)
	}
	var names []string
	err := l.lowerDo(o, func(p string) (err error) {
		names, err = fsutil.LListXattrs(p)
		return err
	})
	return names, err
}

// noXattrAt is set once getxattrat(2) gave ENOSYS (Linux before 6.13).
var noXattrAt atomic.Bool

// lowerDo calls f with a path of the lower object o that leads through
// no symlink of the original: /proc/self/fd/DIR/NAME, DIR its directory
// opened beneath its layer, valid during f. For the calls with no *at
// form (the l*xattr family) and code that takes paths; f must not follow
// the last component.
func (l *Layers) lowerDo(o Origin, f func(path string) error) error {
	dir, name, err := l.lowerDir(o)
	if err != nil {
		return err
	}
	defer l.releaseDir(dir)
	return f("/proc/self/fd/" + strconv.Itoa(dir.fd) + "/" + name)
}
