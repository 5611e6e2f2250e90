package commit

import (
	"bytes"
	"errors"
	"fmt"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/fsutil"
)

// procPath names an O_PATH descriptor's object for the calls that take a
// path: it reaches exactly that inode, never a symlink's target.
func procPath(fd int) string { return fmt.Sprintf("/proc/self/fd/%d", fd) }

// metaOf reads the metadata of the object open as fd (O_PATH), without
// the attributes layout says are the upper layout's.
func metaOf(fd int, layout func(name string) bool) (*meta, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, err
	}
	m := &meta{Mode: st.Mode, Uid: st.Uid, Gid: st.Gid,
		Atime: unix.TimespecToNsec(st.Atim), Mtime: unix.TimespecToNsec(st.Mtim)}
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		return m, nil // no attributes we could carry on a symlink
	}
	if f, ok := metaFlags(fd); ok {
		m.Flags = &f
	}
	// The /proc path is a magic link: the following calls reach the
	// object (the l* ones would read the link itself).
	names, err := listXattrs(procPath(fd))
	if err != nil && !errors.Is(err, unix.ENOTSUP) {
		return nil, err
	}
	for _, n := range names {
		if layout(n) {
			continue
		}
		v, err := getXattr(procPath(fd), n)
		if err != nil {
			continue
		}
		if m.Xattrs == nil {
			m.Xattrs = map[string][]byte{}
		}
		m.Xattrs[n] = v
	}
	return m, nil
}

// metaAt reads the metadata of rel in t.
func (t *tree) metaAt(rel string) (*meta, error) {
	fd, err := t.openObj(rel)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	return metaOf(fd, t.isLayout)
}

// errNotTheObject: the object at a metadata step's path is not the one
// the step is for (another process put another there).
var errNotTheObject = errors.New("another object is at the path")

// setMeta gives rel in t the metadata m: owner, mode, attributes (those
// not in m are removed), times last. With ino (not 0) the object must be
// that inode, else errNotTheObject and nothing is changed; all but a
// symlink's times go through the one descriptor, so a swap after the
// look changes nothing else.
func (t *tree) setMeta(rel string, m *meta, ino uint64) error {
	if rel == "" {
		return t.setRootMeta(m)
	}
	dfd, name, err := t.parent(rel)
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	fd, err := unix.Openat(dfd, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if ino != 0 && st.Ino != ino {
		return errNotTheObject
	}
	if err := unix.Fchownat(fd, "", int(m.Uid), int(m.Gid), unix.AT_EMPTY_PATH); err != nil && !errors.Is(err, unix.EPERM) {
		return err
	}
	ts := []unix.Timespec{unix.NsecToTimespec(m.Atime), unix.NsecToTimespec(m.Mtime)}
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		return unix.UtimesNanoAt(dfd, name, ts, unix.AT_SYMLINK_NOFOLLOW)
	}
	p := procPath(fd)
	if err := unix.Chmod(p, m.Mode&0o7777); err != nil {
		return err
	}
	if err := setXattrs(p, m.Xattrs, t.isLayout); err != nil {
		return err
	}
	if err := setMetaFlags(fd, m.Flags); err != nil {
		return err
	}
	return unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, 0)
}

// metaFlags reads the fsutil.CarriedFlags of the object open as fd
// (O_PATH): false for one that has none to give.
func metaFlags(fd int) (uint32, bool) {
	ffd, err := fsutil.ReopenForFlags(fd)
	if err != nil {
		return 0, false
	}
	defer unix.Close(ffd)
	f, err := fsutil.Flags(ffd)
	return f & fsutil.CarriedFlags, err == nil
}

// setMetaFlags gives the object open as fd (O_PATH) the fsutil.CarriedFlags
// want (nil: leave them), keeping its other flags.
func setMetaFlags(fd int, want *uint32) error {
	if want == nil {
		return nil
	}
	ffd, err := fsutil.ReopenForFlags(fd)
	if errors.Is(err, unix.ENOTTY) {
		return nil // neither a file nor a directory: it has none
	}
	if err != nil {
		return err
	}
	defer unix.Close(ffd)
	cur, err := fsutil.Flags(ffd)
	if fsutil.NoFlags(err) && *want == 0 {
		return nil // a filesystem without flags: none to take away
	}
	if err == nil && cur&fsutil.CarriedFlags == *want {
		return nil
	}
	if err == nil {
		err = fsutil.SetFlags(ffd, cur&^fsutil.CarriedFlags|*want)
	}
	if err != nil {
		return fmt.Errorf("set inode flags (chattr) %s: %w", fsutil.FlagLetters(*want), err)
	}
	return nil
}

