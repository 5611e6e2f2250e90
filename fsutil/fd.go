package fsutil

import "golang.org/x/sys/unix"

// Dup duplicates fd with close-on-exec set (F_DUPFD_CLOEXEC), as every
// descriptor Go opens has it: dup(2)'s copy has not, and a process the
// server starts meanwhile (fusermount3, git) would inherit it, with the
// locks of the journal it may be.
func Dup(fd int) (int, error) {
	return unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
}
