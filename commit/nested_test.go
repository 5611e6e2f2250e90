package commit

import (
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
