package fsutil

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// openFlagged makes the file p and opens it; with flags set, it gives it
// those flags, or skips the test where the filesystem keeps none.
func openFlagged(t *testing.T, p string, flags uint32) int {
	t.Helper()
	require.NoError(t, os.WriteFile(p, []byte("x"), 0o644))
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	require.NoError(t, err)
	t.Cleanup(func() { unix.Close(fd) })
	if flags == 0 {
		return fd
	}
	f, err := Flags(fd)
	if errors.Is(err, unix.ENOTTY) || errors.Is(err, unix.EOPNOTSUPP) {
		t.Skipf("%s keeps no inode flags: %v", filepath.Dir(p), err)
	}
	require.NoError(t, err)
	require.NoError(t, SetFlags(fd, f|flags))
	return fd
}

// TestCopyFlags: the flags a copy keeps (noatime, nodump) reach the copy,
// which keeps its own (ext4's extents flag); one the copy has and the
// original has not (a file made in a directory inherits them) is taken
// away; an original without them leaves a plain copy as it is.
func TestCopyFlags(t *testing.T) {
	dir := t.TempDir()
	src := openFlagged(t, filepath.Join(dir, "src"), FlagNoAtime|FlagNoDump)
	dst := openFlagged(t, filepath.Join(dir, "dst"), FlagSync)
	before, err := Flags(dst)
	require.NoError(t, err)
	CopyFlags(dst, src)
	after, err := Flags(dst)
	require.NoError(t, err)
	assert.Equal(t, before&^FlagSync|FlagNoAtime|FlagNoDump, after)

	plain := openFlagged(t, filepath.Join(dir, "plain"), 0)
	other := openFlagged(t, filepath.Join(dir, "other"), 0)
	before, err = Flags(other)
	require.NoError(t, err)
	CopyFlags(other, plain)
	after, err = Flags(other)
	require.NoError(t, err)
	assert.Equal(t, before, after)
}

// TestHeldFlags: ext4 keeps all four carried flags (D on a directory
// only, which the probe makes and removes); tmpfs keeps A and d, not S
// or D. The probe leaves nothing behind.
func TestHeldFlags(t *testing.T) {
	dir := t.TempDir()
	var sfs unix.Statfs_t
	require.NoError(t, unix.Statfs(dir, &sfs))
	if sfs.Type == unix.EXT4_SUPER_MAGIC {
		assert.Equal(t, CarriedFlags, HeldFlags(dir), "ext4")
	}
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	tmp := t.TempDir()
	require.NoError(t, unix.Mount("tmpfs", tmp, "tmpfs", 0, "size=1m"))
	t.Cleanup(func() { _ = unix.Unmount(tmp, unix.MNT_DETACH) })
	assert.Zero(t, HeldFlags(tmp)&(FlagSync|FlagDirSync), "tmpfs keeps neither S nor D")
	for _, d := range []string{dir, tmp} {
		ents, err := os.ReadDir(d)
		require.NoError(t, err)
		assert.Empty(t, ents, d)
	}
}

// TestFlagLetters: as lsattr names them.
func TestFlagLetters(t *testing.T) {
	assert.Equal(t, "-", FlagLetters(0))
	assert.Equal(t, "SdA", FlagLetters(FlagSync|FlagNoDump|FlagNoAtime|0x10))
	assert.Equal(t, "D", FlagLetters(FlagDirSync))
}

// TestLstatx: the attributes are lstat's, field for field, for every kind
// of object; the protection is what chattr +i and +a set.
func TestLstatx(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "f"), []byte("data"), 0o640))
	require.NoError(t, os.Mkdir(filepath.Join(dir, "d"), 0o750))
	require.NoError(t, os.Symlink("f", filepath.Join(dir, "l")))
	require.NoError(t, unix.Mkfifo(filepath.Join(dir, "p"), 0o600))
	for _, name := range []string{"f", "d", "l", "p", "/dev/null"} {
		var want, got unix.Stat_t
		p := filepath.Join(dir, name)
		if filepath.IsAbs(name) {
			p = name
		}
		require.NoError(t, unix.Lstat(p, &want))
		prot, err := Lstatx(unix.AT_FDCWD, p, &got)
		require.NoError(t, err)
		assert.Equal(t, want, got, name)
		assert.Zero(t, prot, name)
	}
	for _, c := range []struct {
		flag uint32
		want Protection
	}{{0x10, Immutable}, {0x20, AppendOnly}} {
		fd := openFlagged(t, filepath.Join(dir, "g"), 0)
		base, err := Flags(fd)
		require.NoError(t, err)
		if err := SetFlags(fd, base|c.flag); err != nil {
			t.Skipf("chattr +i/+a: %v", err)
		}
		var st unix.Stat_t
		prot, err := Lstatx(unix.AT_FDCWD, filepath.Join(dir, "g"), &st)
		require.NoError(t, SetFlags(fd, base))
		require.NoError(t, err)
		assert.Equal(t, c.want, prot)
	}
}
