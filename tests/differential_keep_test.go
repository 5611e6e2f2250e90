package tests

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestDifferentialCommitKeep commits in the middle of the run with
// --keep, three times, or (one round in three) rolls back with --keep:
// each commit must give the original what the mount showed, each
// rollback leave it as it was, and either leave the sandbox empty
// (status: no changes) and the mount showing the original, over which
// the run goes on. What the sandbox made before a commit is the
// original's after it: a file it gave several names is an original hard
// link then, which the next copy-up parts (the link model is made again
// from the plain directory).
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
		op := "commit"
		if r.rng.Intn(3) == 0 {
			op = "rollback"
		}
		when := fmt.Sprintf("%s %d of %d", op, round, rounds)
		r.compareTrees("before " + when)
		r.closeFds() // files open for writing would make the mount busy
		before := mustWalk(t, r.sb.orig, diffViewOpts)
		out, err := runTimeout(60*time.Second, cliBin, op, "--keep", r.sb.mnt)
		if err != nil {
			st, _ := runTimeout(20*time.Second, cliBin, "status", r.sb.mnt)
			r.fail("", "%s: sbxfs %s --keep: %v\n%s\nsbxfs status:\n%s", when, op, err, out, st)
		}
		r.links.release()
		if op == "rollback" {
			r.history = append(r.history, fmt.Sprintf("%4d sbxfs rollback --keep: the plain directory made a copy of the original again", r.step))
			r.resetRef()
		} else {
			r.history = append(r.history, fmt.Sprintf("%4d sbxfs commit --keep", r.step))
		}
		got, err := walkTree(r.sb.orig, diffViewOpts)
		if err != nil {
			t.Fatalf("walk the original: %v", err)
		}
		want := mustWalk(t, r.ref, diffViewOpts)
		if op == "rollback" {
			want = before
		}
		if d := diffTrees(want, got, 25); len(d) > 0 {
			r.fail(diffAbout(d), "after %s the original differs from what it should hold (want):\n  %s", when, strings.Join(d, "\n  "))
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
	r.closeFds()
	if *flagDiffSnapshot != "" {
		snapshotSandbox(t, r.sb, *flagDiffSnapshot)
	}
	r.checkPatch()
	r.checkListing()
	r.checkDiffCoverage()
}

// resetRef makes the plain directory a copy of the original again (hard
// links kept), as a rollback makes the mount show it.
func (r *diffRun) resetRef() {
	r.t.Helper()
	if err := os.RemoveAll(r.ref); err != nil {
		r.t.Fatal(err)
	}
	if out, err := exec.Command("cp", "-a", r.sb.orig, r.ref).CombinedOutput(); err != nil {
		r.t.Fatalf("cp -a: %v\n%s", err, out)
	}
	r.dirty = true
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

// relink makes the link model again after a commit or a rollback: every
// file of the plain directory with several names is an original hard link
// now.
func (r *diffRun) relink() {
	if r.links == nil { // the sandbox may have made links since
		r.links = newLinkModel(r.t, r.ref)
		return
	}
	r.links.scan()
}
