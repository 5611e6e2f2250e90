package layers

import (
	"errors"
	"maps"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// compactNow compacts s's journal and returns how many dead paths the
// compaction dropped.
func (s *stack) compactNow() int {
	s.t.Helper()
	_, _, dropped, err := s.Journal().compactOnce()
	require.NoError(s.t, err)
	return dropped
}

func (s *stack) changeList() []Change {
	s.t.Helper()
	cs, err := s.Changes()
	require.NoError(s.t, err)
	return cs.Changes
}

// journalNames reports whether a record of s's journal names p.
func (s *stack) journalNames(p string) bool {
	s.t.Helper()
	recs, err := s.Journal().Records()
	require.NoError(s.t, err)
	for _, r := range recs {
		if r.Path == p || r.Path2 == p {
			return true
		}
	}
	return false
}

// TestCompactionDropsDeadPaths: what git does for each object (a
// temporary file, linked to its name, unlinked), what an editor does on
// save (a new file renamed over the old one) and a directory made and
// removed again leave paths that held only what the sandbox made and
// removed again. A compaction leaves them out of the journal, and the
// change set stays what it was.
func TestCompactionDropsDeadPaths(t *testing.T) {
	s := newStack(t, map[string]string{"src/f": "1", "objects/": "", "index": "i"})
	// git: tmp_obj, linked to its object name, unlinked.
	s.createEmpty("objects", "tmp_obj_1")
	var o Obj
	o = s.dir("objects/tmp_obj_1")
	_, err := s.Link("objects/tmp_obj_1", &o, "objects", s.dir("objects"), "ab", s.c)
	require.NoError(t, err)
	require.NoError(t, s.Unlink("objects", s.dir("objects"), "tmp_obj_1", s.c))
	// an editor: .f.swp written, renamed over f.
	s.createEmpty("src", ".f.swp")
	s.write("src/.f.swp", "2")
	require.NoError(t, s.Rename("src", s.dir("src"), ".f.swp", &o, "src", s.dir("src"), "f", 0, s.c))
	// git's index, written twice: index.lock made and renamed over it.
	for range 2 {
		s.createEmpty("", "index.lock")
		require.NoError(t, s.Rename("", s.dir(""), "index.lock", &o, "", s.dir(""), "index", 0, s.c))
	}
	// a build: a directory with a file, removed.
	_, err = s.Mkdir("", s.dir(""), "build", 0o755, s.c)
	require.NoError(t, err)
	s.createEmpty("build", "x.o")
	require.NoError(t, s.Unlink("build", s.dir("build"), "x.o", s.c))
	require.NoError(t, s.Rmdir("", s.dir(""), "build", s.c))

	want := s.changeLines()
	assert.Equal(t, []string{"modified index ", "created objects/ab ", "modified src/f "}, want)
	assert.Equal(t, 5, s.compactNow(), "dead paths dropped")
	assert.Equal(t, want, s.changeLines())
	for _, p := range []string{"objects/tmp_obj_1", "src/.f.swp", "index.lock", "build", "build/x.o"} {
		assert.False(t, s.journalNames(p), "the compacted journal names %s", p)
	}
	assert.True(t, s.journalNames("objects/ab"))

	// The same path used again is a path like any other.
	s.createEmpty("objects", "tmp_obj_1")
	assert.Equal(t, []string{"modified index ", "created objects/ab ", "created objects/tmp_obj_1 ", "modified src/f "}, s.changeLines())
	require.NoError(t, s.Unlink("objects", s.dir("objects"), "tmp_obj_1", s.c))
	assert.Equal(t, 1, s.compactNow())
	assert.Equal(t, want, s.changeLines())
}

// TestCompactionKeepsDeadPathsNotGone: a dead path stays when the upper
// still holds something there: the removal recorded but never made (the
// server died between the two), or made with a whiteout (the original
// gained an object at that path after the sandbox made its own).
func TestCompactionKeepsDeadPathsNotGone(t *testing.T) {
	s := newStack(t, map[string]string{"d/": ""})
	s.createEmpty("d", "crash")
	require.NoError(t, s.record(OpUnlink, "d/crash", "", 0, s.c)) // and no unlink
	s.createEmpty("d", "late")
	require.NoError(t, os.WriteFile(filepath.Join(s.lower, "d", "late"), []byte("original"), 0o644))
	require.NoError(t, s.Unlink("d", s.dir("d"), "late", s.c))
	assert.True(t, isWhiteout(t, filepath.Join(s.upper, "d", "late")))
	s.createEmpty("", "plain")
	require.NoError(t, s.Unlink("", s.dir(""), "plain", s.c))
	// A dead path beneath what is now a symlink to a directory: never
	// looked up through it.
	_, err := s.Mkdir("", s.dir(""), "s", 0o755, s.c)
	require.NoError(t, err)
	s.createEmpty("s", "x")
	require.NoError(t, s.Unlink("s", s.dir("s"), "x", s.c))
	require.NoError(t, s.Rmdir("", s.dir(""), "s", s.c))
	_, err = s.Symlink("", s.dir(""), "s", t.TempDir(), s.c)
	require.NoError(t, err)

	want := s.changeLines()
	assert.Equal(t, []string{"created d/crash ", "deleted d/late ", "created s "}, want)
	assert.Equal(t, 1, s.compactNow(), "only plain dropped")
	assert.True(t, s.journalNames("s/x"))
	assert.Equal(t, want, s.changeLines())
	assert.True(t, s.journalNames("d/crash"))
	assert.True(t, s.journalNames("d/late"))
	assert.False(t, s.journalNames("plain"))
	assert.Equal(t, 0, s.compactNow())
}

// TestCompactionDroppingDeadPathsKeepsTheChangeSet: two stacks over the
// same original take the same random operations (files and directories
// made, written, removed, linked, renamed over each other and
// exchanged); one compacts its journal at random points, dropping the
// dead paths. Both give the same change set at every compaction and at
// the end, but for what a dropped path's own line said (sameEffect); so
// does the other one's journal where the change set is read (which
// drops them too: changesOnce) against the same read keeping them.
func TestCompactionDroppingDeadPathsKeepsTheChangeSet(t *testing.T) {
	names := []string{"a", "b", "c", "t", "a/x", "a/y", "b/x", "t/x", "t/y", "t/x/z"}
	orig := map[string]string{"a/x": "1", "b/": "", "c": "3"}
	dropped := 0
	for seed := int64(1); seed <= 200; seed++ {
		plain, compacting := newStack(t, orig), newStack(t, orig)
		plain.testKeepDead = true
		rng := rand.New(rand.NewSource(seed))
		for i := range 80 {
			op := rng.Intn(9)
			p, q := names[rng.Intn(len(names))], names[rng.Intn(len(names))]
			plain.randomOp(op, p, q)
			compacting.randomOp(op, p, q)
			if rng.Intn(10) == 0 {
				dropped += compacting.compactNow()
				want := plain.changeList()
				sameEffect(t, want, compacting.changeList(), "seed %d, compacted after op %d", seed, i)
				plain.testKeepDead = false // dropped as the change set is read
				sameEffect(t, want, plain.changeList(), "seed %d, read after op %d", seed, i)
				plain.testKeepDead = true
			}
		}
		dropped += compacting.compactNow()
		sameEffect(t, plain.changeList(), compacting.changeList(), "seed %d, at the end", seed)
	}
	assert.Greater(t, dropped, 150, "dead paths dropped in all")
	t.Logf("%d dead paths dropped, %d removals left out of a change set", dropped, leftOut)
}

var leftOut int

// sameEffect requires the change set got to be want, but for removals
// want names that another change of want accounts for: in a sandbox, a
// path the sandbox made an object at while the original had one there
// (hidden by a directory made above it, or moved away with the directory
// it was in), then removed again, reads as the removal of the original's
// object; where the path's records are dropped, as where no record named
// it, the change of the directory above (made, moved, removed) or of
// the object itself elsewhere says what happens to it.
func sameEffect(t *testing.T, want, got []Change, msgAndArgs ...any) {
	t.Helper()
	var kept []Change
	for _, c := range want {
		if slices.Contains(got, c) {
			kept = append(kept, c)
			continue
		}
		if c.Kind != Deleted || !accounted(c, want) {
			require.Equal(t, want, got, msgAndArgs...)
		}
		leftOut++
	}
	require.Equal(t, kept, got, msgAndArgs...)
}

func accounted(c Change, all []Change) bool {
	for _, d := range all {
		if d == c {
			continue
		}
		if strings.HasPrefix(c.Path, d.Path+"/") && d.Kind != Metadata && d.Kind != Linked {
			return true
		}
		if d.Original == c.Path || d.Replaced == c.Path || d.From == c.Path {
			return true
		}
	}
	return false
}

// randomOp applies op to p (and q) as the kernel would ask it, or
// nothing where the kernel would refuse it before asking.
func (s *stack) randomOp(op int, p, q string) {
	s.t.Helper()
	dir, name := Split(p)
	pe, perr := s.lookup(p)
	_, qerr := s.lookup(q)
	parent, derr := s.lookup(dir)
	if derr != nil || !parent.IsDir() {
		return
	}
	allow := func(err error) {
		s.t.Helper()
		for _, ok := range []error{unix.ENOTEMPTY, unix.EXDEV, unix.EISDIR, unix.ENOTDIR, unix.EEXIST, unix.ENOENT, unix.EINVAL} {
			if errors.Is(err, ok) {
				return
			}
		}
		require.NoError(s.t, err, "op %d %s %s", op, p, q)
	}
	switch op {
	case 0, 1: // a file made, maybe written
		if perr == nil {
			return
		}
		fd, _, err := s.Create(dir, parent.Obj, name, 0o644, s.c)
		allow(err)
		if err == nil {
			unix.Close(fd)
			if op == 1 {
				s.write(p, "new "+p)
			}
		}
	case 2:
		if perr == nil {
			return
		}
		_, err := s.Mkdir(dir, parent.Obj, name, 0o755, s.c)
		allow(err)
	case 3:
		if perr != nil {
			return
		}
		if pe.IsDir() {
			allow(s.Rmdir(dir, parent.Obj, name, s.c))
		} else {
			allow(s.Unlink(dir, parent.Obj, name, s.c))
		}
	case 4, 5, 6: // renamed (6: exchanged)
		if perr != nil || p == q || strings.HasPrefix(q, p+"/") || strings.HasPrefix(p, q+"/") {
			return
		}
		qdir, qname := Split(q)
		qparent, err := s.lookup(qdir)
		if err != nil || !qparent.IsDir() {
			return
		}
		flags := uint32(0)
		if op == 6 {
			if qerr != nil {
				return
			}
			flags = unix.RENAME_EXCHANGE
		}
		src := pe.Obj
		allow(s.Rename(dir, parent.Obj, name, &src, qdir, qparent.Obj, qname, flags, s.c))
	case 7: // q linked to p
		if perr != nil || pe.IsDir() || qerr == nil {
			return
		}
		qdir, qname := Split(q)
		qparent, err := s.lookup(qdir)
		if err != nil || !qparent.IsDir() {
			return
		}
		src := pe.Obj
		_, err = s.Link(p, &src, qdir, qparent.Obj, qname, s.c)
		allow(err)
	case 8:
		if perr != nil || pe.IsDir() {
			return
		}
		s.write(p, "written "+p)
	}
}

// TestCompactionDropsDeadPathsMovedIntoPlace: what the sandbox made
// aside and moved into place, removed again, is dead where it was moved
// to, beneath it too: a package manager's directory filled under a
// temporary name (npm, pip), a build's output renamed from its temporary
// name, a new file an editor saves twice (the second save renamed over
// the first). What was moved over something of the original's stays.
func TestCompactionDropsDeadPathsMovedIntoPlace(t *testing.T) {
	s := newStack(t, map[string]string{"c": "3", "lib/": ""})
	var o Obj
	// a package: lib/.staging-1 filled, moved to lib/pkg, removed.
	_, err := s.Mkdir("lib", s.dir("lib"), ".staging-1", 0o755, s.c)
	require.NoError(t, err)
	s.createEmpty("lib/.staging-1", "index.js")
	_, err = s.Mkdir("lib/.staging-1", s.dir("lib/.staging-1"), "sub", 0o755, s.c)
	require.NoError(t, err)
	s.createEmpty("lib/.staging-1/sub", "a.js")
	require.NoError(t, s.Rename("lib", s.dir("lib"), ".staging-1", &o, "lib", s.dir("lib"), "pkg", 0, s.c))
	require.NoError(t, s.Unlink("lib/pkg/sub", s.dir("lib/pkg/sub"), "a.js", s.c))
	require.NoError(t, s.Rmdir("lib/pkg", s.dir("lib/pkg"), "sub", s.c))
	require.NoError(t, s.Unlink("lib/pkg", s.dir("lib/pkg"), "index.js", s.c))
	require.NoError(t, s.Rmdir("lib", s.dir("lib"), "pkg", s.c))
	// a build: out.o.tmp renamed to out.o, removed (make clean).
	s.createEmpty("", "out.o.tmp")
	require.NoError(t, s.Rename("", s.dir(""), "out.o.tmp", &o, "", s.dir(""), "out.o", 0, s.c))
	require.NoError(t, s.Unlink("", s.dir(""), "out.o", s.c))
	// an editor: new file n saved again through .n.swp, removed.
	s.createEmpty("", "n")
	s.createEmpty("", ".n.swp")
	require.NoError(t, s.Rename("", s.dir(""), ".n.swp", &o, "", s.dir(""), "n", 0, s.c))
	require.NoError(t, s.Unlink("", s.dir(""), "n", s.c))
	// a new file moved over the original's c, removed: c's removal.
	s.createEmpty("", "c.new")
	require.NoError(t, s.Rename("", s.dir(""), "c.new", &o, "", s.dir(""), "c", 0, s.c))
	require.NoError(t, s.Unlink("", s.dir(""), "c", s.c))

	want := s.changeLines()
	assert.Equal(t, []string{"deleted c "}, want)
	dead := []string{"lib/.staging-1", "lib/pkg", "lib/pkg/index.js", "lib/pkg/sub", "lib/pkg/sub/a.js",
		"out.o.tmp", "out.o", "n", ".n.swp", "c.new"}
	assert.Equal(t, len(dead), s.compactNow(), "dead paths dropped")
	assert.Equal(t, want, s.changeLines())
	for _, p := range dead {
		assert.False(t, s.journalNames(p), "the compacted journal names %s", p)
	}
	assert.True(t, s.journalNames("c"))
}

// TestGoneFromUpper: what the upper answers for each kind of path a
// dead path can be, looked at in one call (the names of a directory
// through one descriptor of it): gone where nothing is, beneath a
// missing directory or beneath a file; there for an object, a
// whiteout, the root, and beneath a symlink (never followed, even to a
// directory that lacks the name).
func TestGoneFromUpper(t *testing.T) {
	s := newStack(t, map[string]string{"w": "original"})
	u := s.upper
	require.NoError(t, os.MkdirAll(filepath.Join(u, "d/e"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(u, "d/here"), nil, 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(u, "d/file"), nil, 0o644))
	require.NoError(t, os.Symlink(t.TempDir(), filepath.Join(u, "d/link")))
	require.NoError(t, unix.Mknod(filepath.Join(u, "w"), unix.S_IFCHR, 0))
	want := map[string]bool{
		"": false, "w": false, "d": false, "d/e": false, "d/here": false, "d/link": false,
		"d/link/x": false, "d/link/x/y": false,
		"gone": true, "d/gone": true, "d/e/gone": true, "d/missing/x": true, "d/missing/x/y": true,
		"d/file/x": true, "d/file/x/y": true,
	}
	paths := slices.Sorted(maps.Keys(want))
	got := s.goneFromUpper(paths)
	for i, p := range paths {
		assert.Equal(t, want[p], got[i], "gone %q", p)
	}
}
