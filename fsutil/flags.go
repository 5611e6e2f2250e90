package fsutil

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// Inode flags (chattr(1), linux/fs.h) that a copy of a file or directory
// keeps: those its owner may set at any time and that say how the object
// is to be kept rather than what it is. Directories hand them down to
// what is made in them (ext4 does for all four). Left out: immutable and
// append-only (a copy must be written, moved and replaced; they need
// CAP_LINUX_IMMUTABLE), and the flags a filesystem keeps for itself
// (extents, inline data, encryption, casefold, ...).
const (
	FlagSync    uint32 = 0x00000008 // S: synchronous updates
	FlagNoDump  uint32 = 0x00000040 // d: no dump
	FlagNoAtime uint32 = 0x00000080 // A: no atime updates
	FlagDirSync uint32 = 0x00010000 // D: synchronous directory updates

	CarriedFlags = FlagSync | FlagNoDump | FlagNoAtime | FlagDirSync
)

// Flags returns the inode flags of the file or directory open as fd
// (FS_IOC_GETFLAGS); a filesystem without them answers ENOTTY or
// EOPNOTSUPP.
func Flags(fd int) (uint32, error) {
	return unix.IoctlGetUint32(fd, unix.FS_IOC_GETFLAGS)
}

// SetFlags sets the inode flags of the object open as fd
// (FS_IOC_SETFLAGS, which takes an int).
func SetFlags(fd int, flags uint32) error {
	v := int32(flags)
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uintptr(unix.FS_IOC_SETFLAGS), uintptr(unsafe.Pointer(&v)))
	if errno != 0 {
		return errno
	}
	return nil
}

// CopyFlags gives dst the CarriedFlags src has, as kernel overlayfs's
// copy-up does for the ones it carries, so that a copy put in place of
// its original (a commit) keeps them. It is best effort, as there: a
// filesystem on either side that keeps no flags, or refuses one (tmpfs
// keeps only some), leaves dst as it is.
func CopyFlags(dst, src int) {
	f, err := Flags(src)
	if err != nil || f&CarriedFlags == 0 {
		return
	}
	d, err := Flags(dst)
	if err != nil || d|f&CarriedFlags == d {
		return
	}
	_ = SetFlags(dst, d|f&CarriedFlags)
}
