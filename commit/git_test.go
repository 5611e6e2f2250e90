package commit

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbxfs/sbxfs/fsutil"
	"github.com/sbxfs/sbxfs/layers"
)

// gitIn runs the git CLI in dir, without the user's or the system's
// configuration, and returns its output.
func gitIn(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null",
		"GIT_AUTHOR_NAME=Test", "GIT_AUTHOR_EMAIL=test@example.com",
		"GIT_COMMITTER_NAME=Test", "GIT_COMMITTER_EMAIL=test@example.com")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "git %q in %s: %s", args, dir, out)
	return string(out)
}

// newGitRepo makes a repository with the files committed.
func newGitRepo(t *testing.T, files map[string]string) string {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("no git")
	}
	dir, err := filepath.EvalSymlinks(t.TempDir())
	require.NoError(t, err)
	gitIn(t, dir, "init", "-q", "-b", "main")
	if len(files) > 0 {
		writeTestFiles(t, dir, files)
		gitIn(t, dir, "add", "-A")
		gitIn(t, dir, "commit", "-q", "-m", "initial")
	}
	return dir
}

// requireFsck checks that git finds the repository sound.
func requireFsck(t *testing.T, dir string) {
	t.Helper()
	out := gitIn(t, dir, "fsck", "--strict", "--no-dangling")
	assert.Empty(t, strings.TrimSpace(out), "git fsck")
}

