package commit

import (
	"golang.org/x/sys/unix"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Directories renamed into one another: a child moved out of its parent,
// the parent moved under that child's new place, a grandchild moved under
// the old parent.
func TestCommitNestedDirectoryRenames(t *testing.T) {
	s := newSandbox(t, map[string]string{"h/i/j/x": "x", "h/f": "f", "h/i/k": "k"})
	s.mkdir("g")
	s.rename("h/i", "g/y")
	s.rename("h", "g/y/n1")
	s.rename("g/y/j", "g/y/n1/f30")
	s.write("g/y/n1/f30/new", "n")
	s.done()
	require.NoError(t, commitAll(t, s.cfg, Options{}))
	assert.Equal(t, snapshot(t, s.ref), snapshot(t, s.orig))
}

// Extended attributes set in the sandbox on a new directory and on an
// original one reach the original.
func TestCommitDirectoryXattrs(t *testing.T) {
	s := newSandbox(t, map[string]string{"old/": ""})
	s.mkdir("new")
	for _, p := range []string{"new", "old"} {
		o := s.lookup(p)
		require.NoError(t, s.l.Setxattr(p, &o, "user.k", []byte("v-"+p), 0, s.c))
	}
	s.done()
	require.NoError(t, commitAll(t, s.cfg, Options{}))
	for _, p := range []string{"new", "old"} {
		v, err := getXattr(filepath.Join(s.orig, p), "user.k")
		require.NoError(t, err, p)
		assert.Equal(t, "v-"+p, string(v))
	}
}

// A file and a directory swapped with RENAME_EXCHANGE after a file in the
// directory was changed.
func TestCommitExchangeFileAndDir(t *testing.T) {
	s := newSandbox(t, map[string]string{"f00": "file", "e/f27": "old"})
	s.write("e/f27", "changed content")
	o := s.lookup("e")
	require.NoError(t, s.l.Rename("", s.lookup(""), "e", &o, "", s.lookup(""), "f00", unix.RENAME_EXCHANGE, s.c))
	require.NoError(t, unix.Renameat2(unix.AT_FDCWD, filepath.Join(s.ref, "e"), unix.AT_FDCWD, filepath.Join(s.ref, "f00"), unix.RENAME_EXCHANGE))
	s.done()
	require.NoError(t, commitAll(t, s.cfg, Options{}))
	assert.Equal(t, snapshot(t, s.ref), snapshot(t, s.orig))
}
