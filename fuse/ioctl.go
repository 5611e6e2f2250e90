package fuse

import (
	"bytes"
	"context"
	"encoding/binary"
	"syscall"

	fusefs "github.com/hanwen/go-fuse/v2/fs"
	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/fsutil"
)

var _ = (fusefs.NodeIoctler)((*node)(nil))

// Ioctl serves the inode flag calls lsattr and chattr make. The kernel
// turns each FS_IOC_GETFLAGS, SETFLAGS, FSGETXATTR and FSSETXATTR into
// OPEN (or OPENDIR), IOCTL and RELEASE, and checks ownership and
// CAP_LINUX_IMMUTABLE itself first. Any other ioctl is not this
// filesystem's: ENOTTY, as go-fuse answers (a terminal's TCGETS, which
// isatty sends).
func (n *node) Ioctl(ctx context.Context, f fusefs.FileHandle, cmd uint32, arg uint64, input, output []byte) (int32, syscall.Errno) {
	if t := n.StableAttr().Mode & syscall.S_IFMT; t != syscall.S_IFREG && t != syscall.S_IFDIR {
		return 0, syscall.ENOTTY
	}
	switch cmd {
	case unix.FS_IOC_GETFLAGS:
		if len(output) < 4 {
			return 0, syscall.EINVAL
		}
		flags, errno := n.getFlags()
		binary.NativeEndian.PutUint32(output, flags)
		return 0, errno
	case unix.FS_IOC_SETFLAGS:
		if len(input) < 4 {
			return 0, syscall.EINVAL
		}
		return 0, n.setFlags(ctx, binary.NativeEndian.Uint32(input))
	case fsutil.IocFsGetXattr:
		if len(output) < fsutil.FsxattrSize {
			return 0, syscall.EINVAL
		}
		return 0, n.fsGetXattr(output)
	case fsutil.IocFsSetXattr:
		if len(input) < fsutil.FsxattrSize {
			return 0, syscall.EINVAL
		}
		return 0, n.fsSetXattr(ctx, input)
	}
	return 0, syscall.ENOTTY
}

// withFlagsFd is layers.WithFlagsFd for n.
func (n *node) withFlagsFd(f func(fd int) error) syscall.Errno {
	defer n.fs.names.shared()()
	rel, fd, errno := n.target()
	if errno != 0 {
		return errno
	}
	if err := n.fs.layers.WithFlagsFd(rel, n.getObj(), fd, f); err != nil {
		return n.fs.toErrno("inode flags", err)
	}
	return 0
}

func (n *node) getFlags() (flags uint32, errno syscall.Errno) {
	errno = n.withFlagsFd(func(fd int) (err error) {
		flags, err = fsutil.Flags(fd)
		return err
	})
	return flags, errno
}

func (n *node) fsGetXattr(out []byte) syscall.Errno {
	return n.withFlagsFd(func(fd int) error { return fsutil.FsGetXattr(fd, out) })
}

// setFlags changes n's inode flags (layers.SetFlags) and has the kernel
// read its attributes again (the change moved its ctime; a name of an
// original hard link, parted by the copy-up, is looked up again).
func (n *node) setFlags(ctx context.Context, flags uint32) syscall.Errno {
	defer n.fs.enter()()
	defer n.fs.names.shared()()
	rel, fd, errno := n.mutableTarget()
	if errno != 0 {
		return errno
	}
	n.mu.Lock()
	err := n.fs.layers.SetFlags(rel, &n.obj, fd, flags, caller(ctx))
	n.mu.Unlock()
	if err != nil {
		return n.fs.toErrno("set inode flags", err)
	}
	if !n.reissueHere() { // a name of an original hard link parts (Setxattr)
		_ = n.NotifyContent(-1, 0)
	}
	return 0
}

// The xflags of struct fsxattr that mirror fsutil.CarriedFlags.
var xflagOf = []struct{ x, flag uint32 }{
	{fsutil.XflagSync, fsutil.FlagSync},
	{fsutil.XflagNoAtime, fsutil.FlagNoAtime},
	{fsutil.XflagNoDump, fsutil.FlagNoDump},
}

// fsSetXattr is FS_IOC_FSSETXATTR (xfs_io's chattr): a change of the
// xflags that mirror CarriedFlags becomes setFlags; a change of any other
// field (project, extent size hints, other xflags) is refused, as
// SetFlags refuses the flags a copy does not keep.
func (n *node) fsSetXattr(ctx context.Context, in []byte) syscall.Errno {
	var cur [fsutil.FsxattrSize]byte
	var flags uint32
	errno := n.withFlagsFd(func(fd int) (err error) {
		if err = fsutil.FsGetXattr(fd, cur[:]); err == nil {
			flags, err = fsutil.Flags(fd)
		}
		return err
	})
	if errno != 0 {
		return errno
	}
	// fsx_xflags, extsize, nextents (not set), projid, cowextsize.
	if !bytes.Equal(in[4:8], cur[4:8]) || !bytes.Equal(in[12:20], cur[12:20]) {
		return syscall.EOPNOTSUPP
	}
	x, was := binary.NativeEndian.Uint32(in), binary.NativeEndian.Uint32(cur[:])
	for _, m := range xflagOf {
		if x&m.x != 0 {
			flags |= m.flag
		} else {
			flags &^= m.flag
		}
		x, was = x&^m.x, was&^m.x
	}
	if x != was {
		return syscall.EOPNOTSUPP
	}
	return n.setFlags(ctx, flags)
}
