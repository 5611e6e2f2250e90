package fsutil

import (
	"errors"
	"fmt"
	"path/filepath"
	"sync"
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

// CopyFlags gives dst the CarriedFlags src has, and takes away those it
// has and src has not (a file made in a directory inherits them), as
// kernel overlayfs's copy-up does for the ones it carries, so that a copy
// put in place of its original (a commit) keeps them. It is best effort,
// as there: a filesystem on either side that keeps no flags, or refuses
// one (tmpfs keeps only some), leaves dst as it is.
func CopyFlags(dst, src int) {
	f, err := Flags(src)
	if err != nil {
		return
	}
	d, err := Flags(dst)
	if err != nil || (d^f)&CarriedFlags == 0 {
		return
	}
	_ = SetFlags(dst, d&^CarriedFlags|f&CarriedFlags)
}

// FlagLetters names the CarriedFlags in f as lsattr(1) does ("-" for
// none).
func FlagLetters(f uint32) string {
	var b []byte
	for _, l := range []struct {
		bit    uint32
		letter byte
	}{{FlagSync, 'S'}, {FlagDirSync, 'D'}, {FlagNoDump, 'd'}, {FlagNoAtime, 'A'}} {
		if f&l.bit != 0 {
			b = append(b, l.letter)
		}
	}
	if len(b) == 0 {
		return "-"
	}
	return string(b)
}

// NoFlags reports an error that says the filesystem keeps no inode flags
// (or not the ones asked for).
func NoFlags(err error) bool {
	return errors.Is(err, unix.ENOTTY) || errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EINVAL)
}

var heldFlags sync.Map // st_dev -> uint32

// HeldFlags reports which of CarriedFlags the filesystem of the directory
// dir keeps, dir being one of ours to write in (a work directory): it
// sets each on an unnamed file made there (O_TMPFILE), D (which ext4
// keeps only on a directory) on a directory it makes and removes, and
// reads them back. The answer is kept for the filesystem; 0 where it
// keeps none, or dir cannot be written.
func HeldFlags(dir string) uint32 {
	var st unix.Stat_t
	if unix.Stat(dir, &st) != nil {
		return 0
	}
	if v, ok := heldFlags.Load(st.Dev); ok {
		return v.(uint32)
	}
	fd, err := unix.Open(dir, unix.O_TMPFILE|unix.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return 0 // not kept: a later call may find dir writable
	}
	held := probeFlags(fd, FlagSync, FlagNoDump, FlagNoAtime)
	unix.Close(fd)
	sub := filepath.Join(dir, TempName(".flags-probe-"))
	if unix.Mkdir(sub, 0o700) == nil {
		if fd, err := unix.Open(sub, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0); err == nil {
			held |= probeFlags(fd, FlagDirSync)
			unix.Close(fd)
		}
		_ = unix.Rmdir(sub)
	}
	heldFlags.Store(st.Dev, held)
	return held
}

// probeFlags sets each of bits on fd by itself and returns those that
// read back, leaving fd's flags as they were.
func probeFlags(fd int, bits ...uint32) uint32 {
	base, err := Flags(fd)
	if err != nil {
		return 0
	}
	var held uint32
	for _, bit := range bits {
		if SetFlags(fd, base|bit) != nil {
			continue
		}
		if got, err := Flags(fd); err == nil && got&bit != 0 {
			held |= bit
		}
		_ = SetFlags(fd, base)
	}
	return held
}

// FS_IOC_FSGETXATTR (linux/fs.h): _IOR('X', 31, struct fsxattr), the
// extended flags and project of an inode; x/sys has no constant for it.
// FS_IOC_FSSETXATTR is its _IOW twin.
const (
	FsxattrSize   = 28
	IocFsGetXattr = 0x80000000 | FsxattrSize<<16 | 'X'<<8 | 31
	IocFsSetXattr = 0x40000000 | FsxattrSize<<16 | 'X'<<8 | 32
)

// The struct fsxattr xflags that mirror CarriedFlags (the kernel's
// fileattr_fill_xflags); D has none.
const (
	XflagSync    uint32 = 0x00000020
	XflagNoAtime uint32 = 0x00000040
	XflagNoDump  uint32 = 0x00000080
)

