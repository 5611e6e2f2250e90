package fsutil

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/fsutil/fsutiltest"
)

// TestDeepPaths: paths longer than PATH_MAX, which ext4 holds and a
// single system call refuses, are opened beneath a root piece by piece
// (OpenBeneath, OpenBeneathRaw) and reached through ShortPath, with the
// same refusals as short ones.
func TestDeepPaths(t *testing.T) {
	root := t.TempDir()
	deep := fsutiltest.DeepRel("d", 45) // ~9,000 bytes: three pieces
	file := deep + "/file"
	fsutiltest.WriteDeep(t, root, file, "deep")
	require.Greater(t, len(file), 2*unix.PathMax)

	var st unix.Stat_t
	require.ErrorIs(t, unix.Lstat(filepath.Join(root, file), &st), unix.ENAMETOOLONG, "the kernel refuses the whole path")

	rootFd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	require.NoError(t, err)
	defer unix.Close(rootFd)
	for name, open := range map[string]func(string, int) (int, error){
		"OpenBeneath":    func(rel string, fl int) (int, error) { return OpenBeneath(rootFd, rel, fl, 0) },
		"OpenBeneathRaw": func(rel string, fl int) (int, error) { return OpenBeneathRaw(rootFd, rel, fl) },
	} {
		fd, err := open(file, unix.O_RDONLY)
		require.NoError(t, err, name)
		buf := make([]byte, 16)
		n, _ := unix.Read(fd, buf)
		unix.Close(fd)
		assert.Equal(t, "deep", string(buf[:n]), name)
	}

	// A symlink on the way is not followed, in the first piece as in
	// the others; ShortPath opens only the pieces before its tail.
	for _, depth := range []int{10, 31} {
		dfd := fsutiltest.OpenDeep(t, root, fsutiltest.DeepRel("d", depth), unix.O_PATH|unix.O_DIRECTORY, false)
		name := fsutiltest.DeepRel("d", 1)
		require.NoError(t, unix.Renameat(dfd, name, dfd, "moved"))
		require.NoError(t, unix.Symlinkat("moved", dfd, name))
		_, err = OpenBeneathRaw(rootFd, file, unix.O_RDONLY)
		assert.ErrorIs(t, err, unix.ELOOP, "a symlink at depth %d", depth+1)
		if depth == 10 {
			_, err = ShortPath(root, file)
			assert.ErrorIs(t, err, unix.ENOTDIR, "ShortPath reports a symlink on the way as no directory")
		}
		require.NoError(t, unix.Unlinkat(dfd, name, 0))
		require.NoError(t, unix.Renameat(dfd, "moved", dfd, name))
	}

	// ShortPath: a path every call takes, for short and long paths.
	for _, rel := range []string{"", "short", file, deep, fsutiltest.DeepRel("d", 20) + "/x"} {
		s, err := ShortPath(root, rel)
		if rel == fsutiltest.DeepRel("d", 20)+"/x" {
			require.NoError(t, err)
			assert.ErrorIs(t, unix.Lstat(s.Path, &st), unix.ENOENT)
			s.Close()
			continue
		}
		require.NoError(t, err)
		assert.Less(t, len(s.Path)+len("/")+255, unix.PathMax, "room for a name after the path")
		if rel == "short" {
			assert.Equal(t, root+"/short", s.Path)
			s.Close()
			continue
		}
		require.NoError(t, unix.Lstat(s.Path, &st), "%.40s", s.Path)
		if rel == file {
			data, err := os.ReadFile(s.Path)
			require.NoError(t, err)
			assert.Equal(t, "deep", string(data))
			assert.Contains(t, s.Path, "/proc/self/fd/")
		}
		s.Close()
	}
	_, err = ShortPath(root, fsutiltest.DeepRel("e", 25)+"/f")
	assert.ErrorIs(t, err, unix.ENOENT, "a missing directory on the way")

	// The path's directory is a path of rel's directory (settle reads
	// the parent's default ACL that way), also under a long root (the
	// upper of a sandbox deep in a tree).
	long := filepath.Join(root, fsutiltest.DeepRel("d", 19))
	for _, c := range []struct{ root, rel, parent string }{
		{root, file, deep},
		{long, fsutiltest.DeepRel("d", 26) + "/file", deep},                        // rel longer than a tail
		{long, fsutiltest.DeepRel("d", 18) + "/file", fsutiltest.DeepRel("d", 37)}, // not: through the root
	} {
		var want unix.Stat_t
		require.NoError(t, unix.Fstat(fsutiltest.OpenDeep(t, root, c.parent, unix.O_PATH|unix.O_DIRECTORY, false), &want))
		s, err := ShortPath(c.root, c.rel)
		require.NoError(t, err)
		assert.Less(t, len(s.Path)+len("/")+255, unix.PathMax, "room for a name after the path")
		require.NoError(t, unix.Lstat(filepath.Dir(s.Path), &st))
		assert.Equal(t, want.Ino, st.Ino, "the directory of %.60s", s.Path)
		s.Close()
	}
	s, err := ShortPath(long, strings.Repeat("d", 200))
	require.NoError(t, err)
	require.NoError(t, unix.Lstat(filepath.Dir(s.Path), &st))
	assert.True(t, st.Mode&unix.S_IFMT == unix.S_IFDIR)
	s.Close()
	require.NoError(t, DoShort(root, file, func(p string) error { return unix.Lstat(p, &st) }))
	assert.EqualValues(t, 4, st.Size)
}
