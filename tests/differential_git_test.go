package tests

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// gitEnv runs git without the user's or the system's configuration.
var gitEnv = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null",
	"GIT_AUTHOR_NAME=Test", "GIT_AUTHOR_EMAIL=test@example.com",
	"GIT_COMMITTER_NAME=Test", "GIT_COMMITTER_EMAIL=test@example.com")

func gitAt(dir string, args ...string) ([]byte, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir, cmd.Env = dir, gitEnv
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, &gitError{args, err, stderr.String()}
	}
	return out, nil
}

type gitError struct {
	args   []string
	err    error
	stderr string
}

func (e *gitError) Error() string {
	return "git " + strings.Join(e.args, " ") + ": " + e.err.Error() + ": " + e.stderr
}

// gitTrack makes the original's parent a git work tree that tracks the
// original's files, so that the differential commit can record itself in
// git too (sbxfs commit --git) and checkGitCommit can hold that git
// commit to the tree the commit left. It reports whether git is there.
func gitTrack(t *testing.T, orig string) bool {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		t.Logf("no git: the git commit is not checked")
		return false
	}
	top, name := filepath.Split(orig)
	for _, args := range [][]string{{"init", "-q"}, {"add", "-A", "--", name}, {"commit", "-q", "-m", "original"}} {
		if _, err := gitAt(top, args...); err != nil {
			t.Fatal(err)
		}
	}
	return true
}

// checkGitCommit demands that the git commit `sbxfs commit --git` made
// holds the original as the commit left it: git status shows nothing
// beneath it but paths that are now FIFOs, sockets or devices, which git
// does not hold (a path git tracked shows as changed there).
func (r *diffRun) checkGitCommit() {
	r.t.Helper()
	top, name := filepath.Split(r.sb.orig)
	if out, err := gitAt(top, "rev-parse", "--verify", "-q", "HEAD~1"); err != nil || len(out) == 0 {
		r.fail("", "sbxfs commit --git made no git commit: %v", err)
	}
	out, err := gitAt(top, "status", "--porcelain", "-z", "--untracked-files=all", "--", name)
	if err != nil {
		r.fail("", "%v", err)
	}
	var bad []string
	for _, e := range strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00") {
		if len(e) < 4 {
			continue
		}
		var st unix.Stat_t
		if unix.Lstat(filepath.Join(top, e[3:]), &st) == nil {
			switch st.Mode & unix.S_IFMT {
			case unix.S_IFIFO, unix.S_IFSOCK, unix.S_IFCHR, unix.S_IFBLK:
				continue
			}
		}
		bad = append(bad, e)
	}
	if len(bad) > 0 {
		r.fail("", "after sbxfs commit --git, git status shows what the git commit should hold:\n  %q", bad[:min(len(bad), 20)])
	}
	if _, err := gitAt(top, "fsck", "--no-dangling"); err != nil {
		r.fail("", "%v", err)
	}
}
