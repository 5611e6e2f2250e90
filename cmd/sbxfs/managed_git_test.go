package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sbxfs/sbxfs/internal/immutable"
	"github.com/sbxfs/sbxfs/manager"
)

// gitRepo makes dir a git repository with one commit of its files and
// returns a function that runs git there.
func gitRepo(t *testing.T, dir string) func(args ...string) string {
	t.Helper()
	git := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("git", append([]string{"-C", dir}, args...)...)
		cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@t", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@t")
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "git %v: %s", args, out)
		return strings.TrimSpace(string(out))
	}
	git("init", "-q")
	git("add", "-A")
	git("commit", "-q", "-m", "base")
	return git
}

// TestManagedCommitGit: commit --git of managed sandboxes (a plan over two
// repositories, one sandbox) and run --git make a git commit in each
// original of exactly the paths its commit changed, as the standalone
// commit --git does; an original outside a git work tree refuses before
// anything is committed or run; a git commit that fails after the commit
// says the changes are in, with exit 8. (Before, --git was refused for
// managed sandboxes and run had none.)
func TestManagedCommitGit(t *testing.T) {
	t.Parallel()
	e := newManagedEnv(t)
	o1, o2 := e.original("o1"), e.original("o2")
	writeFile(t, filepath.Join(o1, "old.txt"), "old\n")
	git1, git2 := gitRepo(t, o1), gitRepo(t, o2)
	writeFile(t, filepath.Join(o2, "dirty.txt"), "not committed by sbxfs\n")

	s1, s2 := e.create("--plan", "p", o1), e.create("--plan", "p", o2)
	writeFile(t, filepath.Join(s1.Mountpoint, "a.txt"), "one\n")
	require.NoError(t, os.Rename(filepath.Join(s1.Mountpoint, "old.txt"), filepath.Join(s1.Mountpoint, "new.txt")))
	writeFile(t, filepath.Join(s2.Mountpoint, "n.txt"), "two\n")

	assertFailure(t, e.sbxfs("commit", "--git", "--plan", "p"), exitUsage, "--git needs a commit message: give -m MSG")
	r := e.sbxfs("commit", "--git", "-m", "the plan", "--plan", "p", "--json")
	require.Equal(t, 0, r.code, r.stderr)
	var res planJSON
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &res), r.stdout)
	assert.Equal(t, []string{s1.ID, s2.ID}, res.Committed)
	assert.Equal(t, map[string]string{s1.ID: git1("rev-parse", "HEAD"), s2.ID: git2("rev-parse", "HEAD")}, res.GitCommits)
	assert.Equal(t, "the plan", git1("log", "-1", "--format=%s"))
	assert.Equal(t, "M\ta.txt\nR100\told.txt\tnew.txt", git1("show", "--name-status", "--format=", "HEAD"))
	assert.Equal(t, "A\tn.txt", git2("show", "--name-status", "--format=", "HEAD"))
	assert.Equal(t, "?? dirty.txt", git2("status", "--porcelain"), "what the sandbox did not change stays out")

	t.Run("one sandbox, text", func(t *testing.T) {
		sb := e.create(o1)
		writeFile(t, filepath.Join(sb.Mountpoint, "b.txt"), "b\n")
		r := e.sbxfs("commit", "--git", "-m", "one", sb.ID)
		require.Equal(t, 0, r.code, r.stderr)
		assert.Equal(t, "committed "+sb.ID+" (git commit "+git1("rev-parse", "HEAD")+")\n", r.stdout)
		assert.Equal(t, "A\tb.txt", git1("show", "--name-status", "--format=", "HEAD"))
	})

	t.Run("run", func(t *testing.T) {
		r := e.sbxfs("run", "--commit-on-success", "--git", o1, "--", "sh", "-c", "echo r > r.txt")
		require.Equal(t, 0, r.code, r.stderr)
		assert.Equal(t, "sbxfs run sh -c echo r > r.txt", git1("log", "-1", "--format=%s"), "run's default message")
		assert.Equal(t, "A\tr.txt", git1("show", "--name-status", "--format=", "HEAD"))
		r = e.sbxfs("run", "--commit-on-success", "--git", "-m", "agent", "--json", o1, "--", "sh", "-c", "echo s > s.txt")
		require.Equal(t, 0, r.code, r.stderr)
		var out runJSON
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &out), r.stdout)
		require.NotNil(t, out.Commit)
		assert.Equal(t, map[string]string{out.ID: git1("rev-parse", "HEAD")}, out.Commit.GitCommits)
		assert.Equal(t, "agent", git1("log", "-1", "--format=%s"))

		// What git itself changes in the sandbox is not content: an
		// index git status refreshed, the objects and refs of a commit
		// CMD made with git (then nothing is left to commit: no empty
		// commit on top of CMD's).
		r = e.sbxfs("run", "--in-place", "--commit-on-success", "--git", "-m", "after status", o1, "--",
			"sh", "-c", "touch a.txt && git status --porcelain >/dev/null && echo t > t.txt")
		require.Equal(t, 0, r.code, r.stderr)
		assert.Equal(t, "A\tt.txt", git1("show", "--name-status", "--format=", "HEAD"))
		r = e.sbxfs("run", "--in-place", "--commit-on-success", "--git", "--json", o1, "--",
			"sh", "-c", "echo u > u.txt && git add u.txt && git -c user.name=t -c user.email=t@t commit -q -m by-cmd")
		require.Equal(t, 0, r.code, r.stderr)
		out = runJSON{}
		require.NoError(t, json.Unmarshal([]byte(r.stdout), &out), r.stdout)
		assert.Empty(t, out.Commit.GitCommits, "git records CMD's commit already")
		assert.Equal(t, "by-cmd", git1("log", "-1", "--format=%s"))
		assert.Empty(t, git1("status", "--porcelain"))

		marker := filepath.Join(e.base, "ran")
		assertFailure(t, e.sbxfs("run", "--git", o1, "--", "touch", marker), exitUsage, "give --commit-on-success too")
		plain := e.original("plain")
		assertFailure(t, e.sbxfs("run", "--commit-on-success", "--git", plain, "--", "touch", marker), exitBadPath, "nothing was run")
		assert.NoFileExists(t, marker, "CMD never ran")
	})

	t.Run("not a git work tree", func(t *testing.T) {
		plain := e.original("plain2")
		sb := e.create("--plan", "q", plain)
		writeFile(t, filepath.Join(sb.Mountpoint, "a.txt"), "changed\n")
		assertFailure(t, e.sbxfs("commit", "--git", "-m", "x", "--plan", "q"), exitBadPath, "nothing was committed")
		assertFile(t, filepath.Join(plain, "a.txt"), "hello\n")
		assert.Equal(t, manager.Active, e.list()[sb.ID].State, "the sandbox keeps its changes")
		r := e.sbxfs("commit", "--plan", "q")
		require.Equal(t, 0, r.code, r.stderr)
	})

	t.Run("git fails after the commit", func(t *testing.T) {
		sb := e.create(o2)
		writeFile(t, filepath.Join(sb.Mountpoint, "late.txt"), "late\n")
		head := git2("rev-parse", "HEAD")
		immutable.Set(t, filepath.Join(o2, ".git", "objects"))
		r := e.sbxfs("commit", "--git", "-m", "late", sb.ID)
		assertFailure(t, r, exitCommitFailed, "the changes of "+sb.ID+" are committed to "+o2+", but the git commit failed")
		assert.Contains(t, r.stdout, "committed "+sb.ID+"\n", "the commit itself is reported")
		assertFile(t, filepath.Join(o2, "late.txt"), "late\n")
		assert.Equal(t, head, git2("rev-parse", "HEAD"))
	})
}
