package commit

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestResolve: a conflict resolved in the sandbox's favour no longer
// stops the commit, which then replaces what the original has at that
// path (and only there: the other conflicts stay). A change the original
// makes after the resolve conflicts again.
func TestResolve(t *testing.T) {
	for _, tc := range []struct {
		name    string
		sandbox func(s *sandbox)
		other   func(t *testing.T, orig string)
		paths   []string // the conflicts to resolve
		reasons int      // conflicts with those paths
		want    map[string]string
	}{
		{name: "changed in both",
			sandbox: func(s *sandbox) { s.write("f", "sandbox") },
			other:   func(t *testing.T, orig string) { writeFile(t, filepath.Join(orig, "f"), "other writer") },
			paths:   []string{"f"}, reasons: 1, want: map[string]string{"f": "sandbox", "g": "g"}},
		{name: "created in both",
			sandbox: func(s *sandbox) { s.write("new", "sandbox") },
			other:   func(t *testing.T, orig string) { writeFile(t, filepath.Join(orig, "new"), "other writer") },
			paths:   []string{"new"}, reasons: 1, want: map[string]string{"f": "f", "g": "g", "new": "sandbox"}},
		{name: "removed from the original",
			sandbox: func(s *sandbox) { s.write("f", "sandbox") },
			other:   func(t *testing.T, orig string) { require.NoError(t, os.Remove(filepath.Join(orig, "f"))) },
			paths:   []string{"f"}, reasons: 1, want: map[string]string{"f": "sandbox", "g": "g"}},
		{name: "a rename's source and target",
			sandbox: func(s *sandbox) { s.rename("g", "f") },
			other: func(t *testing.T, orig string) {
				writeFile(t, filepath.Join(orig, "g"), "other g")
				require.NoError(t, os.Chmod(filepath.Join(orig, "f"), 0o600))
			},
			paths: []string{"f"}, reasons: 2, want: map[string]string{"f": "g"}},
		{name: "a directory it moved, removed from the original",
			sandbox: func(s *sandbox) { s.rename("d", "e"); s.write("e/n", "n") },
			other:   func(t *testing.T, orig string) { require.NoError(t, os.RemoveAll(filepath.Join(orig, "d"))) },
			paths:   []string{"e"}, reasons: 1, want: map[string]string{"e": "", "e/n": "n", "f": "f", "g": "g"}},
		{name: "a directory it changed the mode of, removed from the original",
			sandbox: func(s *sandbox) { s.chmod("d", 0o700) },
			other:   func(t *testing.T, orig string) { require.NoError(t, os.RemoveAll(filepath.Join(orig, "d"))) },
			paths:   []string{"d"}, reasons: 1, want: map[string]string{"d": "", "f": "f", "g": "g"}},
		{name: "made in a directory the sandbox removed",
			sandbox: func(s *sandbox) { s.remove("d/a"); s.remove("d") },
			other:   func(t *testing.T, orig string) { writeFile(t, filepath.Join(orig, "d/x"), "other writer") },
			paths:   []string{"d/x"}, reasons: 1, want: map[string]string{"f": "f", "g": "g"}},
		// What the commit drops with a directory the original put in a
		// file's place is named too, and resolved on its own.
		{name: "a file it changed, replaced by a directory in the original",
			sandbox: func(s *sandbox) { s.write("f", "sandbox") },
			other:   func(t *testing.T, orig string) { fileToDir(t, filepath.Join(orig, "f")) },
			paths:   []string{"f", "f/x"}, reasons: 2, want: map[string]string{"d": "", "d/a": "a", "f": "sandbox", "g": "g"}},
		{name: "a file it removed, replaced by a directory in the original",
			sandbox: func(s *sandbox) { s.remove("g") },
			other:   func(t *testing.T, orig string) { fileToDir(t, filepath.Join(orig, "g")) },
			paths:   []string{"g", "g/x"}, reasons: 2, want: map[string]string{"d": "", "d/a": "a", "f": "f"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSandbox(t, map[string]string{"f": "f", "g": "g", "d/a": "a"})
			if !strings.Contains(tc.name, "directory") { // d is for those
				s.remove("d/a")
				s.remove("d")
			}
			tc.sandbox(s)
			s.done()
			tc.other(t, s.orig)
			before := snapshot(t, s.orig)
			cf, err := Conflicts(s.cfg)
			require.NoError(t, err)
			n := 0
			for _, c := range cf {
				if slices.Contains(tc.paths, c.Path) {
					n++
				}
			}
			require.Equal(t, tc.reasons, n, "conflicts: %v", cf)

			resolved, left, err := Resolve(s.cfg, tc.paths)
			require.NoError(t, err)
			assert.Len(t, resolved, tc.reasons)
			assert.Empty(t, left)
			assert.Equal(t, before, snapshot(t, s.orig), "resolving changes no original")

			require.NoError(t, commitAll(t, s.cfg, Options{}))
			got := map[string]string{}
			for p := range snapshot(t, s.orig) {
				if st, err := os.Lstat(filepath.Join(s.orig, p)); err == nil && st.IsDir() {
					got[p] = ""
					continue
				}
				b, err := os.ReadFile(filepath.Join(s.orig, p))
				require.NoError(t, err)
				got[p] = string(b)
			}
			assert.Equal(t, tc.want, got)
		})
	}
}

