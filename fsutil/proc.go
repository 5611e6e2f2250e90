package fsutil

import (
	"errors"
	"fmt"
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

// FlockHeld reports whether some process holds a flock(2) lock on the
// file at path (/proc/locks, which lists every lock on the machine,
// whatever pid namespace its holder is in). A symlink at path is not
// followed.
func FlockHeld(path string) (bool, error) {
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		return false, err
	}
	// The kernel prints the device as "%02x:%02x" of its major and
	// minor numbers, then ":%lu" the inode.
	id := fmt.Sprintf("%02x:%02x:%d", unix.Major(st.Dev), unix.Minor(st.Dev), st.Ino)
	b, err := os.ReadFile("/proc/locks")
	if err != nil {
		return false, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 1 && f[1] == "->" {
			continue // a waiter, not a holder
		}
		if len(f) >= 6 && f[1] == "FLOCK" && f[5] == id {
			return true, nil
		}
	}
	return false, nil
}
