package tests

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/fsutil"
)

var pastTime = time.Date(2020, 1, 2, 3, 4, 5, 600, time.UTC)

func setTimes(t testing.TB, p string, tm time.Time) {
	t.Helper()
	ts := unix.NsecToTimespec(tm.UnixNano())
	require.NoError(t, unix.UtimesNanoAt(unix.AT_FDCWD, p, []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW))
}

func getxattr(t testing.TB, p, name string) string {
	t.Helper()
	v, err := fsutil.LGetXattr(p, name)
	require.NoError(t, err, "getxattr %s %s", p, name)
	return string(v)
}

func listDir(t testing.TB, p string) []string {
	t.Helper()
	ents, err := os.ReadDir(p)
	require.NoError(t, err)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	slices.Sort(names)
	return names
}

func isWhiteout(t testing.TB, p string) bool {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		return false
	}
	return st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0
}

// TestCopyUpOnce: the first write to an original file copies it into the
// upper with its mode, owner and attributes; the original is untouched and
// later writes go to the same copy.
func TestCopyUpOnce(t *testing.T) {
	orig := newOrig(t, map[string]string{
		"data.txt":    "original content\n",
		"meta.txt":    "meta content\n",
		"other/x.txt": "x\n",
	})
	for _, name := range []string{"data.txt", "meta.txt"} {
		p := filepath.Join(orig, name)
		require.NoError(t, os.Lchown(p, 1234, 2345))
		require.NoError(t, os.Chmod(p, 0o640))
		require.NoError(t, unix.Setxattr(p, "user.color", []byte("blue"), 0))
		require.NoError(t, unix.Setxattr(p, "user.empty", nil, 0))
		setTimes(t, p, pastTime)
	}
	originalGuard(t, orig)
	sb := mountSandbox(t, orig)

	// Through the mount, before any change, the file is the original.
	st := lstat(t, sb.path("data.txt"))
	assert.Equal(t, uint32(0o640), st.Mode&0o7777, "mode through the mount")
	assert.Equal(t, [2]uint32{1234, 2345}, [2]uint32{st.Uid, st.Gid}, "owner through the mount")
	assert.Equal(t, pastTime.UnixNano(), st.Mtim.Nano(), "mtime through the mount")
	assert.Equal(t, "blue", getxattr(t, sb.path("data.txt"), "user.color"))

	require.NoError(t, appendFile(sb.path("data.txt"), []byte("write 1\n")))
	up := sb.upperPath("data.txt")
	ust := lstat(t, up)
	assert.Equal(t, uint32(unix.S_IFREG|0o640), ust.Mode, "upper copy: type and mode")
	assert.Equal(t, [2]uint32{1234, 2345}, [2]uint32{ust.Uid, ust.Gid}, "upper copy: owner")
	assert.Equal(t, "blue", getxattr(t, up, "user.color"), "upper copy: user.color")
	assert.Equal(t, "", getxattr(t, up, "user.empty"), "upper copy: empty user.empty")

	require.NoError(t, appendFile(sb.path("data.txt"), []byte("write 2\n")))
	ust2 := lstat(t, up)
	assert.Equal(t, ust.Ino, ust2.Ino, "the second write copied the file up again")
	want := "original content\nwrite 1\nwrite 2\n"
	assert.Equal(t, want, mustRead(t, sb.path("data.txt")), "content through the mount")
	assert.Equal(t, want, mustRead(t, up), "content of the upper copy")
	st = lstat(t, sb.path("data.txt"))
	assert.Equal(t, uint32(0o640), st.Mode&0o7777, "mode through the mount after the writes")
	assert.Equal(t, [2]uint32{1234, 2345}, [2]uint32{st.Uid, st.Gid}, "owner through the mount after the writes")

	// A metadata-only copy-up keeps the content and the mtime too.
	require.NoError(t, unix.Setxattr(sb.path("meta.txt"), "user.added", []byte("1"), 0))
	mup := sb.upperPath("meta.txt")
	mst := lstat(t, mup)
	assert.Equal(t, pastTime.UnixNano(), mst.Mtim.Nano(), "mtime of a copy made for setxattr")
	assert.Equal(t, uint32(unix.S_IFREG|0o640), mst.Mode)
	assert.Equal(t, [2]uint32{1234, 2345}, [2]uint32{mst.Uid, mst.Gid})
	assert.Equal(t, "meta content\n", mustRead(t, mup))
	assert.Equal(t, "blue", getxattr(t, mup, "user.color"))
	assert.Equal(t, "1", getxattr(t, sb.path("meta.txt"), "user.added"))

	// Nothing else was copied up.
	_, err := os.Lstat(sb.upperPath("other"))
	assert.True(t, errors.Is(err, os.ErrNotExist), "an untouched directory was copied up: %v", err)
}

// TestInodeStability: st_ino stays through copy-up, chmod, truncate,
// rename and remount; hard links share it and count right; st_dev is the
// mount's.
func TestInodeStability(t *testing.T) {
	orig := newOrig(t, map[string]string{
		"a.txt":         "aaaa\n",
		"o.txt":         "o\n",
		"d/child.txt":   "child\n",
		"d/sub/g.txt":   "g\n",
		"keep/file.txt": "k\n",
	})
	originalGuard(t, orig)
	sb := mountSandbox(t, orig)
	ino := func(rel string) uint64 { st := lstat(t, sb.path(rel)); return st.Ino }

	a0 := ino("a.txt")
	require.NoError(t, appendFile(sb.path("a.txt"), []byte("more")))
	assert.Equal(t, a0, ino("a.txt"), "st_ino changed by the copy-up")
	require.NoError(t, os.Chmod(sb.path("a.txt"), 0o600))
	assert.Equal(t, a0, ino("a.txt"), "st_ino changed by chmod")
	require.NoError(t, os.Truncate(sb.path("a.txt"), 2))
	assert.Equal(t, a0, ino("a.txt"), "st_ino changed by truncate")
	require.NoError(t, os.Mkdir(sb.path("moved"), 0o755))
	require.NoError(t, os.Rename(sb.path("a.txt"), sb.path("moved/a2.txt")))
	assert.Equal(t, a0, ino("moved/a2.txt"), "st_ino changed by rename")

	d0, c0, g0 := ino("d"), ino("d/child.txt"), ino("d/sub/g.txt")
	require.NoError(t, os.Rename(sb.path("d"), sb.path("d2")))
	assert.Equal(t, d0, ino("d2"), "st_ino of a renamed original directory")
	assert.Equal(t, c0, ino("d2/child.txt"), "st_ino of a child of a renamed original directory")
	assert.Equal(t, g0, ino("d2/sub/g.txt"), "st_ino of a grandchild of a renamed original directory")

	require.NoError(t, os.WriteFile(sb.path("c.txt"), []byte("new"), 0o644))
	c1 := ino("c.txt")
	keep := ino("keep/file.txt")

	// Hard links made in the mount.
	require.NoError(t, os.WriteFile(sb.path("h1"), []byte("h"), 0o644))
	require.NoError(t, os.Link(sb.path("h1"), sb.path("h2")))
	h1, h2 := lstat(t, sb.path("h1")), lstat(t, sb.path("h2"))
	assert.Equal(t, h1.Ino, h2.Ino, "hard links have different st_ino")
	assert.Equal(t, [2]uint64{2, 2}, [2]uint64{uint64(h1.Nlink), uint64(h2.Nlink)}, "nlink of two hard links")
	o0 := ino("o.txt")
	require.NoError(t, os.Link(sb.path("o.txt"), sb.path("o-link")))
	ol, oo := lstat(t, sb.path("o-link")), lstat(t, sb.path("o.txt"))
	assert.Equal(t, [2]uint64{o0, o0}, [2]uint64{oo.Ino, ol.Ino}, "st_ino of an original file and its new hard link")
	assert.Equal(t, [2]uint64{2, 2}, [2]uint64{uint64(oo.Nlink), uint64(ol.Nlink)}, "nlink of an original file and its new hard link")
	require.NoError(t, os.Remove(sb.path("h2")))
	h1 = lstat(t, sb.path("h1"))
	assert.Equal(t, uint64(1), h1.Nlink, "nlink after unlinking one of two links")

	// st_dev: every object shows the mount's device.
	mst := lstat(t, sb.mnt)
	var ost unix.Stat_t
	require.NoError(t, unix.Stat(orig, &ost))
	assert.NotEqual(t, ost.Dev, mst.Dev, "the mount shows the original's st_dev")
	for _, rel := range []string{"moved/a2.txt", "d2", "d2/child.txt", "c.txt", "keep/file.txt", "h1"} {
		assert.Equal(t, mst.Dev, lstat(t, sb.path(rel)).Dev, "st_dev of %s", rel)
	}

	remount(t, sb)
	assert.Equal(t, a0, ino("moved/a2.txt"), "st_ino of a copied-up, renamed file after remount")
	assert.Equal(t, d0, ino("d2"), "st_ino of a renamed original directory after remount")
	assert.Equal(t, c0, ino("d2/child.txt"), "st_ino of a child of a renamed directory after remount")
	assert.Equal(t, c1, ino("c.txt"), "st_ino of a created file after remount")
	assert.Equal(t, keep, ino("keep/file.txt"), "st_ino of an untouched original file after remount")
	assert.Equal(t, h1.Ino, ino("h1"), "st_ino of a hard link after remount")
	ol, oo = lstat(t, sb.path("o-link")), lstat(t, sb.path("o.txt"))
	assert.Equal(t, [2]uint64{o0, o0}, [2]uint64{oo.Ino, ol.Ino}, "st_ino of a linked original after remount")
	assert.Equal(t, [2]uint64{2, 2}, [2]uint64{uint64(oo.Nlink), uint64(ol.Nlink)}, "nlink of a linked original after remount")
}

