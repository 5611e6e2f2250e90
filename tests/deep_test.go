package tests

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/fsutil/fsutiltest"
)

// deepDir opens (O_PATH) the directory rel beneath root, however deep
// ("" is root itself), one name at a time: the test reaches deep objects
// without the code it tests.
func deepDir(t *testing.T, root, rel string) int {
	t.Helper()
	if rel == "" {
		fd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		require.NoError(t, err)
		t.Cleanup(func() { unix.Close(fd) })
		return fd
	}
	return fsutiltest.OpenDeep(t, root, rel, unix.O_PATH|unix.O_DIRECTORY, false)
}

// TestDeepPathsThroughAMount: a tree deeper than PATH_MAX (4096 bytes),
// which ext4 and kernel overlayfs hold, works in a sandbox as on ext4:
// the original's deep objects show, copy up, take every change, survive a
// remount with their inode numbers, and commit. Before 2026-11-28 every
// object below ~4,000 bytes of path failed with ENAMETOOLONG (the server
// reached both layers by path), a copy-up there with ENOSPC (its origin
// attribute did not fit in ext4's attribute block), and the commit with
// "file name too long". A directory of the original whose path passes
// 2,048 bytes is not renamed but refused with EXDEV, as kernel overlayfs
// does past its redirect_max, and mv(1) moves it by copying.
func TestDeepPathsThroughAMount(t *testing.T) {
	rtNeedCLI(t)
	D := fsutiltest.DeepRel("d", 24)    // ~4,800 bytes
	short := fsutiltest.DeepRel("s", 8) // a directory a redirect can name
	long := fsutiltest.DeepRel("l", 12) // one it cannot (2,411 bytes)
	gone := fsutiltest.DeepRel("g", 22) // beneath a directory rm -rf takes
	spec := map[string]string{
		D + "/f": "deep\n", D + "/g": "gone\n", D + "/h": "h\n", D + "/x/y": "y\n",
		short + "/a": "a\n", long + "/b": "b\n", "gone/" + gone + "/z": "z\n",
	}
	fill := func(root string) {
		for rel, data := range spec {
			fsutiltest.WriteDeep(t, root, rel, data)
		}
		fd := fsutiltest.OpenDeep(t, root, D+"/f", unix.O_RDONLY, false)
		require.NoError(t, unix.Fsetxattr(fd, "user.k", []byte("1"), 0))
	}
	orig := newOrig(t, nil)
	ref := newOrig(t, nil)
	fill(orig)
	fill(ref)

	sb := mountSandbox(t, orig)
	// Subtests close the descriptors they open in the mount (deepDir,
	// OpenDeep) when they end: a remount needs none left open.
	var st unix.Stat_t
	var ino uint64
	t.Run("read", func(t *testing.T) {
		require.NoError(t, unix.Fstatat(deepDir(t, sb.mnt, D), "f", &st, unix.AT_SYMLINK_NOFOLLOW))
		ino = st.Ino
		assert.Equal(t, "deep\n", fsutiltest.ReadDeep(t, sb.mnt, D+"/f"), "an original file below PATH_MAX reads")
	})

	change := func(t *testing.T, root string, sandbox bool) {
		fd := fsutiltest.OpenDeep(t, root, D+"/f", unix.O_WRONLY|unix.O_APPEND, false)
		_, err := unix.Write(fd, []byte("more\n"))
		require.NoError(t, err, "append (a copy-up at depth 25)")
		fsutiltest.WriteDeep(t, root, D+"/"+fsutiltest.DeepRel("n", 5)+"/n", "new\n")
		d := deepDir(t, root, D)
		require.NoError(t, unix.Renameat(deepDir(t, root, D+"/x"), "y", deepDir(t, root, D+"/x"), "z"))
		require.NoError(t, unix.Symlinkat("f", d, "s"))
		require.NoError(t, unix.Linkat(d, "f", d, "hl", 0))
		require.NoError(t, unix.Unlinkat(d, "g", 0))
		require.NoError(t, unix.Fchmodat(d, "h", 0o600, 0))
		xfd := fsutiltest.OpenDeep(t, root, D+"/x", unix.O_RDONLY|unix.O_DIRECTORY, false)
		require.NoError(t, unix.Fsetxattr(xfd, "user.n", []byte("v"), 0))

		sp := deepDir(t, root, filepath.Dir(short))
		require.NoError(t, unix.Renameat(sp, filepath.Base(short), sp, "S"), "rename of a directory whose path a redirect holds")
		lp := deepDir(t, root, filepath.Dir(long))
		if sandbox {
			err := unix.Renameat(lp, filepath.Base(long), lp, "L")
			require.ErrorIs(t, err, unix.EXDEV, "rename of an original directory past redirectMax")
		}
		mv := exec.Command("mv", filepath.Base(long), "L")
		mv.Dir = filepath.Join(root, filepath.Dir(long))
		out, err := mv.CombinedOutput()
		require.NoError(t, err, "mv: %s", out)
		out, err = exec.Command("rm", "-rf", filepath.Join(root, "gone")).CombinedOutput()
		require.NoError(t, err, "rm -rf: %s", out)
	}
	t.Run("ext4", func(t *testing.T) { change(t, ref, false) })
	t.Run("sandbox", func(t *testing.T) { change(t, sb.mnt, true) })
	if t.Failed() {
		t.FailNow()
	}

	o := walkOpts{xattr: userXattrs, owner: true}
	want := mustWalk(t, ref, o)
	if d := diffTrees(want, mustWalk(t, sb.mnt, o), 10); len(d) > 0 {
		t.Fatalf("the mount differs from ext4 after the same changes:\n%s", strings.Join(d, "\n"))
	}
	out, err := exec.Command("find", sb.mnt, "-name", "n").CombinedOutput()
	require.NoError(t, err, "find: %s", out)
	assert.Equal(t, 1, strings.Count(string(out), "\n"), "find(1) walks the mount")

	remount(t, sb)
	t.Run("remounted", func(t *testing.T) {
		require.NoError(t, unix.Fstatat(deepDir(t, sb.mnt, D), "f", &st, unix.AT_SYMLINK_NOFOLLOW))
		assert.Equal(t, ino, st.Ino, "the copy keeps the original's inode number across a remount (its origin, kept aside)")
		assert.Equal(t, "deep\nmore\n", fsutiltest.ReadDeep(t, sb.mnt, D+"/f"))
	})
	if d := diffTrees(want, mustWalk(t, sb.mnt, o), 10); len(d) > 0 {
		t.Fatalf("after a remount the mount differs from ext4:\n%s", strings.Join(d, "\n"))
	}
	origins, err := os.ReadDir(filepath.Join(sb.work, "origins"))
	require.NoError(t, err, "long origin paths are kept in the work directory")
	assert.NotEmpty(t, origins)

	status, err := exec.Command(cliBin, "status", sb.mnt).CombinedOutput()
	require.NoError(t, err, "sbxfs status: %s", status)
	assert.Contains(t, string(status), "changes")
	diff, err := exec.Command(cliBin, "diff", sb.mnt).CombinedOutput()
	require.NoError(t, err, "sbxfs diff: %.2000s", diff)
	assert.Contains(t, string(diff), "\n deep\n+more\n", "sbxfs diff shows the deep append")
	rtCommitOpts(t, sb, "deep", o)
	if d := diffTrees(want, mustWalk(t, orig, o), 10); len(d) > 0 {
		t.Fatalf("the committed original differs from ext4 after the same changes:\n%s", strings.Join(d, "\n"))
	}
}

