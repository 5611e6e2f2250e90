package commit

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/fsutil"
	"github.com/sbxfs/sbxfs/internal/immutable"
)

// A wholly new tree (an `npm install`, a build's output) is staged inside
// its top directory and comes into the original with that directory's one
// rename: see nest.

var newTreeBase = map[string]string{"keep/edited": "e", "other": "o", "zz/f": "f", "mv.txt": "m", "mvdir/in": "i"}

// newTree makes trees the original does not have: pkg, and other (where
// the original has a file), with files, a symlink, an empty directory,
// hard links within the tree and to a name outside it, modes and an
// attribute, an original file renamed into it (a copy-up: its upper
// object carries the overlay's origin attribute, stripped before the
// apply); and changes beside them.
func newTree(s *sandbox) {
	s.mkdir("pkg")
	s.mkdir("pkg/lib")
	s.mkdir("pkg/lib/deep")
	s.mkdir("pkg/empty")
	s.write("pkg/index.js", "index")
	s.write("pkg/lib/a.js", "a")
	s.write("pkg/lib/deep/b.js", "b")
	s.symlink("lib/a.js", "pkg/main.js")
	s.link("pkg/lib/a.js", "pkg/lib/a-link.js")
	s.link("pkg/lib/deep/b.js", "b-outside")
	s.chmod("pkg/lib", 0o750)
	s.chmod("pkg/index.js", 0o600)
	s.setxattr("pkg/lib/a.js", "user.k", "v")
	s.rename("mv.txt", "pkg/lib/mv.txt")
	s.rename("mvdir/in", "pkg/in")
	s.remove("other")
	s.mkdir("other")
	s.write("other/x", "x")
	s.write("keep/edited", "edited")
}

func TestNewTreeIsStagedInItsTopDirectory(t *testing.T) {
	s := newSandbox(t, newTreeBase)
	newTree(s)
	s.done()
	x, err := Prepare(s.cfg, Options{})
	require.NoError(t, err)
	slots := map[string]string{}
	for _, st := range x.log.Steps {
		if st.Kind == opMkdir && st.In == "" {
			slots[st.Path] = st.Slot
		}
	}
	assert.Len(t, slots, 2, "pkg and other are staged whole")
	stripped := false
	for _, st := range x.log.Steps {
		stripped = stripped || st.In != "" && len(st.Strip) > 0
		top, _, _ := strings.Cut(st.Path, "/")
		if slots[top] == "" || st.Path == top || st.Kind == opMeta {
			continue
		}
		assert.NotEqual(t, opDetach, st.Kind, "nothing to detach beneath a new directory: %s", st.Path)
		assert.Equal(t, slots[top]+st.Path[len(top):], st.In, "%s %s", st.Kind, st.Path)
		assert.NotEqual(t, st.In, st.Slot, "an undo puts it back in a slot of its own")
	}
	assert.True(t, stripped, "the renamed files carry the overlay's attributes")
	require.NoError(t, Commit(x))
	require.NoError(t, os.RemoveAll(s.cfg.Upper))
	assert.Equal(t, snapshot(t, s.ref), snapshot(t, s.orig))
	for _, n := range names(t, s.orig) {
		attrs, err := fsutil.LListXattrs(filepath.Join(s.orig, n))
		require.NoError(t, err)
		for _, a := range attrs {
			assert.False(t, s.cfg.LayoutXattr(a), "%s reached the original with %s", n, a)
		}
	}
}

// Another process never sees part of a new tree: at the apply's midpoint
// the original has all of pkg or none of it.
func TestNewTreeAppearsWhole(t *testing.T) {
	s := newSandbox(t, newTreeBase)
	s.mkdir("pkg")
	for _, d := range []string{"a", "b", "c", "d"} {
		s.mkdir("pkg/" + d)
		for _, f := range []string{"1", "2", "3", "4", "5"} {
			s.write("pkg/"+d+"/"+f, d+f)
		}
	}
	s.done()
	want := names(t, filepath.Join(s.ref, "pkg"))
	var seen []string
	x, err := Prepare(s.cfg, Options{Fault: func(point string) {
		if point == "applying" {
			if _, err := os.Lstat(filepath.Join(s.orig, "pkg")); err == nil {
				seen = names(t, filepath.Join(s.orig, "pkg"))
			} else {
				seen = []string{}
			}
		}
	}})
	require.NoError(t, err)
	require.NoError(t, Commit(x))
	require.NotNil(t, seen, "the fault point was reached")
	if len(seen) > 0 {
		assert.Equal(t, want, seen, "at the apply's midpoint")
	}
	assert.Equal(t, want, names(t, filepath.Join(s.orig, "pkg")))
}

