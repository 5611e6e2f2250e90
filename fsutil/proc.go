package fsutil

import (
	"errors"
	"sync"

	"golang.org/x/sys/unix"
)

// ErrNoProc says /proc is not a mounted procfs.
var ErrNoProc = errors.New("no /proc: sbxfs reaches the objects it opens through /proc/self/fd, never by a path an original could redirect with a symlink; mount it (mount -t proc proc /proc) and try again")

// NeedProc returns ErrNoProc unless /proc/self/fd is procfs's, whose
// entries lead to this process's open descriptors. sbxfs refuses to work
// without it rather than fall back to paths: an attribute read or copy by
// path follows a symlink swapped into a directory of the original.
func NeedProc() error { return needProc() }

var needProc = sync.OnceValue(func() error {
	var st unix.Statfs_t
	if err := unix.Statfs("/proc/self/fd", &st); err != nil || st.Type != unix.PROC_SUPER_MAGIC {
		return ErrNoProc
	}
	return nil
})