func gitLines(s string) []string {
	s = strings.TrimRight(s, "\n")
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

func TestGitCommitExactlyThePaths(t *testing.T) {
	t.Parallel()
	dir := newGitRepo(t, map[string]string{
		"mod.txt": "old\n", "del.txt": "bye\n", "olddir/a": "a\n", "olddir/b/c": "c\n",
		"other.txt": "other\n", "staged.txt": "staged\n", "keep/x": "x\n",
	})
	gitIn(t, dir, "config", "user.name", "Repo User")
	gitIn(t, dir, "config", "user.email", "repo@example.com")
	writeTestFiles(t, dir, map[string]string{
		"mod.txt": "new\n", "new/dir/n.txt": "n\n", "link": "-> mod.txt", "tool.sh": "#!/bin/sh\n",
		"other.txt": "dirty\n", "staged.txt": "staged change\n", "untracked.txt": "u\n", "new/unlisted.txt": "not listed\n",
	})
	require.NoError(t, os.Remove(filepath.Join(dir, "del.txt")))
	require.NoError(t, os.RemoveAll(filepath.Join(dir, "olddir")))
	gitIn(t, dir, "add", "staged.txt")
	before := gitIn(t, dir, "status", "--porcelain")

	paths := []string{"mod.txt", "new", "new/dir", "new/dir/n.txt", "del.txt", "olddir", "link", "tool.sh", "./mod.txt"}
	h, err := GitCommit(dir, paths, GitCommitOptions{Message: "sandbox commit\n\nbody"})
	require.NoError(t, err)

	assert.Equal(t, h, strings.TrimSpace(gitIn(t, dir, "rev-parse", "main")))
	assert.Equal(t, []string{"A\tlink", "A\tnew/dir/n.txt", "A\ttool.sh", "D\tdel.txt", "D\tolddir/a", "D\tolddir/b/c", "M\tmod.txt"},
		sortedLines(gitIn(t, dir, "show", "--name-status", "--format=", "HEAD")))
	assert.True(t, strings.HasSuffix(gitIn(t, dir, "cat-file", "commit", "HEAD"), "\n\nsandbox commit\n\nbody\n"))
	assert.Equal(t, "Repo User <repo@example.com>\n", gitIn(t, dir, "log", "-1", "--format=%an <%ae>"))
	assert.Equal(t, "new\n", gitIn(t, dir, "show", "HEAD:mod.txt"))
	assert.Equal(t, "mod.txt", gitIn(t, dir, "show", "HEAD:link"))
	tree := gitIn(t, dir, "ls-tree", "-r", "HEAD")
	assert.Contains(t, tree, "120000 blob")
	assert.Regexp(t, `100755 blob [0-9a-f]+\ttool.sh`, tree)
	assert.NotContains(t, tree, "unlisted", "unlisted content beneath a listed directory stays out")

	after := gitIn(t, dir, "status", "--porcelain")
	assert.Equal(t, []string{" M other.txt", "?? new/unlisted.txt", "?? untracked.txt", "M  staged.txt"}, sortedLines(after))
	assert.Contains(t, before, "M  staged.txt")
	assert.Equal(t, "staged.txt\n", gitIn(t, dir, "diff", "--cached", "--name-only"), "the staged file stays staged, uncommitted")
	assert.Equal(t, "staged\n", gitIn(t, dir, "show", "HEAD:staged.txt"))
	assert.Contains(t, gitIn(t, dir, "reflog", "-1"), "commit: sandbox commit")
	assert.NoFileExists(t, filepath.Join(dir, ".git", "index.lock"))
	requireFsck(t, dir)
	// The index holds the committed paths' stat data: git sees them clean
	// without rehashing them.
	assert.Equal(t, "other.txt\n", gitIn(t, dir, "diff-files", "--name-only"))
}

func sortedLines(s string) []string {
	l := gitLines(s)
	slices.Sort(l)
	return l
}

func TestGitCommitUnbornAndSubdir(t *testing.T) {
	t.Parallel()
	dir := newGitRepo(t, nil)
	writeTestFiles(t, dir, map[string]string{"sub/a": "a\n", "sub/d/b": "b\n", "other": "o\n"})
	gitIn(t, dir, "add", "other")
	when := time.Date(2024, 5, 6, 7, 8, 9, 0, time.FixedZone("x", 2*3600))
	h, err := GitCommit(filepath.Join(dir, "sub"), []string{"a", "d/b"},
		GitCommitOptions{Message: "first", AuthorName: "A U Thor", AuthorEmail: "a@example.com", When: when})
	require.NoError(t, err)
	assert.Equal(t, h, strings.TrimSpace(gitIn(t, dir, "rev-parse", "HEAD")))
	assert.Equal(t, "\n", gitIn(t, dir, "log", "-1", "--format=%P"), "a root commit has no parent")
	assert.Equal(t, "A U Thor <a@example.com> 2024-05-06T07:08:09+02:00\n", gitIn(t, dir, "log", "-1", "--format=%an <%ae> %aI"))
	assert.Equal(t, []string{"sub/a", "sub/d/b"}, gitLines(gitIn(t, dir, "ls-tree", "-r", "--name-only", "HEAD")))
	assert.Equal(t, []string{"A  other"}, gitLines(gitIn(t, dir, "status", "--porcelain")))
	requireFsck(t, dir)
}

func TestGitCommitDetachedAndTypeChanges(t *testing.T) {
	t.Parallel()
	dir := newGitRepo(t, map[string]string{"x": "file\n", "y/z": "in dir\n", "keep": "k\n"})
	gitIn(t, dir, "checkout", "-q", "--detach")
	mainBefore := gitIn(t, dir, "rev-parse", "main")
	require.NoError(t, os.Remove(filepath.Join(dir, "x")))
	require.NoError(t, os.RemoveAll(filepath.Join(dir, "y")))
	writeTestFiles(t, dir, map[string]string{"x/inner": "now a dir\n", "y": "now a file\n"})
	h, err := GitCommit(dir, []string{"x", "x/inner", "y"}, GitCommitOptions{Message: "types"})
	require.NoError(t, err)
	assert.Equal(t, h, strings.TrimSpace(gitIn(t, dir, "rev-parse", "HEAD")))
	assert.Equal(t, mainBefore, gitIn(t, dir, "rev-parse", "main"), "a detached HEAD moves alone")
	assert.Equal(t, []string{"keep", "x/inner", "y"}, gitLines(gitIn(t, dir, "ls-tree", "-r", "--name-only", "HEAD")))
	assert.Empty(t, gitIn(t, dir, "status", "--porcelain"))
	requireFsck(t, dir)
}

func TestGitCommitLinkedWorktree(t *testing.T) {
	t.Parallel()
	dir := newGitRepo(t, map[string]string{"a": "a\n"})
	wt := filepath.Join(filepath.Dir(dir), filepath.Base(dir)+"-wt")
	gitIn(t, dir, "worktree", "add", "-q", "-b", "side", wt)
	t.Cleanup(func() { os.RemoveAll(wt) })
	writeTestFiles(t, wt, map[string]string{"a": "changed\n"})
	h, err := GitCommit(wt, []string{"a"}, GitCommitOptions{Message: "in a worktree"})
	require.NoError(t, err)
	assert.Equal(t, h, strings.TrimSpace(gitIn(t, dir, "rev-parse", "side")))
	assert.Empty(t, gitIn(t, wt, "status", "--porcelain"))
	assert.Empty(t, gitIn(t, dir, "status", "--porcelain"), "the main work tree's index is untouched")
	requireFsck(t, dir)
}

func TestGitCommitDefaultAuthor(t *testing.T) {
	// Not parallel: it points HOME at an empty directory.
	t.Setenv("HOME", t.TempDir())
	t.Setenv("XDG_CONFIG_HOME", t.TempDir())
	dir := newGitRepo(t, map[string]string{"a": "a\n"})
	writeTestFiles(t, dir, map[string]string{"a": "b\n"})
	_, err := GitCommit(dir, []string{"a"}, GitCommitOptions{Message: "m"})
	require.NoError(t, err)
	assert.Equal(t, "sbxfs <sbxfs@localhost>\n", gitIn(t, dir, "log", "-1", "--format=%an <%ae>"))
}

func TestGitCommitErrors(t *testing.T) {
	t.Parallel()
	dir := newGitRepo(t, map[string]string{"a": "a\n"})
	plain, err := filepath.EvalSymlinks(t.TempDir())
	require.NoError(t, err)
	bare := filepath.Join(plain, "bare.git")
	gitIn(t, plain, "init", "-q", "--bare", bare)
	require.NoError(t, syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o644))
	head := gitIn(t, dir, "rev-parse", "HEAD")

	tests := []struct {
		name  string
		root  string
		paths []string
		msg   string
		is    error
		text  string
	}{
		{"empty message", dir, []string{"a"}, " \n", ErrGitMessage, ""},
		{"not a repository", plain, []string{"a"}, "m", ErrNotGitWorkTree, ""},
		{"bare repository", bare, []string{"a"}, "m", ErrGitBare, ""},
		{"inside .git", filepath.Join(dir, ".git"), []string{"config"}, "m", ErrNotGitWorkTree, ""},
		{"path with ..", dir, []string{"../a"}, "m", fsutil.ErrPathEscapes, ""},
		{"absolute path", dir, []string{"/etc/passwd"}, "m", fsutil.ErrPathEscapes, ""},
		{"path into .git", dir, []string{".git/config"}, "m", fsutil.ErrPathEscapes, ""},
		{"missing root", filepath.Join(plain, "nope"), []string{"a"}, "m", os.ErrNotExist, ""},
	}
	for _, tt := range tests {
		_, err := GitCommit(tt.root, tt.paths, GitCommitOptions{Message: tt.msg})
		require.Error(t, err, tt.name)
		if tt.is != nil {
			assert.ErrorIs(t, err, tt.is, tt.name)
		}
		assert.Contains(t, err.Error(), tt.text, tt.name)
	}
	assert.Equal(t, head, gitIn(t, dir, "rev-parse", "HEAD"), "a refused commit moves nothing")
	assert.NoFileExists(t, filepath.Join(dir, ".git", "index.lock"))

	// A FIFO is left out, as git add -A leaves it, where git rejects
	// git add fifo: the commit records the rest.
	require.NoError(t, os.WriteFile(filepath.Join(dir, "a"), []byte("changed\n"), 0o644))
	_, err = GitCommit(dir, []string{"fifo", "a"}, GitCommitOptions{Message: "m"})
	require.NoError(t, err)
	assert.Equal(t, "M\ta", strings.TrimSpace(gitIn(t, dir, "show", "--name-status", "--format=", "HEAD")))
	assert.Empty(t, gitIn(t, dir, "status", "--porcelain"), "the FIFO stays out of git, as untracked FIFOs are")

	lock := filepath.Join(dir, ".git", "index.lock")
	require.NoError(t, os.WriteFile(lock, nil, 0o644))
	_, err = GitCommit(dir, []string{"a"}, GitCommitOptions{Message: "m"})
	assert.ErrorIs(t, err, ErrGitLocked)
	assert.FileExists(t, lock, "someone else's lock is left alone")
}