// fileToDir replaces the file p by a directory holding a file x.
func fileToDir(t *testing.T, p string) {
	t.Helper()
	require.NoError(t, os.Remove(p))
	require.NoError(t, os.Mkdir(p, 0o755))
	writeFile(t, filepath.Join(p, "x"), "other writer")
}

func TestResolveThenTheOriginalChangesAgain(t *testing.T) {
	s := newSandbox(t, map[string]string{"f": "f"})
	s.write("f", "sandbox")
	s.done()
	writeFile(t, filepath.Join(s.orig, "f"), "other writer")
	_, _, err := Resolve(s.cfg, []string{"f"})
	require.NoError(t, err)
	writeFile(t, filepath.Join(s.orig, "f"), "other writer, later and longer")
	err = commitAll(t, s.cfg, Options{})
	var ce *Error
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, []Conflict{{Path: "f", Reason: "content changed in the original"}}, ce.Conflicts)
}

// A conflict on a path that is not UTF-8 stays resolved: rebase.json keeps
// the path byte for byte (before, JSON wrote U+FFFD and the conflict came
// back on every commit). Its JSON form carries the exact path too.
func TestResolveOfANameThatIsNotUTF8(t *testing.T) {
	s := newSandbox(t, map[string]string{"caf\xe9/f\xff": "f"})
	s.write("caf\xe9/f\xff", "sandbox")
	s.done()
	writeFile(t, filepath.Join(s.orig, "caf\xe9/f\xff"), "other writer")
	cf, err := Conflicts(s.cfg)
	require.NoError(t, err)
	require.Len(t, cf, 1)
	b, err := json.Marshal(cf[0])
	require.NoError(t, err)
	var back Conflict
	require.NoError(t, json.Unmarshal(b, &back))
	assert.Equal(t, cf[0], back, "%s", b)

	_, left, err := Resolve(s.cfg, []string{"caf\xe9/f\xff"})
	require.NoError(t, err)
	assert.Empty(t, left)
	cf, err = Conflicts(s.cfg)
	require.NoError(t, err)
	assert.Empty(t, cf, "resolved")
	require.NoError(t, commitAll(t, s.cfg, Options{}))
	b, err = os.ReadFile(filepath.Join(s.orig, "caf\xe9/f\xff"))
	require.NoError(t, err)
	assert.Equal(t, "sandbox", string(b))
}

