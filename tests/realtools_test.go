package tests

// Real tools, end to end (issue 6): git, go, editors, sqlite3, tar/cp/rsync
// and many writer processes work in a sandbox over a real original; the
// sandbox is committed with the CLI, and the original is compared with a
// plain copy of it (cp -a, made before) that got the same work, and with
// what the mount showed just before the commit.
//
// The helpers here are shared by the realtools_*_test.go and
// writers_test.go files; their names start with rt.

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// rtNeedCLI skips a test that commits when the sbxfs CLI does not build
// (the stand-in server cannot commit).
func rtNeedCLI(t *testing.T) {
	t.Helper()
	if cliBin == "" {
		t.Skipf("needs the sbxfs CLI: %s", cliErr)
	}
}

// rtNeedTool returns the path of the first of names that is installed,
// and skips the test when none is (scripts/install-deps.sh installs them
// all, so they run in CI).
func rtNeedTool(t *testing.T, names ...string) string {
	t.Helper()
	for _, n := range names {
		if p, err := exec.LookPath(n); err == nil {
			return p
		}
	}
	t.Skipf("%s not installed (scripts/install-deps.sh installs it)", strings.Join(names, " or "))
	return ""
}

// rtBaseEnv is the environment of the tools a test runs: ours without
// the settings that would make their output depend on the machine (git,
// locale, time zone, editors, GOFLAGS; GOCACHE and the like stay), plus
// extra.
func rtBaseEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch {
		case strings.HasPrefix(k, "GIT_"), strings.HasPrefix(k, "LC_"), k == "LANG", k == "LANGUAGE", k == "TZ",
			k == "GOFLAGS", k == "GOTMPDIR", k == "GOBIN", k == "EDITOR", k == "VISUAL", k == "VIMINIT", k == "EXINIT":
			continue
		}
		env = append(env, kv)
	}
	env = append(env, "LC_ALL=C", "TZ=UTC", "GORACE=atexit_sleep_ms=0")
	return append(env, extra...)
}

// rtShell runs commands for one side of a comparison (the mount or the
// plain copy) and records their normalized output, so the two sides can
// be compared.
type rtShell struct {
	t       *testing.T
	side    string // "mount" or "plain", for messages
	root    string // replaced by ROOT in recorded output
	env     []string
	timeout time.Duration
	log     []string // "$ cmd\noutput" of every recorded command
}

func newRtShell(t *testing.T, side, root string, env []string) *rtShell {
	return &rtShell{t: t, side: side, root: root, env: env, timeout: 2 * time.Minute}
}

func (s *rtShell) norm(out string) string {
	if s.root != "" {
		out = strings.ReplaceAll(out, s.root, "ROOT")
	}
	return out
}

// try runs name args in dir and returns its combined output.
func (s *rtShell) try(dir string, env []string, name string, args ...string) (string, error) {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(slices.Clone(s.env), env...)
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return "", err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return out.String(), err
	case <-time.After(s.timeout):
		_ = cmd.Process.Kill()
		<-done
		return out.String(), fmt.Errorf("timed out after %v", s.timeout)
	}
}

// run is try that fails the test when the command fails; its output is
// recorded (normalized) and returned.
func (s *rtShell) run(dir string, name string, args ...string) string {
	s.t.Helper()
	return s.runEnv(dir, nil, name, args...)
}

func (s *rtShell) runEnv(dir string, env []string, name string, args ...string) string {
	s.t.Helper()
	start := time.Now()
	out, err := s.try(dir, env, name, args...)
	if d := time.Since(start); d > time.Second {
		s.t.Logf("[%s] %s %s: %v", s.side, filepath.Base(name), strings.Join(args, " "), d.Round(time.Millisecond))
	}
	line := s.norm(fmt.Sprintf("$ %s %s (in %s)", filepath.Base(name), strings.Join(args, " "), dir))
	if err != nil {
		s.t.Fatalf("[%s] %s: %v\n%s", s.side, line, err, out)
	}
	out = s.norm(out)
	s.log = append(s.log, line+"\n"+out)
	return out
}

