package tests

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// Listing a directory of the original through the mount makes the server
// read its subdirectories in the background (fuse/prefetch.go), so that a
// walk entering them finds them in the kernel's caches: their access times
// move although nothing entered them. Deeper directories and files are
// left alone, and what the listing shows is what the original has.
func TestListingPrefetchesSubdirectories(t *testing.T) {
	orig := newOrig(t, map[string]string{
		"top/a/deep/x": "x", "top/b/y": "y", "top/f": "f",
	})
	old := time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC)
	atime := func(rel string) time.Time {
		st := lstat(t, filepath.Join(orig, rel))
		return time.Unix(st.Atim.Unix())
	}
	for _, rel := range []string{"top/a", "top/a/deep", "top/b", "top/f"} {
		require.NoError(t, os.Chtimes(filepath.Join(orig, rel), old, time.Now()))
		require.True(t, atime(rel).Equal(old))
	}
	require.True(t, hasAtimeUpdates(t, filepath.Dir(orig)), "the test needs a filesystem that updates access times (relatime), not noatime")
	sb := mountSandbox(t, orig)

	ents, err := os.ReadDir(sb.path("top"))
	require.NoError(t, err)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	assert.Equal(t, []string{"a", "b", "f"}, names)

	assert.Eventually(t, func() bool {
		return atime("top/a").After(old) && atime("top/b").After(old)
	}, 5*time.Second, 10*time.Millisecond, "the subdirectories of a listed directory are read")
	time.Sleep(100 * time.Millisecond)
	assert.True(t, atime("top/a/deep").Equal(old), "a directory two levels down is not read")
	assert.True(t, atime("top/f").Equal(old), "files are not read")
}

// hasAtimeUpdates reports whether reading a directory made in dir moves
// its access time once it is old (relatime or strictatime, not noatime).
func hasAtimeUpdates(t *testing.T, dir string) bool {
	t.Helper()
	p := filepath.Join(dir, "atime-probe")
	require.NoError(t, os.Mkdir(p, 0o755))
	old := time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC)
	require.NoError(t, os.Chtimes(p, old, time.Now()))
	_, err := os.ReadDir(p)
	require.NoError(t, err)
	var st unix.Stat_t
	require.NoError(t, unix.Lstat(p, &st))
	return time.Unix(st.Atim.Unix()).After(old)
}
