package fsutil

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// A bind mount of a directory is another mount of the same filesystem:
// SameMount says so, and rename(2) between the two indeed fails.
func TestSameMount(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	require.NoError(t, os.Mkdir(a, 0o755))
	require.NoError(t, os.Mkdir(b, 0o755))
	same, err := SameMount(a, b)
	require.NoError(t, err)
	assert.True(t, same, "two directories of one mount")

	if os.Geteuid() != 0 {
		t.Skip("a bind mount needs root")
	}
	require.NoError(t, unix.Mount(b, b, "", unix.MS_BIND, ""))
	t.Cleanup(func() { _ = unix.Unmount(b, unix.MNT_DETACH) })
	same, err = SameMount(a, b)
	require.NoError(t, err)
	assert.False(t, same, "a bind mount is another mount")
	require.NoError(t, os.WriteFile(filepath.Join(a, "f"), nil, 0o644))
	assert.ErrorIs(t, os.Rename(filepath.Join(a, "f"), filepath.Join(b, "f")), unix.EXDEV, "what SameMount foretells")

	_, err = SameMount(a, filepath.Join(dir, "missing"))
	assert.ErrorIs(t, err, unix.ENOENT)
}