// TestResolveRefuses: a path that names no conflict, and a conflict that
// keeping the sandbox's version cannot settle (a symlink now on the way to
// it: the commit never follows one), are refused and record nothing.
func TestResolveRefuses(t *testing.T) {
	s := newSandbox(t, map[string]string{"d/a": "a", "g": "g", "h": "h"})
	s.write("d/a", "sandbox")
	s.write("g", "sandbox")
	s.done()
	d := filepath.Join(s.orig, "d")
	require.NoError(t, os.Rename(d, d+".real"))
	require.NoError(t, os.Symlink("d.real", d))
	writeFile(t, filepath.Join(s.orig, "g"), "other writer")
	want := []Conflict{{Path: "d/a", Reason: "removed from the original"}, {Path: "g", Reason: "content changed in the original"},
		{Path: "d", Reason: "replaced in the original"}}

	_, _, err := Resolve(s.cfg, []string{"g", "h"})
	assert.ErrorIs(t, err, ErrNotAConflict)
	_, _, err = Resolve(s.cfg, []string{"g", "d/a"})
	assert.ErrorIs(t, err, ErrUnresolvable)
	cf, err := Conflicts(s.cfg)
	require.NoError(t, err)
	assert.ElementsMatch(t, want, cf, "nothing was recorded")

	_, left, err := Resolve(s.cfg, []string{"g"})
	require.NoError(t, err)
	assert.ElementsMatch(t, []Conflict{want[0], want[2]}, left)
	err = commitAll(t, s.cfg, Options{})
	var ce *Error
	require.ErrorAs(t, err, &ce)
	assert.ElementsMatch(t, []Conflict{want[0], want[2]}, ce.Conflicts)

	// Once the directory's conflict is resolved (the sandbox's directory
	// replaces the symlink), what is beneath it is no conflict: the
	// commit makes d and puts d/a in it; d.real is left alone.
	_, left, err = Resolve(s.cfg, []string{"d"})
	require.NoError(t, err)
	assert.Empty(t, left)
	require.NoError(t, commitAll(t, s.cfg, Options{}))
	b, err := os.ReadFile(filepath.Join(s.orig, "d", "a"))
	require.NoError(t, err)
	assert.Equal(t, "sandbox", string(b))
	b, err = os.ReadFile(filepath.Join(s.orig, "d.real", "a"))
	require.NoError(t, err)
	assert.Equal(t, "a", string(b))
}

// TestResolveSurvivesAnUndo: a commit of a resolved sandbox that is undone
// leaves the original as it was, and the retry needs no second resolve.
func TestResolveSurvivesAnUndo(t *testing.T) {
	s := newSandbox(t, map[string]string{"f": "f"})
	s.write("f", "sandbox")
	s.write("new", "sandbox")
	s.done()
	writeFile(t, filepath.Join(s.orig, "f"), "other writer")
	writeFile(t, filepath.Join(s.orig, "new"), "other writer")
	_, _, err := Resolve(s.cfg, []string{"f", "new"})
	require.NoError(t, err)
	before := snapshot(t, s.orig)
	x, err := Prepare(s.cfg, Options{})
	require.NoError(t, err)
	require.NoError(t, x.Apply())
	require.NoError(t, x.Undo())
	assert.Equal(t, before, snapshot(t, s.orig))
	require.NoError(t, commitAll(t, s.cfg, Options{}))
	for _, p := range []string{"f", "new"} {
		b, err := os.ReadFile(filepath.Join(s.orig, p))
		require.NoError(t, err)
		assert.Equal(t, "sandbox", string(b), p)
	}
}

