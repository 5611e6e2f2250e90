package commit

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/layers"
)

// diffSandbox is a layers stack over a real original, driven through the
// layers API as the FUSE layer drives it (no mount needed).
type diffSandbox struct {
	t   *testing.T
	l   *layers.Layers
	cfg layers.Config
	c   layers.Caller
}

func newDiffSandbox(t *testing.T, files map[string]string) *diffSandbox {
	t.Helper()
	dir := t.TempDir()
	cfg := layers.Config{Upper: filepath.Join(dir, "upper"), Work: filepath.Join(dir, "work"), Lowers: []string{filepath.Join(dir, "orig")}}
	for _, d := range []string{cfg.Upper, cfg.Work, cfg.Lowers[0]} {
		require.NoError(t, os.MkdirAll(d, 0o755))
	}
	writeTestFiles(t, cfg.Lowers[0], files)
	l, err := layers.Open(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	return &diffSandbox{t: t, l: l, cfg: cfg, c: layers.Caller{Pid: 1}}
}

// writeFiles makes files ("content"), directories (a trailing "/"),
// symlinks ("-> target") and executables ("#!..." content) under root.
func writeTestFiles(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for p, v := range files {
		full := filepath.Join(root, p)
		if strings.HasSuffix(p, "/") {
			require.NoError(t, os.MkdirAll(full, 0o755))
			continue
		}
		require.NoError(t, os.MkdirAll(filepath.Dir(full), 0o755))
		if target, ok := strings.CutPrefix(v, "-> "); ok {
			require.NoError(t, os.Symlink(target, full))
			continue
		}
		mode := os.FileMode(0o644)
		if strings.HasPrefix(v, "#!") {
			mode = 0o755
		}
		require.NoError(t, os.WriteFile(full, []byte(v), mode))
		require.NoError(t, os.Chmod(full, mode))
	}
}

func (s *diffSandbox) lookup(p string) layers.Entry {
	s.t.Helper()
	e, err := s.l.Root()
	require.NoError(s.t, err)
	dir := ""
	for _, name := range strings.Split(p, "/") {
		if name == "" {
			continue
		}
		e, err = s.l.Lookup(dir, e.Obj, name)
		require.NoError(s.t, err, p)
		dir = layers.Join(dir, name)
	}
	return e
}

func splitParent(p string) (string, string) {
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		return p[:i], p[i+1:]
	}
	return "", p
}

func (s *diffSandbox) write(p, data string) {
	s.t.Helper()
	e := s.lookup(p)
	fd, _, err := s.l.Open(p, &e.Obj, unix.O_WRONLY|unix.O_TRUNC, s.c)
	require.NoError(s.t, err)
	_, err = unix.Write(fd, []byte(data))
	require.NoError(s.t, err)
	require.NoError(s.t, unix.Close(fd))
}

func (s *diffSandbox) create(p, data string) {
	s.t.Helper()
	dir, name := splitParent(p)
	fd, _, err := s.l.Create(dir, s.lookup(dir).Obj, name, unix.S_IFREG|0o644, s.c)
	require.NoError(s.t, err)
	_, err = unix.Write(fd, []byte(data))
	require.NoError(s.t, err)
	require.NoError(s.t, unix.Close(fd))
}

func (s *diffSandbox) mkdir(p string) {
	s.t.Helper()
	dir, name := splitParent(p)
	_, err := s.l.Mkdir(dir, s.lookup(dir).Obj, name, 0o755, s.c)
	require.NoError(s.t, err)
}

func (s *diffSandbox) symlink(p, target string) {
	s.t.Helper()
	dir, name := splitParent(p)
	_, err := s.l.Symlink(dir, s.lookup(dir).Obj, name, target, s.c)
	require.NoError(s.t, err)
}

func (s *diffSandbox) remove(p string) {
	s.t.Helper()
	dir, name := splitParent(p)
	if e := s.lookup(p); e.IsDir() {
		require.NoError(s.t, s.l.Rmdir(dir, s.lookup(dir).Obj, name, s.c))
		return
	}
	require.NoError(s.t, s.l.Unlink(dir, s.lookup(dir).Obj, name, s.c))
}

func (s *diffSandbox) rename(from, to string) {
	s.t.Helper()
	od, on := splitParent(from)
	nd, nn := splitParent(to)
	src := s.lookup(from).Obj
	require.NoError(s.t, s.l.Rename(od, s.lookup(od).Obj, on, &src, nd, s.lookup(nd).Obj, nn, 0, s.c))
}

func (s *diffSandbox) exchange(a, b string) {
	s.t.Helper()
	ad, an := splitParent(a)
	bd, bn := splitParent(b)
	src := s.lookup(a).Obj
	require.NoError(s.t, s.l.Rename(ad, s.lookup(ad).Obj, an, &src, bd, s.lookup(bd).Obj, bn, unix.RENAME_EXCHANGE, s.c))
}

func (s *diffSandbox) mkfifo(p string) {
	s.t.Helper()
	dir, name := splitParent(p)
	_, err := s.l.Mknod(dir, s.lookup(dir).Obj, name, unix.S_IFIFO|0o644, 0, s.c)
	require.NoError(s.t, err)
}

func (s *diffSandbox) chmod(p string, mode uint32) {
	s.t.Helper()
	e := s.lookup(p)
	_, err := s.l.Setattr(p, &e.Obj, -1, layers.SetAttr{Mode: &mode}, s.c)
	require.NoError(s.t, err)
}

func (s *diffSandbox) changes() layers.ChangeSet {
	s.t.Helper()
	require.NoError(s.t, s.l.Sync())
	cs, err := layers.Changes(s.cfg)
	require.NoError(s.t, err)
	return cs
}

func (s *diffSandbox) diff(opt DiffOptions) string {
	s.t.Helper()
	var b bytes.Buffer
	require.NoError(s.t, Diff(&b, s.cfg, s.changes(), opt))
	return b.String()
}

