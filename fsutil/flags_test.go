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
// which keeps its own (ext4's extents flag); an original without them
// leaves the copy as it is.
func TestCopyFlags(t *testing.T) {
	dir := t.TempDir()
	src := openFlagged(t, filepath.Join(dir, "src"), FlagNoAtime|FlagNoDump)
	dst := openFlagged(t, filepath.Join(dir, "dst"), 0)
	before, err := Flags(dst)
	require.NoError(t, err)
	CopyFlags(dst, src)
	after, err := Flags(dst)
	require.NoError(t, err)
	assert.Equal(t, before|FlagNoAtime|FlagNoDump, after)

	plain := openFlagged(t, filepath.Join(dir, "plain"), 0)
	other := openFlagged(t, filepath.Join(dir, "other"), 0)
	before, err = Flags(other)
	require.NoError(t, err)
	CopyFlags(other, plain)
	after, err = Flags(other)
	require.NoError(t, err)
	assert.Equal(t, before, after)
}