// TestGitCommitOfADirectoryReplacedByAFIFO: git records no FIFO, so a
// tracked directory replaced by one is gone from the commit with its
// files (git add -A takes them out), while a tracked file replaced by one
// stays as HEAD has it (git add refuses the FIFO; git status shows the
// file modified). Until 2026-11-27 the directory's files stayed in the
// commit, shown deleted by git status (TestDifferentialCommit, seed
// 563182110: a remade directory exchanged with a FIFO).
func TestGitCommitOfADirectoryReplacedByAFIFO(t *testing.T) {
	t.Parallel()
	dir := newGitRepo(t, map[string]string{"g/f07": "f\n", "g/sub/g1": "g\n", "p": "p\n", "other": "o\n"})
	require.NoError(t, os.RemoveAll(filepath.Join(dir, "g")))
	require.NoError(t, syscall.Mkfifo(filepath.Join(dir, "g"), 0o644))
	require.NoError(t, os.Remove(filepath.Join(dir, "p")))
	require.NoError(t, syscall.Mkfifo(filepath.Join(dir, "p"), 0o644))
	_, err := GitCommit(dir, []string{"g", "p"}, GitCommitOptions{Message: "m"})
	require.NoError(t, err)
	assert.Equal(t, []string{"D\tg/f07", "D\tg/sub/g1"}, sortedLines(gitIn(t, dir, "show", "--name-status", "--format=", "HEAD")))
	assert.Equal(t, []string{" M p"}, gitLines(gitIn(t, dir, "status", "--porcelain")), "the file a FIFO replaced stays as HEAD has it")
	assert.Equal(t, "other\np\n", gitIn(t, dir, "ls-files"))
	requireFsck(t, dir)
}