// TestDeepPathsUnprivileged: the same depth through a server run by
// nobody (fusermount3, the user.overlay.* attributes): nobody's bash
// walks 25 directories of 200-byte names down, appends to an original
// file there (a copy-up whose origin is kept aside), makes, renames and
// removes below, and reads it all back; the upper holds what it did.
func TestDeepPathsUnprivileged(t *testing.T) {
	if _, err := exec.LookPath("fusermount3"); err != nil {
		t.Skip("fusermount3 is not installed: an unprivileged server cannot mount")
	}
	name := strings.Repeat("d", 200)
	D := fsutiltest.DeepRel("d", 25)
	orig := newOrig(t, nil)
	fsutiltest.WriteDeep(t, orig, D+"/f", "deep\n")
	fsutiltest.WriteDeep(t, orig, D+"/g", "gone\n")
	sb := mountSandbox(t, orig, asNobody())
	script := `set -e
cd "$1"
i=0
while [ $i -lt 25 ]; do cd "$2"; i=$((i+1)); done
test "$(cat f)" = deep
echo more >> f
mkdir -p n/m
echo new > n/m/x
mv n/m/x n/m/y
rm g
test "$(cat f)" = "$(printf 'deep\nmore')"
test "$(cat n/m/y)" = new
test ! -e g
ls
`
	// bash: dash's cd builds the whole path, which fails past PATH_MAX
	// on ext4 too.
	// (bash says on stderr that getcwd cannot name such a directory for
	// a user who may not list the directories above the mount: as on
	// ext4.)
	cmd := nobodyCmd(t, "bash", "-c", script, "bash", sb.mnt, name)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "changes as nobody at depth 25: %s%s", out, stderr.String())
	assert.Equal(t, "f\nn\n", string(out), "ls at depth 25")
	assert.Equal(t, "deep\nmore\n", fsutiltest.ReadDeep(t, sb.upper, D+"/f"), "the copy in the upper")
	assert.Equal(t, "new\n", fsutiltest.ReadDeep(t, sb.upper, D+"/n/m/y"))
	fd := fsutiltest.OpenDeep(t, sb.upper, D+"/f", unix.O_RDONLY, false)
	buf := make([]byte, 256)
	n, err := unix.Fgetxattr(fd, "user.overlay.sbxfs.origin", buf)
	require.NoError(t, err, "the copy's origin")
	assert.True(t, strings.HasPrefix(string(buf[:n]), "v1s "), "a long origin path is kept aside: %q", buf[:n])
}
