package layers

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// SetAttr is a change of attributes; nil fields stay as they are. A time
// with Nsec == unix.UTIME_NOW means "now".
type SetAttr struct {
	Mode  *uint32
	Uid   *uint32
	Gid   *uint32
	Size  *uint64
	Atime *unix.Timespec
	Mtime *unix.Timespec
}

// Journal flag bits of an OpSetattr record.
const (
	AttrMode  = 1 << iota // permission bits
	AttrOwner             // uid or gid
	AttrSize              // truncate
	AttrTimes             // atime or mtime
	AttrFlags             // inode flags (chattr; SetFlags)
)

func (a *SetAttr) mask() uint32 {
	var m uint32
	if a.Mode != nil {
		m |= AttrMode
	}
	if a.Uid != nil || a.Gid != nil {
		m |= AttrOwner
	}
	if a.Size != nil {
		m |= AttrSize
	}
	if a.Atime != nil || a.Mtime != nil {
		m |= AttrTimes
	}
	return m
}

// Setattr changes attributes of the object at rel, copying it up first.
// When fd is an open upper descriptor of the object (fd >= 0), the change
// goes through it, which also reaches a file that was unlinked while open.
func (l *Layers) Setattr(rel string, o *Obj, fd int, a SetAttr, c Caller) (unix.Stat_t, error) {
	var st unix.Stat_t
	m := a.mask()
	if m == 0 {
		return l.statFd(rel, *o, fd)
	}
	if err := o.mayChange(); err != nil {
		return st, err
	}
	if a.Size != nil {
		if err := o.mayWrite(); err != nil {
			return st, err
		}
	}
	op := OpSetattr
	if a.Size != nil {
		op = OpTruncate
	}
	if err := l.record(op, rel, "", m, c); err != nil {
		return st, err
	}
	if fd < 0 {
		var err error
		if a.Size != nil {
			err = l.copyUp(rel, o, *a.Size > 0)
		} else {
			err = l.copyUpForMeta(rel, o)
		}
		if err != nil {
			return st, err
		}
	}
	var err error
	if fd >= 0 {
		err = applyAttr(fmt.Sprintf("/proc/self/fd/%d", fd), fd, a)
	} else {
		err = l.UpperDo(rel, func(p string) error { return applyAttr(p, fd, a) })
	}
	if err != nil {
		return st, err
	}
	return l.statFd(rel, *o, fd)
}

func (l *Layers) statFd(rel string, o Obj, fd int) (unix.Stat_t, error) {
	if fd >= 0 {
		var st unix.Stat_t
		err := unix.Fstat(fd, &st)
		return st, err
	}
	return l.Stat(rel, o)
}

// applyAttr applies a in the order that keeps every requested value: owner
// first (a chown may clear set-id bits), then mode, size and times.
func applyAttr(path string, fd int, a SetAttr) error {
	if a.Uid != nil || a.Gid != nil {
		uid, gid := -1, -1
		if a.Uid != nil {
			uid = int(*a.Uid)
		}
		if a.Gid != nil {
			gid = int(*a.Gid)
		}
		var err error
		if fd >= 0 {
			err = unix.Fchown(fd, uid, gid)
		} else {
			err = unix.Lchown(path, uid, gid)
		}
		if err != nil {
			return err
		}
	}
	if a.Mode != nil {
		var err error
		if fd >= 0 {
			err = unix.Fchmod(fd, *a.Mode&0o7777)
		} else {
			err = unix.Fchmodat(unix.AT_FDCWD, path, *a.Mode&0o7777, 0)
		}
		if err != nil {
			return err
		}
	}
	if a.Size != nil {
		var err error
		if fd >= 0 {
			err = unix.Ftruncate(fd, int64(*a.Size))
		} else {
			err = unix.Truncate(path, int64(*a.Size))
		}
		if err != nil {
			return err
		}
	}
	if a.Atime != nil || a.Mtime != nil {
		ts := []unix.Timespec{{Nsec: unix.UTIME_OMIT}, {Nsec: unix.UTIME_OMIT}}
		if a.Atime != nil {
			ts[0] = *a.Atime
		}
		if a.Mtime != nil {
			ts[1] = *a.Mtime
		}
		flags := unix.AT_SYMLINK_NOFOLLOW
		if fd >= 0 {
			flags = 0 // the /proc magic link must be followed
		}
		if err := unix.UtimesNanoAt(unix.AT_FDCWD, path, ts, flags); err != nil {
			return err
		}
	}
	return nil
}