// TestGitCommitOfAReplacedDirectory: h removed and made again holding
// less (rm -r h; a build writes h/a anew, h/b moved out first): the
// commit drops what HEAD tracks beneath h that h no longer has, records
// the move, and keeps what h holds now. (Without Replaced, h/c stayed in
// the commit though the work tree lost it: git status showed it
// deleted.)
func TestGitCommitOfAReplacedDirectory(t *testing.T) {
	t.Parallel()
	dir := newGitRepo(t, map[string]string{"h/a": "a\n", "h/b": "b\n", "h/c": "c\n", "h/d/e": "e\n", "other": "o\n",
		"m/x": "x\n", "m/y/z": "z\n"})
	require.NoError(t, os.Rename(filepath.Join(dir, "h/b"), filepath.Join(dir, "k")))
	require.NoError(t, os.RemoveAll(filepath.Join(dir, "h")))
	writeTestFiles(t, dir, map[string]string{"h/a": "new a\n", "h/d/": ""})
	require.NoError(t, os.Rename(filepath.Join(dir, "m"), filepath.Join(dir, "h/d/m")))
	changes := []layers.Change{
		{Path: "h", Kind: layers.Created, Type: "dir"},
		{Path: "h/a", Kind: layers.Created, Type: "file"},
		{Path: "h/d", Kind: layers.Created, Type: "dir"},
		{Path: "h/d/m", From: "m", Kind: layers.Renamed, Type: "dir"},
		{Path: "k", From: "h/b", Kind: layers.Renamed, Type: "file"},
	}
	assert.Equal(t, []string{"h", "h/d"}, GitReplaced(changes))
	_, err := GitCommit(dir, GitPaths(changes), GitCommitOptions{Message: "m", Moves: GitMoves(changes), Replaced: GitReplaced(changes)})
	require.NoError(t, err)
	assert.Equal(t, []string{"D\th/c", "D\th/d/e", "M\th/a", "R100\th/b\tk", "R100\tm/x\th/d/m/x", "R100\tm/y/z\th/d/m/y/z"},
		sortedLines(gitIn(t, dir, "show", "-M", "--name-status", "--format=", "HEAD")), "a directory moved into a remade one keeps its files")
	assert.Empty(t, gitIn(t, dir, "status", "--porcelain"))
	requireFsck(t, dir)
}

