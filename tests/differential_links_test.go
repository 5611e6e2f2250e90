package tests

import (
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/fsutil"
)

// Hard links of the original in the differential tests. A name of an
// original file with several links parts from the others when the sandbox
// copies it up, as in kernel overlayfs without index=on: it becomes a file
// of its own, and the names left keep the original's inode and link count.
// The plain directory is made to do the same (linkModel): before an
// operation copies such a name up, the name's link moves to a holder
// directory outside the tree, so the other names keep their count, and a
// copy takes its place; a name removed or replaced leaves its link in the
// holder too. The holder is emptied before a committed original is
// compared, and the commit must give the original what the mount showed.

var flagDiffNoLinks = flag.Bool("diff.nolinks", false, "no hard links in the differential tests' original (the regression seeds of TestDifferentialCommit never have them)")

// diffLinks are the extra names given to files of makeDiffOriginal: a
// file in another directory, in its own, and one with three more names.
// None is a name the generator's symlinks point to (diffNames, opSymlink),
// so no operation reaches one through a symlink.
var diffLinks = map[string][]string{
	"a/b/f02": {"h/g0", "g/g1"},
	"e/f/f06": {"e/f/g2"},
	"f11":     {"a/b/c/d/g3", "h/i/j/g4", "g5"},
}

