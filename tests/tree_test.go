package tests

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/fsutil"
)

// nodeInfo is what a tree walk records about one object.
type nodeInfo struct {
	Type    uint32 // S_IFMT bits
	Perm    uint32 // mode & 07777
	Size    int64  // non-directories
	Hash    string // regular files: sha256 of the content
	Target  string // symlinks
	Xattrs  map[string]string
	Nlink   uint64 // non-directories
	Uid     uint32
	Gid     uint32
	Mtime   unix.Timespec
	Ctime   unix.Timespec
	Ino     uint64
	Rdev    uint64
	Entries []string // directories: sorted names
}

// walkOpts selects what a comparison looks at.
type walkOpts struct {
	xattr func(name string) bool // which attributes to record (nil: none)
	owner bool
	mtime bool // non-directories
	ctime bool // every object: nothing at all touched it
	ino   bool
}

func userXattrs(name string) bool { return strings.HasPrefix(name, "user.") }

// allXattrs records every attribute, trusted.* included.
func allXattrs(string) bool { return true }

// snapshotOpts is the strictest comparison: for an original that must not
// change at all.
var snapshotOpts = walkOpts{xattr: allXattrs, owner: true, mtime: true, ctime: true, ino: true}

// viewOpts compares what a user sees of two trees made by the same
// operations: names, types, permissions, sizes, content, symlink targets,
// user.* attributes, link counts of non-directories and listings.
var viewOpts = walkOpts{xattr: userXattrs}

func fileTypeName(m uint32) string {
	switch m & unix.S_IFMT {
	case unix.S_IFREG:
		return "file"
	case unix.S_IFDIR:
		return "dir"
	case unix.S_IFLNK:
		return "symlink"
	case unix.S_IFIFO:
		return "fifo"
	case unix.S_IFSOCK:
		return "socket"
	case unix.S_IFCHR:
		return "chardev"
	case unix.S_IFBLK:
		return "blockdev"
	}
	return fmt.Sprintf("type %#o", m&unix.S_IFMT)
}

// walkTree records every object under root (root itself is "").
//
// It reaches each object through its directory's descriptor
// (/proc/self/fd/N/NAME), so trees deeper than PATH_MAX walk too.
func walkTree(root string, o walkOpts) (map[string]nodeInfo, error) {
	out := map[string]nodeInfo{}
	var walk func(rel, p string) error
	walk = func(rel, p string) error {
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return fmt.Errorf("lstat %s: %w", filepath.Join(root, rel), err)
		}
		n := nodeInfo{Type: st.Mode & unix.S_IFMT, Perm: st.Mode & 0o7777}
		if o.owner {
			n.Uid, n.Gid = st.Uid, st.Gid
		}
		if o.ctime {
			n.Ctime = st.Ctim
		}
		if o.ino {
			n.Ino = st.Ino
		}
		if o.xattr != nil {
			x, err := readXattrs(p, o.xattr)
			if err != nil {
				return err
			}
			n.Xattrs = x
		}
		if n.Type != unix.S_IFDIR {
			n.Size, n.Nlink = st.Size, uint64(st.Nlink)
			if o.mtime {
				n.Mtime = st.Mtim
			}
		}
		switch n.Type {
		case unix.S_IFREG:
			h, err := hashFile(p)
			if err != nil {
				return err
			}
			n.Hash = h
		case unix.S_IFLNK:
			t, err := os.Readlink(p)
			if err != nil {
				return err
			}
			n.Target = t
		case unix.S_IFCHR, unix.S_IFBLK:
			n.Rdev = st.Rdev
		case unix.S_IFDIR:
			f, err := os.OpenFile(p, os.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
			if err != nil {
				return err
			}
			defer f.Close()
			names, err := f.Readdirnames(-1)
			if err != nil {
				return fmt.Errorf("readdir %s: %w", filepath.Join(root, rel), err)
			}
			slices.Sort(names)
			n.Entries = names
			out[rel] = n
			dir := "/proc/self/fd/" + strconv.Itoa(int(f.Fd())) + "/"
			for _, name := range names {
				if err := walk(filepath.Join(rel, name), dir+name); err != nil {
					return err
				}
			}
			return nil
		}
		out[rel] = n
		return nil
	}
	return out, walk("", root)
}

func mustWalk(t testing.TB, root string, o walkOpts) map[string]nodeInfo {
	t.Helper()
	m, err := walkTree(root, o)
	if err != nil {
		t.Fatalf("walk %s: %v", root, err)
	}
	return m
}

const blk = 4096

var (
	hashBufs = sync.Pool{New: func() any { b := make([]byte, 64*blk); return &b }}
	zero     = make([]byte, blk)
)

