package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// fsType is the file system type of every sbxfs mount in mountinfo.
const fsType = "fuse.sbxfs"

// mountEntry is one line of /proc/self/mountinfo, with its paths unescaped.
type mountEntry struct {
	ID, Parent int
	Root       string // the mounted subtree of the source file system
	Mountpoint string
	Options    string // per-mount options
	FSType     string
	Source     string // for sbxfs: the absolute path of the work directory
	SuperOpts  string
}

// isSbxfs reports whether the entry is an sbxfs mount.
func (m *mountEntry) isSbxfs() bool { return m.FSType == fsType }

// mountinfoPath is a variable so tests can point it elsewhere.
var mountinfoPath = "/proc/self/mountinfo"

// readMountinfo reads the mount table of this process's mount namespace.
func readMountinfo() ([]mountEntry, error) {
	f, err := os.Open(mountinfoPath)
	if err != nil {
		return nil, fmt.Errorf("read mount table: %w", err)
	}
	defer f.Close()
	return parseMountinfo(f)
}

// parseMountinfo parses the mountinfo format (proc(5)):
//
//	36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue
//
// Fields 1 to 6 are fixed, then optional fields up to a lone "-", then the
// file system type, the source and the super block options. Whitespace and
// backslashes inside fields are escaped as \ooo octal.
func parseMountinfo(r io.Reader) ([]mountEntry, error) {
	var out []mountEntry
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

func parseMountinfoLine(line string) (mountEntry, error) {
	f := strings.Fields(line)
	sep := -1
	for i := 6; i < len(f); i++ {
		if f[i] == "-" {
			sep = i
			break
		}
	}
	if len(f) < 7 || sep < 0 || len(f) < sep+3 {
		return mountEntry{}, fmt.Errorf("malformed entry %q", line)
	}
	id, err1 := strconv.Atoi(f[0])
	parent, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil {
		return mountEntry{}, fmt.Errorf("malformed mount ids in %q", line)
	}
	e := mountEntry{
		ID:         id,
		Parent:     parent,
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

// mountAt returns the topmost mount whose mountpoint is exactly path (clean
// and absolute), or nil.
func mountAt(entries []mountEntry, path string) *mountEntry {
	var found *mountEntry
	for i := range entries {
		if entries[i].Mountpoint == path {
			found = &entries[i] // later lines are mounted on top
		}
	}
	return found
}

// sbxfsMountOf returns the sbxfs mount whose source is the work directory
// work, or nil.
func sbxfsMountOf(entries []mountEntry, work string) *mountEntry {
	for i := range entries {
		if entries[i].isSbxfs() && entries[i].Source == work {
			return &entries[i]
		}
	}
	return nil
}
