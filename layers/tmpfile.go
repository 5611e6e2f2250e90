package layers

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/fsutil"
)

// Tmpfile makes an unnamed regular file (open(O_TMPFILE)) on the upper's
// filesystem for the directory dirRel, owned by the caller, with the
// permissions a file made there gets, and returns its descriptor and
// entry. It gets a name, and a journal record, only if it is linked in
// (LinkFd).
func (l *Layers) Tmpfile(dirRel string, dir Obj, mode uint32, c Caller) (int, Entry, error) {
	if err := dir.mayAdd(); err != nil {
		return -1, Entry{}, err
	}
	var pst unix.Stat_t
	var p perms
	err := l.realDo(dirRel, dir, func(dirPath string) (err error) {
		if err = unix.Lstat(dirPath, &pst); err != nil {
			return err
		}
		p, err = newPerms(dirPath, mode|unix.S_IFREG, c)
		return err
	})
	if err != nil {
		return -1, Entry{}, err
	}
	fd, err := unix.Open(l.work, unix.O_TMPFILE|unix.O_RDWR|unix.O_CLOEXEC, p.mode)
	if err != nil {
		return -1, Entry{}, err
	}
	e, err := l.settleFd(fd, &pst, &p, c)
	if err != nil {
		unix.Close(fd)
		return -1, Entry{}, err
	}
	return fd, e, nil
}

// settleFd is settle for an unnamed file: pst is its directory (a
// setgid directory hands its group down).
func (l *Layers) settleFd(fd int, pst *unix.Stat_t, p *perms, c Caller) (Entry, error) {
	if l.root {
		gid := int(c.Gid)
		if pst.Mode&unix.S_ISGID != 0 {
			gid = int(pst.Gid)
		}
		if err := unix.Fchown(fd, int(c.Uid), gid); err != nil {
			return Entry{}, err
		}
	}
	if err := p.setACLsFd(fd); err != nil {
		return Entry{}, err
	}
	if err := unix.Fchmod(fd, p.mode); err != nil {
		return Entry{}, err
	}
	e := Entry{Obj: Obj{Upper: true}}
	if err := unix.Fstat(fd, &e.Stat); err != nil {
		return Entry{}, err
	}
	e.Stat.Ino = l.stableIno(e.Stat.Dev, e.Stat.Ino)
	return e, nil
}

// LinkFd gives the open upper file fd (a tmpfile, or a file unlinked while
// open) the name name in dirRel. For the change set it is a new file.
func (l *Layers) LinkFd(fd int, dirRel string, dir Obj, name string, c Caller) (Entry, error) {
	rel := Join(dirRel, name)
	if err := dir.mayAdd(); err != nil {
		return Entry{}, err
	}
	if err := l.record(OpCreate, rel, "", 0, c); err != nil {
		return Entry{}, err
	}
	if err := l.ensureParents(rel); err != nil {
		return Entry{}, err
	}
	src := fmt.Sprintf("/proc/self/fd/%d", fd)
	if err := l.place(rel, false, func(p string) error {
		return unix.Linkat(unix.AT_FDCWD, src, unix.AT_FDCWD, p, unix.AT_SYMLINK_FOLLOW)
	}); err != nil {
		return Entry{}, err
	}
	e := Entry{Obj: Obj{Upper: true}}
	return e, l.upperEntry(rel, &e)
}

// CopyOrphan copies an original file that was deleted in the sandbox while
// open (only its read-only descriptor lower is left) into an unnamed upper
// file, so it can take metadata changes as on ext4. The original is never
// written.
func (l *Layers) CopyOrphan(lower int) (int, error) {
	var st unix.Stat_t
	if err := unix.Fstat(lower, &st); err != nil {
		return -1, err
	}
	fd, err := unix.Open(l.work, unix.O_TMPFILE|unix.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return -1, err
	}
	err = fsutil.CopyData(fd, lower)
	if err == nil {
		err = fsutil.CopyXattrs(fd, lower, l.Private)
	}
	if err == nil && l.root {
		err = unix.Fchown(fd, int(st.Uid), int(st.Gid))
	}
	if err == nil {
		err = unix.Fchmod(fd, st.Mode&0o7777)
	}
	if err == nil {
		ts := []unix.Timespec{st.Atim, st.Mtim}
		err = unix.UtimesNanoAt(unix.AT_FDCWD, fmt.Sprintf("/proc/self/fd/%d", fd), ts, 0)
	}
	if err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}
