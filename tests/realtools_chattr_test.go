package tests

import (
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/fsutil"
)

// lsattrCarried runs lsattr(1) on p and returns which of the flags a
// sandbox carries (S, D, d, A) it lists, in that order.
func lsattrCarried(t *testing.T, p string) string {
	t.Helper()
	out, err := exec.Command("lsattr", "-d", p).CombinedOutput()
	require.NoError(t, err, "lsattr -d %s: %s", p, out)
	field, _, _ := strings.Cut(string(out), " ")
	var b strings.Builder
	for _, l := range "SDdA" {
		if strings.ContainsRune(field, l) {
			b.WriteRune(l)
		}
	}
	return b.String()
}

// TestChattrAndLsattr: lsattr in a mount shows the original's flags, and
// chattr of the flags a copy keeps (S, D, d, A) changes them in the
// sandbox only, until the commit gives them to the original. chattr +i
// is refused (a sandbox copy cannot be immutable: the commit must move
// it). Until 2026-11-27 lsattr failed in a mount with "Operation not
// supported" (no ioctl reached the server). xfs_io's form of the calls
// (FS_IOC_FSGETXATTR, FSSETXATTR) works too.
func TestChattrAndLsattr(t *testing.T) {
	rtNeedCLI(t)
	rtNeedTool(t, "chattr")
	orig := newOrig(t, map[string]string{"f": "f\n", "g": "g\n", "x": "x\n", "d/h": "h\n"})
	for _, p := range []string{"g", "x"} {
		out, err := exec.Command("chattr", "+A", filepath.Join(orig, p)).CombinedOutput()
		if err != nil {
			t.Skipf("the original's filesystem keeps no flags: %s", out)
		}
	}
	sb := mountSandbox(t, orig)
	assert.Equal(t, "A", lsattrCarried(t, sb.path("g")), "lsattr shows the original's flag")
	assert.Equal(t, "", lsattrCarried(t, sb.path("f")))

	chattr := func(args ...string) (string, error) {
		out, err := exec.Command("chattr", args...).CombinedOutput()
		return string(out), err
	}
	for _, c := range [][]string{{"+d", "f"}, {"-A", "g"}, {"+D", "d"}, {"+S", "d/h"}} {
		out, err := chattr(c[0], sb.path(c[1]))
		require.NoError(t, err, "chattr %s: %s", strings.Join(c, " "), out)
	}
	out, err := chattr("+i", sb.path("f"))
	require.Error(t, err, "chattr +i in a sandbox")
	assert.Contains(t, out, "Operation not supported")

	// FS_IOC_FSGETXATTR shows x's noatime; FSSETXATTR takes it away.
	fd, err := unix.Open(sb.path("x"), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	require.NoError(t, err)
	var fsx [fsutil.FsxattrSize]byte
	require.NoError(t, fsutil.FsGetXattr(fd, fsx[:]))
	xflags := binary.NativeEndian.Uint32(fsx[:])
	assert.NotZero(t, xflags&fsutil.XflagNoAtime, "xflags %#x: noatime", xflags)
	binary.NativeEndian.PutUint32(fsx[:], xflags&^fsutil.XflagNoAtime)
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), fsutil.IocFsSetXattr, uintptr(unsafe.Pointer(&fsx[0])))
	unix.Close(fd)
	require.Equal(t, syscall.Errno(0), errno, "FS_IOC_FSSETXATTR")

	want := map[string]string{"f": "d", "g": "", "d": "D", "d/h": "S", "x": ""}
	for p, w := range want {
		assert.Equal(t, w, lsattrCarried(t, sb.path(p)), "%s in the mount", p)
	}
	for p, w := range map[string]string{"f": "", "g": "A", "d": "", "d/h": "", "x": "A"} {
		assert.Equal(t, w, lsattrCarried(t, filepath.Join(orig, p)), "%s in the original before the commit", p)
	}
	st, err := exec.Command(cliBin, "status", sb.mnt).CombinedOutput()
	require.NoError(t, err, "%s", st)
	assert.Equal(t, "m d\nm d/h\nm f\nm g\nm x\n5 changes: 5 metadata\n", string(st), "sbxfs status")

	rtCommit(t, sb, "flags")
	for p, w := range want {
		assert.Equal(t, w, lsattrCarried(t, filepath.Join(orig, p)), "%s in the original after the commit", p)
	}
	_, err = os.Stat(filepath.Join(orig, "d/h"))
	require.NoError(t, err)
}