// hashFile hashes the content of a regular file. It reads only the data
// extents (SEEK_DATA/SEEK_HOLE) and skips all-zero blocks, so a sparse
// file of 5 GiB costs little and two files with the same bytes hash the
// same whatever their hole layout.
func hashFile(p string) (string, error) {
	f, err := os.OpenFile(p, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	if err != nil {
		return "", err
	}
	defer f.Close()
	fd := int(f.Fd())
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return "", err
	}
	h := sha256.New()
	bp := hashBufs.Get().(*[]byte)
	defer hashBufs.Put(bp)
	buf := *bp
	var offb [8]byte
	next := int64(0) // blocks below next are hashed already
	// hashRange hashes the non-zero 4 KiB blocks (aligned on the file)
	// that meet [start, end).
	hashRange := func(start, end int64) error {
		off := max(start&^(blk-1), next)
		end = min((end+blk-1)&^(blk-1), st.Size)
		for off < end {
			n, err := unix.Pread(fd, buf[:min(int64(len(buf)), end-off)], off)
			if err != nil {
				return fmt.Errorf("read %s: %w", p, err)
			}
			if n == 0 {
				break
			}
			for i := 0; i < n; i += blk {
				b := buf[i:min(i+blk, n)]
				if bytes.Equal(b, zero[:len(b)]) {
					continue
				}
				binary.LittleEndian.PutUint64(offb[:], uint64(off)+uint64(i))
				h.Write(offb[:])
				h.Write(b)
			}
			off += int64(n)
		}
		next = max(next, off)
		return nil
	}
	for off := int64(0); off < st.Size; {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole is left
		}
		if err != nil { // no SEEK_DATA here: read it all
			if err := hashRange(off, st.Size); err != nil {
				return "", err
			}
			break
		}
		hole, err := unix.Seek(fd, data, unix.SEEK_HOLE)
		if err != nil {
			hole = st.Size
		}
		if err := hashRange(data, hole); err != nil {
			return "", err
		}
		off = hole
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

func readXattrs(p string, keep func(string) bool) (map[string]string, error) {
	names, err := fsutil.LListXattrs(p)
	if err != nil {
		if errnoOf(err) == unix.EOPNOTSUPP {
			return nil, nil
		}
		return nil, fmt.Errorf("listxattr %s: %w", p, err)
	}
	var out map[string]string
	for _, n := range names {
		if !keep(n) {
			continue
		}
		v, err := fsutil.LGetXattr(p, n)
		if err != nil {
			return nil, fmt.Errorf("getxattr %s %s: %w", p, n, err)
		}
		if out == nil {
			out = map[string]string{}
		}
		out[n] = string(v)
	}
	return out, nil
}

// diffTrees lists the differences between two walks (want vs got), at
// most limit of them.
func diffTrees(want, got map[string]nodeInfo, limit int) []string {
	var keys []string
	for k := range want {
		keys = append(keys, k)
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	var out []string
	add := func(format string, args ...any) {
		if len(out) < limit {
			out = append(out, fmt.Sprintf(format, args...))
		}
	}
	for _, k := range keys {
		w, wok := want[k]
		g, gok := got[k]
		name := "/" + k
		switch {
		case !gok:
			add("%s: missing (want %s)", name, fileTypeName(w.Type))
			continue
		case !wok:
			add("%s: unexpected %s", name, fileTypeName(g.Type))
			continue
		case w.Type != g.Type:
			add("%s: type %s, want %s", name, fileTypeName(g.Type), fileTypeName(w.Type))
			continue
		}
		if w.Perm != g.Perm {
			add("%s: mode %#o, want %#o", name, g.Perm, w.Perm)
		}
		if w.Size != g.Size {
			add("%s: size %d, want %d", name, g.Size, w.Size)
		}
		if w.Hash != g.Hash {
			add("%s: content differs", name)
		}
		if w.Target != g.Target {
			add("%s: symlink -> %q, want %q", name, g.Target, w.Target)
		}
		if w.Nlink != g.Nlink {
			add("%s: nlink %d, want %d", name, g.Nlink, w.Nlink)
		}
		if w.Uid != g.Uid || w.Gid != g.Gid {
			add("%s: owner %d:%d, want %d:%d", name, g.Uid, g.Gid, w.Uid, w.Gid)
		}
		if w.Mtime != g.Mtime {
			add("%s: mtime %v, want %v", name, g.Mtime, w.Mtime)
		}
		if w.Ctime != g.Ctime {
			add("%s: ctime %v, want %v (something touched it)", name, g.Ctime, w.Ctime)
		}
		if w.Ino != g.Ino {
			add("%s: ino %d, want %d", name, g.Ino, w.Ino)
		}
		if w.Rdev != g.Rdev {
			add("%s: rdev %#x, want %#x", name, g.Rdev, w.Rdev)
		}
		if !mapsEqual(w.Xattrs, g.Xattrs) {
			add("%s: xattrs %v, want %v", name, g.Xattrs, w.Xattrs)
		}
		if !slices.Equal(w.Entries, g.Entries) {
			add("%s: entries %q, want %q", name, g.Entries, w.Entries)
		}
	}
	return out
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// originalGuard snapshots an original and checks at the end of the test
// that nothing in it changed: content, modes, owners, times, attributes,
// inode numbers, listings.
func originalGuard(t testing.TB, orig string) {
	t.Helper()
	before := mustWalk(t, orig, snapshotOpts)
	t.Cleanup(func() {
		after, err := walkTree(orig, snapshotOpts)
		if err != nil {
			t.Errorf("walk original after the test: %v", err)
			return
		}
		if d := diffTrees(before, after, 30); len(d) > 0 {
			t.Errorf("THE ORIGINAL %s CHANGED:\n  %s", orig, strings.Join(d, "\n  "))
		}
	})
}
