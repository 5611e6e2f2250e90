package tests

import (
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
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
