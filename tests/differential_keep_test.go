package tests

import (
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestDifferentialCommitKeep commits in the middle of the run with
// --keep, three times: each commit must give the original what the mount
// showed, leave the sandbox empty (status: no changes) and the mount
// showing the same tree, over which the run goes on. What the sandbox
// made before a commit is the original's after it: a file it gave
// several names is an original hard link then, which the next copy-up
// parts (the link model is made again from the plain directory).
func TestDifferentialCommitKeep(t *testing.T) {
	if cliBin == "" {
		t.Skipf("needs the sbxfs CLI: %s", cliErr)
	}
	if *flagDiffRef == "overlay" {
		t.Skip("-diff.ref overlay: kernel overlayfs has no commit; its upper's hard links never part")
	}
	seed := diffSeed(t)
	r := newDiffRunGuard(t, seed, false, !*flagDiffNoLinks, *flagDiffOpSet)
	if *flagDiffChurn {
		r.ops = diffChurnOps
	}
	n := max(*flagDiffOps/3, 300)
	const rounds = 3
	for round := 1; round <= rounds; round++ {
		r.run(n / (rounds + 1))
		when := fmt.Sprintf("commit %d of %d", round, rounds)
		r.compareTrees("before " + when)
		r.closeFds() // files open for writing would make the commit busy
		out, err := runTimeout(60*time.Second, cliBin, "commit", "--keep", r.sb.mnt)
		if err != nil {
			st, _ := runTimeout(20*time.Second, cliBin, "status", r.sb.mnt)
			r.fail("", "%s: sbxfs commit --keep: %v\n%s\nsbxfs status:\n%s", when, err, out, st)
		}
		r.links.release()
		want := mustWalk(t, r.ref, diffViewOpts)
		got, err := walkTree(r.sb.orig, diffViewOpts)
		if err != nil {
			t.Fatalf("walk the original: %v", err)
		}
		if d := diffTrees(want, got, 25); len(d) > 0 {
			r.fail(diffAbout(d), "after %s the original differs from the plain directory (want = plain dir):\n  %s", when, strings.Join(d, "\n  "))
		}
		st, err := runTimeout(20*time.Second, cliBin, "status", r.sb.mnt)
		if err != nil || string(st) != "no changes\n" {
			r.fail("", "after %s the sandbox is not empty: %v\n%s", when, err, st)
		}
		r.compareTrees("after " + when)
		r.relink()
	}
	r.run(n / (rounds + 1))
	r.compareTrees("end")
	r.checkPatch()
	r.checkListing()
	r.checkDiffCoverage()
}

// diffAbout names the paths of diffTrees' lines, for r.fail.
func diffAbout(d []string) string {
	var about []string
	for _, l := range d {
		if p, _, ok := strings.Cut(l, ": "); ok {
			about = append(about, fmt.Sprintf("%q", strings.TrimPrefix(p, "/")))
		}
	}
	return strings.Join(about, " ")
}

// relink makes the link model again after a commit: every file of the
// plain directory with several names is an original hard link now.
func (r *diffRun) relink() {
	if r.links == nil { // the sandbox may have made links since
		r.links = newLinkModel(r.t, r.ref)
		return
	}
	r.links.holder = r.t.TempDir()
	r.links.inos = map[uint64]bool{}
	err := filepath.WalkDir(r.ref, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		if st.Nlink > 1 {
			r.links.inos[st.Ino] = true
		}
		return nil
	})
	if err != nil {
		r.t.Fatal(err)
	}
}