// richSandbox makes one change of every kind.
func richSandbox(t *testing.T) *diffSandbox {
	s := newDiffSandbox(t, map[string]string{
		"a.txt": "one\ntwo\nthree\n", "del.txt": "bye\n", "d/f.txt": "in d\n", "d/g.txt": "g\n",
		"bin.dat": "\x00\x01\x02", "link": "-> a.txt", "run.sh": "#!/bin/sh\n", "sp ace.txt": "x\n",
		"emptydir/": "", "mv.txt": "moved\n",
	})
	s.write("a.txt", "one\n2\nthree\nfour")
	s.remove("del.txt")
	s.mkdir("new")
	s.mkdir("new/dir")
	s.create("new/dir/n.txt", "new\n")
	s.rename("d", "e")
	s.write("e/f.txt", "in e\n")
	s.write("bin.dat", "\x00\x01\x03\x04")
	s.remove("link")
	s.symlink("link", "b.txt")
	s.chmod("run.sh", 0o700)
	s.mkdir("emptynew")
	s.remove("emptydir")
	s.create("tab\tname", "")
	s.write("sp ace.txt", "y\n")
	s.rename("mv.txt", "moved.txt")
	return s
}

func TestDiffPatch(t *testing.T) {
	t.Parallel()
	out := richSandbox(t).diff(DiffOptions{})
	for _, want := range []string{
		"diff --git a/a.txt b/a.txt\n--- a/a.txt\n+++ b/a.txt\n@@ -1,3 +1,4 @@\n one\n-two\n+2\n three\n+four\n\\ No newline at end of file\n",
		// git's abbreviated object ids of both sides (git hash-object)
		"diff --git a/bin.dat b/bin.dat\nindex 8352675..ef2caff\nBinary files a/bin.dat and b/bin.dat differ\n",
		"diff --git a/del.txt b/del.txt\ndeleted file mode 100644\n--- a/del.txt\n+++ /dev/null\n@@ -1 +0,0 @@\n-bye\n",
		"renamed directory d -> e\ndiff --git a/d/g.txt b/e/g.txt\nsimilarity index 100%\nrename from d/g.txt\nrename to e/g.txt\n",
		"diff --git a/d/f.txt b/e/f.txt\nrename from d/f.txt\nrename to e/f.txt\n--- a/d/f.txt\n+++ b/e/f.txt\n@@ -1 +1 @@\n-in d\n+in e\n",
		"deleted directory emptydir\n",
		"new directory emptynew\n",
		"diff --git a/link b/link\n--- a/link\n+++ b/link\n@@ -1 +1 @@\n-a.txt\n\\ No newline at end of file\n+b.txt\n\\ No newline at end of file\n",
		"diff --git a/mv.txt b/moved.txt\nrename from mv.txt\nrename to moved.txt\n",
		"diff --git a/new/dir/n.txt b/new/dir/n.txt\nnew file mode 100644\n--- /dev/null\n+++ b/new/dir/n.txt\n@@ -0,0 +1 @@\n+new\n",
		"diff --git a/run.sh b/run.sh\nold mode 100755\nnew mode 100700\n",
		"diff --git a/sp ace.txt b/sp ace.txt\n--- a/sp ace.txt\t\n+++ b/sp ace.txt\t\n@@ -1 +1 @@\n-x\n+y\n",
		"diff --git \"a/tab\\tname\" \"b/tab\\tname\"\nnew file mode 100644\n",
	} {
		assert.Contains(t, out, want)
	}
	assert.NotContains(t, out, "new directory new\n", "a new directory with files beneath shows through them")
	assert.Equal(t, 1, strings.Count(out, "rename to e/f.txt"), "a changed child of a renamed directory is listed once, with its change")
}

func TestDiffNameStatusStatJSON(t *testing.T) {
	t.Parallel()
	s := richSandbox(t)
	cs := s.changes()
	var b bytes.Buffer
	require.NoError(t, NameStatus(&b, cs))
	assert.Equal(t, "M\ta.txt\nM\tbin.dat\nD\tdel.txt\nR\td\te\nM\te/f.txt\nD\temptydir\nA\temptynew\n"+
		"M\tlink\nR\tmv.txt\tmoved.txt\nA\tnew\nA\tnew/dir\nA\tnew/dir/n.txt\nm\trun.sh\nM\tsp ace.txt\nA\t\"tab\\tname\"\n", b.String())

	b.Reset()
	require.NoError(t, NameStatusWithTypes(&b, s.cfg, cs))
	assert.Equal(t, "M\ta.txt\nM\tbin.dat\nD\tdel.txt\nR\td\te\nM\te/f.txt\nR\td/g.txt\te/g.txt\nD\temptydir\nA\temptynew\n"+
		"M\tlink\nR\tmv.txt\tmoved.txt\nA\tnew\nA\tnew/dir\nA\tnew/dir/n.txt\nm\trun.sh\nM\tsp ace.txt\nA\t\"tab\\tname\"\n", b.String(),
		"with the original at hand, the files a renamed directory moves are named too")

	b.Reset()
	require.NoError(t, DiffStat(&b, s.cfg, cs))
	assert.Equal(t, ` a.txt               |   3 ++-
 bin.dat             | Bin 3 -> 4 bytes
 del.txt             |   1 -
 {d => e}/f.txt      |   2 +-
 {d => e}/g.txt      |   0
 link                |   2 +-
 mv.txt => moved.txt |   0
 new/dir/n.txt       |   1 +
 run.sh              |   0
 sp ace.txt          |   2 +-
 "tab\tname"         |   0
 11 files changed, 6 insertions(+), 5 deletions(-)
`, b.String())

	fds, err := DiffJSON(s.cfg, cs)
	require.NoError(t, err)
	raw, err := json.Marshal(fds)
	require.NoError(t, err)
	var back []FileDiff
	require.NoError(t, json.Unmarshal(raw, &back))
	byPath := map[string]FileDiff{}
	for _, f := range back {
		byPath[f.Path] = f
	}
	a := byPath["a.txt"]
	assert.Equal(t, "M", a.Status)
	assert.Equal(t, 2, a.Added)
	assert.Equal(t, 1, a.Deleted)
	assert.Equal(t, "100644", a.OldMode)
	require.NotNil(t, a.OldSize)
	assert.EqualValues(t, 14, *a.OldSize)
	assert.True(t, byPath["bin.dat"].Binary)
	assert.Equal(t, "b.txt", byPath["link"].NewTarget)
	assert.Equal(t, "a.txt", byPath["link"].OldTarget)
	assert.Equal(t, "d/f.txt", byPath["e/f.txt"].OldPath)
	assert.Equal(t, "mv.txt", byPath["moved.txt"].From)
	assert.Nil(t, byPath["new/dir/n.txt"].OldSize)
	assert.Equal(t, "100700", byPath["run.sh"].NewMode)
	assert.Equal(t, "D", byPath["del.txt"].Status)
	assert.Empty(t, byPath["e/f.txt"].ImpliedBy, "a change of its own")
	g := byPath["e/g.txt"]
	assert.Equal(t, FileDiff{Path: "e/g.txt", Kind: "renamed", Status: "R", From: "d/g.txt", OldPath: "d/g.txt", Type: "file",
		OldType: "file", OldMode: "100644", NewMode: "100644", OldSize: g.OldSize, NewSize: g.NewSize, ImpliedBy: "e"}, g)
	require.NotNil(t, g.OldSize)
	assert.EqualValues(t, 2, *g.OldSize)
}