// TestOriginalHardLinksBreakOnCopyUp: the names of a file with several
// links in the original show one st_ino and the link count, but writing
// through one name copies that name up and breaks its link, as in kernel
// overlayfs without index=on: the other names, and a reader that has one
// of them open, go on showing the original content. A link made in the
// sandbox is one inode under both names. The commit gives the original
// what the mount showed.
func TestOriginalHardLinksBreakOnCopyUp(t *testing.T) {
	withAndWithoutPassthrough(t, testOriginalHardLinks)
}

func testOriginalHardLinks(t *testing.T, opts ...mountOption) {
	orig := newOrig(t, map[string]string{"a": "base\n", "d/keep": "k\n"})
	for _, name := range []string{"b", "d/c"} {
		require.NoError(t, os.Link(filepath.Join(orig, "a"), filepath.Join(orig, name)))
	}
	sb := mountSandbox(t, orig, opts...)
	a, b, c := lstat(t, sb.path("a")), lstat(t, sb.path("b")), lstat(t, sb.path("d/c"))
	assert.Equal(t, [3]uint64{a.Ino, a.Ino, a.Ino}, [3]uint64{a.Ino, b.Ino, c.Ino}, "st_ino of the links of an original file")
	assert.Equal(t, [3]uint64{3, 3, 3}, [3]uint64{uint64(a.Nlink), uint64(b.Nlink), uint64(c.Nlink)}, "nlink of the links of an original file")
	assert.Equal(t, "base\n", mustRead(t, sb.path("b")))
	reader, err := unix.Open(sb.path("b"), unix.O_RDONLY, 0)
	require.NoError(t, err)
	closeReader := sync.OnceFunc(func() { unix.Close(reader) })
	t.Cleanup(closeReader) // before the unmount

	require.NoError(t, appendFile(sb.path("a"), []byte("more\n")))
	check := func(when, wantB string) {
		t.Helper()
		for name, want := range map[string]string{"a": "base\nmore\n", "b": wantB, "d/c": "base\n"} {
			assert.Equal(t, want, mustRead(t, sb.path(name)), "content of %s %s", name, when)
		}
		assert.Equal(t, uint64(1), lstat(t, sb.path("a")).Nlink, "nlink of the copied-up a %s", when)
		assert.Equal(t, uint64(3), lstat(t, sb.path("d/c")).Nlink, "nlink of the untouched d/c (the original's) %s", when)
	}
	check("after a was written", "base\n")
	assert.Equal(t, "base\n", preadAll(t, reader), "a reader of b, after a was written")
	closeReader()

	// A link made in the sandbox to another name: one inode, both names.
	require.NoError(t, os.Link(sb.path("b"), sb.path("e")))
	require.NoError(t, appendFile(sb.path("e"), []byte("via e\n")))
	be, ee := lstat(t, sb.path("b")), lstat(t, sb.path("e"))
	assert.Equal(t, be.Ino, ee.Ino, "st_ino of b and its new link e")
	assert.Equal(t, [2]uint64{2, 2}, [2]uint64{uint64(be.Nlink), uint64(ee.Nlink)}, "nlink of b and its new link e")
	check("after a link to b was written", "base\nvia e\n")

	remount(t, sb)
	check("after a remount", "base\nvia e\n")
	be, ee = lstat(t, sb.path("b")), lstat(t, sb.path("e"))
	assert.Equal(t, be.Ino, ee.Ino, "st_ino of b and e after a remount")
	assert.NotEqual(t, be.Ino, lstat(t, sb.path("d/c")).Ino, "b (copied up) and d/c show one st_ino after a remount")

	// The commit replaces a and b in the original: d/c keeps the old
	// content (and is left the only link of its inode).
	requireCLI(t)
	r := sbxfsCLI(t, cliTimeout, "commit", sb.mnt)
	require.Equal(t, 0, r.code, "commit: %s", r)
	for name, want := range map[string]string{"a": "base\nmore\n", "b": "base\nvia e\n", "e": "base\nvia e\n", "d/c": "base\n"} {
		assert.Equal(t, want, mustRead(t, filepath.Join(orig, name)), "the original's %s after the commit", name)
	}
	ob, oe := lstat(t, filepath.Join(orig, "b")), lstat(t, filepath.Join(orig, "e"))
	assert.Equal(t, [2]uint64{ob.Ino, 2}, [2]uint64{oe.Ino, uint64(ob.Nlink)}, "the original's b and e after the commit: one file, two links")
}

// TestPartedLinkShowsItsOwnInode: a name of an original file with several
// links that a change copies up (chmod, setxattr, a write, a link, a
// rename) is a file of its own in the sandbox, and shows its own st_ino
// as soon as no descriptor holds it open, to the very next stat after the
// change, as in kernel overlayfs: before,
// it kept the original's number, shared with the names it was parted
// from, and cp(1) refused to copy one over the other ("are the same
// file"). Names the sandbox links stay one inode.
func TestPartedLinkShowsItsOwnInode(t *testing.T) {
	withAndWithoutPassthrough(t, testPartedLinks)
}

