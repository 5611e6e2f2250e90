package layers

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// lookupIn looks name up in dir through an Obj held from before, as a
// node of the mount holds its directory's: found, and whether in the upper.
func (s *stack) lookupIn(dir string, held Obj, name string) (found, upper bool) {
	s.t.Helper()
	e, err := s.Lookup(dir, held, name)
	if err != nil {
		require.ErrorIs(s.t, err, unix.ENOENT)
		return false, false
	}
	return true, e.Upper
}

// putInUpper writes a file into the upper layer directly, as no one but
// another process (a commit's undo, with the mount frozen) may.
func (s *stack) putInUpper(rel, data string) {
	s.t.Helper()
	p := s.UpperPath(rel)
	require.NoError(s.t, os.MkdirAll(filepath.Dir(p), 0o755))
	require.NoError(s.t, os.WriteFile(p, []byte(data), 0o644))
}

// A lookup in a directory found absent from the upper skips the upper
// (dirgen.go), and stops skipping as soon as an upper directory may have
// appeared there.
func TestLookupTrustsAnAbsentUpperUntilADirectoryAppears(t *testing.T) {
	s := newStack(t, map[string]string{
		"d/x": "X", "d/y": "Y", "e/w": "W", "f/v": "V", "g/u": "U", "h/t": "T",
		"a/b/": "", "a/k/": "", "a/keep": "K",
	})

	// Trusted: what appears in the upper behind the layers' back does
	// not show (it would, were the upper looked at: the test of the skip).
	held := s.dir("g")
	s.putInUpper("g/u", "behind")
	s.putInUpper("g/new", "behind")
	found, upper := s.lookupIn("g", held, "u")
	assert.True(t, found)
	assert.False(t, upper, "the held directory was found absent: its lookups skip the upper")
	found, _ = s.lookupIn("g", held, "new")
	assert.False(t, found, "the held directory was found absent: its lookups skip the upper")

	// A change in d makes d's upper directory: the held Obj must not hide
	// what lands there.
	held = s.dir("d")
	require.NoError(t, s.Unlink("d", s.dir("d"), "x", s.c))
	found, _ = s.lookupIn("d", held, "x")
	assert.False(t, found, "a name removed in a directory copied up since the lookup")
	s.createEmpty("d", "z")
	found, upper = s.lookupIn("d", held, "z")
	assert.True(t, found && upper, "a file made in a directory copied up since the lookup")

	// A rename moves upper directories (and the paths of what is below):
	// an upper directory exchanged into e's place shows through e.
	held = s.dir("e")
	_, err := s.Mkdir("", s.dir(""), "n", 0o755, s.c)
	require.NoError(t, err)
	s.createEmpty("n", "only-in-n")
	src := s.dir("n")
	require.NoError(t, s.Rename("", s.dir(""), "n", &src, "", s.dir(""), "e", unix.RENAME_EXCHANGE, s.c))
	found, upper = s.lookupIn("e", held, "only-in-n")
	assert.True(t, found && upper, "a file of the directory exchanged into the held one's place")

	// A rename alone (no directory made) puts an upper directory where the
	// held one was: the empty original directory a/b replaced by c/b.
	s.createEmpty("a", "z")
	for _, p := range []string{"c", "c/b"} {
		_, err := s.Mkdir(filepath.Dir(p), s.dir(filepath.Dir(p)), filepath.Base(p), 0o755, s.c)
		require.NoError(t, err)
	}
	s.createEmpty("c/b", "new")
	held = s.dir("a/b")
	src = s.dir("c/b")
	require.NoError(t, s.Rename("c", s.dir("c"), "b", &src, "a", s.dir("a"), "b", 0, s.c))
	found, upper = s.lookupIn("a/b", held, "new")
	assert.True(t, found && upper, "a file of the directory moved over the held one")

	// A directory made again where one was removed: the held Obj of the
	// one removed must not hide the new one's files.
	held = s.dir("a/k")
	require.NoError(t, s.Rmdir("a", s.dir("a"), "k", s.c))
	_, err = s.Mkdir("a", s.dir("a"), "k", 0o755, s.c)
	require.NoError(t, err)
	s.createEmpty("a/k", "new")
	found, upper = s.lookupIn("a/k", held, "new")
	assert.True(t, found && upper, "a file of the directory made again")

	// While another process may change the upper (SetShared), lookups
	// look at it and learn nothing; after, they learn again.
	held = s.dir("f")
	s.SetShared(true)
	s.putInUpper("f/outside", "outside")
	found, upper = s.lookupIn("f", held, "outside")
	assert.True(t, found && upper, "a file put in the upper while it was shared")
	assert.Zero(t, s.dir("h").absentAt, "absence learnt while the upper was shared")
	s.SetShared(false)
	assert.NotZero(t, s.dir("h").absentAt, "absence not learnt after the sharing")
}