// TestStatusListingNamesDroppedFiles: an original file that went without
// a removal of its own (another object moved over it, then removed with
// its directory, which had been moved away) is listed by status as
// removed, as the diff forms list it: from the change set where an
// original object moved over it (its removal carries the place it took,
// through the lineage of its removed directory), else from the
// original's listing of the directory.
func TestStatusListingNamesDroppedFiles(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		ops  func(s *diffSandbox)
		want string
		// fromChangeSet: the change set names it (the removal of the
		// object moved over it carries it: Replaced)
		fromChangeSet bool
	}{
		{"an original file moved over it", func(s *diffSandbox) {
			s.rename("g", "n")
			s.rename("q", "n/f")
			s.remove("n/keep")
			s.remove("n/f")
			s.remove("n")
		}, "D g, D g/f, D g/keep, D q", true},
		{"a new file moved over it, a new directory in its place", func(s *diffSandbox) {
			s.chmod("", 0o750) // a change of the root, read first, reads nothing beneath
			s.rename("g", "n")
			s.create("x", "new\n")
			s.rename("x", "n/f")
			s.remove("n/keep")
			s.remove("n/f")
			s.remove("n")
			s.mkdir("g")
			// (the rename over n/f removes g/f: since 2026-11-28 the
			// change set names it, TestChangeSetRemovalOfWhatARenameReplaced)
		}, "m , D g, A g, D g/f, D g/keep", true},
		{"exchanged with a file, which is removed in its place", func(s *diffSandbox) {
			// (seed 586386707 of TestDifferential: the removal of the
			// file names g, the directory's place, with the file's type)
			s.exchange("g", "q")
			s.remove("g")
			s.create("x", "new\n")
			s.rename("x", "q/f")
			s.remove("q/keep")
			s.remove("q/f")
			s.remove("q")
			// (the rename over q/f removes g/f: since 2026-11-28 the
			// change set names it, TestChangeSetRemovalOfWhatARenameReplaced)
		}, "D g, D g/f, D g/keep, D q", true},
		{"exchanged with a file, removed where it went, under a name a new directory took and left", func(s *diffSandbox) {
			// (seed 555798659 of TestDifferentialRemount: the removals
			// moved with the new directory, where they name nothing)
			s.exchange("g", "q")
			s.mkdir("h")
			s.rename("q", "h/n2")
			s.remove("h/n2/f")
			s.remove("h/n2/keep")
			s.remove("h/n2")
			s.mkdir("h/n2")
			s.rename("h/n2", "y")
			// (the removals keep the lineage they had: since 2026-11-28
			// the change set names them, TestChangeSetTwoRemovalsAtOnePath)
		}, "R g, D g/f, D g/keep, A h, A y", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := newDiffSandbox(t, map[string]string{"g/f": "f\n", "g/keep": "k\n", "q": "q\n"})
			tc.ops(s)
			cs := s.changes()
			assert.Equal(t, tc.fromChangeSet, slices.Contains(strings.Split(statusLines(cs.Listing()), ", "), "D g/f"), "the change set names it")
			got, err := StatusListing(s.cfg, cs)
			require.NoError(t, err)
			assert.Equal(t, tc.want, statusLines(got))
		})
	}
}

// TestListingsNameARemovalCarriedOffByANewDirectory: rm -r n0, then a new
// n0/b exchanged with the original's e/f carries the removal records of
// the original's n0/b/y with it, and n0/b/y's path takes e/f's lineage: a
// change at n0/b/y names the removal of e/f/y (moved from there and
// removed elsewhere). The original's n0/b/y is named by no change; the
// walk of the original n0/b (replaced by a new directory) must list it,
// and did not: the change at its path claimed it. Found by
// TestDifferentialCommitKeep, seed 7 (diff --json coverage).
func TestListingsNameARemovalCarriedOffByANewDirectory(t *testing.T) {
	t.Parallel()
	s := newDiffSandbox(t, map[string]string{"n0/b/y": "y\n", "n0/b/k": "k\n", "e/f/y": "ey\n", "e/f/k": "ek\n"})
	for _, p := range []string{"n0/b/y", "n0/b/k", "n0/b", "n0"} {
		s.remove(p) // rm -r n0
	}
	s.mkdir("n0")
	s.mkdir("n0/b")
	s.exchange("e/f", "n0/b")
	s.rename("n0/b/y", "e/f/n3")
	for _, p := range []string{"n0/b/k", "n0/b", "n0", "e/f/n3", "e/f", "e"} {
		s.remove(p) // rm -r n0 e
	}
	s.mkdir("n0")
	s.mkdir("n0/b")
	cs := s.changes()
	got, err := StatusListing(s.cfg, cs)
	require.NoError(t, err)
	assert.Equal(t, "D e, D e/f, D e/f/k, D e/f/y, A n0, A n0/b, D n0/b/k, D n0/b/y", statusLines(got), "status")
	fds, err := DiffJSON(s.cfg, cs)
	require.NoError(t, err)
	var paths []string
	for _, f := range fds {
		paths = append(paths, f.Status+" "+f.Path)
	}
	assert.Equal(t, []string{"D e", "D e/f", "D e/f/k", "D e/f/y", "A n0", "A n0/b", "D n0/b/k", "D n0/b/y"}, paths, "diff --json")
}