func addOriginalLinks(t *testing.T, orig string) {
	t.Helper()
	for from, names := range diffLinks {
		for _, n := range names {
			if err := os.Link(filepath.Join(orig, from), filepath.Join(orig, n)); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// linkModel keeps the plain directory's hard links as the sandbox shows
// them.
type linkModel struct {
	t      *testing.T
	ref    string
	holder string          // outside ref: links of names parted or gone
	inos   map[uint64]bool // inodes of the original's linked files, in ref
	n      int
	// parted and dropped count the names parted and removed, for the log.
	parted, dropped int
}

func newLinkModel(t *testing.T, ref string) *linkModel {
	m := &linkModel{t: t, ref: ref}
	m.scan()
	t.Cleanup(func() {
		t.Logf("hard links of the original: %d names parted by a copy-up, %d removed or replaced", m.parted, m.dropped)
	})
	return m
}

// scan takes every file of the plain directory with several names for an
// original hard link, with an empty holder: at the start, and after a
// commit (what the sandbox linked is the original's then).
func (m *linkModel) scan() {
	m.holder, m.inos = m.t.TempDir(), map[uint64]bool{}
	err := filepath.WalkDir(m.ref, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		if st.Nlink > 1 {
			m.inos[st.Ino] = true
		}
		return nil
	})
	if err != nil {
		m.t.Fatal(err)
	}
}

// unparted returns the inode at rel when it is a name of an original
// file with several links that no copy-up parted yet.
func (m *linkModel) unparted(rel string) (uint64, bool) {
	if m == nil {
		return 0, false
	}
	var st unix.Stat_t
	if unix.Lstat(filepath.Join(m.ref, rel), &st) != nil || st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return 0, false
	}
	return st.Ino, m.inos[st.Ino]
}

// original reports whether base is the name of an original file that
// addOriginalLinks gave more names: once parted, it shows the original's
// st_ino until its kernel entry is dropped, which waits while it is open.
func (m *linkModel) original(base string) bool {
	if m == nil {
		return false
	}
	for from := range diffLinks {
		if filepath.Base(from) == base {
			return true
		}
	}
	return false
}

// hold links the file at rel into the holder and returns the link.
func (m *linkModel) hold(rel string) string {
	m.n++
	h := filepath.Join(m.holder, fmt.Sprint(m.n))
	if err := os.Link(filepath.Join(m.ref, rel), h); err != nil {
		m.t.Fatal(err)
	}
	return h
}

// part gives rel a file of its own, as a copy-up in the sandbox does. The
// returned func puts the shared file back when the operation failed: the
// sandbox checks what would make it fail before it copies up (unless a
// step of an operation of several wrote the copy before another failed:
// then the sandbox copied it up as well, and the copy stays).
func (m *linkModel) part(rel string, nofollow bool) func(failed bool) {
	if !nofollow {
		var ok bool
		if rel, ok = m.followed(rel); !ok {
			return func(bool) {}
		}
	}
	ino, ok := m.unparted(rel)
	if !ok {
		return func(bool) {}
	}
	p := filepath.Join(m.ref, rel)
	h := m.hold(rel)
	m.parted++
	tmp := filepath.Join(filepath.Dir(p), ".diff-part")
	if err := copyFileAll(p, tmp); err != nil {
		m.t.Fatalf("part %s: %v", rel, err)
	}
	if err := os.Rename(tmp, p); err != nil {
		m.t.Fatal(err)
	}
	return func(failed bool) {
		if !failed {
			return
		}
		var st, held unix.Stat_t
		if unix.Lstat(p, &st) == nil && !m.inos[st.Ino] && st.Nlink == 1 {
			if unix.Lstat(h, &held) == nil && (st.Size != held.Size || st.Mtim != held.Mtim) {
				// An operation of several steps (remaking a tree)
				// wrote the copy before a later step failed: the
				// sandbox copied it up for that write too.
				return
			}
			if err := os.Rename(h, p); err != nil { // the copy goes
				m.t.Fatal(err)
			}
			m.parted--
			return
		}
		m.t.Fatalf("part %s: the operation failed and moved the copy (inode %d)", rel, ino)
	}
}

// drop keeps the link of rel, a name the operation removes or replaces;
// the returned func lets it go again when rel is still there.
func (m *linkModel) drop(rel string) func(failed bool) {
	ino, ok := m.unparted(rel)
	if !ok {
		return func(bool) {}
	}
	h := m.hold(rel)
	return func(bool) {
		var st unix.Stat_t
		if unix.Lstat(filepath.Join(m.ref, rel), &st) == nil && st.Ino == ino {
			if err := os.Remove(h); err != nil {
				m.t.Fatal(err)
			}
			return
		}
		m.dropped++
	}
}

// followed is the path in ref of what rel names once its symlinks are
// followed; false when that is nothing or lies outside ref.
func (m *linkModel) followed(rel string) (string, bool) {
	real, err := filepath.EvalSymlinks(filepath.Join(m.ref, rel))
	if err != nil {
		return "", false
	}
	root, err := filepath.EvalSymlinks(m.ref)
	if err != nil {
		m.t.Fatal(err)
	}
	r, err := filepath.Rel(root, real)
	if err != nil || r == ".." || strings.HasPrefix(r, "../") {
		return "", false
	}
	if r == "." {
		r = ""
	}
	return r, true
}

// release empties the holder: the links a commit drops with its backups.
func (m *linkModel) release() {
	if m == nil {
		return
	}
	if err := os.RemoveAll(m.holder); err != nil {
		m.t.Fatal(err)
	}
}

// copyFileAll copies the non-directory src (a regular file, a symlink or
// a FIFO) to dst with its content, mode, owner, times and user.*
// attributes, as a copy-up does.
func copyFileAll(src, dst string) error {
	var st unix.Stat_t
	if err := unix.Lstat(src, &st); err != nil {
		return err
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFLNK:
		// A symlink with several names (linkat of a symlink, which the
		// first sandbox of a stack may have made).
		target, err := os.Readlink(src)
		if err != nil {
			return err
		}
		if err := os.Symlink(target, dst); err != nil {
			return err
		}
		if err := os.Lchown(dst, int(st.Uid), int(st.Gid)); err != nil {
			return err
		}
		return unix.UtimesNanoAt(unix.AT_FDCWD, dst, []unix.Timespec{st.Atim, st.Mtim}, unix.AT_SYMLINK_NOFOLLOW)
	case unix.S_IFIFO:
		if err := unix.Mkfifo(dst, 0o600); err != nil {
			return err
		}
	default:
		data, err := os.ReadFile(src)
		if err != nil {
			return err
		}
		if err := os.WriteFile(dst, data, 0o600); err != nil {
			return err
		}
	}
	names, err := fsutil.LListXattrs(src)
	if err != nil {
		return err
	}
	for _, n := range names {
		if !strings.HasPrefix(n, "user.") {
			continue
		}
		v, err := fsutil.LGetXattr(src, n)
		if err != nil {
			return err
		}
		if err := unix.Lsetxattr(dst, n, v, 0); err != nil {
			return err
		}
	}
	if err := os.Lchown(dst, int(st.Uid), int(st.Gid)); err != nil {
		return err
	}
	if err := unix.Chmod(dst, st.Mode&0o7777); err != nil {
		return err
	}
	return unix.UtimesNanoAt(unix.AT_FDCWD, dst, []unix.Timespec{st.Atim, st.Mtim}, unix.AT_SYMLINK_NOFOLLOW)
}

// linkGroups lists which names of root share an inode (non-directories
// with several links), for comparing a committed original.
func linkGroups(root string) ([]string, error) {
	byIno := map[uint64][]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		if st.Nlink > 1 {
			rel, _ := filepath.Rel(root, p)
			byIno[st.Ino] = append(byIno[st.Ino], rel)
		}
		return nil
	})
	var out []string
	for _, names := range byIno {
		if len(names) > 1 {
			slices.Sort(names)
			out = append(out, strings.Join(names, " = "))
		}
	}
	slices.Sort(out)
	return out, err
}