// setXattrs gives p the attributes want, removing the others but for the
// upper layout's (layout) and security.* ones.
func setXattrs(p string, want map[string][]byte, layout func(name string) bool) error {
	have, err := listXattrs(p)
	if err != nil && !errors.Is(err, unix.ENOTSUP) {
		return err
	}
	for _, n := range have {
		if _, keep := want[n]; !keep && !layout(n) && !strings.HasPrefix(n, "security.") {
			if err := unix.Removexattr(p, n); err != nil && !errors.Is(err, unix.ENODATA) {
				return err
			}
		}
	}
	for n, v := range want {
		if err := unix.Setxattr(p, n, v, 0); err != nil {
			if errors.Is(err, unix.EPERM) && !strings.HasPrefix(n, "user.") {
				continue // trusted.* or security.* we may not set here
			}
			return err
		}
	}
	return nil
}

// listXattrs and getXattr follow a final symlink (the /proc magic link).
func listXattrs(p string) ([]string, error) {
	for size := 1024; ; size *= 4 {
		buf := make([]byte, size)
		n, err := unix.Listxattr(p, buf)
		if errors.Is(err, unix.ERANGE) && size < 1<<20 {
			continue
		}
		if err != nil {
			return nil, err
		}
		var out []string
		for _, name := range strings.Split(string(buf[:n]), "\x00") {
			if name != "" {
				out = append(out, name)
			}
		}
		return out, nil
	}
}

func getXattr(p, name string) ([]byte, error) {
	for size := 1024; ; size *= 4 {
		buf := make([]byte, size)
		n, err := unix.Getxattr(p, name, buf)
		if errors.Is(err, unix.ERANGE) && size < 1<<20 {
			continue
		}
		if err != nil {
			return nil, err
		}
		return buf[:n], nil
	}
}

// setRootMeta gives the root directory itself the metadata m.
func (t *tree) setRootMeta(m *meta) error {
	p := procPath(t.fd)
	if err := unix.Fchownat(t.fd, "", int(m.Uid), int(m.Gid), unix.AT_EMPTY_PATH); err != nil && !errors.Is(err, unix.EPERM) {
		return err
	}
	if err := unix.Chmod(p, m.Mode&0o7777); err != nil {
		return err
	}
	if err := setXattrs(p, m.Xattrs, t.isLayout); err != nil {
		return err
	}
	if err := setMetaFlags(t.fd, m.Flags); err != nil {
		return err
	}
	ts := []unix.Timespec{unix.NsecToTimespec(m.Atime), unix.NsecToTimespec(m.Mtime)}
	return unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, 0)
}

// revertMeta is what the undo of a metadata step sets: cur, the object's
// metadata now, with each part the step set (cur has New's) back to
// old's. A part another process changed since keeps that change, and a
// part the step never reached (an apply that stopped, or crashed, before
// it or within it) is left as it is. nil: nothing to set back. The
// owner goes as one part, the times with the mtime (an atime moves on
// any read), each attribute by itself.
func revertMeta(cur, old, new *meta) *meta {
	back := *cur
	changed := false
	if cur.Uid == new.Uid && cur.Gid == new.Gid && (cur.Uid != old.Uid || cur.Gid != old.Gid) {
		back.Uid, back.Gid, changed = old.Uid, old.Gid, true
	}
	if perm := cur.Mode & 0o7777; perm == new.Mode&0o7777 && perm != old.Mode&0o7777 {
		back.Mode, changed = cur.Mode&^0o7777|old.Mode&0o7777, true
	}
	if cur.Mtime == new.Mtime && (cur.Mtime != old.Mtime || cur.Atime != old.Atime) {
		back.Atime, back.Mtime, changed = old.Atime, old.Mtime, true
	}
	if cur.Flags != nil && old.Flags != nil && new.Flags != nil && *cur.Flags == *new.Flags && *cur.Flags != *old.Flags {
		back.Flags, changed = old.Flags, true
	}
	back.Xattrs = map[string][]byte{}
	for n, v := range cur.Xattrs {
		back.Xattrs[n] = v
	}
	for _, m := range []map[string][]byte{old.Xattrs, new.Xattrs} {
		for n := range m {
			c, inCur := cur.Xattrs[n]
			w, inNew := new.Xattrs[n]
			if inCur != inNew || !bytes.Equal(c, w) {
				continue // not as the step left it
			}
			o, inOld := old.Xattrs[n]
			if inOld == inCur && bytes.Equal(o, c) {
				continue
			}
			if inOld {
				back.Xattrs[n] = o
			} else {
				delete(back.Xattrs, n)
			}
			changed = true
		}
	}
	if !changed {
		return nil
	}
	return &back
}