// TestDiffOfATreeMadeAgain: rm -r g, then g made again with files at the
// original's paths (git checkout, a build that cleans its output, npm
// ci). The change set has the new g replace the original's whole, its
// files new; status and the diff forms compare each file made again
// with the original's at its path, as git does: M, and a patch git
// apply takes. (Before, each was listed D and A, and the patch deleted
// it twice: git apply refused.) A file the original has there no longer
// is removed; a symlink made again is modified; a directory of the
// original moved away leaves a new one there new.
func TestDiffOfATreeMadeAgain(t *testing.T) {
	t.Parallel()
	files := map[string]string{"g/f": "one\n", "g/n/f": "two\n", "g/old": "old\n", "g/same": "same\n", "g/ln": "-> f",
		"m/x": "x\n", "keep": "k\n"}
	s := newDiffSandbox(t, files)
	for _, p := range []string{"g/n/f", "g/n", "g/f", "g/old", "g/same", "g/ln", "g"} {
		s.remove(p)
	}
	s.mkdir("g")
	s.mkdir("g/n")
	s.create("g/f", "remade\n")
	s.create("g/n/f", "two\n")
	s.create("g/same", "same\n")
	s.symlink("g/ln", "n/f")
	s.rename("m", "m2")
	s.mkdir("m")
	s.create("m/x", "new x\n")
	cs := s.changes()

	got, err := StatusListing(s.cfg, cs)
	require.NoError(t, err)
	assert.Equal(t, "A g, M g/f, M g/ln, A g/n, M g/n/f, D g/old, M g/same, A m, A m/x, R m2", statusLines(got))

	var b bytes.Buffer
	require.NoError(t, NameStatusWithTypes(&b, s.cfg, cs))
	assert.Equal(t, "A\tg\nM\tg/f\nM\tg/ln\nA\tg/n\nM\tg/n/f\nD\tg/old\nM\tg/same\nA\tm\nA\tm/x\nR\tm\tm2\nR\tm/x\tm2/x\n", b.String())

	patch := s.diff(DiffOptions{Binary: true})
	assert.Contains(t, patch, "diff --git a/g/f b/g/f\n--- a/g/f\n+++ b/g/f\n@@ -1 +1 @@\n-one\n+remade\n")
	assert.Equal(t, 1, strings.Count(patch, "deleted file mode"), "g/old only, once:\n%s", patch)
	work := appliedPatch(t, files, patch)
	want := t.TempDir()
	writeTestFiles(t, want, map[string]string{"g/f": "remade\n", "g/n/f": "two\n", "g/same": "same\n", "g/ln": "-> n/f",
		"m/x": "new x\n", "m2/x": "x\n", "keep": "k\n"})
	assert.Equal(t, snapshot(t, want), snapshot(t, work))
}

// TestPatchDeletesAnObjectRemovedUnderTwoNamesOnce: mv x y; mv y/d z;
// mkdir y/d; a file made at y/d/f and removed; rm z/f. The change set
// names the removal of the original's x/d/f twice: at z/f, where it was
// removed, and at y/d/f, whose record takes y's lineage (x) since the
// new y/d has none of its own. The patch deleted x/d/f twice and git
// apply refused it ("has been renamed/deleted"); it deletes it once
// (TestDifferentialCommitKeep, seed 176176858 with -diff.churn).
func TestPatchDeletesAnObjectRemovedUnderTwoNamesOnce(t *testing.T) {
	t.Parallel()
	files := map[string]string{"x/d/f": "f\n", "x/d/k": "k\n", "x/keep": "x\n"}
	s := newDiffSandbox(t, files)
	s.rename("x", "y")
	s.rename("y/d", "z")
	s.mkdir("y/d")
	s.create("y/d/f", "new\n")
	s.remove("y/d/f")
	s.remove("z/f")
	cs := s.changes()
	patch := s.diff(DiffOptions{Binary: true})
	assert.Equal(t, 1, strings.Count(patch, "diff --git a/x/d/f b/x/d/f"), "x/d/f deleted once:\n%s", patch)
	work := appliedPatch(t, files, patch)
	want := t.TempDir()
	writeTestFiles(t, want, map[string]string{"y/keep": "x\n", "z/k": "k\n"}) // (git apply makes no empty directory)
	assert.Equal(t, snapshot(t, want), snapshot(t, work))
	got, err := StatusListing(s.cfg, cs)
	require.NoError(t, err)
	assert.Equal(t, 1, strings.Count(statusLines(got), "D x/d/f"), statusLines(got))
}

// appliedPatch applies patch with git apply to a new directory holding
// files, and returns that directory.
func appliedPatch(t *testing.T, files map[string]string, patch string) string {
	t.Helper()
	work := t.TempDir()
	writeTestFiles(t, work, files)
	cmd := exec.Command("git", "apply", "-")
	cmd.Dir, cmd.Stdin = work, strings.NewReader(patch)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "git apply: %s\npatch:\n%s", out, patch)
	return work
}

// TestListingNamesTheDirectoriesADroppedTreeHad: the listing forms name
// each directory of the original that went with a replaced one and that
// no entry names (as rm -r lists each), not only its files: h made again,
// then its new h/i exchanged for a file (the original's h/i/j is gone,
// and no change of the set is at its path).
func TestListingNamesTheDirectoriesADroppedTreeHad(t *testing.T) {
	t.Parallel()
	s := newDiffSandbox(t, map[string]string{"h/i/j/f": "f\n", "g/x": "x\n"})
	for _, p := range []string{"h/i/j/f", "h/i/j", "h/i", "h"} {
		s.remove(p)
	}
	for _, p := range []string{"h", "h/i", "h/i/j"} {
		s.mkdir(p)
	}
	s.create("h/i/j/f", "f2\n")
	s.exchange("g/x", "h/i")
	cs := s.changes()
	got, err := StatusListing(s.cfg, cs)
	require.NoError(t, err)
	assert.Equal(t, "A g/x, A g/x/j, A g/x/j/f, A h, R h/i, D h/i/j, D h/i/j/f", statusLines(got))
	fds, err := DiffJSON(s.cfg, cs)
	require.NoError(t, err)
	var paths []string
	for _, f := range fds {
		paths = append(paths, f.Status+" "+f.Path)
	}
	assert.Equal(t, []string{"A g/x", "A g/x/j", "A g/x/j/f", "A h", "R h/i", "D h/i/j", "D h/i/j/f"}, paths)
}

// statusLines is a status listing on one line: "D g, A g, ...".
func statusLines(changes []layers.Change) string {
	var out []string
	for _, c := range changes {
		out = append(out, statusLetter(c, c.Type)+" "+c.Path)
	}
	return strings.Join(out, ", ")
}

