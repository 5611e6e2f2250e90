package tests

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sbxfs/sbxfs/layers"
)

// TestRealGitDeadPathsDropped: git makes every object as a temporary file
// it links to the object's name and unlinks, and writes its index as
// index.lock renamed over it; an editor saves through a file renamed over
// the old one; a build makes a directory of objects and removes it; a
// package manager moves a package it unpacked aside into place (mv) and
// removes it again (rm -rf), a build renames its output from a temporary
// name and cleans it. Each leaves a path that held only what the sandbox
// made and removed again.
// Two sandboxes of one repository do the same work, one with its server
// compacting its journal every 4 KiB, which drops those paths: its
// journal names none of them, `sbxfs status` lists the same changes as
// the other's, and its commit gives the original what its mount showed.
func TestRealGitDeadPathsDropped(t *testing.T) {
	rtNeedCLI(t)
	rtNeedTool(t, "git")
	bare := rtMakeBareRepo(t)
	orig := filepath.Join(t.TempDir(), "orig")
	newRtGit(t, "seed", "").git("/", "clone", "-q", "--no-hardlinks", bare, orig)
	plain := mountSandbox(t, orig)
	compacting := mountSandbox(t, orig, withServerEnv("SBXFS_JOURNAL_COMPACT=4096"))

	work := func(sb *sandbox, side string) {
		t.Helper()
		g := newRtGit(t, side, sb.mnt)
		for round := range 4 {
			for i := range 10 {
				rtWrite(t, sb.path("src", fmt.Sprintf("gen%d.txt", i)), fmt.Sprintf("round %d file %d\n", round, i), 0o644)
			}
			// An editor's save of README.md.
			rtWrite(t, sb.path(".README.md.swp"), fmt.Sprintf("saved in round %d\n", round), 0o644)
			if err := os.Rename(sb.path(".README.md.swp"), sb.path("README.md")); err != nil {
				t.Fatal(err)
			}
			for i := range 5 {
				rtWrite(t, sb.path("build", "obj", fmt.Sprintf("o%d.o", i)), "object\n", 0o644)
			}
			if err := os.RemoveAll(sb.path("build")); err != nil {
				t.Fatal(err)
			}
			// A package manager's install: a package unpacked under a
			// temporary name, moved into place by mv(1), removed by
			// rm(1) (the next install); a build's output written
			// under a temporary name and renamed, then cleaned.
			stage := sb.path("vendor", fmt.Sprintf(".staging-%d", round))
			for i := range 5 {
				rtWrite(t, filepath.Join(stage, "lib", fmt.Sprintf("m%d.js", i)), "module\n", 0o644)
			}
			rtWrite(t, sb.path("out.o.tmp"), "output\n", 0o644)
			for _, cmd := range [][]string{{"mv", stage, sb.path("vendor", "pkg")}, {"mv", sb.path("out.o.tmp"), sb.path("out.o")},
				{"rm", "-rf", sb.path("vendor")}, {"rm", sb.path("out.o")}} {
				if out, err := runTimeout(30*time.Second, cmd[0], cmd[1:]...); err != nil {
					t.Fatalf("%q: %v\n%s", cmd, err, out)
				}
			}
			g.git(sb.mnt, "add", "-A")
			g.git(sb.mnt, "commit", "-q", "-m", "round "+strconv.Itoa(round))
		}
		// git gc: a pack written as tmp_pack_* and renamed, the loose
		// objects and their directories removed, twice (the second
		// pack replaces the first).
		for i := range 2 {
			rtWrite(t, sb.path("src", "gen0.txt"), fmt.Sprintf("gc %d\n", i), 0o644)
			g.git(sb.mnt, "commit", "-q", "-a", "-m", "before gc")
			g.git(sb.mnt, "gc", "-q", "--prune=now")
		}
	}
	work(plain, "plain")
	work(compacting, "compacting")

	if dropped := compactOnceMore(t, compacting, compacting.path("src", "gen0.txt")); dropped < 40 {
		t.Errorf("the compacting server dropped %d dead paths, want 40 or more; its log:\n%s", dropped, compacting.log)
	}
	if named := keptPaths(t, compacting, func(p string) bool {
		return strings.Contains(p, "tmp_obj_") || strings.Contains(p, "tmp_pack_") || strings.Contains(p, "tmp_idx_") ||
			strings.HasSuffix(p, ".lock") || strings.HasSuffix(p, ".swp") ||
			strings.HasPrefix(p, "build") || strings.HasPrefix(p, "vendor") || strings.HasPrefix(p, "out.o")
	}); len(named) > 0 {
		t.Errorf("the compacted journal still names dead paths: %q", named)
	}
	// Of the packs, only those there now: git gc renames the old ones
	// to .tmp-PID-pack-* and removes them.
	if named := keptPaths(t, compacting, func(p string) bool {
		_, err := os.Lstat(compacting.path(p))
		return strings.HasPrefix(p, ".git/objects/pack/") && errors.Is(err, os.ErrNotExist)
	}); len(named) > 0 {
		t.Errorf("the compacted journal still names packs git gc removed: %q", named)
	}

	status := func(sb *sandbox) string {
		t.Helper()
		out, err := runTimeout(60*time.Second, cliBin, "status", "--json", sb.mnt)
		if err != nil {
			t.Fatalf("sbxfs status: %v\n%s", err, out)
		}
		var st struct {
			Changes json.RawMessage `json:"changes"`
		}
		if err := json.Unmarshal(out, &st); err != nil {
			t.Fatalf("sbxfs status --json: %v\n%s", err, out)
		}
		return string(st.Changes)
	}
	if want, got := status(plain), status(compacting); got != want {
		t.Errorf("sbxfs status of the compacting sandbox differs from the other's:\n--- other:\n%s\n--- compacting:\n%s", want, got)
	}
	rtCommit(t, compacting, "dead paths")
	after := newRtGit(t, "original", orig)
	if st := after.git(orig, "status", "--porcelain"); st != "" {
		t.Errorf("git status in the original is not clean:\n%s", st)
	}
	after.git(orig, "fsck", "--strict")
}

