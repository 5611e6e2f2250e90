package tests

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// readNames reads directory entries from fd with getdents into a small
// buffer, at most max names (all when max < 0), leaving out "." and "..".
func readNames(t *testing.T, fd int, max int) []string {
	t.Helper()
	var names []string
	buf := make([]byte, 512) // a few entries a call: many READDIRs
	for max < 0 || len(names) < max {
		n, err := unix.Getdents(fd, buf)
		if err != nil {
			t.Fatalf("getdents: %v", err)
		}
		if n == 0 {
			break
		}
		_, _, got := unix.ParseDirent(buf[:n], -1, nil)
		names = append(names, got...)
	}
	return names
}

// TestReaddirOffsetsAcrossChanges checks what the kernel's listing cache
// relies on: a directory offset means the same position in every handle,
// before and after other names change. A reader that stops, has its
// offset carried to a new handle (telldir/seekdir), and goes on after
// names before and after it were removed and added, sees every unchanged
// name exactly once; and a listing made after all that is exactly right.
func TestReaddirOffsetsAcrossChanges(t *testing.T) {
	files := map[string]string{}
	for i := range 300 {
		files[fmt.Sprintf("d/low%03d", i)] = "x"
	}
	sb := mountSandbox(t, newOrig(t, files))
	dir := filepath.Join(sb.mnt, "d")
	for i := range 300 {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("up%03d", i)), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want := map[string]bool{}
	for i := range 300 {
		want[fmt.Sprintf("low%03d", i)] = true
		want[fmt.Sprintf("up%03d", i)] = true
	}

	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	first := readNames(t, fd, 200)
	off, err := unix.Seek(fd, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	unix.Close(fd)

	// Change names on both sides of the reader's position: every third
	// name goes (lower ones become whiteouts), new ones come.
	gone := map[string]bool{}
	all := make([]string, 0, len(want))
	for n := range want {
		all = append(all, n)
	}
	sort.Strings(all)
	for i, n := range all {
		if i%3 == 0 {
			if err := os.Remove(filepath.Join(dir, n)); err != nil {
				t.Fatal(err)
			}
			gone[n] = true
			delete(want, n)
		}
	}
	for i := range 100 {
		n := fmt.Sprintf("new%03d", i)
		if err := os.WriteFile(filepath.Join(dir, n), nil, 0o644); err != nil {
			t.Fatal(err)
		}
		want[n] = true
	}

	fd, err = unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if _, err := unix.Seek(fd, off, 0); err != nil {
		t.Fatal(err)
	}
	rest := readNames(t, fd, -1)
	seen := map[string]int{}
	for _, n := range append(first, rest...) {
		seen[n]++
	}
	for n := range want {
		if seen[n] > 1 {
			t.Errorf("%s listed %d times", n, seen[n])
		}
		if !strings.HasPrefix(n, "new") && seen[n] != 1 {
			t.Errorf("unchanged name %s listed %d times, want once", n, seen[n])
		}
	}
	for _, n := range rest {
		if gone[n] {
			t.Errorf("%s listed after it was removed", n)
		}
	}

	// A new listing (served by the kernel's cache or by sbxfs) is exact.
	for round := range 2 {
		ents, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]bool{}
		for _, e := range ents {
			got[e.Name()] = true
		}
		for n := range want {
			if !got[n] {
				t.Errorf("listing %d: %s missing", round, n)
			}
		}
		for n := range got {
			if !want[n] {
				t.Errorf("listing %d: %s should not be there", round, n)
			}
		}
	}
}