// TestDiffListsWhatARenamedDirectoryMoves: the listing forms read with
// the original name every file a renamed directory moves (files beneath
// a renamed subdirectory with its own rename, FIFOs too) and every
// original file it drops, sorted by path as git sorts them.
func TestDiffListsWhatARenamedDirectoryMoves(t *testing.T) {
	t.Parallel()
	s := newDiffSandbox(t, map[string]string{
		"d/a": "a\n", "d/bin": "\x00bin", "d/sub/b": "b\n", "d/keep/c": "c\nc\n", "d/over": "one\ntwo\n", "y": "y\n",
	})
	require.NoError(t, unix.Mkfifo(filepath.Join(s.cfg.Lowers[0], "d/pipe"), 0o644))
	s.rename("d", "e")
	s.rename("e/sub", "e/sub2")
	s.rename("y", "e/over") // drops the original d/over
	s.write("e/a", "A\n")
	cs := s.changes()

	var b bytes.Buffer
	require.NoError(t, NameStatusWithTypes(&b, s.cfg, cs))
	assert.Equal(t, "D\td/over\n"+
		"R\td\te\n"+
		"M\te/a\n"+
		"R\td/bin\te/bin\n"+
		"R\td/keep/c\te/keep/c\n"+
		"R\ty\te/over\n"+
		"R\td/pipe\te/pipe\n"+
		"R\td/sub\te/sub2\n"+
		"R\td/sub/b\te/sub2/b\n", b.String())

	b.Reset()
	require.NoError(t, NameStatus(&b, cs))
	// (the rename over e/over removes d/over: since 2026-11-28 the change
	// set names it, TestChangeSetRemovalOfWhatARenameReplaced, as it
	// names d/over for mv d e; rm e/over)
	assert.Equal(t, "D\td/over\nR\td\te\nM\te/a\nR\ty\te/over\nR\td/sub\te/sub2\n", b.String(), "without the original, the change set alone")

	b.Reset()
	require.NoError(t, DiffStat(&b, s.cfg, cs))
	assert.Equal(t, ` d/over              |   2 --
 {d => e}/a          |   2 +-
 {d => e}/bin        | Bin
 {d => e}/keep/c     |   0
 y => e/over         |   0
 {d => e}/pipe       |   0
 {d/sub => e/sub2}/b |   0
 7 files changed, 1 insertion(+), 3 deletions(-)
`, b.String())

	fds, err := DiffJSON(s.cfg, cs)
	require.NoError(t, err)
	var got []string
	for _, f := range fds {
		got = append(got, fmt.Sprintf("%s %s<-%s with=%q type=%s", f.Status, f.Path, f.From, f.ImpliedBy, f.Type))
	}
	assert.Equal(t, []string{
		`D d/over<- with="" type=file`, // a change of its own (above)
		`R e<-d with="" type=dir`,
		`M e/a<- with="" type=file`,
		`R e/bin<-d/bin with="e" type=file`,
		`R e/keep/c<-d/keep/c with="e" type=file`,
		`R e/over<-y with="" type=file`,
		`R e/pipe<-d/pipe with="e" type=fifo`,
		`R e/sub2<-d/sub with="" type=dir`,
		`R e/sub2/b<-d/sub/b with="e/sub2" type=file`,
	}, got)
	assert.True(t, fds[3].Binary, "a moved binary file is told by its first bytes")
	assert.Equal(t, 2, fds[0].Deleted, "a dropped file counts its lines")
}

// TestDiffDirectoryTurnedIntoANonDirectory: an original directory j
// whose place holds a file or symlink now, after j was removed or moved
// away whole, inside a renamed directory or not. Its files move with it
// when it moved (never to beneath the new file: the fuzzed differential
// test's git apply refused such a patch, "beyond a symbolic link"), and
// are removed only when it was; status and every diff form agree.
func TestDiffDirectoryTurnedIntoANonDirectory(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		ops        func(s *diffSandbox)
		nameStatus string
		status     string
	}{
		{"removed, a symlink in its place, its parent moved", func(s *diffSandbox) {
			s.rename("h/i/j", "y")
			s.rename("h/i", "X")
			s.remove("y/f")
			s.remove("y")
			s.symlink("X/j", "ln")
		}, "R\th/i\tX\nR\th/i/g\tX/g\nT\tX/j\nD\th/i/j/f\n", "R X, M X/j, D h/i/j/f"},
		{"moved away, a file in its place, its parent moved", func(s *diffSandbox) {
			s.rename("h/i", "X")
			s.rename("X/j", "y")
			s.create("X/j", "z\n")
		}, "R\th/i\tX\nR\th/i/g\tX/g\nT\tX/j\nR\th/i/j\ty\nR\th/i/j/f\ty/f\n", "R X, M X/j, R y"},
		{"moved away, a file in its place", func(s *diffSandbox) {
			s.rename("h/i/j", "y")
			s.create("h/i/j", "z\n")
		}, "T\th/i/j\nR\th/i/j\ty\nR\th/i/j/f\ty/f\n", "M h/i/j, R y"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			files := map[string]string{"h/i/j/f": "f\n", "h/i/g": "g\n"}
			s := newDiffSandbox(t, files)
			tc.ops(s)
			cs := s.changes()
			var b bytes.Buffer
			require.NoError(t, NameStatusWithTypes(&b, s.cfg, cs))
			assert.Equal(t, tc.nameStatus, b.String())
			got, err := StatusListing(s.cfg, cs)
			require.NoError(t, err)
			assert.Equal(t, tc.status, statusLines(got))

			if _, err := exec.LookPath("git"); err != nil {
				return
			}
			work := t.TempDir()
			writeTestFiles(t, work, files)
			cmd := exec.Command("git", "apply", "-")
			patch := s.diff(DiffOptions{Binary: true})
			cmd.Dir, cmd.Stdin = work, strings.NewReader(patch)
			out, err := cmd.CombinedOutput()
			require.NoError(t, err, "git apply: %s\npatch:\n%s", out, patch)
		})
	}
}

