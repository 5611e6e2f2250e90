package tests

import (
	"encoding/json"
	"fmt"
	"os"
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
	}
	work(plain, "plain")
	work(compacting, "compacting")

	compactions := regexp.MustCompile(`journal compacted.*dead_paths_dropped=(\d+)`)
	// Once more with git done: records enough for a compaction (a
	// file opened for writing 200 times), and the server's word it made it.
	done := len(compactions.FindAllString(compacting.log.String(), -1))
	for range 200 {
		f, err := os.OpenFile(compacting.path("src", "gen0.txt"), os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	for deadline := time.Now().Add(10 * time.Second); len(compactions.FindAllString(compacting.log.String(), -1)) == done; {
		if time.Now().After(deadline) {
			t.Fatalf("no compaction after the last appends; the server's log:\n%s", compacting.log)
		}
		time.Sleep(20 * time.Millisecond)
	}
	dropped := 0
	for _, m := range compactions.FindAllStringSubmatch(compacting.log.String(), -1) {
		n, _ := strconv.Atoi(m[1])
		dropped += n
	}
	if dropped < 40 {
		t.Errorf("the compacting server dropped %d dead paths, want 40 or more; its log:\n%s", dropped, compacting.log)
	}
	recs, err := layers.ReadJournal(filepath.Join(compacting.work, "journal"))
	if err != nil {
		t.Fatal(err)
	}
	var named []string
	for _, r := range recs {
		if r.Op != layers.OpKeep && r.Op != layers.OpKeepLink {
			continue // appended since the last compaction
		}
		for _, p := range []string{r.Path, r.Path2} {
			if strings.Contains(p, "tmp_obj_") || strings.HasSuffix(p, ".lock") || strings.HasSuffix(p, ".swp") ||
				strings.HasPrefix(p, "build") || strings.HasPrefix(p, "vendor") || strings.HasPrefix(p, "out.o") {
				named = append(named, p)
			}
		}
	}
	if len(named) > 0 {
		t.Errorf("the compacted journal still names dead paths: %q", named)
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
