package fsutil

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// IsStaleMount reports whether p is a FUSE mount whose server is gone.
// statfs, not stat: the kernel answers stat from its attribute cache
// without asking the (dead) server, statfs always asks. ECONNABORTED: a
// server that took requests through io_uring is torn down after it
// exits, and a request made meanwhile ends with the abort.
func IsStaleMount(p string) bool {
	var st unix.Statfs_t
	err := unix.Statfs(p, &st)
	return errors.Is(err, unix.ENOTCONN) || errors.Is(err, unix.ECONNABORTED)
}

// MountID returns the id of the mount the open file fd is on, or 0
// where statx(2) does not give mount ids (before Linux 5.8).
func MountID(fd int) (uint64, error) {
	var st unix.Statx_t
	if err := unix.Statx(fd, "", unix.AT_EMPTY_PATH, unix.STATX_MNT_ID, &st); err != nil {
		return 0, fmt.Errorf("statx: %w", err)
	}
	if st.Mask&unix.STATX_MNT_ID == 0 {
		return 0, nil
	}
	return st.Mnt_id, nil
}

// UniqueMountID returns the identifier the kernel gives the mount the object at
// path is reached through (statx STATX_MNT_ID_UNIQUE: never used again
// on this boot, unlike STATX_MNT_ID), not following a symlink at path.
// ok is false when the kernel does not give one (before Linux 6.8).
func UniqueMountID(path string) (id uint64, ok bool) {
	var stx unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, path, unix.AT_SYMLINK_NOFOLLOW|unix.AT_STATX_DONT_SYNC, unix.STATX_MNT_ID_UNIQUE, &stx); err != nil {
		return 0, false
	}
	return stx.Mnt_id, stx.Mask&unix.STATX_MNT_ID_UNIQUE != 0
}

// SameMount reports whether the paths a and b lie on one mount, so that
// rename(2) and link(2) between them can work: the same filesystem is not
// enough, a bind mount of it is another mount (EXDEV). Where statx(2)
// does not give mount ids (before Linux 5.8), the filesystem decides.
func SameMount(a, b string) (bool, error) {
	var sa, sb unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, a, 0, unix.STATX_MNT_ID, &sa); err != nil {
		return false, fmt.Errorf("statx %s: %w", a, err)
	}
	if err := unix.Statx(unix.AT_FDCWD, b, 0, unix.STATX_MNT_ID, &sb); err != nil {
		return false, fmt.Errorf("statx %s: %w", b, err)
	}
	if sa.Dev_major != sb.Dev_major || sa.Dev_minor != sb.Dev_minor {
		return false, nil
	}
	if sa.Mask&sb.Mask&unix.STATX_MNT_ID == 0 {
		return true, nil
	}
	return sa.Mnt_id == sb.Mnt_id, nil
}