func TestDiffTypeChange(t *testing.T) {
	t.Parallel()
	s := newDiffSandbox(t, map[string]string{"f": "text\n", "l": "-> f", "x/": ""})
	s.remove("f")
	s.symlink("f", "target")
	s.remove("l")
	s.create("l", "now a file\n")
	s.remove("x")
	s.create("x", "")
	cs := s.changes()
	var b bytes.Buffer
	require.NoError(t, NameStatus(&b, cs))
	assert.Equal(t, "M\tf\nM\tl\nM\tx\n", b.String(), "the change set alone cannot tell a file's type change")
	b.Reset()
	require.NoError(t, NameStatusWithTypes(&b, s.cfg, cs))
	assert.Equal(t, "T\tf\nT\tl\nT\tx\n", b.String())
	out := s.diff(DiffOptions{})
	assert.Contains(t, out, "diff --git a/f b/f\ndeleted file mode 100644\n--- a/f\n+++ /dev/null\n@@ -1 +0,0 @@\n-text\n"+
		"diff --git a/f b/f\nnew file mode 120777\n--- /dev/null\n+++ b/f\n@@ -0,0 +1 @@\n+target\n\\ No newline at end of file\n")
	assert.Contains(t, out, "deleted directory x\ndiff --git a/x b/x\nnew file mode 100644\n")
}

func TestDiffContextOption(t *testing.T) {
	t.Parallel()
	var lines []string
	for i := range 20 {
		lines = append(lines, string(rune('a'+i)))
	}
	orig := strings.Join(lines, "\n") + "\n"
	s := newDiffSandbox(t, map[string]string{"f": orig})
	s.write("f", strings.Replace(strings.Replace(orig, "c\n", "C\n", 1), "r\n", "R\n", 1))
	tests := []struct {
		context int
		hunks   []string
	}{
		{0, []string{"@@ -3 +3 @@\n-c\n+C\n", "@@ -18 +18 @@\n-r\n+R\n"}},
		{-1, []string{"@@ -3 +3 @@\n-c\n+C\n", "@@ -18 +18 @@\n-r\n+R\n"}},
		{1, []string{"@@ -2,3 +2,3 @@\n b\n-c\n+C\n d\n", "@@ -17,3 +17,3 @@\n q\n-r\n+R\n s\n"}},
		{8, []string{"@@ -1,20 +1,20 @@\n a\n b\n-c\n+C\n"}},
	}
	for _, tt := range tests {
		ctx := tt.context
		if ctx == 0 {
			ctx = -1 // git's -U0
		}
		out := s.diff(DiffOptions{Context: ctx})
		for _, h := range tt.hunks {
			assert.Contains(t, out, h, "context %d", tt.context)
		}
		assert.Equal(t, len(tt.hunks), strings.Count(out, "@@ -"), "context %d:\n%s", tt.context, out)
	}
	assert.Contains(t, s.diff(DiffOptions{}), "@@ -1,6 +1,6 @@\n a\n b\n-c\n+C\n d\n e\n f\n", "default context is 3")
}

// TestDiffBinaryIndexLine: without --binary, a changed binary file gets
// git's index line with git's own object ids of both sides (also for a
// file read only in part, past the first 8,000 bytes), so git apply
// refuses that file with its own message and, with --exclude, applies
// the rest (without the line it misread the patches that follow).
func TestDiffBinaryIndexLine(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("no git")
	}
	big := "\x00" + strings.Repeat("binary content ", 2000)
	s := newDiffSandbox(t, map[string]string{"big.bin": big, "small.bin": "\x00s", "t.txt": "a\n"})
	s.write("big.bin", big+"more")
	s.write("small.bin", "\x00t")
	s.write("t.txt", "b\n")
	patch := s.diff(DiffOptions{})

	hashOf := func(data string) string {
		cmd := exec.Command("git", "hash-object", "--stdin")
		cmd.Stdin = strings.NewReader(data)
		out, err := cmd.Output()
		require.NoError(t, err)
		return strings.TrimSpace(string(out))[:7]
	}
	assert.Contains(t, patch, "diff --git a/big.bin b/big.bin\nindex "+hashOf(big)+".."+hashOf(big+"more")+"\nBinary files")
	assert.Contains(t, patch, "diff --git a/small.bin b/small.bin\nindex "+hashOf("\x00s")+".."+hashOf("\x00t")+"\nBinary files")

	work := t.TempDir()
	writeTestFiles(t, work, map[string]string{"big.bin": big, "small.bin": "\x00s", "t.txt": "a\n"})
	cmd := exec.Command("git", "apply", "-")
	cmd.Dir, cmd.Stdin = work, strings.NewReader(patch)
	out, err := cmd.CombinedOutput()
	require.Error(t, err)
	assert.Contains(t, string(out), "cannot apply binary patch to 'big.bin' without full index line")
	cmd = exec.Command("git", "apply", "--exclude=*.bin", "-")
	cmd.Dir, cmd.Stdin = work, strings.NewReader(patch)
	out, err = cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	b, err := os.ReadFile(filepath.Join(work, "t.txt"))
	require.NoError(t, err)
	assert.Equal(t, "b\n", string(b))
}

