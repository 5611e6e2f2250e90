package tests

import (
	"flag"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/fsutil/fsutiltest"
)

// The differential tests apply one random sequence of operations to a
// plain directory that started as a copy of the original and to an sbxfs
// mount of the original, and demand the same outcome: the same errno for
// every operation, and the same trees (names, types, permission bits,
// sizes, content, symlink targets, user.* attributes, link counts of
// non-directories, listings). The original must not change at all.
//
// Reproduce a failure with the seed it prints:
//
//	go test ./tests -run TestDifferential -seed N -diff.ops M

// flagDiffAvoid leaves out operations that hit a known bug, so a run can
// look for others. It is empty by default: known bugs fail the test.
var flagDiffAvoid = flag.String("diff.avoid", "", "comma-separated known bugs the generator avoids: "+
	"mode0 (objects with permission bits 0), dirtonew (renaming a directory to a name that does not exist), "+
	"dirmtime (a directory's mtime changed by a copy-up beneath it), "+
	"openunlink (unlinking or renaming files the run holds open), "+
	"xattrflags (setxattr with XATTR_CREATE or XATTR_REPLACE: sbxfs fails before a copy-up, kernel overlayfs after), "+
	"fds (operations on descriptors kept open: kernel overlayfs reports the original's link count for an unlinked file and fails a fchmod of it with EEXIST), "+
	"noopchown (chown(-1, -1): kernel overlayfs copies the object up, sbxfs does not)")

var flagDiffNoPassthrough = flag.Bool("diff.nopassthrough", false, "mount the differential tests' sandbox without FUSE passthrough")

var flagDiffLongUpper = flag.Bool("diff.longupper", false, "keep the differential tests' sandbox state ~3,900 bytes deep, so that most upper paths pass PATH_MAX")

var flagDiffCompact = flag.Bool("diff.compact", false, "have the differential tests' server compact its change journal every 2 KiB appended (layers/compact.go)")

var flagDiffRef = flag.String("diff.ref", "plain", "what the differential tests compare the mount with: plain (a copy of the original, "+
	"made to part hard links as overlayfs does) or overlay (a kernel overlayfs mount over a copy, redirect_dir=on, index=off)")

var flagDiffHistory = flag.String("diff.history", "", "on a mismatch, write every operation of the run to this file")

var flagDiffCommit = flag.Bool("diff.commit", false, "TestDifferentialCommit runs one random seed instead of its regression seeds")

var flagDiffSnapshot = flag.String("diff.snapshot", "", "TestDifferentialCommit copies the original and the sandbox directory (upper, work: the journal) "+
	"into this directory before it commits, and the status output beside them, to study a failing commit")

func avoiding(what string) bool {
	return slices.Contains(strings.Split(*flagDiffAvoid, ","), what)
}

// pickMode picks a mode from modes (all zero bits are left out under
// -diff.avoid=mode0).
func (r *diffRun) pickMode(modes []uint32) uint32 {
	for {
		m := modes[r.rng.Intn(len(modes))]
		if m&0o777 != 0 || !avoiding("mode0") {
			return m
		}
	}
}

// diffViewOpts is what the differential tests compare: what a user sees,
// and owners (operation set 2 changes them).
var diffViewOpts = walkOpts{xattr: userXattrs, owner: true}

// diffCompareEvery is how many operations pass between two tree
// comparisons.
const diffCompareEvery = 20

func diffSeed(t *testing.T) int64 {
	seed := *flagSeed
	if seed == 0 {
		seed = time.Now().UnixNano() % 1_000_000_007
	}
	t.Logf("seed %d (rerun: go test ./tests -run '%s$' -seed %d -diff.ops %d%s)", seed, t.Name(), seed, *flagDiffOps, diffSetFlags())
	return seed
}

// diffSetFlags are the flags a rerun needs for the same operations.
func diffSetFlags() string {
	var f string
	if *flagDiffOpSet != diffOpSetLatest {
		f += fmt.Sprintf(" -diff.opset %d", *flagDiffOpSet)
	}
	if *flagDiffChurn {
		f += " -diff.churn"
	}
	return f
}