func testPartedLinks(t *testing.T, opts ...mountOption) {
	names := []string{"chmod", "xattr", "write", "link", "d/rename", "keep"}
	orig := newOrig(t, map[string]string{"chmod": "shared\n"})
	require.NoError(t, os.Mkdir(filepath.Join(orig, "d"), 0o755))
	for _, name := range names[1:] {
		require.NoError(t, os.Link(filepath.Join(orig, "chmod"), filepath.Join(orig, name)))
	}
	sb := mountSandbox(t, orig, opts...)
	keep := lstat(t, sb.path("keep"))
	for _, name := range names {
		assert.Equal(t, keep.Ino, lstat(t, sb.path(name)).Ino, "%s before any change", name)
	}
	// ownIno is the number name shows, which must be its own: asked
	// right after the change that parted it, while the kernel's entry of
	// the name may still be the node it had (reissue drops it from
	// another goroutine), so the old node must send the kernel on.
	ownIno := func(name string) uint64 {
		t.Helper()
		st := lstat(t, sb.path(name))
		assert.NotEqual(t, keep.Ino, st.Ino, "%s shows the st_ino of the names it was parted from", name)
		return st.Ino
	}
	seen := map[uint64]string{}
	parted := func(name string) {
		t.Helper()
		ino := ownIno(name)
		assert.NotContains(t, seen, ino, "%s has the number of %s", name, seen[ino])
		seen[ino] = name
	}

	require.NoError(t, os.Chmod(sb.path("chmod"), 0o600))
	parted("chmod")
	require.NoError(t, unix.Lsetxattr(sb.path("xattr"), "user.k", []byte("v"), 0))
	parted("xattr")
	_, closeF := openAppend(t, sb.path("write"), "more\n")
	// statx for the link count alone, as stat -c %h asks: the write made
	// only the size and times stale.
	var stx unix.Statx_t
	require.NoError(t, unix.Statx(unix.AT_FDCWD, sb.path("write"), unix.AT_SYMLINK_NOFOLLOW, unix.STATX_NLINK, &stx))
	assert.EqualValues(t, 1, stx.Nlink, "the link count of write, open after its copy-up")
	require.NoError(t, os.Link(sb.path("link"), sb.path("linked")))
	parted("link")
	require.NoError(t, os.Rename(sb.path("d/rename"), sb.path("renamed")))
	parted("renamed")
	link, linked := lstat(t, sb.path("link")), lstat(t, sb.path("linked"))
	assert.Equal(t, [2]uint64{link.Ino, 2}, [2]uint64{linked.Ino, uint64(linked.Nlink)}, "link and its new name linked: one inode, two links")

	// The written name is reissued at its last release, which the kernel
	// sends after close(2) returns.
	closeF()
	var ino uint64
	assert.Eventually(t, func() bool {
		ino = lstat(t, sb.path("write")).Ino
		return ino != keep.Ino
	}, 10*time.Second, 5*time.Millisecond, "write shows the st_ino of the names it was parted from")
	assert.NotContains(t, seen, ino, "write has the number of %s", seen[ino])
	assert.Equal(t, "shared\nmore\n", mustRead(t, sb.path("write")))
	st := lstat(t, sb.path("keep"))
	assert.Equal(t, [2]uint64{keep.Ino, 6}, [2]uint64{st.Ino, uint64(st.Nlink)}, "keep, untouched: the original's number and link count")

	// What a user runs into: cp over a parted name.
	cp := exec.Command("cp", "chmod", "keep")
	cp.Dir = sb.mnt
	out, err := cp.CombinedOutput()
	require.NoError(t, err, "cp chmod keep: %s", out)
	assert.Equal(t, "shared\n", mustRead(t, sb.path("keep")))
	assert.Equal(t, "shared\nmore\n", mustRead(t, sb.path("write")), "cp over keep reached write")
}

// TestPartedLinkHeldByAnOPathDescriptor: an O_PATH descriptor of a name
// of an original file with several links, opened before a chmod parts
// that name, holds the node the parting took away: fstat on it fails with
// ESTALE (as from NFS once a file is replaced; docs/design.md,
// "Departures"), while the name itself shows the copy, with the new mode
// and a number of its own.
func TestPartedLinkHeldByAnOPathDescriptor(t *testing.T) {
	orig := newOrig(t, map[string]string{"a": "shared\n"})
	require.NoError(t, os.Link(filepath.Join(orig, "a"), filepath.Join(orig, "b")))
	sb := mountSandbox(t, orig)
	b := lstat(t, sb.path("b"))
	fd, err := unix.Open(sb.path("a"), unix.O_PATH|unix.O_CLOEXEC, 0)
	require.NoError(t, err)
	defer unix.Close(fd)
	var st unix.Stat_t
	require.NoError(t, unix.Fstat(fd, &st))
	assert.Equal(t, b.Ino, st.Ino, "a and b before the chmod")

	require.NoError(t, os.Chmod(sb.path("a"), 0o600))
	a := lstat(t, sb.path("a"))
	assert.NotEqual(t, b.Ino, a.Ino, "a, parted, shows a number of its own")
	assert.Equal(t, uint32(0o600), a.Mode&0o7777)
	assert.ErrorIs(t, unix.Fstat(fd, &st), unix.ESTALE, "fstat of the O_PATH descriptor opened before the parting")
	assert.Equal(t, "shared\n", mustRead(t, sb.path("a")))
}

// TestPartingLinksUnderConcurrentStats: names of original files with
// several links are parted (chmod, a new link, a rename) while another
// thread stats and reads them without pause. The old node of a parted
// name sends a stat or open that still reaches it on with ESTALE, which
// the kernel answers by looking the name up again: none of that may reach
// the reader, as a stat or open that fails or a read of other content.
// (A name the reader holds open as it is parted keeps its node, and the
// original's number, until the last close: a chmodded or renamed one
// shows its own number then; a new link and its name stay one inode.)
func TestPartingLinksUnderConcurrentStats(t *testing.T) {
	const n = 60
	files := map[string]string{}
	for i := range n {
		files[fmt.Sprintf("f%d", i)] = fmt.Sprintf("content %d\n", i)
	}
	orig := newOrig(t, files)
	for i := range n {
		require.NoError(t, os.Link(filepath.Join(orig, fmt.Sprintf("f%d", i)), filepath.Join(orig, fmt.Sprintf("g%d", i))))
	}
	sb := mountSandbox(t, orig)
	g := make([]uint64, n)
	for i := range n {
		g[i] = lstat(t, sb.path(fmt.Sprintf("g%d", i))).Ino
	}
	// parted is the name of f<i> once parted: a rename gives another.
	parted := func(i int) string {
		if i%3 == 2 {
			return fmt.Sprintf("r%d", i)
		}
		return fmt.Sprintf("f%d", i)
	}
	var stop atomic.Bool
	var readerErr atomic.Value
	var reads atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for !stop.Load() {
			for i := range n {
				name := sb.path(fmt.Sprintf("f%d", i))
				if i%3 == 2 {
					continue // renamed: its old name goes away
				}
				var st unix.Stat_t
				if err := unix.Lstat(name, &st); err != nil {
					readerErr.CompareAndSwap(nil, fmt.Sprintf("lstat f%d: %v", i, err))
					return
				}
				data, err := os.ReadFile(name)
				if err != nil || string(data) != files[fmt.Sprintf("f%d", i)] {
					readerErr.CompareAndSwap(nil, fmt.Sprintf("read f%d: %q, %v", i, data, err))
					return
				}
				reads.Add(1)
			}
		}
	}()
	for i := range n {
		f := sb.path(fmt.Sprintf("f%d", i))
		switch i % 3 {
		case 0:
			require.NoError(t, os.Chmod(f, 0o600))
		case 1:
			require.NoError(t, os.Link(f, sb.path(fmt.Sprintf("h%d", i))))
		case 2:
			require.NoError(t, os.Rename(f, sb.path(parted(i))))
		}
		var st unix.Stat_t
		require.NoError(t, unix.Lstat(sb.path(parted(i)), &st), "%s right after it was parted", parted(i))
	}
	stop.Store(true)
	<-done
	if e := readerErr.Load(); e != nil {
		t.Errorf("the reader: %s", e)
	}
	t.Logf("%d stats and reads alongside", reads.Load())
	for i := range n {
		name := parted(i)
		if i%3 == 1 {
			f, h := lstat(t, sb.path(name)), lstat(t, sb.path(fmt.Sprintf("h%d", i)))
			assert.Equal(t, [2]uint64{f.Ino, 2}, [2]uint64{h.Ino, uint64(h.Nlink)}, "%s and its new link h%d (g%d: %#x)", name, i, i, g[i])
			continue
		}
		assert.Eventually(t, func() bool { return lstat(t, sb.path(name)).Ino != g[i] },
			10*time.Second, 5*time.Millisecond, "%s shows the number of g%d it was parted from", name, i)
		assert.Equal(t, files[fmt.Sprintf("f%d", i)], mustRead(t, sb.path(name)))
	}
}