// FsGetXattr reads the struct fsxattr of the object open as fd into buf
// (at least FsxattrSize bytes).
func FsGetXattr(fd int, buf []byte) error {
	if len(buf) < FsxattrSize {
		return unix.EINVAL
	}
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), IocFsGetXattr, uintptr(unsafe.Pointer(&buf[0])))
	if errno != 0 {
		return errno
	}
	return nil
}

// OpenForFlags opens path (relative to dirfd, its last component never
// followed) for the inode flag calls, which need a real descriptor: only
// a regular file or a directory (ENOTTY for anything else, which an open
// could act on: a device, a FIFO), read-only and non-blocking.
func OpenForFlags(dirfd int, path string) (int, error) {
	pfd, err := unix.Openat(dirfd, path, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	defer unix.Close(pfd)
	return ReopenForFlags(pfd)
}

// ReopenForFlags is OpenForFlags for an O_PATH descriptor.
func ReopenForFlags(pfd int) (int, error) {
	var st unix.Stat_t
	if err := unix.Fstat(pfd, &st); err != nil {
		return -1, err
	}
	if t := st.Mode & unix.S_IFMT; t != unix.S_IFREG && t != unix.S_IFDIR {
		return -1, unix.ENOTTY
	}
	return unix.Open(fmt.Sprintf("/proc/self/fd/%d", pfd), unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
}

// FlagsAt returns the CarriedFlags of path (as OpenForFlags), and false
// where it has none to give (another kind of object, a filesystem without
// flags).
func FlagsAt(dirfd int, path string) (uint32, bool) {
	fd, err := OpenForFlags(dirfd, path)
	if err != nil {
		return 0, false
	}
	defer unix.Close(fd)
	f, err := Flags(fd)
	return f & CarriedFlags, err == nil
}

// Protection is what an object's immutable and append-only flags (chattr
// +i, +a) forbid, as statx(2) reports them (STATX_ATTR_IMMUTABLE,
// STATX_ATTR_APPEND) at no cost beyond the stat.
type Protection uint8

const (
	Immutable  Protection = 1 << iota // nothing of it may change
	AppendOnly                        // a file may only grow; a directory only gain entries
)

// Lstatx is fstatat(dirfd, name, AT_SYMLINK_NOFOLLOW) through statx,
// which also gives the object's Protection; with name "", dirfd's own.
func Lstatx(dirfd int, name string, st *unix.Stat_t) (Protection, error) {
	var x unix.Statx_t
	flags := unix.AT_SYMLINK_NOFOLLOW
	if name == "" {
		flags |= unix.AT_EMPTY_PATH
	}
	for {
		err := unix.Statx(dirfd, name, flags, unix.STATX_BASIC_STATS, &x)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EINTR) {
			return 0, err
		}
	}
	*st = unix.Stat_t{
		Dev:  unix.Mkdev(x.Dev_major, x.Dev_minor),
		Ino:  x.Ino,
		Mode: uint32(x.Mode),
		Uid:  x.Uid,
		Gid:  x.Gid,
		Rdev: unix.Mkdev(x.Rdev_major, x.Rdev_minor),
		Size: int64(x.Size),
	}
	// Fields whose width differs between architectures.
	SetInt(&st.Nlink, int64(x.Nlink))
	SetInt(&st.Blksize, int64(x.Blksize))
	SetInt(&st.Blocks, int64(x.Blocks))
	for _, t := range []struct {
		to   *unix.Timespec
		from unix.StatxTimestamp
	}{{&st.Atim, x.Atime}, {&st.Mtim, x.Mtime}, {&st.Ctim, x.Ctime}} {
		SetInt(&t.to.Sec, t.from.Sec)
		SetInt(&t.to.Nsec, int64(t.from.Nsec))
	}
	var p Protection
	if x.Attributes&unix.STATX_ATTR_IMMUTABLE != 0 {
		p |= Immutable
	}
	if x.Attributes&unix.STATX_ATTR_APPEND != 0 {
		p |= AppendOnly
	}
	return p, nil
}

// SetInt sets an integer field of a system structure whose width differs
// between architectures (unix.Stat_t's Nlink, Blksize, ...).
func SetInt[T ~int32 | ~int64 | ~uint32 | ~uint64](p *T, v int64) { *p = T(v) }