// makeDiffOriginal builds an original of about 50 files in about 10
// directories (nested ones, an empty one), a symlink and a FIFO, with
// assorted modes, sizes and user.* attributes. Hard links come after, from
// addOriginalLinks (differential_links_test.go).
func makeDiffOriginal(t *testing.T, rng *rand.Rand) string {
	t.Helper()
	orig := newOrig(t, nil)
	dirs := []string{"a", "a/b", "a/b/c", "a/b/c/d", "e", "e/f", "g", "h", "h/i", "h/i/j", "empty"}
	for _, d := range dirs {
		if err := os.MkdirAll(filepath.Join(orig, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Chmod(filepath.Join(orig, "g"), 0o2775); err != nil {
		t.Fatal(err)
	}
	modes := []os.FileMode{0o644, 0o644, 0o600, 0o755, 0o444, 0o640}
	fileDirs := append([]string{""}, dirs[:len(dirs)-1]...)
	for i := 0; i < 50; i++ {
		d := fileDirs[i%len(fileDirs)]
		name := filepath.Join(orig, d, fmt.Sprintf("f%02d", i))
		size := rng.Intn(3000)
		if i%17 == 0 {
			size = 100<<10 + rng.Intn(1000)
		}
		if err := os.WriteFile(name, randBytes(rng, size), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(name, modes[rng.Intn(len(modes))]); err != nil {
			t.Fatal(err)
		}
		if i%5 == 0 {
			if err := unix.Setxattr(name, "user.a", []byte(fmt.Sprintf("v%d", i)), 0); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := unix.Setxattr(filepath.Join(orig, "a/b"), "user.dir", []byte("dx"), 0); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("f01", filepath.Join(orig, "a", "ln")); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(filepath.Join(orig, "e", "fifo"), 0o640); err != nil {
		t.Fatal(err)
	}
	// Some history, so times differ from "now".
	past := time.Now().Add(-48 * time.Hour)
	_ = filepath.Walk(orig, func(p string, _ os.FileInfo, err error) error {
		if err == nil {
			ts := []unix.Timespec{unix.NsecToTimespec(past.UnixNano()), unix.NsecToTimespec(past.UnixNano())}
			_ = unix.UtimesNanoAt(unix.AT_FDCWD, p, ts, unix.AT_SYMLINK_NOFOLLOW)
		}
		return nil
	})
	return orig
}

func randBytes(rng *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte('a' + rng.Intn(26))
	}
	if n > 0 && rng.Intn(4) == 0 {
		b[0] = 0 // binary too
	}
	return b
}

// copyTree copies orig to a new plain directory with cp -a.
func copyTree(t *testing.T, orig string) string {
	t.Helper()
	ref := filepath.Join(t.TempDir(), "ref")
	if out, err := exec.Command("cp", "-a", orig, ref).CombinedOutput(); err != nil {
		t.Fatalf("cp -a: %v\n%s", err, out)
	}
	return ref
}

// diffRun is one differential run.
type diffRun struct {
	t       *testing.T
	seed    int64
	rng     *rand.Rand
	ref     string
	sb      *sandbox
	step    int
	history []string
	ents    []diffEnt // the ref tree, refreshed after every change
	dirty   bool      // ents is out of date
	// fds are descriptors kept open across operations, the same slot on
	// each side (-1: closed): renames, unlinks and copy-ups happen while
	// files are open.
	fds    [2][diffSlots]int
	fdPath [diffSlots]string // the path each slot was opened at
	// dfds are directories kept open the same way (operation set 2).
	dfds    [2][diffSlots]int
	dfdPath [diffSlots]string
	// ops are the operations the run draws from (-diff.opset).
	ops []weightedOp
	// links keeps the plain directory's hard links of the original as
	// the sandbox shows them (nil: the original has none);
	// groupIno holds the st_ino the mount shows for them.
	links    *linkModel
	groupIno map[uint64]bool
	// removed holds trees opRemoveTree removed (each its entries, the
	// top first), for opRemakeTree.
	removed [][]diffEnt
}

const diffSlots = 4

// closeFds closes every descriptor the run keeps open.
func (r *diffRun) closeFds() {
	for _, fds := range []*[2][diffSlots]int{&r.fds, &r.dfds} {
		for side := range fds {
			for k, fd := range fds[side] {
				if fd >= 0 {
					unix.Close(fd)
					fds[side][k] = -1
				}
			}
		}
	}
}

type diffEnt struct {
	rel  string
	mode uint32
	size int64
}

// diffOp is one operation, applied the same way under each root.
type diffOp struct {
	desc string
	do   func(root string) (any, error)
	// check compares the results of a successful do on both sides; it
	// returns "" when they agree.
	check func(ref, mnt any) string
	// keepsTree: the operation changes no name, type or size.
	keepsTree bool
	// onSide replaces do for operations on the descriptors a run keeps
	// open (side 0: the plain directory, 1: the mount).
	onSide func(side int, root string) (any, error)
	// parts names the paths the sandbox copies up when the operation
	// succeeds (where that parts a hard link of the original:
	// linkModel); drops names the paths it removes or replaces.
	// nofollow: the operation copies up a symlink among parts itself
	// (rename, link, lchown, utimensat or setxattr without following);
	// else it follows it to what it names (open, chmod, truncate).
	parts    []string
	drops    []string
	nofollow bool
}

func TestDifferential(t *testing.T) {
	seed := diffSeed(t)
	r := newDiffRun(t, seed, !*flagDiffNoLinks)
	r.run(*flagDiffOps)
	r.compareTrees("end")
	r.checkPatch()
	r.checkListing()
	r.checkDiffCoverage()
}

// diffCommitSeeds are histories that once broke the commit (kept as
// regression runs; -diff.commit or -seed runs one more, random or given).
// links: the original has hard links (diffLinks), as in random runs.
// opset: the operations the seed draws from (-diff.opset, or
// diffOpSetChurn: -diff.churn).
var diffCommitSeeds = []struct {
	seed, ops int64
	links     bool
	opset     int
}{
	{1, 1000, false, 1}, {2, 1000, false, 1}, {3, 1000, false, 1}, {4, 1000, false, 1}, {7, 1000, false, 1},
	{10, 1000, false, 1}, {17, 1000, false, 1}, {107, 1000, false, 1}, {159, 1000, false, 1}, {169, 1000, false, 1},
	{306, 2000, false, 1}, {456, 2000, false, 1}, {87300363, 1000, false, 1}, {367227571, 1000, false, 1},
	{895216717, 1000, false, 1}, {775086874, 1000, true, 1},
	{946070738, 1000, true, diffOpSetChurn}, // a link moved over its removed other name, a directory made there
	{563182110, 702, true, diffOpSetLatest}, // a remade directory exchanged with a FIFO: the git commit kept its files
}

// TestDifferentialCommit runs random operations through the mount, commits
// the sandbox with the CLI, and compares the original with the plain
// directory that got the same operations.
func TestDifferentialCommit(t *testing.T) {
	if cliBin == "" {
		t.Skipf("needs the sbxfs CLI: %s", cliErr)
	}
	if *flagDiffCommit || *flagSeed != 0 {
		diffCommit(t, diffSeed(t), *flagDiffOps/3, !*flagDiffNoLinks, *flagDiffOpSet)
		return
	}
	for _, c := range diffCommitSeeds {
		t.Run(fmt.Sprint(c.seed), func(t *testing.T) {
			rerun := fmt.Sprintf("go test ./tests -run 'TestDifferentialCommit$' -seed %d -diff.ops %d", c.seed, 3*c.ops)
			if !c.links {
				rerun += " -diff.nolinks"
			}
			switch c.opset {
			case diffOpSetLatest:
			case diffOpSetChurn:
				rerun += " -diff.churn"
			default:
				rerun += fmt.Sprintf(" -diff.opset %d", c.opset)
			}
			t.Logf("seed %d (rerun: %s)", c.seed, rerun)
			diffCommit(t, c.seed, int(c.ops), c.links, c.opset)
		})
	}
}

func diffCommit(t *testing.T, seed int64, ops int, links bool, opset int) *diffRun {
	r := newDiffRunGuard(t, seed, false, links, opset)
	withGit := gitTrack(t, r.sb.orig)
	r.run(ops)
	r.compareTrees("before commit")
	r.closeFds()
	r.links.release()
	if *flagDiffSnapshot != "" {
		snapshotSandbox(t, r.sb, *flagDiffSnapshot)
	}
	r.checkPatch()
	r.checkListing()
	r.checkDiffCoverage()
	r.commitAndCompare(r.sb.mnt, withGit)
	return r
}

// commitAndCompare commits the sandbox (its mountpoint, or its directory
// when unmounted) with the CLI, and compares the original with the plain
// directory.
func (r *diffRun) commitAndCompare(target string, withGit bool) {
	t := r.t
	args := []string{"commit", "-m", "differential", target}
	if withGit {
		args = append(args[:1], append([]string{"--git"}, args[1:]...)...)
	}
	out, err := runTimeout(60*time.Second, cliBin, args...)
	if err != nil {
		st, _ := runTimeout(20*time.Second, cliBin, "status", target)
		r.fail("", "sbxfs %s: %v\n%s\nsbxfs status:\n%s", strings.Join(args, " "), err, out, st)
	}
	want, err := walkTree(r.ref, diffViewOpts)
	if err != nil {
		t.Fatalf("walk plain dir: %v", err)
	}
	got, err := walkTree(r.sb.orig, diffViewOpts)
	if err != nil {
		t.Fatalf("walk the original: %v", err)
	}
	if *flagDiffRef == "overlay" {
		// Kernel overlayfs shows an unparted name of an original hard
		// link with the original's count, whatever names went since;
		// the link groups are compared below.
		for _, m := range []map[string]nodeInfo{want, got} {
			for p, n := range m {
				n.Nlink = 0
				m[p] = n
			}
		}
	}
	if d := diffTrees(want, got, 25); len(d) > 0 {
		r.fail(diffAbout(d), "after commit the original differs from the plain directory (want = plain dir):\n  %s", strings.Join(d, "\n  "))
	}
	wantLinks, err := linkGroups(r.ref)
	if err != nil {
		t.Fatal(err)
	}
	gotLinks, err := linkGroups(r.sb.orig)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(wantLinks, gotLinks) {
		r.fail("", "after commit the original's hard links differ from the plain directory's:\n  want %q\n  got  %q", wantLinks, gotLinks)
	}
	if withGit {
		r.checkGitCommit()
	}
}

// diffLongUpper is -diff.longupper for TestDifferentialLongUpper's run.
var diffLongUpper bool

// longStateDir makes a directory whose path is ~3,900 bytes long: a
// sandbox whose state is there has its upper and work directories just
// below PATH_MAX, so the server reaches nearly every upper object through
// a descriptor of a directory on the way (fsutil.ShortPath).
func longStateDir(t testing.TB) string {
	base := t.TempDir()
	rest := 3880 - len(base) - 1
	d := filepath.Join(base, fsutiltest.DeepRel("u", rest/201), strings.Repeat("v", rest%201))
	if err := os.MkdirAll(d, 0o700); err != nil {
		t.Fatal(err)
	}
	return d
}

// TestDifferentialLongUpper is one of TestDifferentialCommit's histories
// (hard links in the original, the churn operations) with the sandbox's
// upper at ~3,900 bytes of path: every upper access of the server and the
// commit goes through the long-path form (fsutil.ShortPath) and must give
// what the short form gives.
func TestDifferentialLongUpper(t *testing.T) {
	if cliBin == "" {
		t.Skipf("needs the sbxfs CLI: %s", cliErr)
	}
	diffLongUpper = true
	defer func() { diffLongUpper = false }()
	c := diffCommitSeeds[len(diffCommitSeeds)-2] // links, churn
	diffCommit(t, c.seed, int(c.ops), c.links, c.opset)
}

// diffCompact is -diff.compact for TestDifferentialCompactedJournal's
// run.
var diffCompact bool

// TestDifferentialCompactedJournal is one of TestDifferentialCommit's
// histories (hard links in the original, the churn operations) with the
// server compacting its change journal every 2 KiB of records
// (layers/compact.go): status, the patch, the listing and the commit,
// read from journals rewritten many times while the operations went on,
// some of their dead paths dropped (docs/journal-format.md "Dead
// paths"), must give what the plain directory holds.
func TestDifferentialCompactedJournal(t *testing.T) {
	if cliBin == "" {
		t.Skipf("needs the sbxfs CLI: %s", cliErr)
	}
	diffCompact = true
	defer func() { diffCompact = false }()
	// Seed 2 fails when a compaction loses where a path was renamed
	// from (checked); the other has links and the churn operations.
	for _, c := range []struct {
		seed, ops int64
		links     bool
		opset     int
	}{diffCommitSeeds[1], diffCommitSeeds[len(diffCommitSeeds)-2]} {
		t.Run(fmt.Sprint(c.seed), func(t *testing.T) {
			r := diffCommit(t, c.seed, int(c.ops), c.links, c.opset)
			if n := strings.Count(r.sb.log.String(), "journal compacted"); n < 5 {
				t.Errorf("the server compacted its journal %d times, want 5 or more; its log:\n%s", n, r.sb.log)
			}
			dropped := 0
			for _, m := range regexp.MustCompile(`journal compacted.*dead_paths_dropped=(\d+)`).FindAllStringSubmatch(r.sb.log.String(), -1) {
				n, _ := strconv.Atoi(m[1])
				dropped += n
			}
			if dropped == 0 {
				t.Errorf("the server's compactions dropped no dead path (made and removed again); its log:\n%s", r.sb.log)
			}
			t.Logf("the server's compactions dropped %d dead paths", dropped)
		})
	}
}

// TestDifferentialRemount remounts the sandbox in the middle of the run:
// the tree and the inode number of every object must survive.
func TestDifferentialRemount(t *testing.T) {
	seed := diffSeed(t)
	r := newDiffRun(t, seed, !*flagDiffNoLinks)
	n := max(*flagDiffOps/3, 200)
	r.run(n / 2)
	r.compareTrees("before remount")

	// The inode numbers asked of: a created file, a created and renamed
	// file, an original file copied up by a write, an original renamed.
	probes := map[string]string{"created": "zz-created", "created and renamed": "zz-renamed"}
	r.apply(diffOp{desc: "create zz-created, create zz-torename and rename it to zz-renamed", do: func(root string) (any, error) {
		if err := os.WriteFile(filepath.Join(root, "zz-created"), []byte("new"), 0o644); err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(root, "zz-torename"), []byte("ren"), 0o644); err != nil {
			return nil, err
		}
		return nil, os.Rename(filepath.Join(root, "zz-torename"), filepath.Join(root, "zz-renamed"))
	}})
	r.refresh()
	var origFile, origRen string
	for _, e := range r.ents {
		b := filepath.Base(e.rel)
		if !isFileEnt(e) || len(b) != 3 || b[0] != 'f' || b == "f01" || r.links.original(b) {
			continue // made by makeDiffOriginal: fNN (f01 is also a name ops create), not hard-linked
		}
		if origFile == "" {
			origFile = e.rel
		} else if origRen == "" {
			origRen = e.rel
		}
	}
	if origFile != "" {
		probes["original, copied up"] = origFile
		r.apply(diffOp{desc: "append to " + origFile, do: func(root string) (any, error) {
			return nil, appendFile(filepath.Join(root, origFile), []byte("more"))
		}})
	}
	if origRen != "" {
		probes["original, renamed"] = "zz-renamed-orig"
		r.apply(diffOp{desc: "rename " + origRen + " to zz-renamed-orig", do: func(root string) (any, error) {
			return nil, os.Rename(filepath.Join(root, origRen), filepath.Join(root, "zz-renamed-orig"))
		}})
	}
	before := mustWalk(t, r.sb.mnt, walkOpts{ino: true})
	r.closeFds() // open files would keep the mount busy
	remount(t, r.sb)
	after := mustWalk(t, r.sb.mnt, walkOpts{ino: true})
	for kind, p := range probes {
		if b, a := before[p].Ino, after[p].Ino; a != b || a == 0 {
			t.Errorf("st_ino of the %s file %s changed across the remount: %d before, %d after", kind, p, b, a)
		}
	}
	var changed []string
	for p, b := range before {
		// A name of an original hard link parted from the others shows
		// the original's st_ino until its kernel entry is dropped, which
		// may not have happened yet (and not while it was open).
		if a, ok := after[p]; ok && a.Ino != b.Ino && !r.groupIno[b.Ino] {
			changed = append(changed, fmt.Sprintf("/%s (%s): %d -> %d", p, fileTypeName(b.Type), b.Ino, a.Ino))
		}
	}
	slices.Sort(changed)
	if len(changed) > 0 {
		t.Errorf("st_ino changed across the remount for %d of %d objects:\n  %s", len(changed), len(before),
			strings.Join(changed[:min(len(changed), 20)], "\n  "))
	}
	r.compareTrees("after remount")
	r.run(n - n/2)
	r.compareTrees("end")
	r.checkPatch()
	r.checkListing()
	r.checkDiffCoverage()
}

// TestDifferentialKill SIGKILLs the server in the middle of the run,
// cleans up the dead mount as a user would and mounts the same sandbox
// again: every operation that returned before the kill is in the upper
// and the journal, so the tree, the listings of status and diff and the
// patch are as if nothing had happened.
func TestDifferentialKill(t *testing.T) {
	seed := diffSeed(t)
	r := newDiffRun(t, seed, !*flagDiffNoLinks)
	n := max(*flagDiffOps/3, 200)
	r.run(n / 2)
	r.compareTrees("before the kill")
	r.closeFds() // descriptors of a dead mount: nothing to close them through
	r.sb.kill(t)
	var out []byte
	var err error
	if r.sb.useStandIn() {
		out, err = runTimeout(20*time.Second, "umount", "-l", r.sb.mnt)
	} else {
		out, err = runTimeout(20*time.Second, cliBin, "unmount", r.sb.mnt)
	}
	if err != nil {
		t.Fatalf("unmount the dead mount: %v\n%s", err, out)
	}
	r.sb.start(t)
	r.compareTrees("after the kill and a new mount")
	r.checkListing()
	r.run(n - n/2)
	r.compareTrees("end")
	r.checkPatch()
	r.checkListing()
	r.checkDiffCoverage()
}

func newDiffRun(t *testing.T, seed int64, links bool) *diffRun {
	return newDiffRunGuard(t, seed, true, links, *flagDiffOpSet)
}

// newDiffRunGuard starts a run; guard checks the original is unchanged at
// the end (off for a run that commits); links gives the original hard
// links (diffLinks); opSet picks the operations (-diff.opset).
func newDiffRunGuard(t *testing.T, seed int64, guard, links bool, opSet int) *diffRun {
	rng := rand.New(rand.NewSource(seed))
	orig := makeDiffOriginal(t, rng)
	if links {
		addOriginalLinks(t, orig)
	}
	if guard {
		originalGuard(t, orig)
	}
	ref := copyTree(t, orig)
	plain := *flagDiffRef != "overlay"
	if !plain {
		ref = mountOverlay(t, ref)
	}
	var opts []mountOption
	if *flagDiffNoPassthrough {
		opts = append(opts, withNoPassthrough())
	}
	if *flagDiffLongUpper || diffLongUpper {
		opts = append(opts, withStateIn(longStateDir(t)))
	}
	if *flagDiffCompact || diffCompact {
		opts = append(opts, withServerEnv("SBXFS_JOURNAL_COMPACT=2048"))
	}
	sb := mountSandbox(t, orig, opts...)
	r := &diffRun{t: t, seed: seed, rng: rng, ref: ref, sb: sb, groupIno: map[uint64]bool{}, ops: diffOpsOf(opSet)}
	if *flagDiffChurn || opSet == diffOpSetChurn {
		r.ops = diffChurnOps
	}
	if links && plain {
		r.links = newLinkModel(t, ref)
	}
	if links {
		for from := range diffLinks {
			var st unix.Stat_t
			if err := unix.Lstat(filepath.Join(sb.mnt, from), &st); err != nil {
				t.Fatal(err)
			}
			r.groupIno[st.Ino] = true
		}
	}
	r.initFds()
	r.compareTrees("start")
	return r
}

// initFds marks every descriptor slot closed and closes what is open
// when the test ends, before the unmount.
func (r *diffRun) initFds() {
	for side := range r.fds {
		for k := range r.fds[side] {
			r.fds[side][k] = -1
			r.dfds[side][k] = -1
		}
	}
	r.t.Cleanup(r.closeFds)
}

func (r *diffRun) run(n int) {
	start := time.Now()
	for i := 0; i < n; i++ {
		if r.dirty || r.ents == nil {
			r.refresh()
		}
		r.apply(r.nextOp())
		if r.step%diffCompareEvery == 0 {
			r.compareTrees(fmt.Sprintf("after step %d", r.step))
		}
		if r.step%500 == 0 {
			r.t.Logf("step %d: %d objects, %v", r.step, len(r.ents), time.Since(start).Round(time.Millisecond))
		}
	}
}

// apply runs op under both roots and compares the outcomes.
func (r *diffRun) apply(op diffOp) {
	r.t.Helper()
	r.step++
	var resRef, resMnt any
	var errRef, errMnt error
	var undo []func(failed bool)
	if r.links != nil {
		for _, p := range op.parts {
			undo = append(undo, r.links.part(p, op.nofollow))
		}
		for _, p := range op.drops {
			undo = append(undo, r.links.drop(p))
		}
	}
	if op.onSide != nil {
		resRef, errRef = op.onSide(0, r.ref)
		resMnt, errMnt = op.onSide(1, r.sb.mnt)
	} else {
		resRef, errRef = op.do(r.ref)
		resMnt, errMnt = op.do(r.sb.mnt)
	}
	for _, u := range undo {
		u(errRef != nil)
	}
	eRef, eMnt := errnoOf(errRef), errnoOf(errMnt)
	r.dirty = errRef == nil && !op.keepsTree
	r.history = append(r.history, fmt.Sprintf("%4d %s -> %s", r.step, op.desc, errnoName(eRef)))
	if eRef != eMnt {
		r.fail(op.desc, "step %d: %s\n  plain dir: %s (%v)\n  sbxfs:     %s (%v)", r.step, op.desc, errnoName(eRef), errRef, errnoName(eMnt), errMnt)
	}
	if errRef == nil && op.check != nil {
		if d := op.check(resRef, resMnt); d != "" {
			r.fail(op.desc, "step %d: %s: results differ: %s", r.step, op.desc, d)
		}
	}
}

// fail reports a mismatch with the last operations and every earlier one
// that named a path (or a parent of a path) quoted in about.
func (r *diffRun) fail(about, format string, args ...any) {
	r.t.Helper()
	last := r.history[max(0, len(r.history)-30):]
	var related []string
	if paths := quotedPaths(about); len(paths) > 0 {
		for _, h := range r.history[:len(r.history)-len(last)] {
			for _, q := range quotedPaths(h) {
				if slices.ContainsFunc(paths, func(p string) bool {
					return p == q || strings.HasPrefix(p, q+"/") || strings.HasPrefix(q, p+"/")
				}) {
					related = append(related, h)
					break
				}
			}
		}
	}
	msg := fmt.Sprintf("DIFFERENTIAL MISMATCH (seed %d)\n%s\n", r.seed, fmt.Sprintf(format, args...))
	if *flagDiffHistory != "" {
		if err := os.WriteFile(*flagDiffHistory, []byte(strings.Join(r.history, "\n")+"\n"), 0o644); err != nil {
			msg += fmt.Sprintf("(could not write the history: %v)\n", err)
		} else {
			msg += fmt.Sprintf("(every operation: %s)\n", *flagDiffHistory)
		}
	}
	if len(related) > 0 {
		msg += "earlier operations on these paths:\n  " + strings.Join(related, "\n  ") + "\n"
	}
	r.t.Fatalf("%slast operations:\n  %s", msg, strings.Join(last, "\n  "))
}

// quotedPaths returns the %q-quoted strings of an operation description.
func quotedPaths(desc string) []string {
	var out []string
	for {
		i := strings.IndexByte(desc, '"')
		if i < 0 {
			return out
		}
		j := strings.IndexByte(desc[i+1:], '"')
		if j < 0 {
			return out
		}
		if p := desc[i+1 : i+1+j]; p != "" {
			out = append(out, p)
		}
		desc = desc[i+j+2:]
	}
}

func (r *diffRun) compareTrees(when string) {
	r.t.Helper()
	want, err := walkTree(r.ref, diffViewOpts)
	if err != nil {
		r.t.Fatalf("walk plain dir: %v", err)
	}
	got, err := walkTree(r.sb.mnt, diffViewOpts)
	if err != nil {
		r.fail("", "%s: walk the mount: %v", when, err)
	}
	if d := diffTrees(want, got, 25); len(d) > 0 {
		r.fail(diffAbout(d), "%s: the mount differs from the plain directory (want = plain dir):\n  %s", when, strings.Join(d, "\n  "))
	}
}

// mountOverlay mounts kernel overlayfs over lower (with the directory
// renames and hard-link rules sbxfs follows) and returns its mountpoint;
// it is unmounted when the test ends, if restackOverlay has not.
func mountOverlay(t *testing.T, lower string) string {
	t.Helper()
	return mountOverlayRoot(t, lower, "")
}

// mountOverlayRoot is mountOverlay with an upper whose root takes the
// mode, owner, user attributes and times of the directory like (none
// when ""): kernel overlayfs shows the upper root's.
func mountOverlayRoot(t *testing.T, lower, like string) string {
	t.Helper()
	dir := t.TempDir()
	upper, work, mnt := filepath.Join(dir, "upper"), filepath.Join(dir, "work"), filepath.Join(dir, "mnt")
	for _, d := range []string{upper, work, mnt} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if like != "" {
		copyRootAttrs(t, like, upper)
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s,redirect_dir=on,index=off,metacopy=off", lower, upper, work)
	if err := unix.Mount("overlay", mnt, "overlay", 0, opts); err != nil {
		t.Skipf("-diff.ref overlay: mount overlayfs: %v", err)
	}
	overlayLowers.Store(mnt, lower)
	t.Cleanup(func() {
		if _, mounted := overlayLowers.LoadAndDelete(mnt); !mounted {
			return
		}
		if err := unix.Unmount(mnt, 0); err != nil {
			t.Errorf("unmount the overlayfs reference: %v", err)
			_ = unix.Unmount(mnt, unix.MNT_DETACH)
		}
	})
	return mnt
}

// overlayLowers maps each mountOverlay mountpoint still mounted to its
// lowerdir option.
var overlayLowers sync.Map

// restackOverlay unmounts the kernel overlayfs reference at mnt and
// mounts a new one whose lower layers are its upper over its lower, as
// a sandbox stacked on another's upper sees them: a name the first one
// made, the second one sees in a lower layer (its hard links keep their
// count when one name goes, as in the sandbox).
func restackOverlay(t *testing.T, mnt string) string {
	t.Helper()
	lower, ok := overlayLowers.LoadAndDelete(mnt)
	if !ok {
		t.Fatalf("restackOverlay: %s is no overlayfs reference", mnt)
	}
	if err := unix.Unmount(mnt, 0); err != nil {
		t.Fatalf("unmount the overlayfs reference: %v", err)
	}
	upper := filepath.Join(filepath.Dir(mnt), "upper")
	return mountOverlayRoot(t, upper+":"+lower.(string), upper)
}

// copyRootAttrs gives the directory to the mode, owner, user attributes
// and times of from.
func copyRootAttrs(t *testing.T, from, to string) {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(from, &st); err != nil {
		t.Fatal(err)
	}
	sz, err := unix.Llistxattr(from, nil)
	if err != nil {
		t.Fatal(err)
	}
	names := make([]byte, sz)
	if sz, err = unix.Llistxattr(from, names); err != nil {
		t.Fatal(err)
	}
	for _, name := range strings.Split(string(names[:sz]), "\x00") {
		if !strings.HasPrefix(name, "user.") {
			continue
		}
		val := make([]byte, 64<<10)
		n, err := unix.Lgetxattr(from, name, val)
		if err != nil {
			t.Fatal(err)
		}
		if err := unix.Lsetxattr(to, name, val[:n], 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Lchown(to, int(st.Uid), int(st.Gid)); err != nil {
		t.Fatal(err)
	}
	if err := unix.Chmod(to, st.Mode&07777); err != nil {
		t.Fatal(err)
	}
	times := []unix.Timespec{st.Atim, st.Mtim}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, to, times, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		t.Fatal(err)
	}
}

// refresh lists the plain directory: the generator picks from it, so a
// seed gives the same operations whatever sbxfs does.
func (r *diffRun) refresh() {
	r.ents = r.ents[:0]
	var walk func(rel string)
	walk = func(rel string) {
		f, err := os.Open(filepath.Join(r.ref, rel))
		if err != nil {
			r.t.Fatal(err)
		}
		names, err := f.Readdirnames(-1)
		f.Close()
		if err != nil {
			r.t.Fatal(err)
		}
		slices.Sort(names)
		for _, n := range names {
			p := filepath.Join(rel, n)
			var st unix.Stat_t
			if err := unix.Lstat(filepath.Join(r.ref, p), &st); err != nil {
				r.t.Fatal(err)
			}
			r.ents = append(r.ents, diffEnt{rel: p, mode: st.Mode, size: st.Size})
			if st.Mode&unix.S_IFMT == unix.S_IFDIR {
				walk(p)
			}
		}
	}
	walk("")
}

// --- picking paths ---

var diffNames = []string{"n0", "n1", "n2", "n3", "x", "y", "f01", "b", "new dir"}

func (r *diffRun) pick(filter func(diffEnt) bool) (diffEnt, bool) {
	var c []diffEnt
	for _, e := range r.ents {
		if filter(e) {
			c = append(c, e)
		}
	}
	if len(c) == 0 {
		return diffEnt{}, false
	}
	return c[r.rng.Intn(len(c))], true
}

func isDirEnt(e diffEnt) bool  { return e.mode&unix.S_IFMT == unix.S_IFDIR }
func isFileEnt(e diffEnt) bool { return e.mode&unix.S_IFMT == unix.S_IFREG }
func anyEnt(diffEnt) bool      { return true }

// dir returns an existing directory ("" is the root).
func (r *diffRun) dir() string {
	if r.rng.Intn(5) == 0 {
		return ""
	}
	if e, ok := r.pick(isDirEnt); ok {
		return e.rel
	}
	return ""
}

// newPath returns a name in an existing directory, which may exist.
func (r *diffRun) newPath() string {
	return filepath.Join(r.dir(), diffNames[r.rng.Intn(len(diffNames))])
}

// existing returns an existing path passing filter (often), else a new one.
func (r *diffRun) existing(filter func(diffEnt) bool) string {
	if r.rng.Intn(8) != 0 {
		if e, ok := r.pick(filter); ok {
			return e.rel
		}
	}
	return r.newPath()
}

// openPath returns, now and then, the path of a file the run holds open
// (when it still exists), so that unlinks and renames meet open files.
func (r *diffRun) openPath() (string, bool) {
	if avoiding("openunlink") || r.rng.Intn(4) != 0 {
		return "", false
	}
	k := r.slot()
	if r.fds[0][k] < 0 || !r.exists(r.fdPath[k]) {
		return "", false
	}
	return r.fdPath[k], true
}

func (r *diffRun) isDir(rel string) bool {
	for _, e := range r.ents {
		if e.rel == rel {
			return isDirEnt(e)
		}
	}
	return false
}

func (r *diffRun) exists(rel string) bool {
	return slices.ContainsFunc(r.ents, func(e diffEnt) bool { return e.rel == rel })
}

func (r *diffRun) fileSize(rel string) int64 {
	for _, e := range r.ents {
		if e.rel == rel {
			return e.size
		}
	}
	return 0
}

// snapshotSandbox copies the original and the sandbox's directories into
// dir (which must not exist) and writes `sbxfs status` into dir/status.
func snapshotSandbox(t *testing.T, sb *sandbox, dir string) {
	t.Helper()
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatalf("-diff.snapshot: %v", err)
	}
	for from, to := range map[string]string{sb.orig: "orig", sb.upper: "upper", filepath.Join(filepath.Dir(sb.upper), "work"): "work"} {
		if out, err := exec.Command("cp", "-a", from, filepath.Join(dir, to)).CombinedOutput(); err != nil {
			t.Fatalf("-diff.snapshot: cp -a %s: %v\n%s", from, err, out)
		}
	}
	st, _ := runTimeout(20*time.Second, cliBin, "status", sb.mnt)
	if err := os.WriteFile(filepath.Join(dir, "status"), st, 0o600); err != nil {
		t.Fatalf("-diff.snapshot: %v", err)
	}
	t.Logf("-diff.snapshot: the sandbox before the commit is in %s", dir)
}