// TestResolveADirectoryGoneFromTheOriginal: the sandbox made a file in an
// original directory that the original then moved away, removed with
// its parent, or replaced by a file. The conflict on the directory is
// resolved (or --force given): the commit makes the sandbox's directory
// again, with the new file in it; what the original moved away stays
// where it went, and a file in the directory's place goes.
func TestResolveADirectoryGoneFromTheOriginal(t *testing.T) {
	for _, tc := range []struct {
		name  string
		other func(t *testing.T, orig string)
		want  Conflict
		force bool
		after []string
	}{
		{name: "moved away", want: Conflict{Path: "d/sub", Reason: "removed from the original"},
			other: func(t *testing.T, orig string) {
				require.NoError(t, os.Rename(filepath.Join(orig, "d/sub"), filepath.Join(orig, "d/moved")))
			},
			after: []string{"d", "d/a", "d/moved", "d/moved/f", "d/sub", "d/sub/new"}},
		{name: "moved away, --force", force: true, want: Conflict{Path: "d/sub", Reason: "removed from the original"},
			other: func(t *testing.T, orig string) {
				require.NoError(t, os.Rename(filepath.Join(orig, "d/sub"), filepath.Join(orig, "d/moved")))
			},
			after: []string{"d", "d/a", "d/moved", "d/moved/f", "d/sub", "d/sub/new"}},
		{name: "removed with its parent", want: Conflict{Path: "d/sub", Reason: "removed from the original"},
			other: func(t *testing.T, orig string) { require.NoError(t, os.RemoveAll(filepath.Join(orig, "d"))) },
			after: []string{"d", "d/sub", "d/sub/new"}},
		{name: "replaced by a file", want: Conflict{Path: "d/sub", Reason: "replaced in the original"},
			other: func(t *testing.T, orig string) {
				require.NoError(t, os.RemoveAll(filepath.Join(orig, "d/sub")))
				writeFile(t, filepath.Join(orig, "d/sub"), "other writer")
			},
			after: []string{"d", "d/a", "d/sub", "d/sub/new"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSandbox(t, map[string]string{"d/a": "a", "d/sub/f": "f"})
			s.write("d/sub/new", "new")
			s.done()
			tc.other(t, s.orig)
			cf, err := Conflicts(s.cfg)
			require.NoError(t, err)
			require.Equal(t, []Conflict{tc.want}, cf)
			if tc.force {
				require.NoError(t, commitAll(t, s.cfg, Options{Force: true}))
			} else {
				_, left, err := Resolve(s.cfg, []string{"d/sub"})
				require.NoError(t, err)
				require.Empty(t, left)
				require.NoError(t, commitAll(t, s.cfg, Options{}))
			}
			assert.ElementsMatch(t, tc.after, slices.Collect(maps.Keys(snapshot(t, s.orig))))
			b, err := os.ReadFile(filepath.Join(s.orig, "d/sub/new"))
			require.NoError(t, err)
			assert.Equal(t, "new", string(b))
		})
	}
}

// TestResolveAMovedDirectoryGoneWithWhatIsBeneath: the sandbox moved a
// directory and made a file in a subdirectory of it; the original removed
// the directory. Resolved (or forced), the commit makes the moved
// directory and the subdirectory anew around the new file (the
// subdirectory's resolve names its path through the sandbox's rename;
// until the fuzzed concurrent test found it, the commit failed there).
func TestResolveAMovedDirectoryGoneWithWhatIsBeneath(t *testing.T) {
	for _, force := range []bool{false, true} {
		t.Run(fmt.Sprintf("force=%v", force), func(t *testing.T) {
			s := newSandbox(t, map[string]string{"a/d/x": "x", "k": "k"})
			s.rename("a", "b")
			s.write("b/d/new", "new")
			s.done()
			require.NoError(t, os.RemoveAll(filepath.Join(s.orig, "a")))
			cf, err := Conflicts(s.cfg)
			require.NoError(t, err)
			assert.ElementsMatch(t, []Conflict{{Path: "b", Reason: "removed from the original"}, {Path: "b/d", Reason: "removed from the original"}}, cf)
			if force {
				require.NoError(t, commitAll(t, s.cfg, Options{Force: true}))
			} else {
				_, left, err := Resolve(s.cfg, []string{"b", "b/d"})
				require.NoError(t, err)
				require.Empty(t, left)
				require.NoError(t, commitAll(t, s.cfg, Options{}))
			}
			assert.ElementsMatch(t, []string{"b", "b/d", "b/d/new", "k"}, slices.Collect(maps.Keys(snapshot(t, s.orig))))
		})
	}
}

// TestResolveADirectoryGoneBeneathAMovedOne: the sandbox moves d into a
// directory it made (n/d) and makes a file in d/sub; the original
// removes d/sub. The conflict names n/d/sub, though a new directory is
// above it: beneath the moved d are the original's objects. Before, the
// check took n/d/sub for part of the new n, named only the files the
// sandbox changed in it, and the commit failed (exit 8) once they were
// resolved.
func TestResolveADirectoryGoneBeneathAMovedOne(t *testing.T) {
	s := newSandbox(t, map[string]string{"d/a": "a", "d/sub/f": "f"})
	s.write("d/sub/new", "new")
	s.write("d/sub/f", "sandbox")
	s.mkdir("n")
	s.rename("d", "n/d")
	s.done()
	require.NoError(t, os.RemoveAll(filepath.Join(s.orig, "d/sub")))
	cf, err := Conflicts(s.cfg)
	require.NoError(t, err)
	assert.ElementsMatch(t, []Conflict{{Path: "n/d/sub", Reason: "removed from the original"}, {Path: "n/d/sub/f", Reason: "removed from the original"}}, cf)
	_, left, err := Resolve(s.cfg, []string{"n/d/sub", "n/d/sub/f"})
	require.NoError(t, err)
	require.Empty(t, left)
	require.NoError(t, commitAll(t, s.cfg, Options{}))
	assert.ElementsMatch(t, []string{"n", "n/d", "n/d/a", "n/d/sub", "n/d/sub/f", "n/d/sub/new"}, slices.Collect(maps.Keys(snapshot(t, s.orig))))
}