// TestLookupInADirectoryChangedSinceItWasLookedUp: the server skips the
// upper layer when it looks a name up in a directory whose own lookup
// found nothing of it there (layers/dirgen.go). Directory d of the
// original is looked up and held open (so its node, and what it learnt,
// stays), then a change through the mount makes d's upper directory: a
// file made, one removed, one written. Once the kernel forgets d's
// children (drop_caches), looking them up again must find the sandbox's
// state, not the original's.
func TestLookupInADirectoryChangedSinceItWasLookedUp(t *testing.T) {
	orig := newOrig(t, map[string]string{"d/x": "x\n", "d/y": "y\n", "d/z": "z\n", "e/w": "w\n"})
	sb := mountSandbox(t, orig)
	for _, dir := range []string{"d", "e"} {
		f, err := os.Open(sb.path(dir))
		require.NoError(t, err)
		t.Cleanup(func() { f.Close() })
	}
	assert.Equal(t, "x\n", mustRead(t, sb.path("d/x")))
	assert.Equal(t, "w\n", mustRead(t, sb.path("e/w")))
	forget := func() {
		t.Helper()
		require.NoError(t, os.WriteFile("/proc/sys/vm/drop_caches", []byte("2"), 0))
	}
	gone := func(p, why string) {
		t.Helper()
		_, err := os.Lstat(sb.path(p))
		assert.ErrorIs(t, err, os.ErrNotExist, why)
	}

	// Changes in d alone: its upper directory is made by the first.
	require.NoError(t, os.WriteFile(sb.path("d/new"), []byte("new\n"), 0o644))
	require.NoError(t, os.Remove(sb.path("d/x")))
	require.NoError(t, os.WriteFile(sb.path("d/y"), []byte("changed\n"), 0o644))
	forget()
	assert.Equal(t, "new\n", mustRead(t, sb.path("d/new")), "a file made in d")
	gone("d/x", "d/x was removed in the sandbox")
	assert.Equal(t, "changed\n", mustRead(t, sb.path("d/y")))

	// A rename into e, which makes e's upper directory.
	require.NoError(t, os.Rename(sb.path("d/z"), sb.path("e/z")))
	forget()
	gone("d/z", "d/z was moved away")
	assert.Equal(t, "z\n", mustRead(t, sb.path("e/z")), "moved into e")
	assert.Equal(t, "w\n", mustRead(t, sb.path("e/w")))
	assert.Equal(t, "x\n", mustRead(t, filepath.Join(orig, "d/x")), "the original is untouched")
}

// TestOriginalLinkLookedUpAgainWhileOpen: a name of an original file with
// several links, open for writing (so copied up), gets a new link in the
// sandbox; the kernel forgets the new name's entry (drop_caches) and looks
// it up again, then the new name is renamed. The open name must still
// reach its file: the lookup gave the new name a node of its own, and the
// first name's node went on resolving through the new name (go-fuse kept
// it as a parent), so after the rename its stat failed with ENOENT
// (differential seed 377503685).
func TestOriginalLinkLookedUpAgainWhileOpen(t *testing.T) {
	withAndWithoutPassthrough(t, func(t *testing.T, opts ...mountOption) {
		orig := newOrig(t, map[string]string{"a": "base\n"})
		require.NoError(t, os.Link(filepath.Join(orig, "a"), filepath.Join(orig, "b")))
		sb := mountSandbox(t, orig, opts...)
		f, closeF := openAppend(t, sb.path("a"), "more\n")
		require.NoError(t, os.Link(sb.path("a"), sb.path("c")))
		require.NoError(t, os.WriteFile("/proc/sys/vm/drop_caches", []byte("2"), 0))
		lstat(t, sb.path("c"))
		require.NoError(t, os.Rename(sb.path("c"), sb.path("d")))
		require.NoError(t, os.WriteFile(sb.path("c"), []byte("another file\n"), 0o644))

		st := lstat(t, sb.path("a"))
		assert.EqualValues(t, 2, st.Nlink, "a and d are one file")
		_, err := f.WriteString("again\n")
		require.NoError(t, err)
		closeF()
		for name, want := range map[string]string{"a": "base\nmore\nagain\n", "d": "base\nmore\nagain\n", "b": "base\n", "c": "another file\n"} {
			assert.Equal(t, want, mustRead(t, sb.path(name)), name)
		}
		require.NoError(t, os.Chmod(sb.path("a"), 0o600))
		assert.EqualValues(t, 0o600, lstat(t, sb.path("d")).Mode&0o777, "a chmod through a reaches d, not c")
		assert.EqualValues(t, 0o644, lstat(t, sb.path("c")).Mode&0o777)
	})
}

// openAppend opens p for appending and writes data; the returned close
// runs once (at the latest when the test ends, before the unmount).
func openAppend(t *testing.T, p, data string) (*os.File, func()) {
	t.Helper()
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
	require.NoError(t, err)
	closeF := sync.OnceFunc(func() { f.Close() })
	t.Cleanup(closeF)
	_, err = f.WriteString(data)
	require.NoError(t, err)
	return f, closeF
}

// withAndWithoutPassthrough runs f as two subtests: mounts with FUSE
// passthrough for upper files (where the kernel has it), and without.
func withAndWithoutPassthrough(t *testing.T, f func(t *testing.T, opts ...mountOption)) {
	t.Run("passthrough", func(t *testing.T) { f(t) })
	t.Run("no passthrough", func(t *testing.T) { f(t, withNoPassthrough()) })
}

func preadAll(t testing.TB, fd int) string {
	t.Helper()
	var out []byte
	buf := make([]byte, 4096)
	for off := int64(0); ; {
		n, err := unix.Pread(fd, buf, off)
		require.NoError(t, err)
		if n == 0 {
			return string(out)
		}
		out = append(out, buf[:n]...)
		off += int64(n)
	}
}

// TestOpenFdSeesCopyUp: a descriptor opened read-only on an original file
// before the file is copied up reads what is written later (as on a plain
// filesystem); writes never reach the original, also through mmap.
func TestOpenFdSeesCopyUp(t *testing.T) {
	orig := newOrig(t, map[string]string{
		"f.txt":   "old content",
		"g.txt":   "old g content",
		"h.txt":   "old h content",
		"map.bin": strings.Repeat("o", 8192),
	})
	originalGuard(t, orig)
	withAndWithoutPassthrough(t, func(t *testing.T, opts ...mountOption) {
		testOpenFdSeesCopyUp(t, orig, mountSandbox(t, orig, opts...))
	})
}

