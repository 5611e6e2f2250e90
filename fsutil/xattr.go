package fsutil

import (
	"errors"
	"fmt"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

const (
	// xattrFirstBuf is the first buffer tried; most names lists and values
	// fit, so the common case is one syscall.
	xattrFirstBuf = 1024
	// xattrMaxBuf bounds the growth loop. The kernel's limits are 64 KiB
	// (XATTR_SIZE_MAX, XATTR_LIST_MAX); a little slack for the future.
	xattrMaxBuf = 16 << 20
)

// ListXattrs returns the names of the extended attributes of fd.
func ListXattrs(fd int) ([]string, error) {
	names, err := readNames(func(b []byte) (int, error) { return unix.Flistxattr(fd, b) })
	if err != nil {
		return nil, fmt.Errorf("list xattrs of fd %d: %w", fd, err)
	}
	return names, nil
}

// GetXattr returns the value of the extended attribute name of fd.
// A missing attribute gives an error matching unix.ENODATA.
func GetXattr(fd int, name string) ([]byte, error) {
	v, err := readValue(func(b []byte) (int, error) { return unix.Fgetxattr(fd, name, b) })
	if err != nil {
		return nil, fmt.Errorf("get xattr %q of fd %d: %w", name, fd, err)
	}
	return v, nil
}

// LListXattrs is ListXattrs on a path; a symlink is not followed.
func LListXattrs(path string) ([]string, error) {
	names, err := readNames(func(b []byte) (int, error) { return unix.Llistxattr(path, b) })
	if err != nil {
		return nil, fmt.Errorf("list xattrs of %q: %w", path, err)
	}
	return names, nil
}

// LGetXattr is GetXattr on a path; a symlink is not followed.
func LGetXattr(path, name string) ([]byte, error) {
	v, err := readValue(func(b []byte) (int, error) { return unix.Lgetxattr(path, name, b) })
	if err != nil {
		return nil, fmt.Errorf("get xattr %q of %q: %w", name, path, err)
	}
	return v, nil
}

// CopyXattrs copies every extended attribute of src to dst, except the names
// for which skip (when not nil) returns true. Setting a trusted.* or
// security.* attribute may fail with EPERM or EOPNOTSUPP when unprivileged or
// on a filesystem without that namespace; such names are skipped silently.
// Any other error is returned. A source filesystem without xattr support has
// nothing to copy.
func CopyXattrs(dst, src int, skip func(name string) bool) error {
	names, err := ListXattrs(src)
	if errors.Is(err, unix.EOPNOTSUPP) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("copy xattrs: %w", err)
	}
	for _, name := range names {
		if skip != nil && skip(name) {
			continue
		}
		val, err := GetXattr(src, name)
		if errors.Is(err, unix.ENODATA) {
			continue // removed since the list
		}
		if err != nil {
			return fmt.Errorf("copy xattrs: %w", err)
		}
		err = unix.Fsetxattr(dst, name, val, 0)
		if err != nil && !ignorableSetErr(name, err) {
			return fmt.Errorf("copy xattrs: set %q: %w", name, err)
		}
	}
	return nil
}

// ignorableSetErr reports whether failing to set name with err is expected
// for an unprivileged process or a filesystem without that namespace.
func ignorableSetErr(name string, err error) bool {
	privileged := strings.HasPrefix(name, "trusted.") || strings.HasPrefix(name, "security.")
	return privileged && (errors.Is(err, unix.EPERM) || errors.Is(err, unix.EOPNOTSUPP))
}

// xattrBufs holds the first buffers readGrowing tries. A change set or
// a commit lists the attributes of every path it looks at, most of which
// have none: a buffer made for each call was most of what they allocated.
var xattrBufs = sync.Pool{New: func() any { b := make([]byte, xattrFirstBuf); return &b }}

// readNames reads a list of attribute names with get (readGrowing).
func readNames(get func([]byte) (int, error)) ([]string, error) {
	var names []string
	err := readGrowing(get, func(b []byte) { names = splitNames(b) })
	return names, err
}

// readValue reads an attribute's value with get (readGrowing).
func readValue(get func([]byte) (int, error)) ([]byte, error) {
	var v []byte
	err := readGrowing(get, func(b []byte) { v = append([]byte{}, b...) })
	return v, err
}

// readGrowing calls get with a buffer until it fits, and then use with
// what get read (valid only during the call): on ERANGE it asks the size
// (get with an empty buffer) and retries with a larger buffer, since the
// value may change between the two calls.
func readGrowing(get func([]byte) (int, error), use func([]byte)) error {
	first := xattrBufs.Get().(*[]byte)
	defer xattrBufs.Put(first)
	buf := *first
	for {
		n, err := get(buf)
		if err == nil {
			use(buf[:n])
			return nil
		}
		if !errors.Is(err, unix.ERANGE) {
			return err
		}
		size, err := get(nil)
		if err != nil {
			return err
		}
		size = max(size, 2*len(buf))
		if size > xattrMaxBuf {
			return unix.ERANGE
		}
		buf = make([]byte, size)
	}
}

// splitNames splits a NUL-terminated list of names.
func splitNames(buf []byte) []string {
	if len(buf) == 0 {
		return nil // most objects have no attribute
	}
	var names []string
	for _, n := range strings.Split(string(buf), "\x00") {
		if n != "" {
			names = append(names, n)
		}
	}
	return names
}
