package fsutil

import (
	"errors"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// A Short is a path a system call takes for an object whose own path may
// be longer than PATH_MAX. Close it once the calls are made; the zero
// Short holds nothing.
type Short struct {
	Path string
	fd   int
	own  bool // fd is the directory Path leads through
}

// Close releases the directory the path leads through, if there is one.
func (s Short) Close() {
	if s.own {
		unix.Close(s.fd)
	}
}

// shortMax bounds the path of a Short, leaving room for "/" and a name
// (NAME_MAX) to be appended: a directory's path serves its entries too.
const shortMax = unix.PathMax - 1 - 255 - 1

// shortTail bounds what a Short leaves after "/proc/self/fd/N/".
const shortTail = shortMax - 32

// ShortPath returns a path of rel (clean, relative) beneath the directory
// root for the system calls that take paths, with room left for "/NAME"
// after it: root/rel itself when that fits in PATH_MAX, else
// /proc/self/fd/N/TAIL, where N is a descriptor of a directory on the way
// to rel, opened beneath root following no symlink (OpenBeneathRaw), and
// TAIL the rest of rel, valid until Close. It fails as a call on the whole
// path would: ENOENT or ENOTDIR when a directory on the way is missing or
// is not one (a symlink there reads as ENOTDIR). The path reaches the
// object a call on root/rel would reach without PATH_MAX; a path that fits
// costs nothing more. filepath.Dir of the path is a path of rel's
// directory (for rel not "").
func ShortPath(root, rel string) (Short, error) {
	full := root
	if rel != "" {
		full = root + "/" + rel
	}
	if len(full) <= shortMax {
		return Short{Path: full}, nil
	}
	var fd int
	var tail string
	if start := len(rel) - shortTail; start > 0 {
		i := strings.IndexByte(rel[start:], '/')
		if i < 0 {
			return Short{}, unix.ENAMETOOLONG // a name longer than any filesystem takes
		}
		var head string
		head, tail = rel[:start+i], rel[start+i+1:] // tail: many names
		top, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return Short{}, err
		}
		fd, err = OpenBeneathRaw(top, head, unix.O_PATH|unix.O_DIRECTORY)
		unix.Close(top)
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.EXDEV) {
			err = unix.ENOTDIR
		}
		if err != nil {
			return Short{}, err
		}
	} else if strings.IndexByte(rel, '/') >= 0 {
		// The root's own path is much of it: through the root.
		var err error
		if fd, err = unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err != nil {
			return Short{}, err
		}
		tail = rel
	} else {
		// One name (or none) under a long root: through the root's
		// parent, so that the path's directory is a path too.
		var err error
		if fd, err = unix.Open(filepath.Dir(root), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err != nil {
			return Short{}, err
		}
		tail = filepath.Base(root) + "/" + rel
	}
	return Short{Path: "/proc/self/fd/" + strconv.Itoa(fd) + "/" + tail, fd: fd, own: true}, nil
}

// DoShort calls f with the ShortPath of rel beneath root, valid during f.
func DoShort(root, rel string, f func(path string) error) error {
	s, err := ShortPath(root, rel)
	if err != nil {
		return err
	}
	defer s.Close()
	return f(s.Path)
}