// TestDiffGitApply checks the patch against git: applied with `git
// apply` to a copy of the original, it gives the sandbox's files and
// symlinks (content, executable bits) and nothing else, with binary files
// (--binary), directory renames (nested, with changed and removed
// children), and objects git does not hold (FIFOs, a directory's mode)
// left to plain-words lines git apply passes over.
func TestDiffGitApply(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("no git")
	}
	files := map[string]string{
		"a.txt": "1\n2\n3\n4\n5\n6\n7\n8\n9\n10\n11\n12\n", "gone.txt": "x\ny\n", "s/l": "-> ../a.txt",
		"run.sh": "#!/bin/sh\necho hi\n", "noeol.txt": "no newline", "sp ace.txt": "a\n", "ren.txt": "r1\nr2\n",
		"bin.dat": "\x00\x01\x02", "gone.bin": "\x00gone", "text2bin": "text\n",
		"d/f": "f\n", "d/g.bin": "\x00g", "d/ln": "-> f", "d/x": "x\n", "d/run.sh": "#!/bin/sh\n",
		"d/sub/h": "h\n", "d/sub/deep/i": "i\n", "d/out": "out\n", "d/sp ace": "s\n", "fifodir/": "",
		"over/x": "x\n", "over/y": "y\n", "bak/f": "f\n", "r/keep": "k\n", "r/replaced": "old\n", "other": "other\n",
		"m/f": "old\n", "m/t": "t\n", "q/sub/f": "f\n", "q/sub/g": "g\n", "q/h": "h\n",
		"w/b/f": "f\n", "w/k": "k\n", "gone/f": "f\n", "gone/sub/g": "g\n",
		"sl": "-> a.txt", "fl": "fl\n", "k/ln": "-> x",
	}
	s := newDiffSandbox(t, files)
	s.write("a.txt", "1\n2\nthree\n4\n5\n6\n7\n8\n9\nten\n11\n12\n13\n")
	s.remove("gone.txt")
	s.create("fresh.txt", "fresh\n")
	s.create("empty.txt", "")
	s.remove("s/l")
	s.symlink("s/l", "elsewhere")
	s.write("noeol.txt", "no newline\nnow has one\n")
	s.write("sp ace.txt", "b\n")
	s.rename("ren.txt", "renamed.txt")
	s.write("renamed.txt", "r1\nr2\nr3\n")
	s.chmod("run.sh", 0o644)
	s.write("bin.dat", strings.Repeat("\x00\x01\x03\x04 some bytes", 40))
	s.create("new.bin", "\x00new")
	s.remove("gone.bin")
	s.write("text2bin", "\x00now binary")
	s.rename("d", "e")
	s.write("e/f", "f\nchanged\n")
	s.remove("e/x")
	s.rename("e/sub", "e/sub2")
	s.write("e/sub2/deep/i", "i\ni\n")
	s.rename("e/out", "out")
	s.chmod("e", 0o700)
	s.mkfifo("e/fifo")
	s.mkfifo("fifodir/p")
	s.rename("over/y", "over/x")     // the original x is lost: deleted first
	s.rename("bak/f", "bak/f~")      // an editor's save with a backup: f~ is a
	s.create("bak/f", "new\n")       // copy of f, f a change of the original f
	s.rename("r", "r2")              // a file that moved with its directory,
	s.rename("other", "r2/replaced") // then replaced: deleted
	s.rename("m", "m2")              // the original m/f and m/t are removed
	s.remove("m2/f")                 // where they moved to (listed after
	s.remove("m2/t")                 // m), a new m/f and m/t made at their
	s.mkdir("m2/t")                  // old paths: the removals must come
	s.mkdir("m")                     // first in the patch (git apply takes
	s.create("m/f", "new\n")         // an entry as acting on what earlier
	s.create("m/t", "new t\n")       // ones left)
	s.rename("q", "q2")              // a subdirectory of a moved directory
	s.mkdir("q")                     // removed, one of its files made anew
	s.mkdir("q/sub")                 // at its original path: nothing of
	s.create("q/sub/f", "new\n")     // q/sub moves to q2
	s.remove("q2/sub/f")
	s.remove("q2/sub/g")
	s.remove("q2/sub")
	s.mkdir("t")           // the original w/b exchanged for a new directory
	s.exchange("w/b", "t") // and removed where it went; w moved and the
	s.remove("t/f")        // new w/b removed there: the change set says
	s.remove("t")          // w2/b is removed, which the patch takes for the
	s.rename("w", "w2")    // original w/b: its files go too, none moves
	s.remove("w2/b")
	s.rename("gone", "gone2") // mv gone gone2; rm -r gone2: the change set
	s.remove("gone2/sub/g")   // names the files by where they were
	s.remove("gone2/sub")     // removed, which the original does not
	s.remove("gone2/f")       // have: they go with the removed directory
	s.remove("gone2")
	s.mkdir("nd")            // an original symlink and file exchanged for
	s.create("nd/n0", "n\n") // new directories with files: git apply
	s.exchange("sl", "nd")   // makes nothing beneath a symlink unless
	s.mkdir("nf")            // the entry that moves it says it is one
	s.create("nf/x", "x\n")  // (its mode lines)
	s.exchange("fl", "nf")
	s.rename("k", "k2") // a symlink moved with its directory, a new
	s.mkdir("k")        // directory with a file made at its old path
	s.mkdir("k/ln")
	s.create("k/ln/y", "y\n")
	patch := s.diff(DiffOptions{Binary: true})
	for _, want := range []string{
		"renamed directory d -> e\nmode changed e 040755 -> 040700\n",
		"renamed directory d/sub -> e/sub2\n",
		"new fifo e/fifo\n",
		"GIT binary patch\nliteral ",
		"diff --git a/over/x b/over/x\ndeleted file mode 100644\n",
		"diff --git a/bak/f b/bak/f~\ncopy from bak/f\ncopy to bak/f~\n",
		"diff --git a/r/replaced b/r/replaced\ndeleted file mode 100644\n",
	} {
		assert.Contains(t, patch, want)
	}

	work := t.TempDir()
	writeTestFiles(t, work, files)
	cmd := exec.Command("git", "apply", "-")
	cmd.Dir, cmd.Stdin = work, strings.NewReader(patch)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "git apply: %s\npatch:\n%s", out, patch)

	sandbox := map[string]string{
		"a.txt": "1\n2\nthree\n4\n5\n6\n7\n8\n9\nten\n11\n12\n13\n", "fresh.txt": "fresh\n", "empty.txt": "",
		"s/l": "-> elsewhere", "run.sh": "#!/bin/sh\necho hi\n", "noeol.txt": "no newline\nnow has one\n",
		"sp ace.txt": "b\n", "renamed.txt": "r1\nr2\nr3\n", "bin.dat": strings.Repeat("\x00\x01\x03\x04 some bytes", 40),
		"new.bin": "\x00new", "text2bin": "\x00now binary",
		"e/f": "f\nchanged\n", "e/g.bin": "\x00g", "e/ln": "-> f", "e/run.sh": "#!/bin/sh\n",
		"e/sub2/h": "h\n", "e/sub2/deep/i": "i\ni\n", "out": "out\n", "e/sp ace": "s\n",
		"over/x": "y\n", "bak/f~": "f\n", "bak/f": "new\n", "r2/keep": "k\n", "r2/replaced": "other\n",
		"m/f": "new\n", "m/t": "new t\n", "q/sub/f": "new\n", "q2/h": "h\n", "w2/k": "k\n",
		"sl/n0": "n\n", "nd": "-> a.txt", "fl/x": "x\n", "nf": "fl\n", "k2/ln": "-> x", "k/ln/y": "y\n",
	}
	got, executable := map[string]string{}, map[string]bool{}
	require.NoError(t, filepath.WalkDir(work, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(work, p)
		if d.Type()&fs.ModeSymlink != 0 {
			target, err := os.Readlink(p)
			got[rel] = "-> " + target
			return err
		}
		data, err := os.ReadFile(p)
		got[rel] = string(data)
		if info, ierr := d.Info(); ierr == nil && info.Mode()&0o100 != 0 {
			executable[rel] = true
		}
		return err
	}))
	assert.Equal(t, sandbox, got)
	assert.Equal(t, map[string]bool{"e/run.sh": true}, executable, "executable files")
}

