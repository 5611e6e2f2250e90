package fsutil

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// MountEntry is one line of a mountinfo table (proc(5)), with its paths
// unescaped.
type MountEntry struct {
	ID, Parent int
	Dev        uint64 // the file system's device number, as st_dev
	Root       string // the mounted subtree of the source file system
	Mountpoint string
	Options    string // per-mount options
	FSType     string
	Source     string // for sbxfs: the absolute path of the work directory
	SuperOpts  string
}

// ReadMountinfo reads the mount table of this process's mount namespace.
func ReadMountinfo() ([]MountEntry, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("read mount table: %w", err)
	}
	defer f.Close()
	return ParseMountinfo(f)
}

// ParseMountinfo parses the mountinfo format (proc(5)):
//
//	36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
//
// Fields 1 to 6 are fixed, then optional fields up to a lone "-", then the
// file system type, the source and the super block options. Whitespace and
// backslashes inside fields are escaped as \ooo octal.
func ParseMountinfo(r io.Reader) ([]MountEntry, error) {
	var out []MountEntry
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if strings.TrimSpace(line) == "" {
			continue
		}
		e, err := parseMountinfoLine(line)
		if err != nil {
			return nil, fmt.Errorf("mountinfo line %d: %w", n, err)
		}
		out = append(out, e)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read mount table: %w", err)
	}
	return out, nil
}

func parseMountinfoLine(line string) (MountEntry, error) {
	f := strings.Fields(line)
	sep := -1
	for i := 6; i < len(f); i++ {
		if f[i] == "-" {
			sep = i
			break
		}
	}
	if len(f) < 7 || sep < 0 || len(f) < sep+3 {
		return MountEntry{}, fmt.Errorf("malformed entry %q", line)
	}
	id, err1 := strconv.Atoi(f[0])
	parent, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil {
		return MountEntry{}, fmt.Errorf("malformed mount ids in %q", line)
	}
	major, minor, ok := strings.Cut(f[2], ":")
	maj, err1 := strconv.ParseUint(major, 10, 32)
	mnr, err2 := strconv.ParseUint(minor, 10, 32)
	if !ok || err1 != nil || err2 != nil {
		return MountEntry{}, fmt.Errorf("malformed device number in %q", line)
	}
	e := MountEntry{
		ID:         id,
		Parent:     parent,
		Dev:        unix.Mkdev(uint32(maj), uint32(mnr)),
		Root:       unescapeMountinfo(f[3]),
		Mountpoint: unescapeMountinfo(f[4]),
		Options:    f[5],
		FSType:     unescapeMountinfo(f[sep+1]),
		Source:     unescapeMountinfo(f[sep+2]),
	}
	if len(f) > sep+3 {
		e.SuperOpts = f[sep+3]
	}
	return e, nil
}