// TestGitCommitOfWhatGitRecordsAlready: a git commit made in the sandbox
// comes with the changes (the repository's own files changed too): the
// paths hold what HEAD records, and no empty commit is made on top. And
// GitPaths and GitMoves leave out the repository's own files, which the
// sbxfs commit put in place as files (a refreshed index, objects, refs).
func TestGitCommitOfWhatGitRecordsAlready(t *testing.T) {
	t.Parallel()
	dir := newGitRepo(t, map[string]string{"a": "a\n"})
	writeTestFiles(t, dir, map[string]string{"a": "changed\n", "n": "new\n"})
	gitIn(t, dir, "add", "-A")
	gitIn(t, dir, "commit", "-q", "-m", "made with git")
	head := gitIn(t, dir, "rev-parse", "HEAD")
	_, err := GitCommit(dir, []string{"a", "n"}, GitCommitOptions{Message: "m"})
	assert.ErrorIs(t, err, ErrGitNothingToCommit)
	assert.Equal(t, head, gitIn(t, dir, "rev-parse", "HEAD"), "no empty commit")
	assert.NoFileExists(t, filepath.Join(dir, ".git", "index.lock"))

	changes := []layers.Change{
		{Path: ".git/index", Kind: layers.Modified, Type: "file"},
		{Path: ".git/objects/ab", Kind: layers.Created, Type: "dir"},
		{Path: "sub/.git/HEAD", Kind: layers.Modified, Type: "file"},
		{Path: ".git/refs/heads/x", Kind: layers.Deleted, Type: "file"},
		{Path: "b", Kind: layers.Modified, Type: "file"},
		{Path: "out", From: ".git/tmp", Kind: layers.Renamed, Type: "file"},
		{Path: ".git/in", From: "c", Kind: layers.Renamed, Type: "file"},
		{Path: "e", From: "d", Kind: layers.Renamed, Type: "file"},
		{Path: "f", Kind: layers.Deleted, Type: "file"},
	}
	assert.Equal(t, []string{"b", "out", "c", "e", "d", "f"}, GitPaths(changes))
	assert.Equal(t, []GitMove{{From: "c"}, {From: "d", To: "e"}, {From: "f"}}, GitMoves(changes))
}