// chattrOrig runs chattr on an original path and undoes it when the test
// ends (an immutable tree cannot be removed); it skips where the
// filesystem keeps no such flag.
func chattrOrig(t *testing.T, flag, p string) {
	t.Helper()
	if out, err := exec.Command("chattr", "+"+flag, p).CombinedOutput(); err != nil {
		t.Skipf("chattr +%s %s: %v %s", flag, p, err, out)
	}
	t.Cleanup(func() { _ = exec.Command("chattr", "-"+flag, p).Run() })
}

// TestProtectedOriginalsThroughAMount: the shell's and coreutils' changes
// of immutable and append-only originals fail at once with "Operation
// not permitted", as on ext4 and kernel overlayfs, and nothing of them
// reaches the sandbox; what a commit can apply (a file made in an
// append-only directory, a change beneath an immutable directory's
// subdirectory, a chmod, times or an attribute of a file in a protected
// directory, which the commit makes in place, as ext4 allows) works and
// commits, the originals keeping their flags.
// Until 2026-11-27 the changes were made in the sandbox and its commit
// failed (exit 8).
func TestProtectedOriginalsThroughAMount(t *testing.T) {
	rtNeedCLI(t)
	rtNeedTool(t, "chattr")
	orig := newOrig(t, map[string]string{"i": "i\n", "a": "a\n", "I/x": "x\n", "I/sub/z": "z\n", "A/y": "y\n"})
	chattrOrig(t, "i", filepath.Join(orig, "i"))
	chattrOrig(t, "a", filepath.Join(orig, "a"))
	chattrOrig(t, "i", filepath.Join(orig, "I"))
	chattrOrig(t, "a", filepath.Join(orig, "A"))
	sb := mountSandbox(t, orig)
	sh := func(script string) (string, error) {
		cmd := exec.Command("sh", "-c", script)
		cmd.Dir = sb.mnt
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	for _, script := range []string{
		"echo more >> i", "echo new > i", "chmod 600 i", "rm -f i", "mv i j", "ln i k", "touch i",
		"echo new > a", "echo more >> a", "rm -f a", "mv a b",
		"touch I/new", "mkdir I/d", "rm I/x", "mv I/x x2", "echo new > I/x", "chmod 700 I",
		"rm A/y", "mv A/y y2", "echo new > A/y",
	} {
		out, err := sh(script)
		if assert.Error(t, err, script) {
			assert.Contains(t, out, "Operation not permitted", script)
		}
	}
	assert.Contains(t, lsattrLetters(t, sb.path("i")), "i", "lsattr shows the original's immutable flag")
	for _, script := range []string{"touch A/new", "echo changed > I/sub/z",
		"chmod 600 I/x", "touch -d 2001-02-03 A/y", "setfattr -n user.t -v 1 I/x"} {
		out, err := sh(script)
		require.NoError(t, err, "%s: %s", script, out)
	}
	// The content of a file whose attributes changed still cannot.
	for _, script := range []string{"echo new > I/x", "echo more >> I/x", "echo new > A/y", "truncate -s 0 A/y"} {
		out, err := sh(script)
		if assert.Error(t, err, script) {
			assert.Contains(t, out, "Operation not permitted", script)
		}
	}
	st, err := exec.Command(cliBin, "status", sb.mnt).CombinedOutput()
	require.NoError(t, err, "%s", st)
	assert.Equal(t, "A A/new\nm A/y\nM I/sub/z\nm I/x\n4 changes: 1 created, 1 modified, 2 metadata\n", string(st),
		"sbxfs status: nothing of the refused changes")

	rtCommit(t, sb, "protected")
	assert.Equal(t, "changed\n", mustRead(t, filepath.Join(orig, "I/sub/z")))
	assert.EqualValues(t, 0o600, lstat(t, filepath.Join(orig, "I/x")).Mode&0o7777, "the chmod of I/x, committed in place")
	assert.Equal(t, "x\n", mustRead(t, filepath.Join(orig, "I/x")))
	mtim := lstat(t, filepath.Join(orig, "A/y")).Mtim
	assert.Equal(t, 2001, time.Unix(mtim.Unix()).Year(), "the new mtime of A/y")
	for p, l := range map[string]string{"i": "i", "a": "a", "I": "i", "A": "a"} {
		assert.Contains(t, lsattrLetters(t, filepath.Join(orig, p)), l, "%s keeps its flag", p)
	}
}

// lsattrLetters is the flags field lsattr(1) prints for p.
func lsattrLetters(t *testing.T, p string) string {
	t.Helper()
	out, err := exec.Command("lsattr", "-d", p).CombinedOutput()
	require.NoError(t, err, "lsattr -d %s: %s", p, out)
	field, _, _ := strings.Cut(string(out), " ")
	return field
}
