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

// TestXattrAt reads attributes of names in a directory descriptor as the
// l* calls read them by path, never following a symlink.
func TestXattrAt(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "f")
	require.NoError(t, os.WriteFile(f, []byte("x"), 0o644))
	require.NoError(t, os.Symlink("f", filepath.Join(dir, "ln")))
	if err := unix.Setxattr(f, "user.a", []byte("value"), 0); errors.Is(err, unix.EOPNOTSUPP) {
		t.Skip("no user xattrs here")
	}
	require.NoError(t, unix.Setxattr(f, "user.b", nil, 0))
	d, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY, 0)
	require.NoError(t, err)
	defer unix.Close(d)
	buf := make([]byte, 16)
	n, err := GetxattrAt(d, "f", "user.a", buf)
	if errors.Is(err, unix.ENOSYS) {
		t.Skip("no getxattrat(2): Linux before 6.13")
	}
	require.NoError(t, err)
	assert.Equal(t, "value", string(buf[:n]))
	n, err = GetxattrAt(d, "f", "user.a", nil)
	require.NoError(t, err)
	assert.Equal(t, 5, n, "the size alone")
	_, err = GetxattrAt(d, "f", "user.a", buf[:2])
	assert.ErrorIs(t, err, unix.ERANGE)
	_, err = GetxattrAt(d, "f", "user.none", buf)
	assert.ErrorIs(t, err, unix.ENODATA)
	_, err = GetxattrAt(d, "ln", "user.a", buf)
	assert.ErrorIs(t, err, unix.ENODATA, "the symlink's own, not its target's")
	names, err := LListXattrsAt(d, "f")
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"user.a", "user.b"}, names)
	names, err = LListXattrsAt(d, "ln")
	require.NoError(t, err)
	assert.Empty(t, names, "the symlink's own")
	_, err = LListXattrsAt(d, "missing")
	assert.ErrorIs(t, err, unix.ENOENT)
}