// TestGitCommitRenamedDirectories: the files git tracks beneath a
// renamed directory are recorded as renamed, with HEAD's content, and
// their index entries move too (as git mv): an untracked file stays
// untracked, a staged change stays staged, and git status is clean
// where it was. Nested renames, an exchange and renames in an original
// below the work tree's top land where the sandbox put them.
func TestGitCommitRenamedDirectories(t *testing.T) {
	t.Parallel()
	t.Run("plain, nested and exchanged", func(t *testing.T) {
		t.Parallel()
		dir := newGitRepo(t, map[string]string{
			"d/f": "f\n", "d/sub/g": "g\n", "d/staged": "s\n",
			"p/c/x": "x\n", "p/y": "y\n", "a/1": "1\n", "b/2": "2\n", "keep": "k\n",
		})
		writeTestFiles(t, dir, map[string]string{"d/untracked": "u\n", "d/staged": "staged change\n"})
		gitIn(t, dir, "add", "d/staged")
		mv := func(from, to string) { require.NoError(t, os.Rename(filepath.Join(dir, from), filepath.Join(dir, to))) }
		mv("d", "e")
		mv("p", "q")
		mv("q/c", "r") // nested: p/c ends at r, p at q
		mv("a", "tmp") // an exchange of a and b
		mv("b", "a")
		mv("tmp", "b")
		writeTestFiles(t, dir, map[string]string{"e/f": "f changed\n"})
		require.NoError(t, os.Remove(filepath.Join(dir, "e/sub/g")))
		require.NoError(t, os.Remove(filepath.Join(dir, "e/sub")))

		paths := []string{"e", "d", "e/f", "e/sub", "e/sub/g", "q", "p", "r", "p/c", "a", "b"}
		moves := []GitMove{{"d", "e"}, {"p", "q"}, {"p/c", "r"}, {"b", "a"}, {"a", "b"}}
		_, err := GitCommit(dir, paths, GitCommitOptions{Message: "renames", Moves: moves})
		require.NoError(t, err)

		assert.Equal(t, []string{"100644 a/2", "100644 b/1", "100644 e/f", "100644 e/staged", "100644 keep", "100644 q/y", "100644 r/x"},
			treeFiles(t, dir), "HEAD's files where the sandbox put them")
		assert.Equal(t, "f changed\n", gitIn(t, dir, "show", "HEAD:e/f"))
		assert.Equal(t, "s\n", gitIn(t, dir, "show", "HEAD:e/staged"), "the staged change is not committed")
		assert.Equal(t, "x\n", gitIn(t, dir, "show", "HEAD:r/x"))
		assert.Equal(t, []string{"?? e/untracked", "M  e/staged"}, sortedLines(gitIn(t, dir, "status", "--porcelain")),
			"the staged change stays staged at its new path, the untracked file untracked")
		requireFsck(t, dir)
	})
	t.Run("a directory renamed into a renamed one", func(t *testing.T) {
		t.Parallel()
		dir := newGitRepo(t, map[string]string{"d/k": "k\n", "d/y/z": "old\n", "d/y/w": "w\n", "x/z": "new\n"})
		require.NoError(t, os.Rename(filepath.Join(dir, "d"), filepath.Join(dir, "e")))
		require.NoError(t, os.RemoveAll(filepath.Join(dir, "e/y")))
		require.NoError(t, os.Rename(filepath.Join(dir, "x"), filepath.Join(dir, "e/y")))
		_, err := GitCommit(dir, []string{"e", "d", "e/y", "x"}, GitCommitOptions{Message: "m", Moves: []GitMove{{"d", "e"}, {"x", "e/y"}}})
		require.NoError(t, err)
		assert.Equal(t, []string{"100644 e/k", "100644 e/y/z"}, treeFiles(t, dir), "d/y went where x took its place")
		assert.Equal(t, "new\n", gitIn(t, dir, "show", "HEAD:e/y/z"))
		assert.Empty(t, gitIn(t, dir, "status", "--porcelain"))
	})
	t.Run("an original below the top", func(t *testing.T) {
		t.Parallel()
		dir := newGitRepo(t, map[string]string{"proj/d/f": "f\n", "other/d/f": "other\n"})
		require.NoError(t, os.Rename(filepath.Join(dir, "proj/d"), filepath.Join(dir, "proj/e")))
		_, err := GitCommit(filepath.Join(dir, "proj"), []string{"e", "d"}, GitCommitOptions{Message: "m", Moves: []GitMove{{"d", "e"}}})
		require.NoError(t, err)
		assert.Equal(t, []string{"100644 other/d/f", "100644 proj/e/f"}, treeFiles(t, dir))
		assert.Empty(t, gitIn(t, dir, "status", "--porcelain"))
		_, err = GitCommit(filepath.Join(dir, "proj"), nil, GitCommitOptions{Message: "m", Moves: []GitMove{{"e", "../other"}}})
		require.ErrorIs(t, err, fsutil.ErrPathEscapes, "a move must stay inside the original")
	})
}

// treeFiles lists HEAD's files as "mode path".
func treeFiles(t *testing.T, dir string) []string {
	var out []string
	for _, l := range gitLines(gitIn(t, dir, "ls-tree", "-r", "HEAD")) {
		f := strings.Fields(l)
		out = append(out, f[0]+" "+f[3])
	}
	return out
}