// TestSetgidDirInheritance: a directory made in a setgid directory gets
// its group and its setgid bit, as on ext4, also when it replaces a
// removed original directory (made elsewhere and moved into place); a
// file, a FIFO, a symlink and a file made with O_TMPFILE and linked in get
// its group.
func TestSetgidDirInheritance(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to give the original a group")
	}
	orig := newOrig(t, map[string]string{"g/d/file": "x"})
	if err := os.Chown(filepath.Join(orig, "g"), 0, 100); err != nil {
		t.Fatal(err)
	}
	if err := unix.Chmod(filepath.Join(orig, "g"), 0o2775); err != nil {
		t.Fatal(err)
	}
	sb := mountSandbox(t, orig)
	g := filepath.Join(sb.mnt, "g")
	if err := os.RemoveAll(filepath.Join(g, "d")); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"d", "e"} {
		p := filepath.Join(g, name)
		if err := unix.Mkdir(p, 0o755); err != nil {
			t.Fatal(err)
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			t.Fatal(err)
		}
		if st.Mode&unix.S_ISGID == 0 || st.Gid != 100 {
			t.Errorf("%s: mode %o gid %d, want the setgid bit and gid 100", name, st.Mode&0o7777, st.Gid)
		}
	}
	tmp, err := unix.Open(g, unix.O_TMPFILE|unix.O_WRONLY|unix.O_CLOEXEC, 0o644)
	require.NoError(t, err)
	defer unix.Close(tmp)
	for name, mk := range map[string]func(p string) error{
		"file":    func(p string) error { return os.WriteFile(p, nil, 0o644) },
		"fifo":    func(p string) error { return unix.Mkfifo(p, 0o644) },
		"symlink": func(p string) error { return os.Symlink("file", p) },
		"tmpfile": func(p string) error { return unix.Linkat(tmp, "", unix.AT_FDCWD, p, unix.AT_EMPTY_PATH) },
	} {
		p := filepath.Join(g, name)
		require.NoError(t, mk(p), name)
		var st unix.Stat_t
		require.NoError(t, unix.Lstat(p, &st))
		if st.Gid != 100 {
			t.Errorf("%s: gid %d, want 100 (the setgid directory's)", name, st.Gid)
		}
	}
}

// TestOriginalChangedBehindListing: a name added to or removed from the
// original behind the sandbox shows in the listing of a directory the
// sandbox never changed once the attributes time out (here 1 s), though
// the kernel keeps listings (no OPENDIR): the directory's new mtime makes
// it list again. A stat finds the new name and not the removed one.
func TestOriginalChangedBehindListing(t *testing.T) {
	orig := newOrig(t, map[string]string{"d/a": "a", "d/b": "b"})
	sb := mountSandbox(t, orig, withTimeout(time.Second))
	names := func() []string {
		t.Helper()
		ents, err := os.ReadDir(sb.path("d"))
		require.NoError(t, err)
		var l []string
		for _, e := range ents {
			l = append(l, e.Name())
		}
		return l
	}
	require.Equal(t, []string{"a", "b"}, names())
	lstat(t, sb.path("d/b"))
	require.NoError(t, os.WriteFile(filepath.Join(orig, "d/new"), []byte("n"), 0o644))
	require.NoError(t, os.Remove(filepath.Join(orig, "d/b")))

	deadline := time.Now().Add(10 * time.Second)
	for {
		got := names()
		if slices.Equal(got, []string{"a", "new"}) {
			break
		}
		require.True(t, time.Now().Before(deadline), "the listing still shows %v 10 s after the original changed (timeouts 1 s)", got)
		time.Sleep(100 * time.Millisecond)
	}
	assert.Equal(t, "n", mustRead(t, sb.path("d/new")))
	_, err := os.Lstat(sb.path("d/b"))
	assert.ErrorIs(t, err, os.ErrNotExist, "a name removed from the original")
}

// TestOriginalDirectoryReplacedBehindTheMount: a directory of the original
// replaced behind the sandbox (moved away, a new one made at its name)
// shows through the mount once the kernel's caches time out (here 1 s):
// the server keeps the original's directories it read for at most that
// long (layers/lowerdirs.go), so a name only the new directory has is
// found, and one only the old had is gone.
func TestOriginalDirectoryReplacedBehindTheMount(t *testing.T) {
	orig := newOrig(t, map[string]string{"d/a": "a", "d/sub/x": "x"})
	sb := mountSandbox(t, orig, withTimeout(time.Second))
	assert.Equal(t, "a", mustRead(t, sb.path("d/a")))
	lstat(t, sb.path("d/sub/x"))
	require.NoError(t, os.Rename(filepath.Join(orig, "d"), filepath.Join(orig, "old")))
	writeTree(t, orig, map[string]string{"d/b": "b", "d/sub/y": "y"})

	deadline := time.Now().Add(10 * time.Second)
	for {
		_, errB := os.Lstat(sb.path("d/b"))
		_, errY := os.Lstat(sb.path("d/sub/y"))
		if errB == nil && errY == nil {
			break
		}
		require.True(t, time.Now().Before(deadline), "10 s after d was replaced in the original (timeouts 1 s): d/b: %v, d/sub/y: %v", errB, errY)
		time.Sleep(100 * time.Millisecond)
	}
	assert.Equal(t, "b", mustRead(t, sb.path("d/b")))
	for _, p := range []string{"d/a", "d/sub/x"} {
		_, err := os.Lstat(sb.path(p))
		assert.ErrorIs(t, err, os.ErrNotExist, "%s: only the old d had it", p)
	}
	assert.Equal(t, "a", mustRead(t, sb.path("old/a")), "the old d, at its new name")
}

