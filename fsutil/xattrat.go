package fsutil

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// The *xattrat system calls (Linux 6.13) read the attributes of a name in
// a directory descriptor without following it: one call where a path
// through /proc/self/fd/DIR/NAME costs a walk of /proc as well. Before
// 6.13 they give ENOSYS.

// xattrArgs is struct xattr_args of getxattrat(2).
type xattrArgs struct {
	value uint64
	size  uint32
	flags uint32
}

// GetxattrAt reads the attribute attr of name in the directory dir, not
// following name, into dest (empty: only the size), as lgetxattr(2).
func GetxattrAt(dir int, name, attr string, dest []byte) (int, error) {
	p, err := unix.BytePtrFromString(name)
	if err != nil {
		return 0, err
	}
	a, err := unix.BytePtrFromString(attr)
	if err != nil {
		return 0, err
	}
	args := xattrArgs{size: uint32(len(dest))}
	if len(dest) > 0 {
		args.value = uint64(uintptr(unsafe.Pointer(&dest[0])))
	}
	r, _, e := unix.Syscall6(unix.SYS_GETXATTRAT, uintptr(dir), uintptr(unsafe.Pointer(p)), uintptr(unix.AT_SYMLINK_NOFOLLOW),
		uintptr(unsafe.Pointer(a)), uintptr(unsafe.Pointer(&args)), unsafe.Sizeof(args))
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}

// ListxattrAt lists the attribute names of name in the directory dir, not
// following name, into dest (empty: only the size), as llistxattr(2).
func ListxattrAt(dir int, name string, dest []byte) (int, error) {
	p, err := unix.BytePtrFromString(name)
	if err != nil {
		return 0, err
	}
	var d unsafe.Pointer
	if len(dest) > 0 {
		d = unsafe.Pointer(&dest[0])
	}
	r, _, e := unix.Syscall6(unix.SYS_LISTXATTRAT, uintptr(dir), uintptr(unsafe.Pointer(p)), uintptr(unix.AT_SYMLINK_NOFOLLOW),
		uintptr(d), uintptr(len(dest)), 0)
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}

// LListXattrsAt is LListXattrs of name in the directory dir (ListxattrAt).
func LListXattrsAt(dir int, name string) ([]string, error) {
	return readNames(func(b []byte) (int, error) { return ListxattrAt(dir, name, b) })
}
