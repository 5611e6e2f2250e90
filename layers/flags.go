package layers

import (
	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/fsutil"
)

// Inode flags (chattr): the sandbox shows those of the object's current
// copy, and changes only fsutil.CarriedFlags, which a copy keeps (copy-up
// carries them, the commit sets them on the original).

// WithFlagsFd calls f with a descriptor of the current copy of the object
// at rel on which the inode flag calls work (fsutil.OpenForFlags): fd
// itself when it is one (an object removed while open), else its upper
// copy or, while it has none, its original. ENOTTY for an object that is
// neither a regular file nor a directory.
func (l *Layers) WithFlagsFd(rel string, o Obj, fd int, f func(fd int) error) error {
	if fd >= 0 {
		return f(fd)
	}
	up, lower, err := l.real(rel, o)
	if err != nil {
		return err
	}
	if lower {
		dir, name, derr := l.lowerDir(o.Lowers[0])
		if derr != nil {
			return derr
		}
		fd, err = fsutil.OpenForFlags(dir.fd, name)
		l.releaseDir(dir)
	} else {
		fd, err = fsutil.OpenForFlags(unix.AT_FDCWD, up.Path)
		up.Close()
	}
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return f(fd)
}

// Flags returns the inode flags of the object at rel (WithFlagsFd).
func (l *Layers) Flags(rel string, o Obj, fd int) (uint32, error) {
	var flags uint32
	err := l.WithFlagsFd(rel, o, fd, func(fd int) (err error) {
		flags, err = fsutil.Flags(fd)
		return err
	})
	return flags, err
}

// SetFlags gives the object at rel the inode flags flags, copying it up
// first. A change of any but fsutil.CarriedFlags is refused with
// EOPNOTSUPP (what ext4 answers for a flag it cannot set), and so is any
// change where the upper's filesystem does not keep all of them (tmpfs):
// there a copy-up could not carry the original's flags, and the change
// set, which compares the copy's flags with the original's, would take a
// flag the copy lost for one the sandbox took away.
func (l *Layers) SetFlags(rel string, o *Obj, fd int, flags uint32, c Caller) error {
	cur, err := l.Flags(rel, *o, fd)
	if err != nil {
		return err
	}
	change := cur ^ flags
	if change == 0 {
		return nil
	}
	if err := o.mayChange(); err != nil {
		return err
	}
	if change&^fsutil.CarriedFlags != 0 || !l.keepsFlags() {
		return unix.EOPNOTSUPP
	}
	if err := l.record(OpSetattr, rel, "", AttrFlags, c); err != nil {
		return err
	}
	if fd < 0 {
		if err := l.copyUpForMeta(rel, o); err != nil {
			return err
		}
	}
	return l.WithFlagsFd(rel, *o, fd, func(fd int) error {
		u, err := fsutil.Flags(fd)
		if err != nil {
			return err
		}
		return fsutil.SetFlags(fd, u&^fsutil.CarriedFlags|flags&fsutil.CarriedFlags)
	})
}

// keepsFlags reports whether the upper's filesystem keeps every one of
// fsutil.CarriedFlags (probed once a filesystem).
func (l *Layers) keepsFlags() bool {
	return fsutil.HeldFlags(l.work) == fsutil.CarriedFlags
}

// sameFlags reports whether the upper object up and the original's at
// lpath (both a regular file or both a directory) have the same
// fsutil.CarriedFlags. Where the upper cannot keep them all, the sandbox
// cannot have changed them (SetFlags), and a difference is one its
// filesystem lost at copy-up: the same, then.
func (l *Layers) sameFlags(up, lpath string) bool {
	if !l.keepsFlags() {
		return true
	}
	u, uok := fsutil.FlagsAt(unix.AT_FDCWD, up)
	o, ook := fsutil.FlagsAt(unix.AT_FDCWD, lpath)
	return u == o || !uok || !ook
}