func testOpenFdSeesCopyUp(t *testing.T, orig string, sb *sandbox) {
	t.Run("reader before a truncating writer", func(t *testing.T) {
		fd1, err := unix.Open(sb.path("f.txt"), unix.O_RDONLY, 0)
		require.NoError(t, err)
		defer unix.Close(fd1)
		assert.Equal(t, "old content", preadAll(t, fd1))
		require.NoError(t, os.WriteFile(sb.path("f.txt"), []byte("new content!"), 0o644))
		assert.Equal(t, "new content!", preadAll(t, fd1), "read through the descriptor opened before the copy-up")
		var st unix.Stat_t
		require.NoError(t, unix.Fstat(fd1, &st))
		assert.Equal(t, int64(12), st.Size, "fstat through the old descriptor")
	})
	t.Run("reader and writer open together", func(t *testing.T) {
		fd1, err := unix.Open(sb.path("g.txt"), unix.O_RDONLY, 0)
		require.NoError(t, err)
		defer unix.Close(fd1)
		assert.Equal(t, "old g content", preadAll(t, fd1))
		fd2, err := unix.Open(sb.path("g.txt"), unix.O_RDWR, 0)
		require.NoError(t, err)
		defer unix.Close(fd2)
		_, err = unix.Pwrite(fd2, []byte("NEW"), 0)
		require.NoError(t, err)
		assert.Equal(t, "NEW g content", preadAll(t, fd1), "reader sees the writer's bytes (writer still open)")
		assert.Equal(t, "NEW g content", preadAll(t, fd2))
		fd3, err := unix.Open(sb.path("g.txt"), unix.O_RDONLY, 0)
		require.NoError(t, err)
		defer unix.Close(fd3)
		assert.Equal(t, "NEW g content", preadAll(t, fd3), "a reader opened after the copy-up")
	})
	t.Run("writer first then reader then writer closes", func(t *testing.T) {
		fd2, err := unix.Open(sb.path("h.txt"), unix.O_WRONLY, 0)
		require.NoError(t, err)
		fd1, err := unix.Open(sb.path("h.txt"), unix.O_RDONLY, 0)
		require.NoError(t, err)
		defer unix.Close(fd1)
		_, err = unix.Pwrite(fd2, []byte("HHH"), 4)
		require.NoError(t, err)
		require.NoError(t, unix.Close(fd2))
		assert.Equal(t, "old HHHontent", preadAll(t, fd1), "reader opened after the copy-up, writer closed")
	})
	t.Run("mmap MAP_SHARED", func(t *testing.T) {
		for _, name := range []string{"map.bin", "new.bin"} {
			p := sb.path(name)
			fd, err := unix.Open(p, unix.O_RDWR|unix.O_CREAT, 0o644)
			require.NoError(t, err)
			require.NoError(t, unix.Ftruncate(fd, 8192))
			m, err := unix.Mmap(fd, 0, 8192, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
			require.NoError(t, err)
			copy(m[100:], "written through mmap")
			require.NoError(t, unix.Msync(m, unix.MS_SYNC))
			require.NoError(t, unix.Munmap(m))
			require.NoError(t, unix.Close(fd))
			got := mustRead(t, p)
			assert.Equal(t, "written through mmap", got[100:120], "%s: read(2) after an mmap write", name)
			assert.Len(t, got, 8192)
		}
		assert.Equal(t, strings.Repeat("o", 8192), mustRead(t, filepath.Join(orig, "map.bin")), "mmap write reached the original")
	})
}

// TestWhiteoutsAndOpaqueDirs checks the upper's kernel-overlayfs layout.
func TestWhiteoutsAndOpaqueDirs(t *testing.T) {
	orig := newOrig(t, map[string]string{
		"gone.txt":          "gone",
		"tree/a.txt":        "a",
		"tree/sub/b.txt":    "b",
		"moved/x.txt":       "x",
		"moved/deep/y.txt":  "y",
		"moved/.hidden":     "h",
		"moved/deep/z/zz/w": "w",
	})
	originalGuard(t, orig)
	sb := mountSandbox(t, orig)
	xp := sb.xattrPrefix()

	require.NoError(t, os.Remove(sb.path("gone.txt")))
	assert.True(t, isWhiteout(t, sb.upperPath("gone.txt")), "deleting an original file leaves no char 0/0 whiteout")
	_, err := os.Lstat(sb.path("gone.txt"))
	assert.True(t, errors.Is(err, os.ErrNotExist), "deleted file still visible: %v", err)

	require.NoError(t, os.RemoveAll(sb.path("tree")))
	require.NoError(t, os.Mkdir(sb.path("tree"), 0o755))
	assert.Empty(t, listDir(t, sb.path("tree")), "old children visible in a re-created directory")
	out, err := runTimeout(10*time.Second, "getfattr", "-n", xp+"opaque", "--only-values", "--absolute-names", sb.upperPath("tree"))
	assert.NoError(t, err, "getfattr %sopaque: %s", xp, out)
	assert.Equal(t, "y", string(out), "opaque mark of the re-created directory")
	_, err = os.Lstat(sb.path("tree/a.txt"))
	assert.True(t, errors.Is(err, os.ErrNotExist), "old child reachable by name: %v", err)

	require.NoError(t, os.Rename(sb.path("moved"), sb.path("renamed")))
	assert.Equal(t, []string{".hidden", "deep", "x.txt"}, listDir(t, sb.path("renamed")))
	assert.Equal(t, "y", mustRead(t, sb.path("renamed/deep/y.txt")))
	assert.Equal(t, "w", mustRead(t, sb.path("renamed/deep/z/zz/w")))
	_, err = os.Lstat(sb.path("moved"))
	assert.True(t, errors.Is(err, os.ErrNotExist), "old name still visible: %v", err)
	assert.Equal(t, "/moved", getxattr(t, sb.upperPath("renamed"), xp+"redirect"), "redirect of the renamed directory")
	ents, err := os.ReadDir(sb.upperPath("renamed"))
	require.NoError(t, err)
	assert.Empty(t, ents, "the children of a renamed original directory were copied into the upper")
	assert.True(t, isWhiteout(t, sb.upperPath("moved")), "no whiteout at the old name of the renamed directory")
}

// TestNoWhiteoutMadeThroughTheMount: a character device 0/0 is how the
// upper records a removal, so one made through the mount would read back
// as a removal: the name gone, or the original's object there hidden.
// Kernel overlayfs refuses to make one: mknod(2) of it gives EPERM,
// renameat2(2) with RENAME_WHITEOUT EINVAL. So does a sandbox, for a new
// name and over an original's, and nothing changes; another device, a
// rename without the flag, still work.
func TestNoWhiteoutMadeThroughTheMount(t *testing.T) {
	orig := newOrig(t, map[string]string{"a": "a", "b": "b"})
	originalGuard(t, orig)
	sb := mountSandbox(t, orig)
	ovl := mountOverlay(t, copyTree(t, orig))
	for _, root := range []string{ovl, sb.mnt} {
		assert.Equal(t, unix.EPERM, unix.Mknod(filepath.Join(root, "w"), unix.S_IFCHR|0o600, 0), "%s: mknod c 0 0", root)
		assert.Equal(t, unix.EINVAL, unix.Renameat2(unix.AT_FDCWD, filepath.Join(root, "a"), unix.AT_FDCWD, filepath.Join(root, "c"), unix.RENAME_WHITEOUT),
			"%s: rename with RENAME_WHITEOUT", root)
		assert.Equal(t, unix.EINVAL, unix.Renameat2(unix.AT_FDCWD, filepath.Join(root, "a"), unix.AT_FDCWD, filepath.Join(root, "b"), unix.RENAME_WHITEOUT),
			"%s: rename over an original's name with RENAME_WHITEOUT", root)
		assert.Equal(t, []string{"a", "b"}, listDir(t, root), root)
		assert.Equal(t, "b", mustRead(t, filepath.Join(root, "b")), root)
	}
	require.NoError(t, unix.Mknod(sb.path("null"), unix.S_IFCHR|0o600, int(unix.Mkdev(1, 3))))
	require.NoError(t, unix.Renameat2(unix.AT_FDCWD, sb.path("a"), unix.AT_FDCWD, sb.path("c"), unix.RENAME_NOREPLACE))
	assert.Equal(t, []string{"b", "c", "null"}, listDir(t, sb.mnt))
}

// TestKernelOverlayReadsUpper: after unmounting, kernel overlayfs mounts
// the same original and upper and shows the tree the sbxfs mount showed.
func TestKernelOverlayReadsUpper(t *testing.T) {
	orig := newOrig(t, map[string]string{
		"keep.txt":           "keep",
		"mod.txt":            "modify me",
		"del.txt":            "delete me",
		"deldir/a":           "a",
		"deldir/b/c":         "c",
		"recreate/old1":      "1",
		"recreate/sub/old2":  "2",
		"mvdir/child":        "child",
		"mvdir/sub/grand":    "grand",
		"mvfile.txt":         "mv",
		"meta.txt":           "meta",
		"link":               "->keep.txt",
		"nested/deep/f.txt":  "deep",
		"nested/deep/g.txt":  "g",
		"nested/other/h.txt": "h",
	})
	require.NoError(t, unix.Setxattr(filepath.Join(orig, "meta.txt"), "user.orig", []byte("o"), 0))
	originalGuard(t, orig)
	sb := mountSandbox(t, orig)
	m := sb.path
	require.NoError(t, appendFile(m("mod.txt"), []byte(" - modified")))
	require.NoError(t, os.Remove(m("del.txt")))
	require.NoError(t, os.RemoveAll(m("deldir")))
	require.NoError(t, os.RemoveAll(m("recreate")))
	require.NoError(t, os.MkdirAll(m("recreate/sub"), 0o755))
	require.NoError(t, os.WriteFile(m("recreate/new"), []byte("new"), 0o644))
	require.NoError(t, os.Rename(m("mvdir"), m("mvdir2")))
	require.NoError(t, os.Rename(m("mvfile.txt"), m("nested/mvfile.txt")))
	require.NoError(t, os.Chmod(m("meta.txt"), 0o600))
	require.NoError(t, unix.Setxattr(m("meta.txt"), "user.new", []byte("n"), 0))
	require.NoError(t, os.Remove(m("nested/deep/g.txt")))
	require.NoError(t, os.WriteFile(m("nested/deep/new.txt"), []byte("n"), 0o640))
	require.NoError(t, os.MkdirAll(m("newdir/x/y"), 0o750))
	require.NoError(t, os.Symlink("../keep.txt", m("newdir/ln")))
	require.NoError(t, os.Link(m("newdir/../keep.txt"), m("newdir/hard")))
	require.NoError(t, unix.Mkfifo(m("newdir/fifo"), 0o600))
	want := mustWalk(t, sb.mnt, viewOpts)
	require.NoError(t, sb.stop(), "unmount sbxfs")

	kwork := filepath.Join(sb.state, "kernel-work")
	require.NoError(t, os.Mkdir(kwork, 0o700))
	kmnt := filepath.Join(t.TempDir(), "kmnt")
	require.NoError(t, os.Mkdir(kmnt, 0o755))
	registerMount(kmnt)
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", orig, sb.upper, kwork)
	if p, err := os.ReadFile("/sys/module/overlay/parameters/redirect_dir"); err == nil && strings.TrimSpace(string(p)) != "Y" {
		// The kernel follows redirects only when asked here.
		opts += ",redirect_dir=on"
	}
	out, err := runTimeout(20*time.Second, "mount", "-t", "overlay", "overlay", "-o", opts, kmnt)
	if err != nil {
		if _, serr := os.Stat("/sys/module/overlay"); serr != nil {
			t.Skipf("kernel overlayfs is not available: %v %s", err, out)
		}
		t.Fatalf("mount -t overlay -o %s: %v %s", opts, err, out)
	}
	t.Cleanup(func() {
		if out, err := runTimeout(20*time.Second, "umount", kmnt); err != nil {
			t.Errorf("umount %s: %v %s", kmnt, err, out)
			_, _ = runTimeout(10*time.Second, "umount", "-l", kmnt)
		}
	})
	t.Logf("mount -t overlay -o %s", opts)
	got := mustWalk(t, kmnt, viewOpts)
	if d := diffTrees(want, got, 40); len(d) > 0 {
		t.Errorf("kernel overlayfs shows another tree than the sbxfs mount did (want = sbxfs):\n  %s", strings.Join(d, "\n  "))
	}
}

// TestSeveralLowers: a stack of two read-only layers; the upper layer of
// the stack (the original) hides a file of the lower one with a whiteout
// and a directory's contents with an opaque mark.
func TestSeveralLowers(t *testing.T) {
	lower2 := newOrig(t, map[string]string{
		"only2.txt":  "from lower 2",
		"gone.txt":   "hidden by a whiteout",
		"op/x.txt":   "hidden by an opaque dir",
		"m/b.txt":    "b from lower 2",
		"shadow.txt": "lower 2 version",
	})
	orig := newOrig(t, map[string]string{
		"op/y.txt":   "y",
		"m/a.txt":    "a",
		"shadow.txt": "original version",
	})
	require.NoError(t, unix.Mknod(filepath.Join(orig, "gone.txt"), unix.S_IFCHR, 0))
	require.NoError(t, unix.Lsetxattr(filepath.Join(orig, "op"), "trusted.overlay.opaque", []byte("y"), 0))

	check := func(t *testing.T, ls func(string) ([]string, error), read func(string) (string, error)) {
		names, err := ls("")
		require.NoError(t, err)
		assert.Equal(t, []string{"m", "only2.txt", "op", "shadow.txt"}, names, "root listing")
		names, err = ls("op")
		require.NoError(t, err)
		assert.Equal(t, []string{"y.txt"}, names, "opaque dir listing")
		names, err = ls("m")
		require.NoError(t, err)
		assert.Equal(t, []string{"a.txt", "b.txt"}, names, "merged dir listing")
		for p, want := range map[string]string{"only2.txt": "from lower 2", "shadow.txt": "original version", "m/b.txt": "b from lower 2"} {
			got, err := read(p)
			require.NoError(t, err, p)
			assert.Equal(t, want, got, p)
		}
		for _, p := range []string{"gone.txt", "op/x.txt"} {
			_, err := read(p)
			assert.True(t, errors.Is(err, unix.ENOENT), "%s: want ENOENT, got %v", p, err)
		}
	}

	t.Run("mount", func(t *testing.T) {
		originalGuard(t, orig)
		originalGuard(t, lower2)
		sb := mountSandbox(t, orig, withLowers(lower2))
		check(t, func(rel string) ([]string, error) {
			ents, err := os.ReadDir(sb.path(rel))
			var n []string
			for _, e := range ents {
				n = append(n, e.Name())
			}
			slices.Sort(n)
			return n, err
		}, func(rel string) (string, error) {
			b, err := os.ReadFile(sb.path(rel))
			return string(b), err
		})
		require.NoError(t, appendFile(sb.path("only2.txt"), []byte("+")))
		assert.Equal(t, "from lower 2+", mustRead(t, sb.upperPath("only2.txt")), "copy-up from the second lower")
		require.NoError(t, os.Remove(sb.path("m/b.txt")))
		assert.Equal(t, []string{"a.txt"}, listDir(t, sb.path("m")))
		assert.True(t, isWhiteout(t, sb.upperPath("m/b.txt")), "whiteout for a file of the second lower")
		require.NoError(t, os.Mkdir(sb.path("gone.txt"), 0o755), "mkdir over a lower whiteout")
		assert.Empty(t, listDir(t, sb.path("gone.txt")))
	})
	t.Run("layers.Open", func(t *testing.T) {
		// The same stack without a mount, through the layers API.
		checkLayersStack(t, orig, lower2, check)
	})
}

// TestUpperAsLower: the upper of a sandbox whose directories were renamed
// (redirects), used as the top lower layer of another sandbox, shows what
// the first sandbox showed, as kernel overlayfs shows that stack; the
// second sandbox's status and diff compare with that view (the patch
// applies to a copy of it), and its commit is refused, clearly, with
// nothing changed: no one directory holds its original.
func TestUpperAsLower(t *testing.T) {
	requireCLI(t)
	orig := newOrig(t, map[string]string{
		"d2/x": "x\n", "d2/sub/y": "y\n", "e/z": "z\n", "m/b.txt": "b\n", "only.txt": "o\n", "keep": "k\n",
	})
	originalGuard(t, orig)
	first := mountSandbox(t, orig)
	require.NoError(t, os.Rename(first.path("d2"), first.path("d3")))
	require.NoError(t, os.Rename(first.path("e"), first.path("d3/e")))
	require.NoError(t, os.WriteFile(first.path("d3/new"), []byte("n\n"), 0o644))
	require.NoError(t, os.Remove(first.path("m/b.txt")))
	want := mustWalk(t, first.mnt, viewOpts)
	plain := filepath.Join(t.TempDir(), "plain")
	out, err := exec.Command("cp", "-a", first.mnt, plain).CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.NoError(t, first.stop(), "unmount the first sandbox")
	originalGuard(t, first.upper)

	// The mount-helper form takes several lower layers.
	dir := t.TempDir()
	mnt, upper, work := filepath.Join(dir, "mnt"), filepath.Join(dir, "upper"), filepath.Join(dir, "work")
	for _, d := range []string{mnt, upper, work} {
		require.NoError(t, os.Mkdir(d, 0o700))
	}
	registerMount(mnt)
	lowers := first.upper + ":" + orig
	m := sbxfsCLI(t, 30*time.Second, "sbxfs", mnt, "-o", "lowerdir="+lowers+",upperdir="+upper+",workdir="+work)
	require.Equal(t, 0, m.code, "%s", m)
	t.Cleanup(func() {
		if out, err := runTimeout(20*time.Second, "umount", mnt); err != nil {
			t.Errorf("umount %s: %v %s", mnt, err, out)
			_, _ = runTimeout(10*time.Second, "umount", "-l", mnt)
		}
	})
	path := func(rel string) string { return filepath.Join(mnt, rel) }
	assertSameTree(t, want, mustWalk(t, mnt, viewOpts), "the stack (want = the first sandbox's view)")

	kmnt := filepath.Join(t.TempDir(), "kmnt")
	require.NoError(t, os.Mkdir(kmnt, 0o755))
	registerMount(kmnt)
	opts := fmt.Sprintf("lowerdir=%s:%s,redirect_dir=follow", first.upper, orig)
	if out, err := runTimeout(20*time.Second, "mount", "-t", "overlay", "overlay", "-o", opts, kmnt); err != nil {
		t.Errorf("mount -t overlay -o %s: %v %s", opts, err, out)
	} else {
		assertSameTree(t, mustWalk(t, mnt, viewOpts), mustWalk(t, kmnt, viewOpts), "kernel overlayfs over the same stack (want = sbxfs)")
		if out, err := runTimeout(20*time.Second, "umount", kmnt); err != nil {
			t.Errorf("umount %s: %v %s", kmnt, err, out)
		}
	}

	require.NoError(t, appendFile(path("d3/x"), []byte("more\n")))
	require.NoError(t, os.Remove(path("d3/e/z")))
	require.NoError(t, os.Remove(path("only.txt")))
	require.NoError(t, os.Rename(path("d3"), path("d4")))
	st := sbxfsCLI(t, 30*time.Second, "status", mnt)
	require.Equal(t, 0, st.code, "%s", st)
	assert.Equal(t, "D d3/e/z\nR d3 -> d4\nM d4/x\nD only.txt\n4 changes: 1 modified, 2 deleted, 1 renamed\n", st.stdout)

	d := sbxfsCLI(t, 30*time.Second, "diff", "--binary", mnt)
	require.Equal(t, 0, d.code, "%s", d)
	require.NoError(t, gitView(plain))
	apply := exec.Command("git", "apply", "-")
	apply.Dir, apply.Stdin = plain, strings.NewReader(d.stdout)
	out, err = apply.CombinedOutput()
	require.NoError(t, err, "git apply of the diff to a copy of the stack's view: %s\n%s", out, d.stdout)
	gotFiles, err := gitFiles(plain)
	require.NoError(t, err)
	wantFiles, err := gitFiles(mnt)
	require.NoError(t, err)
	assert.Equal(t, wantFiles, gotFiles, "the patched copy (want = the mount)")

	before := mustWalk(t, mnt, viewOpts)
	c := sbxfsCLI(t, 30*time.Second, "commit", mnt)
	assertCleanCLIError(t, c, exitBadPathCode)
	assert.Contains(t, c.stderr, "several lower layers cannot be committed")
	assert.Contains(t, c.stderr, "lowerdir="+upper+":"+lowers, "says how to stack the changes")
	assertSameTree(t, before, mustWalk(t, mnt, viewOpts), "the mount after the refused commit")
}

// TestKernelUpperAsLower: an upper kernel overlayfs made (redirect_dir=on),
// with a directory renamed in its parent (a relative redirect), one
// renamed inside a moved directory and one moved into a new directory (an
// absolute redirect), serves as the top lower layer of an sbxfs mount,
// which shows what kernel overlayfs shows over the same stack.
func TestKernelUpperAsLower(t *testing.T) {
	orig := newOrig(t, map[string]string{"d/x": "x", "e/sub/y": "y", "e/z": "z", "keep": "k"})
	originalGuard(t, orig)
	dir := t.TempDir()
	kupper, kwork, kmnt := filepath.Join(dir, "kupper"), filepath.Join(dir, "kwork"), filepath.Join(dir, "kmnt")
	for _, d := range []string{kupper, kwork, kmnt} {
		require.NoError(t, os.Mkdir(d, 0o755))
	}
	registerMount(kmnt)
	mountKernel := func(opts string) bool {
		t.Helper()
		out, err := runTimeout(20*time.Second, "mount", "-t", "overlay", "overlay", "-o", opts, kmnt)
		if err != nil {
			if _, serr := os.Stat("/sys/module/overlay"); serr != nil {
				t.Skipf("kernel overlayfs is not available: %v %s", err, out)
			}
			t.Fatalf("mount -t overlay -o %s: %v %s", opts, err, out)
		}
		return true
	}
	umountKernel := func() {
		t.Helper()
		if out, err := runTimeout(20*time.Second, "umount", kmnt); err != nil {
			_, _ = runTimeout(10*time.Second, "umount", "-l", kmnt)
			t.Fatalf("umount %s: %v %s", kmnt, err, out)
		}
	}
	mountKernel(fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s,redirect_dir=on,index=off", orig, kupper, kwork))
	require.NoError(t, os.Rename(filepath.Join(kmnt, "d"), filepath.Join(kmnt, "d2")))
	require.NoError(t, os.Rename(filepath.Join(kmnt, "e/sub"), filepath.Join(kmnt, "e/sub2")))
	require.NoError(t, os.Mkdir(filepath.Join(kmnt, "g"), 0o755))
	require.NoError(t, os.Rename(filepath.Join(kmnt, "e"), filepath.Join(kmnt, "g/e")))
	umountKernel()
	r, err := fsutil.LGetXattr(filepath.Join(kupper, "d2"), "trusted.overlay.redirect")
	require.NoError(t, err)
	require.Equal(t, "d", string(r), "kernel overlayfs wrote a relative redirect")

	mountKernel(fmt.Sprintf("lowerdir=%s:%s,redirect_dir=follow", kupper, orig))
	want := mustWalk(t, kmnt, viewOpts)
	umountKernel()
	for _, p := range []string{"d2/x", "g/e/sub2/y", "g/e/z"} {
		require.Contains(t, want, p, "kernel overlayfs shows it")
	}
	sb := mountSandbox(t, kupper, withLowers(orig))
	assertSameTree(t, want, mustWalk(t, sb.mnt, viewOpts), "sbxfs over the stack (want = kernel overlayfs over it)")
}

// TestKernelUpperAsUpper: an upper kernel overlayfs made, with a
// directory renamed in its parent (a relative redirect: the old name)
// and one renamed inside it, serves as the upper of an sbxfs mount (the
// mount-helper form), which shows what kernel overlayfs shows: until
// 2026-11-27 sbxfs ignored a relative redirect in the upper, and both
// renamed directories showed empty. A rename in sbxfs carries them on.
func TestKernelUpperAsUpper(t *testing.T) {
	orig := newOrig(t, map[string]string{"d/x": "x", "d/sub/y": "y", "e/z": "z"})
	originalGuard(t, orig)
	dir := t.TempDir()
	kupper, kwork, kmnt, mnt, work := filepath.Join(dir, "kupper"), filepath.Join(dir, "kwork"), filepath.Join(dir, "kmnt"), filepath.Join(dir, "mnt"), filepath.Join(dir, "work")
	for _, d := range []string{kupper, kwork, kmnt, mnt, work} {
		require.NoError(t, os.Mkdir(d, 0o700))
	}
	registerMount(kmnt)
	registerMount(mnt)
	kopts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s,redirect_dir=on,index=off", orig, kupper, kwork)
	kernel := func(do func()) {
		t.Helper()
		if out, err := runTimeout(20*time.Second, "mount", "-t", "overlay", "overlay", "-o", kopts, kmnt); err != nil {
			if _, serr := os.Stat("/sys/module/overlay"); serr != nil {
				t.Skipf("kernel overlayfs is not available: %v %s", err, out)
			}
			t.Fatalf("mount -t overlay -o %s: %v %s", kopts, err, out)
		}
		defer func() {
			if out, err := runTimeout(20*time.Second, "umount", kmnt); err != nil {
				_, _ = runTimeout(10*time.Second, "umount", "-l", kmnt)
				t.Fatalf("umount %s: %v %s", kmnt, err, out)
			}
		}()
		do()
	}
	var want map[string]nodeInfo
	kernel(func() {
		require.NoError(t, os.Rename(filepath.Join(kmnt, "d"), filepath.Join(kmnt, "d2")))
		require.NoError(t, os.Rename(filepath.Join(kmnt, "d2/sub"), filepath.Join(kmnt, "d2/sub2")))
		want = mustWalk(t, kmnt, viewOpts)
	})
	r, err := fsutil.LGetXattr(filepath.Join(kupper, "d2"), "trusted.overlay.redirect")
	require.NoError(t, err)
	require.Equal(t, "d", string(r), "kernel overlayfs wrote a relative redirect")
	require.Contains(t, want, "d2/sub2/y", "kernel overlayfs shows it")

	m := sbxfsCLI(t, 30*time.Second, "sbxfs", mnt, "-o", "lowerdir="+orig+",upperdir="+kupper+",workdir="+work)
	require.Equal(t, 0, m.code, "%s", m)
	unmounted := false
	t.Cleanup(func() {
		if unmounted {
			return
		}
		if out, err := runTimeout(20*time.Second, "umount", mnt); err != nil {
			t.Errorf("umount %s: %v %s", mnt, err, out)
			_, _ = runTimeout(10*time.Second, "umount", "-l", mnt)
		}
	})
	assertSameTree(t, want, mustWalk(t, mnt, viewOpts), "sbxfs over kernel overlayfs's upper (want = kernel overlayfs)")
	assert.Equal(t, "y", mustRead(t, filepath.Join(mnt, "d2/sub2/y")))
	require.NoError(t, os.Rename(filepath.Join(mnt, "d2"), filepath.Join(mnt, "e/d3")))
	assert.Equal(t, "y", mustRead(t, filepath.Join(mnt, "e/d3/sub2/y")), "moved on by sbxfs")
	assert.Equal(t, "x", mustRead(t, filepath.Join(mnt, "e/d3/x")))
	want = mustWalk(t, mnt, viewOpts)
	out, err := runTimeout(20*time.Second, "umount", mnt)
	require.NoError(t, err, "umount: %s", out)
	unmounted = true
	kernel(func() {
		assertSameTree(t, want, mustWalk(t, kmnt, viewOpts), "kernel overlayfs over the upper sbxfs changed (want = sbxfs)")
	})
}

// TestRenameOverDeletedName: a name whose original object was deleted is
// free: renaming a directory (or a file) to it works, as on a plain
// filesystem (`rm -rf build && mv build.new build`).
func TestRenameOverDeletedName(t *testing.T) {
	orig := newOrig(t, map[string]string{
		"build/out.o": "o", "build/sub/x": "x", "old.txt": "old", "f.txt": "f", "keep/k": "k",
	})
	originalGuard(t, orig)
	sb := mountSandbox(t, orig)
	require.NoError(t, os.RemoveAll(sb.path("build")))
	require.NoError(t, os.MkdirAll(sb.path("build.new/sub"), 0o755))
	require.NoError(t, os.WriteFile(sb.path("build.new/sub/y"), []byte("y"), 0o644))
	assert.NoError(t, os.Rename(sb.path("build.new"), sb.path("build")), "rename a new directory to a deleted directory's name")
	assert.Equal(t, []string{"sub"}, listDir(t, sb.path("build")))

	require.NoError(t, os.Remove(sb.path("old.txt")))
	require.NoError(t, os.Mkdir(sb.path("newdir"), 0o755))
	assert.NoError(t, os.Rename(sb.path("newdir"), sb.path("old.txt")), "rename a new directory to a deleted file's name")

	require.NoError(t, os.Remove(sb.path("f.txt")))
	assert.NoError(t, os.Rename(sb.path("keep"), sb.path("f.txt")), "rename an original directory to a deleted file's name")
	assert.Equal(t, "k", mustRead(t, sb.path("f.txt/k")))
}

// TestCopyUpKeepsParentTimes: copying a file up must not change the
// modification time of its directories (kernel overlayfs restores them);
// on a plain filesystem writing to a file leaves its directory alone.
func TestCopyUpKeepsParentTimes(t *testing.T) {
	orig := newOrig(t, map[string]string{"d/sub/f": "f", "d/sub/g": "g", "e/h": "h"})
	for _, p := range []string{"d/sub/f", "d/sub/g", "e/h", "d/sub", "d", "e", ""} {
		setTimes(t, filepath.Join(orig, p), pastTime)
	}
	originalGuard(t, orig)
	sb := mountSandbox(t, orig)
	require.NoError(t, appendFile(sb.path("d/sub/f"), []byte("+")))             // data copy-up
	require.NoError(t, unix.Setxattr(sb.path("e/h"), "user.x", []byte("1"), 0)) // metadata copy-up
	remount(t, sb)                                                              // no attribute cached by the kernel
	for _, p := range []string{"", "d", "d/sub", "e"} {
		st := lstat(t, sb.path(p))
		assert.Equal(t, pastTime.UnixNano(), st.Mtim.Nano(), "mtime of directory %q after a copy-up beneath it: %v",
			p, time.Unix(st.Mtim.Sec, st.Mtim.Nsec).UTC())
	}
	g, h := lstat(t, sb.path("d/sub/g")), lstat(t, sb.path("e/h"))
	assert.Equal(t, pastTime.UnixNano(), g.Mtim.Nano(), "mtime of an untouched sibling")
	assert.Equal(t, pastTime.UnixNano(), h.Mtim.Nano(), "mtime of a file after setxattr")
}