// names lists every path beneath root.
func names(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	require.NoError(t, filepath.Walk(root, func(p string, _ os.FileInfo, err error) error {
		if err == nil && p != root {
			out = append(out, p[len(root)+1:])
		}
		return err
	}))
	sort.Strings(out)
	return out
}

func TestCrashAtEveryPointWithANewTree(t *testing.T) {
	crashAtEveryPoint(t, newTreeBase, newTree)
}

// An apply that fails after a new tree came in takes the tree back out,
// object by object (the undo of a step skipped by the apply is the undo
// of an install), and the sandbox keeps it: once the cause is gone the
// same sandbox commits.
func TestNewTreeUndoneAfterALaterStepFailed(t *testing.T) {
	s := newSandbox(t, newTreeBase)
	newTree(s)
	s.write("zz/g", "new in zz") // after pkg and other: fails
	s.done()
	old := snapshotTimes(t, s.orig)
	unlock := immutable.Set(t, filepath.Join(s.orig, "zz"))

	err := commitAll(t, s.cfg, Options{})
	var ce *Error
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, StageApply, ce.Stage)
	assert.True(t, ce.RolledBack, "the error says the original is unchanged")
	assert.Equal(t, old, snapshotTimes(t, s.orig))

	unlock()
	require.NoError(t, commitAll(t, s.cfg, Options{}))
	assert.Equal(t, snapshot(t, s.ref), snapshot(t, s.orig))
}

// With the upper on another filesystem the tree is copied into its top
// directory's slot (hard links copied once and linked there), then moved
// in the same way.
func TestNewTreeFromAnUpperOnAnotherFilesystem(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	box := t.TempDir()
	require.NoError(t, unix.Mount("tmpfs", box, "tmpfs", 0, "size=8m"))
	t.Cleanup(func() { _ = unix.Unmount(box, unix.MNT_DETACH) })
	s := newSandboxIn(t, t.TempDir(), box, newTreeBase)
	newTree(s)
	s.commitMatchesRef()
}

// A directory renamed into a new directory comes from the original at the
// apply: that new directory is not staged whole (its other entries are
// installed one by one), and the commit is the same.
func TestNewDirectoryHoldingARenamedOneIsNotStagedWhole(t *testing.T) {
	s := newSandbox(t, newTreeBase)
	s.mkdir("n")
	s.mkdir("n/sub")
	s.write("n/sub/f", "f")
	s.rename("keep", "n/sub/keep")
	s.mkdir("n/sub/fresh")
	s.write("n/sub/fresh/g", "g")
	s.done()
	x, err := Prepare(s.cfg, Options{})
	require.NoError(t, err)
	for _, st := range x.log.Steps {
		if strings.HasPrefix(st.Path, "n/sub/fresh/") {
			assert.Equal(t, "n/sub/fresh", topOf(x.log.Steps, st), "fresh is new throughout: %s", st.Path)
		} else {
			assert.Empty(t, st.In, "%s %s", st.Kind, st.Path)
		}
	}
	require.NoError(t, Commit(x))
	require.NoError(t, os.RemoveAll(s.cfg.Upper))
	assert.Equal(t, snapshot(t, s.ref), snapshot(t, s.orig))
}

// topOf is the path of the mkdir step whose slot st is staged in.
func topOf(steps []step, st step) string {
	for _, m := range steps {
		if m.Kind == opMkdir && m.In == "" && strings.HasPrefix(st.In, m.Slot+"/") {
			return m.Path
		}
	}
	return ""
}
