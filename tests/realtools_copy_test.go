package tests

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// rtAllTypesTree fills dir with every kind of file tar, cp and rsync
// carry: regular files (empty, small, 1 MiB), a sparse file with holes
// inside and at the end, symlinks (relative, absolute, dangling, to a
// directory), hard links (in one directory and across two), a FIFO, an
// empty directory, user.* attributes (empty and binary values, on files
// and directories), odd modes (0000, 0444, 04755, 02755, a 01777 and a
// 0700 directory), other owners, odd names, and old times: 1970-01-01
// 00:00:01, 1980, nanoseconds, and one before 1970. Directory times are
// set last, as tar does.
func rtAllTypesTree(t *testing.T, dir string) {
	t.Helper()
	big := make([]byte, 1<<20)
	for i := range big {
		big[i] = byte(i*7 + i>>12)
	}
	writeTree(t, dir, map[string]string{
		"reg/small.txt":                     "small\n",
		"reg/empty":                         "",
		"hard/a":                            "hard linked three times\n",
		"links/rel":                         "->../reg/small.txt",
		"links/abs":                         "->/etc/hostname",
		"links/dangling":                    "->does/not/exist",
		"links/dir":                         "->../reg",
		"empty/":                            "",
		"modes/m0000":                       "no permissions\n",
		"modes/m0444":                       "read only\n",
		"modes/suid":                        "#!/bin/sh\n",
		"modes/sgid":                        "#!/bin/sh\n",
		"modes/sticky/inside":               "in a sticky directory\n",
		"modes/private/inside":              "in a 0700 directory\n",
		"names/with space":                  "space\n",
		"names/ünïcödé":                     "unicode\n",
		"names/" + strings.Repeat("n", 200): "long name\n",
		"owned/by-1234":                     "owned\n",
		"special/":                          "",
	})
	p := func(rel string) string { return filepath.Join(dir, rel) }
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(p("reg/big.bin"), big, 0o644))
	// Sparse: 4 KiB at 0, 4 KiB at 1 MiB, 8 MiB long (a hole at the end).
	f, err := os.Create(p("reg/sparse.img"))
	must(err)
	_, err = f.WriteAt([]byte(strings.Repeat("S", 4096)), 0)
	must(err)
	_, err = f.WriteAt([]byte(strings.Repeat("T", 4096)), 1<<20)
	must(err)
	must(f.Truncate(8 << 20))
	must(f.Close())
	must(os.Link(p("hard/a"), p("hard/b")))
	must(os.Link(p("hard/a"), p("reg/hard-c")))
	must(unix.Mkfifo(p("special/fifo"), 0o640))
	must(unix.Setxattr(p("reg/small.txt"), "user.color", []byte("blue"), 0))
	must(unix.Setxattr(p("reg/small.txt"), "user.empty", nil, 0))
	must(unix.Setxattr(p("reg/big.bin"), "user.bin", []byte{0, 1, 2, 0xff, '\n'}, 0))
	must(unix.Setxattr(p("reg"), "user.dir", []byte("on a directory"), 0))
	must(unix.Setxattr(p("hard/a"), "user.linked", []byte("shared"), 0))
	for rel, mode := range map[string]os.FileMode{
		"modes/m0000": 0, "modes/m0444": 0o444, "modes/suid": 0o755 | os.ModeSetuid,
		"modes/sgid": 0o755 | os.ModeSetgid, "modes/sticky": 0o777 | os.ModeSticky, "modes/private": 0o700,
	} {
		must(os.Chmod(p(rel), mode))
	}
	must(os.Lchown(p("owned/by-1234"), 1234, 2345))
	must(os.Lchown(p("owned"), 1234, 2345))
	must(os.Lchown(p("links/rel"), 1234, 2345))
	times := []time.Time{
		time.Unix(1, 0),
		time.Date(1980, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(2001, 9, 9, 1, 46, 40, 123456789, time.UTC),
		time.Date(1960, 6, 1, 12, 0, 0, 0, time.UTC),
	}
	var dirs []string
	i := 0
	must(filepath.Walk(dir, func(q string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if fi.IsDir() {
			dirs = append(dirs, q)
			return nil
		}
		setTimes(t, q, times[i%len(times)])
		i++
		return nil
	}))
	for j := len(dirs) - 1; j >= 0; j-- { // children first
		setTimes(t, dirs[j], times[j%len(times)])
	}
}