var compactions = regexp.MustCompile(`journal compacted.*dead_paths_dropped=(\d+)`)

// compactOnceMore has sb's server (SBXFS_JOURNAL_COMPACT set low) compact
// its journal once more, with the work before done: records enough for a
// compaction (file, an existing file of the mount, opened for writing 200
// times), then the server's word it made it. It returns how many dead
// paths the server's compactions dropped in all.
func compactOnceMore(t *testing.T, sb *sandbox, file string) int {
	t.Helper()
	done := len(compactions.FindAllString(sb.log.String(), -1))
	for range 200 {
		f, err := os.OpenFile(file, os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	for deadline := time.Now().Add(10 * time.Second); len(compactions.FindAllString(sb.log.String(), -1)) == done; {
		if time.Now().After(deadline) {
			t.Fatalf("no compaction after the last appends; the server's log:\n%s", sb.log)
		}
		time.Sleep(20 * time.Millisecond)
	}
	dropped := 0
	for _, m := range compactions.FindAllStringSubmatch(sb.log.String(), -1) {
		n, _ := strconv.Atoi(m[1])
		dropped += n
	}
	return dropped
}

// keptPaths returns the paths match takes among those the keep records
// of sb's journal name (what its last compaction kept).
func keptPaths(t *testing.T, sb *sandbox, match func(string) bool) []string {
	t.Helper()
	recs, err := layers.ReadJournal(filepath.Join(sb.work, "journal"))
	if err != nil {
		t.Fatal(err)
	}
	var named []string
	for _, r := range recs {
		if r.Op != layers.OpKeep && r.Op != layers.OpKeepLink {
			continue // appended since the last compaction
		}
		for _, p := range []string{r.Path, r.Path2} {
			if p != "" && match(p) {
				named = append(named, p)
			}
		}
	}
	return named
}

// TestRealNpmDeadPathsDropped: npm upgrades a package by renaming its
// directory aside (node_modules/.NAME-RANDOM), unpacking the new version
// in its place and removing the old one; each upgrade leaves paths of a
// random name that held only what the sandbox made and removed again.
// The sandbox's server compacts its journal every 4 KiB: after three
// upgrades and an uninstall its journal names none of the retired
// directories, `sbxfs status` lists none, and the commit gives the
// original what npm left.
func TestRealNpmDeadPathsDropped(t *testing.T) {
	rtNeedCLI(t)
	npm := rtNeedTool(t, "npm")
	rtNeedTool(t, "tar")
	orig := filepath.Join(t.TempDir(), "app")
	rtWrite(t, filepath.Join(orig, "package.json"), `{"name":"app","version":"1.0.0","private":true}`+"\n", 0o644)
	pkgs := t.TempDir()
	for v := 1; v <= 4; v++ {
		src := filepath.Join(t.TempDir(), "package")
		rtWrite(t, filepath.Join(src, "package.json"), fmt.Sprintf(`{"name":"demo-pkg","version":"1.0.%d","main":"lib/index.js"}`+"\n", v), 0o644)
		for i := range 20 {
			rtWrite(t, filepath.Join(src, "lib", fmt.Sprintf("m%d.js", i)), fmt.Sprintf("module.exports = %d\n", v), 0o644)
		}
		tgz := filepath.Join(pkgs, fmt.Sprintf("demo-pkg-1.0.%d.tgz", v))
		if out, err := runTimeout(30*time.Second, "tar", "-czf", tgz, "-C", filepath.Dir(src), "package"); err != nil {
			t.Fatalf("tar: %v\n%s", err, out)
		}
	}
	sb := mountSandbox(t, orig, withServerEnv("SBXFS_JOURNAL_COMPACT=4096"))
	home := t.TempDir()
	run := func(args ...string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, npm, args...)
		cmd.Dir = sb.mnt
		cmd.Env = rtBaseEnv("HOME="+home, "npm_config_cache="+filepath.Join(home, "cache"),
			"npm_config_update_notifier=false", "npm_config_fund=false", "npm_config_audit=false")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("npm %q: %v\n%s", args, err, out)
		}
	}
	for v := 1; v <= 4; v++ {
		run("install", "--offline", "--ignore-scripts", filepath.Join(pkgs, fmt.Sprintf("demo-pkg-1.0.%d.tgz", v)))
		if b, err := os.ReadFile(sb.path("node_modules", "demo-pkg", "lib", "m0.js")); err != nil || string(b) != fmt.Sprintf("module.exports = %d\n", v) {
			t.Fatalf("after installing version %d, m0.js holds %q (%v)", v, b, err)
		}
	}
	run("uninstall", "--offline", "demo-pkg")

	retired := func(p string) bool { return strings.Contains(p, "node_modules/.demo-pkg-") }
	// npm retires the directory to the same name each time: 23 paths
	// (the directory, package.json, lib and its 20 files), and the
	// package's own directory, moved away at the uninstall, are dead at
	// the last compaction, if not also at one before.
	if dropped := compactOnceMore(t, sb, sb.path("package.json")); dropped < 24 {
		t.Errorf("the server dropped %d dead paths, want 24 or more; its log:\n%s", dropped, sb.log)
	}
	if named := keptPaths(t, sb, retired); len(named) > 0 {
		t.Errorf("the compacted journal still names npm's retired directories: %q", named)
	}
	out, err := runTimeout(60*time.Second, cliBin, "status", "--all", sb.mnt)
	if err != nil {
		t.Fatalf("sbxfs status: %v\n%s", err, out)
	}
	if strings.Contains(string(out), ".demo-pkg-") || strings.Contains(string(out), "node_modules/demo-pkg") {
		t.Errorf("sbxfs status lists what npm removed again:\n%s", out)
	}
	want, err := os.ReadFile(sb.path("package.json"))
	if err != nil {
		t.Fatal(err)
	}
	rtCommit(t, sb, "npm")
	if got, err := os.ReadFile(filepath.Join(orig, "package.json")); err != nil || string(got) != string(want) {
		t.Errorf("the original's package.json after the commit: %q (%v), want %q", got, err, want)
	}
	if left, _ := filepath.Glob(filepath.Join(orig, "node_modules", "*demo-pkg*")); len(left) > 0 {
		t.Errorf("the commit left %q in the original", left)
	}
}