func TestDiffEmptyAndErrors(t *testing.T) {
	t.Parallel()
	s := newDiffSandbox(t, map[string]string{"a": "a\n"})
	var b bytes.Buffer
	require.NoError(t, Diff(&b, s.cfg, s.changes(), DiffOptions{}))
	require.NoError(t, DiffStat(&b, s.cfg, s.changes()))
	require.NoError(t, NameStatus(&b, s.changes()))
	assert.Empty(t, b.String())
	fds, err := DiffJSON(s.cfg, s.changes())
	require.NoError(t, err)
	assert.NotNil(t, fds)
	assert.Empty(t, fds)

	cs := layers.ChangeSet{Changes: []layers.Change{{Path: "../escape", Kind: layers.Modified, Type: "file"}}}
	assert.Error(t, Diff(&b, s.cfg, cs, DiffOptions{}), "a path that leaves the root is refused")
	assert.Error(t, Diff(&b, layers.Config{}, s.changes(), DiffOptions{}))
}

// TestDiffListsRemovalsAtOriginalPaths: the change set names a removal
// by the last path its object had (the commit works in final paths), but
// status and the diff forms name it by its original path, once, and not
// where another change takes the original's object there.
func TestDiffListsRemovalsAtOriginalPaths(t *testing.T) {
	t.Parallel()
	listing := func(cs layers.ChangeSet) string {
		var b bytes.Buffer
		require.NoError(t, NameStatus(&b, cs))
		return b.String()
	}
	t.Run("a renamed directory removed", func(t *testing.T) {
		t.Parallel()
		s := newDiffSandbox(t, map[string]string{"d/f": "f\n", "d/sub/g": "g\ng\n"})
		s.rename("d", "e")
		s.remove("e/sub/g")
		s.remove("e/sub")
		s.remove("e/f")
		s.remove("e")
		cs := s.changes()
		var raw []string
		for _, c := range cs.Changes {
			raw = append(raw, c.Path)
		}
		assert.Contains(t, raw, "e/f", "the commit's change set names the final path")
		assert.Equal(t, "D\td\nD\td/f\nD\td/sub\nD\td/sub/g\n", listing(cs))
		var b bytes.Buffer
		require.NoError(t, DiffStat(&b, s.cfg, cs))
		assert.Equal(t, " d/f     | 1 -\n d/sub/g | 2 --\n 2 files changed, 3 deletions(-)\n", b.String())
	})
	t.Run("a directory replaced by a renamed one, then removed", func(t *testing.T) {
		t.Parallel()
		s := newDiffSandbox(t, map[string]string{"a/x": "a\n", "b/x": "bbb\nbbb\n"})
		s.rename("b", "c")
		s.rename("a", "b")
		s.remove("c/x")
		s.remove("c")
		cs := s.changes()
		assert.Equal(t, "D\tb\nR\ta\tb\nD\tb/x\n", listing(cs))
		var b bytes.Buffer
		require.NoError(t, NameStatusWithTypes(&b, s.cfg, cs))
		assert.Equal(t, "D\tb\nR\ta\tb\nD\tb/x\nR\ta/x\tb/x\n", b.String())
		fds, err := DiffJSON(s.cfg, cs)
		require.NoError(t, err)
		var gone, moved *FileDiff
		for i := range fds {
			switch {
			case fds[i].Path == "b/x" && fds[i].Status == "D":
				gone = &fds[i]
			case fds[i].Path == "b/x":
				moved = &fds[i]
			}
		}
		require.NotNil(t, moved, "a/x moves with a: %+v", fds)
		assert.Equal(t, "a/x", moved.From)
		assert.Equal(t, "b", moved.ImpliedBy)
		require.NotNil(t, gone, "%+v", fds)
		assert.Equal(t, "D", gone.Status)
		require.NotNil(t, gone.OldSize)
		assert.EqualValues(t, 8, *gone.OldSize, "the old side is the original b/x, not a/x renamed there")
		assert.Equal(t, 2, gone.Deleted)
	})
	t.Run("a file moved into a renamed directory and removed", func(t *testing.T) {
		t.Parallel()
		s := newDiffSandbox(t, map[string]string{"d/x": "x\n", "y": "y\n"})
		s.rename("d/x", "z")
		s.rename("y", "d/x")
		s.rename("d", "e")
		s.remove("e/x")
		assert.Equal(t, "R\td\te\nD\ty\nR\td/x\tz\n", listing(s.changes()))
	})
	t.Run("a file renamed over another, then removed", func(t *testing.T) {
		t.Parallel()
		s := newDiffSandbox(t, map[string]string{"x": "x\n", "y": "y\n"})
		s.rename("y", "x")
		s.remove("x")
		assert.Equal(t, "D\tx\nD\ty\n", listing(s.changes()), "both original files are gone")
	})
	t.Run("a file renamed over one in a renamed directory, then removed", func(t *testing.T) {
		t.Parallel()
		s := newDiffSandbox(t, map[string]string{"d/x": "x\n", "d/keep": "k\n", "y": "y\n"})
		s.rename("d", "e")
		s.rename("y", "e/x")
		s.remove("e/x")
		assert.Equal(t, "D\td/x\nR\td\te\nD\ty\n", listing(s.changes()))
	})
	t.Run("a removal another change takes", func(t *testing.T) {
		t.Parallel()
		s := newDiffSandbox(t, map[string]string{"f": "old\n"})
		s.rename("f", "g")
		s.create("f", "new\n")
		s.remove("g")
		assert.Equal(t, "M\tf\n", listing(s.changes()))
	})
	t.Run("a directory in place of a moved and removed original file", func(t *testing.T) {
		t.Parallel()
		s := newDiffSandbox(t, map[string]string{"f": "old\n"})
		s.rename("f", "g")
		s.mkdir("f")
		s.remove("g")
		assert.Equal(t, "T\tf\n", listing(s.changes()), "a type change, as git shows it")
	})
}