// TestOriginalDirectoryMovedBehindAnOpenDirectory: as above, with the
// old d held open through the mount while the original moves it, so
// that the server still has its node when the lookup of its new name
// finds the same inode: that node must now reach the directory by its
// new name. It kept the old one (the lookups beneath old/ went to the
// new d: old/a was not found), seen in CI under io_uring, where the
// kernel's forget of the old node came late.
func TestOriginalDirectoryMovedBehindAnOpenDirectory(t *testing.T) {
	orig := newOrig(t, map[string]string{"d/a": "a", "d/sub/x": "x"})
	sb := mountSandbox(t, orig, withTimeout(time.Second))
	held, err := os.Open(sb.path("d"))
	require.NoError(t, err)
	defer held.Close()
	assert.Equal(t, "a", mustRead(t, sb.path("d/a")))
	require.NoError(t, os.Rename(filepath.Join(orig, "d"), filepath.Join(orig, "old")))
	writeTree(t, orig, map[string]string{"d/b": "b"})

	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Lstat(sb.path("d/b")); err == nil {
			break
		}
		require.True(t, time.Now().Before(deadline), "10 s after d was replaced in the original (timeouts 1 s), d/b is not there")
		time.Sleep(100 * time.Millisecond)
	}
	assert.Equal(t, "a", mustRead(t, sb.path("old/a")), "the old d, at its new name")
	assert.Equal(t, "x", mustRead(t, sb.path("old/sub/x")))
	names, err := held.Readdirnames(-1)
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"a", "sub"}, names, "the directory held open lists its own entries")
}

// TestOriginalFileMovedBehindTheMount: an editor's save in the original
// (mv f f~; a new f) while the kernel still holds the node of f (its
// entry cached): f~ must read as the old f. It read as the new f: the
// lookup of f~ found the same inode, go-fuse handed back the node of f,
// and its open went to f's path.
func TestOriginalFileMovedBehindTheMount(t *testing.T) {
	orig := newOrig(t, map[string]string{"f": "old\n"})
	sb := mountSandbox(t, orig)
	held, err := os.Open(sb.path("f"))
	require.NoError(t, err)
	defer held.Close()
	require.NoError(t, os.Rename(filepath.Join(orig, "f"), filepath.Join(orig, "f~")))
	writeTree(t, orig, map[string]string{"f": "new\n"})
	assert.Equal(t, "old\n", mustRead(t, sb.path("f~")), "the old f, at its new name")
}

// TestParallelListingsOfOneDirectory: eight ls -l of one directory at
// once, each directory new to the kernel, so that the server answers
// lookups of the same objects from several threads at once (readdirplus;
// under io_uring a thread a queue). The node table of registry.go once
// read a node another lookup was still setting up: the race detector's
// report of the server fails the test (harness_test.go).
func TestParallelListingsOfOneDirectory(t *testing.T) {
	files := map[string]string{}
	for d := range 4 {
		for f := range 500 {
			files[fmt.Sprintf("d%d/f%d", d, f)] = ""
		}
	}
	orig := newOrig(t, files)
	sb := mountSandbox(t, orig)
	for d := range 4 {
		var wg sync.WaitGroup
		errs := make([]error, 8)
		for i := range errs {
			wg.Go(func() {
				out, err := exec.Command("ls", "-l", sb.path(fmt.Sprintf("d%d", d))).Output()
				if err == nil && strings.Count(string(out), "\n") != 501 {
					err = fmt.Errorf("ls -l listed %d lines", strings.Count(string(out), "\n"))
				}
				errs[i] = err
			})
		}
		wg.Wait()
		for _, err := range errs {
			require.NoError(t, err)
		}
	}
}
