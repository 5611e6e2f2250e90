package tests

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// rtGit runs git for one side with a fixed identity and clock: every git
// command gets the next second of a fixed date, so the two sides make the
// same commits (same hashes).
type rtGit struct {
	*rtShell
	tick int
}

// newRtGit makes the git environment of a side: HOME with a .gitconfig
// (auto gc in the foreground, so no git process is still writing when the
// sandbox is committed; fsync on; default branch main).
func newRtGit(t *testing.T, side, root string) *rtGit {
	home := t.TempDir()
	cfg := `[user]
	name = Sandbox Tester
	email = tester@example.com
[init]
	defaultBranch = main
[gc]
	autoDetach = false
[maintenance]
	autoDetach = false
[core]
	fsync = all
	fsyncMethod = fsync
[advice]
	detachedHead = false
[safe]
	directory = *
[protocol "file"]
	allow = always
`
	if err := os.WriteFile(filepath.Join(home, ".gitconfig"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	env := rtBaseEnv("HOME="+home, "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL="+filepath.Join(home, ".gitconfig"),
		"GIT_TERMINAL_PROMPT=0", "GIT_PAGER=cat", "PAGER=cat", "GIT_EDITOR=true")
	return &rtGit{rtShell: newRtShell(t, side, root, env)}
}

// git runs git -C dir args, recording its output.
func (g *rtGit) git(dir string, args ...string) string {
	g.t.Helper()
	g.tick++
	date := "@" + strconv.Itoa(1700000000+g.tick*60) + " +0000"
	return g.runEnv(dir, []string{"GIT_AUTHOR_DATE=" + date, "GIT_COMMITTER_DATE=" + date}, "git", args...)
}

// state is what a repository looks like to git, for comparing two
// repositories made by the same commands: status, every ref, the history
// of all of them, the index entries, stashes, and a full fsck.
func (g *rtGit) state(repo string) string {
	g.t.Helper()
	var b strings.Builder
	for _, args := range [][]string{
		{"status", "--porcelain=v1", "--untracked-files=all", "--branch"},
		{"symbolic-ref", "-q", "HEAD"},
		{"for-each-ref", "--format=%(refname) %(objectname) %(objecttype)"},
		{"log", "--all", "--graph", "--format=%H %P %s / %an %ad / %cn %cd", "--date=raw"},
		{"ls-files", "-s"},
		{"stash", "list"},
		{"fsck", "--full", "--strict", "--no-dangling", "--no-progress"},
		{"count-objects", "-v"}, // checked below: garbage 0
	} {
		out := g.git(repo, args...)
		if args[0] == "count-objects" {
			for _, l := range strings.Split(out, "\n") {
				if strings.HasPrefix(l, "garbage:") || strings.HasPrefix(l, "size-garbage:") {
					fmt.Fprintf(&b, "count-objects %s\n", l)
				}
			}
			continue
		}
		fmt.Fprintf(&b, "$ git %s\n%s", strings.Join(args, " "), out)
	}
	return b.String()
}

// rtMakeBareRepo makes a bare repository with real history: main (three
// commits, a symlink, an executable, 40 data files), feature (branched
// after the second commit) and other (after the third).
func rtMakeBareRepo(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	seed := filepath.Join(dir, "seed")
	g := newRtGit(t, "seed", "")
	g.git(dir, "init", "-q", seed)
	writeTree(t, seed, map[string]string{
		"README.md":      "# demo\n\nA small project.\n",
		"src/a.txt":      "alpha\nbeta\ngamma\n",
		"src/b.txt":      "one\ntwo\nthree\n",
		"docs/guide.md":  "Guide\n=====\n\nStep 1.\n",
		"scripts/run.sh": "#!/bin/sh\necho run\n",
		"link":           "->src/a.txt",
	})
	if err := os.Chmod(filepath.Join(seed, "scripts/run.sh"), 0o755); err != nil {
		t.Fatal(err)
	}
	g.git(seed, "add", "-A")
	g.git(seed, "commit", "-q", "-m", "initial")
	if err := os.WriteFile(filepath.Join(seed, "src/a.txt"), []byte("alpha\nbeta (edited)\ngamma\ndelta\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	g.git(seed, "commit", "-q", "-a", "-m", "edit a")
	g.git(seed, "branch", "feature")
	data := map[string]string{}
	for i := range 40 {
		data[fmt.Sprintf("data/f%02d.txt", i)] = strings.Repeat(fmt.Sprintf("line %d of file %d\n", i, i), 20+i)
	}
	writeTree(t, seed, data)
	g.git(seed, "add", "data")
	g.git(seed, "commit", "-q", "-m", "add data")
	g.git(seed, "checkout", "-q", "-b", "other")
	if err := os.WriteFile(filepath.Join(seed, "docs/guide.md"), []byte("Guide\n=====\n\nStep 1.\nStep 2.\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	g.git(seed, "commit", "-q", "-a", "-m", "guide step 2")
	g.git(seed, "checkout", "-q", "feature")
	if err := os.WriteFile(filepath.Join(seed, "src/b.txt"), []byte("one\ntwo\nthree\nfour\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	g.git(seed, "commit", "-q", "-a", "-m", "feature: b gets four")
	writeTree(t, seed, map[string]string{"feature.txt": "the feature\n"})
	g.git(seed, "add", "feature.txt")
	g.git(seed, "commit", "-q", "-m", "feature: add feature.txt")
	g.git(seed, "checkout", "-q", "main")
	bare := filepath.Join(dir, "bare.git")
	g.git(dir, "clone", "-q", "--bare", seed, bare)
	return bare
}

// rtWrite writes a file of a work tree (for the work a side does).
func rtWrite(t *testing.T, p, content string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
}

func rtAppend(t *testing.T, p, content string) {
	t.Helper()
	if err := appendFile(p, []byte(content)); err != nil {
		t.Fatal(err)
	}
}

// TestRealGitClone: git clones a bare repository into the mount (the
// local transport and the file:// pack transport), checks out a branch,
// edits, renames and removes files, stages and commits, rebases onto
// main, merges, stashes, fetches between the two clones, and runs git gc;
// the same commands run on a plain copy of the original. Every command
// prints the same on both sides, the repositories look the same to git
// (refs, history, index entries, status, fsck), and after sbxfs commit
// the original's repositories do too.
func TestRealGitClone(t *testing.T) {
	rtNeedCLI(t)
	rtNeedTool(t, "git")
	bare := rtMakeBareRepo(t)
	orig := newOrig(t, map[string]string{"NOTES": "the original holds only this\n"})
	ref := copyTree(t, orig)
	sb := mountSandbox(t, orig)

	work := func(g *rtGit, root string) {
		t.Helper()
		repo := filepath.Join(root, "repo")
		g.git(root, "clone", "-q", "--no-hardlinks", bare, "repo")
		g.git(repo, "checkout", "-q", "-b", "feature", "origin/feature")
		rtAppend(t, filepath.Join(repo, "src/b.txt"), "five\nsix\n")
		rtWrite(t, filepath.Join(repo, "src/c.txt"), "#!/bin/sh\necho c\n", 0o755)
		rtWrite(t, filepath.Join(repo, "src/deep/er/x.txt"), "deep\n", 0o644)
		g.git(repo, "mv", "src/a.txt", "src/a-renamed.txt")
		g.git(repo, "rm", "-q", "scripts/run.sh")
		if err := os.Remove(filepath.Join(repo, "link")); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink("src/a-renamed.txt", filepath.Join(repo, "link")); err != nil {
			t.Fatal(err)
		}
		g.git(repo, "status", "--porcelain")
		g.git(repo, "add", "-A")
		g.git(repo, "status", "--porcelain")
		g.git(repo, "commit", "-q", "-m", "feature work")
		g.git(repo, "diff", "--stat", "main...feature")
		g.git(repo, "rebase", "-q", "main")
		g.git(repo, "log", "--format=%H %s", "-n", "8")
		g.git(repo, "checkout", "-q", "main")
		g.git(repo, "merge", "-q", "--no-ff", "-m", "merge feature", "feature")
		rtAppend(t, filepath.Join(repo, "README.md"), "Work in progress.\n")
		g.git(repo, "stash", "-q")
		g.git(repo, "status", "--porcelain")
		g.git(repo, "stash", "pop", "-q")
		g.git(repo, "commit", "-q", "-a", "-m", "readme")
		g.git(repo, "tag", "-a", "-m", "release 1", "v1")
		g.git(repo, "gc", "-q", "--prune=now")
		g.git(repo, "status", "--porcelain")

		// A second clone over the pack transport, fetching from the first.
		repo2 := filepath.Join(root, "repo2")
		g.git(root, "clone", "-q", "file://"+bare, "repo2")
		g.git(repo2, "checkout", "-q", "other")
		rtAppend(t, filepath.Join(repo2, "docs/guide.md"), "Step 3.\n")
		g.git(repo2, "commit", "-q", "-a", "-m", "guide step 3")
		g.git(repo2, "fetch", "-q", "../repo", "main:from-repo", "refs/tags/v1:refs/tags/v1")
		g.git(repo2, "merge", "-q", "-m", "merge from repo", "from-repo")
		g.git(repo2, "repack", "-a", "-d", "-q")
		g.git(repo2, "prune")
	}

	plain := newRtGit(t, "plain", ref)
	work(plain, ref)
	mount := newRtGit(t, "mount", sb.mnt)
	work(mount, sb.mnt)
	rtCompareLogs(t, plain.rtShell, mount.rtShell)

	wantState := map[string]string{}
	for _, r := range []string{"repo", "repo2"} {
		wantState[r] = plain.state(filepath.Join(ref, r))
		if got := mount.state(sb.path(r)); got != wantState[r] {
			t.Errorf("%s in the mount, as git sees it, differs from the plain copy:\n--- plain:\n%s\n--- mount:\n%s", r, wantState[r], got)
		}
	}
	rtCompareTrees(t, "work trees in the mount vs the plain copy (.git left out)", ref, sb.mnt, viewOpts, rtNamed(".git"))

	rtCommit(t, sb, "git clone")

	after := newRtGit(t, "original", orig)
	for _, r := range []string{"repo", "repo2"} {
		if got := after.state(filepath.Join(orig, r)); got != wantState[r] {
			t.Errorf("%s in the original after the commit, as git sees it, differs from the plain copy:\n--- plain:\n%s\n--- original:\n%s", r, wantState[r], got)
		}
		if st := after.git(filepath.Join(orig, r), "status", "--porcelain"); st != "" {
			t.Errorf("git status in the original's %s is not clean:\n%s", r, st)
		}
	}
	rtCompareTrees(t, "the original after the commit vs the plain copy (.git left out)", ref, orig, viewOpts, rtNamed(".git"))
}

// TestRealGitExistingRepo: the original is a git work tree. In the
// sandbox files are edited, added and committed (so .git changes: new
// objects, index, refs, logs), a branch is made and merged, a tag added,
// git clean removes untracked files, git reset --hard restores a deleted
// one, and git gc removes loose objects of the original. After sbxfs
// commit the original's repository passes git fsck, has the plain copy's
// history and index entries, a clean status, and the plain copy's files.
func TestRealGitExistingRepo(t *testing.T) {
	rtNeedCLI(t)
	rtNeedTool(t, "git")
	bare := rtMakeBareRepo(t)
	orig := filepath.Join(t.TempDir(), "orig")
	seed := newRtGit(t, "seed", "")
	seed.git("/", "clone", "-q", "--no-hardlinks", bare, orig)
	seed.git(orig, "branch", "-q", "--track", "other", "origin/other")
	// Loose objects in the original, for gc to pack and delete.
	rtWrite(t, filepath.Join(orig, "loose.txt"), "a loose object\n", 0o644)
	seed.git(orig, "add", "loose.txt")
	seed.git(orig, "commit", "-q", "-m", "loose")
	ref := copyTree(t, orig)
	sb := mountSandbox(t, orig)

	work := func(g *rtGit, repo string) {
		t.Helper()
		g.git(repo, "status", "--porcelain")
		rtAppend(t, filepath.Join(repo, "src/b.txt"), "edited in the sandbox\n")
		rtWrite(t, filepath.Join(repo, "src/new.txt"), "new file\n", 0o644)
		if err := os.Remove(filepath.Join(repo, "data/f07.txt")); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(filepath.Join(repo, "src/a.txt"), 0o755); err != nil {
			t.Fatal(err)
		}
		g.git(repo, "add", "-A")
		g.git(repo, "commit", "-q", "-m", "edit in the sandbox")
		g.git(repo, "checkout", "-q", "-b", "topic")
		rtWrite(t, filepath.Join(repo, "topic.txt"), "topic\n", 0o644)
		g.git(repo, "add", "topic.txt")
		g.git(repo, "commit", "-q", "-m", "topic")
		g.git(repo, "checkout", "-q", "main")
		g.git(repo, "merge", "-q", "--no-ff", "-m", "merge topic", "topic")
		g.git(repo, "merge", "-q", "-m", "merge other", "other")
		g.git(repo, "branch", "-q", "-d", "topic")
		g.git(repo, "tag", "v2")
		// Untracked files cleaned away, a deleted file restored.
		rtWrite(t, filepath.Join(repo, "build/out.o"), "object\n", 0o644)
		rtWrite(t, filepath.Join(repo, "scratch.txt"), "scratch\n", 0o644)
		if err := os.Remove(filepath.Join(repo, "README.md")); err != nil {
			t.Fatal(err)
		}
		g.git(repo, "clean", "-q", "-f", "-d", "-x")
		g.git(repo, "reset", "-q", "--hard")
		g.git(repo, "gc", "-q", "--prune=now")
		g.git(repo, "status", "--porcelain")
		g.git(repo, "log", "--format=%H %s", "-n", "10")
	}
	plain := newRtGit(t, "plain", ref)
	work(plain, ref)
	mount := newRtGit(t, "mount", sb.mnt)
	work(mount, sb.mnt)
	rtCompareLogs(t, plain.rtShell, mount.rtShell)
	want := plain.state(ref)
	if got := mount.state(sb.mnt); got != want {
		t.Errorf("the repository in the mount, as git sees it, differs from the plain copy:\n--- plain:\n%s\n--- mount:\n%s", want, got)
	}

	rtCommit(t, sb, "git existing repository")

	after := newRtGit(t, "original", orig)
	if got := after.state(orig); got != want {
		t.Errorf("the original's repository after the commit, as git sees it, differs from the plain copy:\n--- plain:\n%s\n--- original:\n%s", want, got)
	}
	if st := after.git(orig, "status", "--porcelain"); st != "" {
		t.Errorf("git status in the original is not clean:\n%s", st)
	}
	if log := after.git(orig, "log", "-1", "--format=%s"); strings.TrimSpace(log) != "merge other" {
		t.Errorf("last commit of the original: %q, want %q", log, "merge other")
	}
	if s := mustRead(t, filepath.Join(orig, "src/b.txt")); !strings.HasSuffix(s, "edited in the sandbox\n") {
		t.Errorf("src/b.txt in the original: %q", s)
	}
	rtCompareTrees(t, "the original after the commit vs the plain copy (.git left out)", ref, orig, viewOpts, rtNamed(".git"))
}