// unescapeMountinfo undoes the kernel's octal escapes (\040 for a space,
// \011 tab, \012 newline, \134 backslash). Anything else is kept as is.
func unescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) && isOctal(s[i+1]) && isOctal(s[i+2]) && isOctal(s[i+3]) {
			if v := int(s[i+1]-'0')<<6 | int(s[i+2]-'0')<<3 | int(s[i+3]-'0'); v <= 0xff {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isOctal(c byte) bool { return c >= '0' && c <= '7' }

// MountAt returns the topmost mount whose mountpoint is exactly path (clean
// and absolute), or nil.
func MountAt(entries []MountEntry, path string) *MountEntry {
	var found *MountEntry
	for i := range entries {
		if entries[i].Mountpoint == path {
			found = &entries[i] // later lines are mounted on top
		}
	}
	return found
}

// MountContaining returns the mount the clean absolute path lies in: the
// topmost of those with the deepest mountpoint that is path or one of its
// parents; nil when entries has none (no "/").
func MountContaining(entries []MountEntry, path string) *MountEntry {
	var found *MountEntry
	for i := range entries {
		mp := entries[i].Mountpoint
		if path != mp && mp != "/" && !strings.HasPrefix(path, mp+"/") {
			continue
		}
		if found == nil || len(mp) >= len(found.Mountpoint) {
			found = &entries[i] // later lines are mounted on top
		}
	}
	return found
}

// FuseConnDir is the fusectl directory (/sys/fs/fuse/connections/N) of the
// FUSE file system with device number dev: fusectl names a connection by
// the kernel's dev_t, major<<20 | minor. Writing to its abort file ends
// the connection.
func FuseConnDir(dev uint64) string {
	return fmt.Sprintf("/sys/fs/fuse/connections/%d", uint64(unix.Major(dev))<<20|uint64(unix.Minor(dev)))
}

// FuseConn holds the control directory of one FUSE connection, opened
// while its file system is mounted (OpenFuseConn): through it CutOff
// reaches that connection alone. By name, FuseConnDir(dev) is whichever
// connection has device number dev now, and an unmounted file system's
// number is free at once: the next FUSE mount, anyone's, may get it, and
// CutOffFuse, which goes by name, would abort that mount's connection.
// fusectl removes a connection's directory when it goes; the held one
// then has no control files (and theirs name no connection).
type FuseConn struct {
	mu  sync.Mutex
	dir int // -1 once closed
}

// OpenFuseConn opens the control directory of the connection of the
// mounted FUSE file system with device number dev. It needs fusectl
// (/sys/fs/fuse/connections); cutting off needs root.
func OpenFuseConn(dev uint64) (*FuseConn, error) {
	fd, err := unix.Open(FuseConnDir(dev), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	return &FuseConn{dir: fd}, nil
}

// released reports whether the connection is gone. Called with mu held.
// ("waiting" cannot be read again through one descriptor: fusectl's
// files are not seekable.)
func (c *FuseConn) released() bool {
	if c.dir < 0 {
		return true // closed: its server finished, the connection with it
	}
	fd, err := unix.Openat(c.dir, "waiting", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return true
	}
	defer unix.Close(fd)
	var b [32]byte
	n, err := unix.Read(fd, b[:])
	return err != nil || n == 0
}

// CutOff is CutOffFuse for the held connection: it ends it if it is still
// alive wait after its mountpoint was unmounted, and reports whether it
// did. It may be called again, and after Close (then it does nothing).
func (c *FuseConn) CutOff(wait time.Duration) (bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for end := time.Now().Add(wait); !c.released(); time.Sleep(10 * time.Millisecond) {
		if !time.Now().After(end) {
			continue
		}
		fd, err := unix.Openat(c.dir, "abort", unix.O_WRONLY|unix.O_CLOEXEC, 0)
		if err == nil {
			_, err = unix.Write(fd, []byte("1"))
			unix.Close(fd)
		}
		if err != nil {
			if c.released() {
				return false, nil // gone in the meantime
			}
			return false, fmt.Errorf("cut off the FUSE connection: %w", err)
		}
		return true, nil
	}
	return false, nil
}

// Close closes the control directory.
func (c *FuseConn) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dir >= 0 {
		unix.Close(c.dir)
		c.dir = -1
	}
}

// CutOffFuse ends the connection of the FUSE file system with device
// number dev if it is still alive wait after its mountpoint was unmounted,
// and reports whether it did. The kernel ends a file system nothing else
// holds before umount(2) returns, and with it its fusectl directory; one
// still there is held elsewhere: by a bind mount of the mountpoint, or by
// a copy of the mount in another mount namespace (made by unshare -m, or
// a service's private namespace, while it was mounted), which the unmount
// does not reach. Its server would go on serving that copy; cut off, the
// copy answers ENOTCONN and the server finishes. Never call it after a
// lazy unmount (MNT_DETACH): what still uses a detached mount holds it on
// purpose. Without fusectl (/sys/fs/fuse/connections) it does nothing.
func CutOffFuse(dev uint64, wait time.Duration) (bool, error) {
	dir := FuseConnDir(dev)
	for end := time.Now().Add(wait); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(dir); err != nil {
			return false, nil // gone: nothing held it (or no fusectl)
		}
		if time.Now().After(end) {
			break
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "abort"), []byte("1"), 0); err != nil {
		if _, serr := os.Stat(dir); serr != nil {
			return false, nil // gone in the meantime
		}
		return false, fmt.Errorf("cut off the FUSE connection %s: %w", dir, err)
	}
	return true, nil
}

// UsedElsewhere lists the processes outside this process's mount
// namespace that use the file system with device number dev: a working
// directory or root in it, a descriptor or a mapping of a file of it. Such
// a process holds a copy of the mount in its own namespace (made by
// unshare -m, or by 'sbxfs run --in-place' for its CMD), which an unmount
// here would not see as busy; CutOffFuse would cut it off under that
// process. Processes it may not look at (another user's) are not listed.
func UsedElsewhere(dev uint64) []int {
	self, err := os.Readlink("/proc/self/ns/mnt")
	if err != nil {
		return nil
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	// Only a namespace that has the file system mounted can hold a copy:
	// its mount table is read once, for the first of its processes.
	field := fmt.Sprintf(" %d:%d ", unix.Major(dev), unix.Minor(dev))
	mounted := map[string]bool{}
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		dir := "/proc/" + e.Name()
		ns, err := os.Readlink(dir + "/ns/mnt")
		if err != nil || ns == self {
			continue
		}
		has, seen := mounted[ns]
		if !seen {
			b, err := os.ReadFile(dir + "/mountinfo")
			if err != nil {
				continue // gone, or not ours to read: ask its next process
			}
			has = strings.Contains(string(b), field)
			mounted[ns] = has
		}
		if has && processUses(dir, dev) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// processUses reports whether the process of /proc directory dir has its
// working directory, its root, a descriptor or a mapping on dev.
func processUses(dir string, dev uint64) bool {
	// The magic links lead to the object without a lookup, and
	// AT_STATX_DONT_SYNC keeps a FUSE file system from being asked (one
	// whose server hangs would hang the scan).
	major, minor := unix.Major(dev), unix.Minor(dev)
	on := func(p string) bool {
		var st unix.Statx_t
		return unix.Statx(unix.AT_FDCWD, p, unix.AT_STATX_DONT_SYNC, 0, &st) == nil &&
			st.Dev_major == major && st.Dev_minor == minor
	}
	if on(dir+"/cwd") || on(dir+"/root") {
		return true
	}
	if fds, err := os.ReadDir(dir + "/fd"); err == nil {
		for _, fd := range fds {
			if on(dir + "/fd/" + fd.Name()) {
				return true
			}
		}
	}
	maps, err := os.ReadFile(dir + "/maps")
	if err != nil {
		return false
	}
	want := fmt.Sprintf(" %02x:%02x ", major, minor)
	return strings.Contains(string(maps), want)
}

// FUSEUser returns the user_id= of a FUSE mount: the user who mounted it,
// as the mounting user namespace numbers it.
func (e *MountEntry) FUSEUser() (uint32, bool) {
	for _, o := range strings.Split(e.SuperOpts, ",") {
		if v, ok := strings.CutPrefix(o, "user_id="); ok {
			n, err := strconv.ParseUint(v, 10, 32)
			return uint32(n), err == nil
		}
	}
	return 0, false
}

// MountedByMe reports whether the FUSE mount e was made by this process's
// effective user. Anyone may mount a FUSE file system with any type and
// source name (fusermount3), so neither says whose a mount is. A process
// in a user namespace of its own sees a mount made outside it under the
// outside uid: that uid counts as its own too (/proc/self/uid_map).
func (e *MountEntry) MountedByMe() bool {
	u, ok := e.FUSEUser()
	if !ok {
		return false
	}
	euid := uint32(os.Geteuid())
	return u == euid || u == outsideUID(euid)
}

// outsideUID maps uid of this user namespace to the namespace above, as
// /proc/self/uid_map says (uid itself in the initial namespace, or when
// the map cannot be read).
func outsideUID(uid uint32) uint32 {
	b, err := os.ReadFile("/proc/self/uid_map")
	if err != nil {
		return uid
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 {
			continue
		}
		in, err1 := strconv.ParseUint(f[0], 10, 32)
		out, err2 := strconv.ParseUint(f[1], 10, 32)
		n, err3 := strconv.ParseUint(f[2], 10, 32)
		if err1 == nil && err2 == nil && err3 == nil && uint64(uid) >= in && uint64(uid)-in < n {
			return uint32(out + uint64(uid) - in)
		}
	}
	return uid
}