// TestResolveASymlinkInADirectorysPlace: the original moved a directory
// away and left a symlink to it in its place (d -> d.real), under every
// kind of change the sandbox made beneath d. The conflicts name d, and
// resolving d (or --force) commits: the sandbox's directory replaces the
// symlink and holds the sandbox's changes; a removal has nothing to
// remove (the symlink stays if nothing else needs the directory); d.real
// is left alone. Until 2026-11-26 only a change directly in d named d:
// the others were unresolvable, or failed the commit after the resolve.
func TestResolveASymlinkInADirectorysPlace(t *testing.T) {
	for _, force := range []bool{false, true} {
		for _, tc := range []struct {
			name    string
			sandbox func(s *sandbox)
			check   func(t *testing.T, orig string)
		}{
			{"a directory removed", func(s *sandbox) { s.remove("d/sub/f"); s.remove("d/sub") },
				func(t *testing.T, orig string) {
					target, err := os.Readlink(filepath.Join(orig, "d"))
					require.NoError(t, err, "d stays the symlink")
					assert.Equal(t, "d.real", target)
				}},
			{"a file written", func(s *sandbox) { s.write("d/sub/f", "new") },
				func(t *testing.T, orig string) { assert.Equal(t, "new", readFile(t, filepath.Join(orig, "d/sub/f"))) }},
			{"a directory's mode changed", func(s *sandbox) { s.chmod("d/sub", 0o700) },
				func(t *testing.T, orig string) {
					st, err := os.Stat(filepath.Join(orig, "d/sub"))
					require.NoError(t, err)
					assert.Equal(t, os.FileMode(0o700), st.Mode().Perm())
				}},
			{"a directory renamed", func(s *sandbox) { s.rename("d/sub", "d/sub2") },
				func(t *testing.T, orig string) { assert.DirExists(t, filepath.Join(orig, "d/sub2")) }},
			{"a file made", func(s *sandbox) { s.write("d/n", "n") },
				func(t *testing.T, orig string) { assert.Equal(t, "n", readFile(t, filepath.Join(orig, "d/n"))) }},
			{"a directory made", func(s *sandbox) { s.mkdir("d/nd") },
				func(t *testing.T, orig string) { assert.DirExists(t, filepath.Join(orig, "d/nd")) }},
			{"a file made deeper", func(s *sandbox) { s.write("d/sub/n", "n") },
				func(t *testing.T, orig string) { assert.Equal(t, "n", readFile(t, filepath.Join(orig, "d/sub/n"))) }},
		} {
			t.Run(fmt.Sprintf("%s, force %v", tc.name, force), func(t *testing.T) {
				s := newSandbox(t, map[string]string{"d/sub/f": "f", "d/g": "g"})
				tc.sandbox(s)
				s.done()
				d := filepath.Join(s.orig, "d")
				require.NoError(t, os.Rename(d, d+".real"))
				require.NoError(t, os.Symlink("d.real", d))
				cf, err := Conflicts(s.cfg)
				require.NoError(t, err)
				assert.Contains(t, cf, Conflict{Path: "d", Reason: "replaced in the original"})
				opt := Options{Force: force}
				if !force {
					_, left, err := Resolve(s.cfg, []string{"d"})
					require.NoError(t, err)
					assert.Empty(t, left, "resolving d settles what is beneath it")
				}
				require.NoError(t, commitAll(t, s.cfg, opt))
				tc.check(t, s.orig)
				assert.Equal(t, "f", readFile(t, filepath.Join(s.orig, "d.real/sub/f")), "d.real is left alone")
				assert.Equal(t, "g", readFile(t, filepath.Join(s.orig, "d.real/g")))
			})
		}
	}
}