// rtOldTimes gives everything under root with an mtime of the last hour
// the mtime old, directories after their children.
func rtOldTimes(t *testing.T, root string, old time.Time) {
	t.Helper()
	recent := time.Now().Add(-time.Hour)
	var dirs []string
	err := filepath.Walk(root, func(q string, fi os.FileInfo, err error) error {
		switch {
		case err != nil:
			return err
		case fi.IsDir():
			dirs = append(dirs, q)
		case fi.ModTime().After(recent):
			setTimes(t, q, old)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for j := len(dirs) - 1; j >= 0; j-- {
		if fi, err := os.Lstat(dirs[j]); err == nil && fi.ModTime().After(recent) {
			setTimes(t, dirs[j], old)
		}
	}
}

// rtDirTimes records the mtime of every directory under root.
func rtDirTimes(t *testing.T, root string) map[string]unix.Timespec {
	t.Helper()
	out := map[string]unix.Timespec{}
	err := filepath.Walk(root, func(q string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if fi.IsDir() {
			rel, _ := filepath.Rel(root, q)
			out[rel] = lstat(t, q).Mtim
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// rtCopyOpts is what a copy with tar -p, cp -a or rsync -aHAX keeps.
var rtCopyOpts = walkOpts{xattr: userXattrs, owner: true, mtime: true}

// rtCompareCopy compares a copy with what it was copied from: the tree
// (with owners, mtimes, user.* attributes and link counts), the mtimes of
// directories that have an old one (set by tar, cp or rsync: a directory
// changed by the work has the time of the change, which is not the same
// on two sides), and whether the sparse file is still sparse.
func rtCompareCopy(t *testing.T, what, want, got string) {
	t.Helper()
	rtCompareTrees(t, what, want, got, rtCopyOpts, nil)
	wt, gt := rtDirTimes(t, want), rtDirTimes(t, got)
	recent := time.Now().Add(-time.Hour).Unix()
	for rel, w := range wt {
		if g, ok := gt[rel]; ok && g != w && w.Sec < recent {
			t.Errorf("%s: directory /%s: mtime %v, want %v", what, rel, time.Unix(g.Unix()), time.Unix(w.Unix()))
		}
	}
	// Sparse files stay sparse (reg/sparse.img wherever the tree is).
	err := filepath.Walk(want, func(q string, fi os.FileInfo, err error) error {
		if err != nil || fi.Name() != "sparse.img" {
			return err
		}
		rel, _ := filepath.Rel(want, q)
		sparse := func(p string) bool {
			st := lstat(t, p)
			return st.Blocks*512 < st.Size/2
		}
		if w, g := sparse(q), sparse(filepath.Join(got, rel)); w != g {
			t.Errorf("%s: /%s: sparse %v, want %v", what, rel, g, w)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestRealCopyRoundTrip: a tree with every file type is copied into the
// mount with cp -a, tar (--xattrs --sparse, extracted with -p) and rsync
// -aHAXS, and an original copy of it is updated in place by rsync
// --delete from a changed source; the same is done to a plain copy of the
// original, and the trees must match (content, types, modes, owners,
// mtimes of files, symlinks and directories, user.* attributes, hard
// links, sparseness), in the mount and, after sbxfs commit, in the
// original. (cp -a also copies a tree of the original to a new place in
// the mount, and mv moves a tree of the original and a directory out of
// it.) Then copies out of the mount (tar, cp -a and rsync from a
// tree the original holds and from one copied in) must equal the source.
func TestRealCopyRoundTrip(t *testing.T) {
	rtNeedCLI(t)
	rtNeedTool(t, "tar")
	rtNeedTool(t, "rsync")
	src := filepath.Join(t.TempDir(), "src")
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	rtAllTypesTree(t, src)
	// src2 is src changed: a file rewritten, one removed, one added, a
	// mode changed, a symlink retargeted, the FIFO gone, an attribute
	// added, the hard-linked file rewritten.
	src2 := copyTree(t, src)
	p2 := func(rel string) string { return filepath.Join(src2, rel) }
	rtWrite(t, p2("reg/small.txt"), "small, changed\n", 0o644)
	setTimes(t, p2("reg/small.txt"), time.Date(1999, 12, 31, 23, 59, 59, 0, time.UTC))
	for _, rel := range []string{"reg/big.bin", "special/fifo"} {
		if err := os.Remove(p2(rel)); err != nil {
			t.Fatal(err)
		}
	}
	rtWrite(t, p2("reg/new.txt"), "new\n", 0o600)
	if err := os.Chmod(p2("modes/m0444"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(p2("links/rel")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../reg/new.txt", p2("links/rel")); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr(p2("names/with space"), "user.added", []byte("yes"), 0); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p2("hard/a"), []byte("hard linked, rewritten\n"), 0o644); err != nil { // all three names
		t.Fatal(err)
	}
	setTimes(t, p2("hard/a"), time.Unix(1, 0))
	// What the changes stamped with the current time gets an old time, as
	// in a tree unpacked from an archive (and so rsync, which compares
	// times to the second, cannot take a fresh time for an unchanged one).
	rtOldTimes(t, src2, time.Date(2010, 1, 2, 3, 4, 5, 6, time.UTC))

	orig := newOrig(t, map[string]string{"README": "copies\n"})
	sh := newRtShell(t, "setup", "", rtBaseEnv())
	sh.run("/", "cp", "-a", src, filepath.Join(orig, "lower"))   // updated by rsync in place
	sh.run("/", "cp", "-a", src, filepath.Join(orig, "lowerro")) // only read
	sh.run("/", "cp", "-a", src, filepath.Join(orig, "lowermv")) // moved
	ref := copyTree(t, orig)
	sb := mountSandbox(t, orig)

	tarX := []string{"--xattrs", "--xattrs-include=user.*", "--numeric-owner"}
	tarCopy := func(s *rtShell, from, to string) {
		if err := os.MkdirAll(to, 0o755); err != nil {
			t.Fatal(err)
		}
		s.sh("/", fmt.Sprintf("tar -C %q %s --sparse -cf - . | tar -C %q %s -xpf -",
			from, strings.Join(tarX, " "), to, strings.Join(tarX, " ")))
	}
	work := func(side, root string) *rtShell {
		s := newRtShell(t, side, root, rtBaseEnv())
		s.run("/", "cp", "-a", src, filepath.Join(root, "cp"))
		tarCopy(s, src, filepath.Join(root, "tar"))
		s.run("/", "rsync", "-aHAXS", "--numeric-ids", src+"/", filepath.Join(root, "rsync")+"/")
		s.run("/", "rsync", "-aHAXS", "--numeric-ids", "--delete", src2+"/", filepath.Join(root, "lower")+"/")
		// Within the tree: a copy of an original tree, and an original
		// directory moved elsewhere.
		s.run("/", "cp", "-a", filepath.Join(root, "lowerro"), filepath.Join(root, "within"))
		s.run("/", "mv", filepath.Join(root, "lowermv"), filepath.Join(root, "moved"))
		s.run("/", "mv", filepath.Join(root, "moved/modes"), filepath.Join(root, "moved-modes"))
		return s
	}
	plain := work("plain", ref)
	mount := work("mount", sb.mnt)
	rtCompareLogs(t, plain, mount)
	for _, d := range []string{"cp", "tar", "rsync"} {
		rtCompareCopy(t, d+": copied into the mount vs the source", src, sb.path(d))
	}
	rtCompareCopy(t, "lower: updated by rsync in the mount vs the changed source", src2, sb.path("lower"))
	rtCompareCopy(t, "lowerro: the original's copy, seen through the mount vs the source", src, sb.path("lowerro"))
	rtCompareCopy(t, "within: copied from lowerro in the mount vs the source", src, sb.path("within"))
	rtCompareCopy(t, "the mount vs the plain copy", ref, sb.mnt)

	// Copies out of the mount: of a tree the original holds, and of one
	// copied in.
	out := t.TempDir()
	s := newRtShell(t, "out", "", rtBaseEnv())
	tarCopy(s, sb.path("lowerro"), filepath.Join(out, "tar-lower"))
	tarCopy(s, sb.path("rsync"), filepath.Join(out, "tar-upper"))
	s.run("/", "cp", "-a", sb.path("lowerro"), filepath.Join(out, "cp-lower"))
	s.run("/", "cp", "-a", sb.path("tar"), filepath.Join(out, "cp-upper"))
	s.run("/", "rsync", "-aHAXS", "--numeric-ids", sb.path("lowerro")+"/", filepath.Join(out, "rsync-lower")+"/")
	s.run("/", "rsync", "-aHAXS", "--numeric-ids", sb.path("cp")+"/", filepath.Join(out, "rsync-upper")+"/")
	for _, d := range []string{"tar-lower", "tar-upper", "cp-lower", "cp-upper", "rsync-lower", "rsync-upper"} {
		rtCompareCopy(t, d+": copied out of the mount vs the source", src, filepath.Join(out, d))
	}

	rtCommitOpts(t, sb, "copies", rtCopyOpts)
	rtCompareCopy(t, "the original after the commit vs the plain copy", ref, orig)
}
