package fsutil

import (
	"errors"
	"io"
	"os"
	"strconv"
	"strings"
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

// BootID is the kernel's random identifier of this boot
// (/proc/sys/kernel/random/boot_id), "" when it cannot be read.
func BootID() string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// ProcessStart returns when process pid started (field 22 of
// /proc/PID/stat, clock ticks after boot): with the boot, it names one
// process for good, where a pid is used again. ok is false when no such
// process runs (a zombie neither).
func ProcessStart(pid int) (start uint64, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	// pid (comm) state ...: comm may hold spaces and parentheses.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(s[i+1:])
	// f[0] is the state (field 3), so field 22 is f[19].
	if len(f) < 20 || f[0] == "Z" || f[0] == "X" {
		return 0, false
	}
	start, err = strconv.ParseUint(f[19], 10, 64)
	return start, err == nil
}

// HoldLock places a write lock on the whole file open at fd, held by
// its open file description (F_OFD_SETLK) until the description's last
// descriptor is closed, and seen by LockedElsewhere from any process in
// any pid namespace. Unlike flock(2), which the kernel shows only in
// /proc/locks (and there hides a holder whose pid the reader's
// namespace does not see), it can be asked about without placing it.
func HoldLock(fd int) error {
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: io.SeekStart}
	return unix.FcntlFlock(uintptr(fd), unix.F_OFD_SETLK, &lk)
}

// LockedElsewhere reports whether some open file description holds a
// lock on the file at path that a write lock of the whole file would
// conflict with (HoldLock's), without placing one (F_OFD_GETLK). A
// symlink at path is not followed.
func LockedElsewhere(path string) (bool, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: io.SeekStart}
	if err := unix.FcntlFlock(uintptr(fd), unix.F_OFD_GETLK, &lk); err != nil {
		return false, &os.PathError{Op: "F_OFD_GETLK", Path: path, Err: err}
	}
	return lk.Type != unix.F_UNLCK, nil
}