// sh runs a shell script with bash -euo pipefail.
func (s *rtShell) sh(dir, script string) string {
	s.t.Helper()
	return s.run(dir, "bash", "-euo", "pipefail", "-c", script)
}

// rtCompareLogs compares what the same commands printed on both sides.
func rtCompareLogs(t *testing.T, plain, mount *rtShell) {
	t.Helper()
	for i := 0; i < max(len(plain.log), len(mount.log)); i++ {
		var p, m string
		if i < len(plain.log) {
			p = plain.log[i]
		}
		if i < len(mount.log) {
			m = mount.log[i]
		}
		if p != m {
			t.Errorf("command %d printed differently in the mount and in the plain copy:\n--- plain:\n%s\n--- mount:\n%s", i, p, m)
		}
	}
}

// rtFilter drops the entries of a walk skip says so, and the names of
// skipped children from directory listings.
func rtFilter(m map[string]nodeInfo, skip func(rel string) bool) map[string]nodeInfo {
	if skip == nil {
		return m
	}
	out := map[string]nodeInfo{}
	for rel, n := range m {
		if skip(rel) {
			continue
		}
		if n.Entries != nil {
			var ents []string
			for _, e := range n.Entries {
				if !skip(filepath.Join(rel, e)) {
					ents = append(ents, e)
				}
			}
			n.Entries = ents
		}
		out[rel] = n
	}
	return out
}

// rtCompareTrees fails the test when the trees at want and got differ in
// what o records (skip: paths left out of the comparison).
func rtCompareTrees(t *testing.T, what, want, got string, o walkOpts, skip func(rel string) bool) {
	t.Helper()
	rtCompareWalks(t, what, rtFilter(mustWalk(t, want, o), skip), rtFilter(mustWalk(t, got, o), skip))
}

func rtCompareWalks(t *testing.T, what string, want, got map[string]nodeInfo) {
	t.Helper()
	if d := diffTrees(want, got, 40); len(d) > 0 {
		t.Errorf("%s:\n  %s", what, strings.Join(d, "\n  "))
	}
}

// rtUnder returns a skip function for the paths under (and at) the given
// relative paths.
func rtUnder(rels ...string) func(string) bool {
	return func(rel string) bool {
		for _, r := range rels {
			if rel == r || strings.HasPrefix(rel, r+"/") {
				return true
			}
		}
		return false
	}
}

// rtNamed returns a skip function for every path with one of the given
// base names (and what is under it).
func rtNamed(names ...string) func(string) bool {
	return func(rel string) bool {
		for _, part := range strings.Split(rel, "/") {
			if slices.Contains(names, part) {
				return true
			}
		}
		return false
	}
}

// rtCommit commits the sandbox with the CLI and checks that the commit
// ended it (unmounted). It first records the mount's view, and checks
// after the commit that the original shows exactly that (content, types,
// modes, symlink targets, link counts, user.* attributes, owners, mtimes).
func rtCommit(t *testing.T, sb *sandbox, msg string) {
	t.Helper()
	rtCommitOpts(t, sb, msg, walkOpts{xattr: userXattrs, owner: true, mtime: true})
}

func rtCommitOpts(t *testing.T, sb *sandbox, msg string, o walkOpts) {
	t.Helper()
	before := mustWalk(t, sb.mnt, o)
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, cliBin, "commit", "-m", msg, sb.mnt)
	cmd.Env = childEnv() // no 1 s sleep at exit of a -race CLI
	out, err := cmd.CombinedOutput()
	if err != nil {
		st, _ := runTimeout(20*time.Second, cliBin, "status", sb.mnt)
		t.Fatalf("sbxfs commit %s: %v\n%s\nsbxfs status:\n%s", sb.mnt, err, out, st)
	}
	t.Logf("sbxfs commit (%v): %s", time.Since(start).Round(time.Millisecond), strings.TrimSpace(string(out)))
	if _, ok := mountAt(sb.mnt); ok {
		t.Errorf("%s is still mounted after sbxfs commit", sb.mnt)
	}
	rtCompareWalks(t, "after the commit the original differs from what the mount showed before it (want = mount)",
		before, mustWalk(t, sb.orig, o))
}
