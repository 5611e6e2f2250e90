package tests

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/commit"
	"github.com/sbxfs/sbxfs/layers"
)

// TestDifferentialConcurrentCommit: random operations through the mount,
// then a few changes made to the original directly (as an editor, git or
// another agent would while the sandbox is open: a file appended to,
// chmodded, chowned, given an attribute, saved over by an editor,
// removed, renamed, made or replaced by a directory, a directory made,
// renamed with what it holds or removed with it), then `sbxfs commit`.
// Whatever the two histories, nothing anyone wrote is lost: a refused
// commit (exit 7) leaves the original exactly as the other writer left
// it; a commit that succeeds keeps every file the other writer wrote or
// changed (found by content wherever the sandbox's renames took it, with
// its mode) and applies the sandbox's changes to the rest (the files the
// other writer did not touch end as in the plain directory). Files are
// compared by content because a directory the sandbox moved takes the
// other writer's files with it.
func TestDifferentialConcurrentCommit(t *testing.T) {
	concurrentSeeds(t, concurrentCommit)
}

// concurrentSeeds runs run for 16 seeds, or the one -seed names, with
// few enough operations (-diff.ops / 50) that most of the tree stays
// untouched for the other writer.
func concurrentSeeds(t *testing.T, run func(t *testing.T, seed int64, ops int)) {
	if cliBin == "" {
		t.Skipf("needs the sbxfs CLI: %s", cliErr)
	}
	seeds := []int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	if *flagSeed != 0 {
		seeds = []int64{diffSeed(t)}
	}
	for _, seed := range seeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Logf("seed %d (rerun: go test ./tests -run '%s$' -seed %d -diff.ops %d%s)", seed, strings.Split(t.Name(), "/")[0], seed, *flagDiffOps, diffSetFlags())
			run(t, seed, max(*flagDiffOps/50, 20))
		})
	}
}

// TestDifferentialWriteDuringCommit: TestDifferentialConcurrentCommit's
// other writer acts while the commit runs, after the conflict check
// passed and the new objects are staged, before the apply's first step
// (commit.Options.Fault "staged"): its changes land where the apply
// backs up, in directories the commit removes or replaces, anywhere.
// The commit runs in this process, over the sandbox unmounted; odd seeds
// give the original hard links. Nothing anyone wrote is lost: the commit
// succeeds and keeps every file the other writer wrote (as
// TestDifferentialConcurrentCommit checks), or it refuses or fails,
// undone, and the original is exactly as the other writer left it.
func TestDifferentialWriteDuringCommit(t *testing.T) {
	concurrentSeeds(t, writeDuringCommit)
}

func writeDuringCommit(t *testing.T, seed int64, ops int) {
	// (Odd seeds: the apply's own steps change inodes seen at other
	// paths too.)
	r := concurrentHistory(t, seed, ops)
	if err := r.sb.stop(); err != nil {
		t.Fatal(err)
	}
	var wrote []otherWrite
	var touched map[string]bool
	var left map[string]nodeInfo
	x, err := commit.Prepare(r.sb.layersConfig(), commit.Options{Fault: func(point string) {
		if point != "staged" {
			return
		}
		wrote, touched = r.otherWriter()
		var err error
		if left, err = walkTree(r.sb.orig, unchangedOpts); err != nil {
			t.Fatal(err)
		}
	}})
	if err != nil {
		r.fail("", "prepare the commit (the original is unchanged until the check is done): %v", err)
	}
	if left == nil {
		return // no changes: nothing staged, nothing for the other writer to meet
	}
	err = commit.Commit(x)
	t.Logf("commit: %v", err)
	if err == nil {
		r.checkCommitted(wrote, touched)
		return
	}
	var ce *commit.Error
	if !errors.As(err, &ce) || !ce.RolledBack {
		r.fail("", "the commit failed without being undone: %v", err)
	}
	now, werr := walkTree(r.sb.orig, unchangedOpts)
	if werr != nil {
		t.Fatal(werr)
	}
	if d := diffTrees(left, now, 25); len(d) > 0 {
		r.fail("", "an undone commit changed the original (want = as the other writer left it; %v):\n  %s", err, strings.Join(d, "\n  "))
	}
}

// otherWrite is what the other writer left in the original: a file with
// this content and mode, at (or moved from) paths.
type otherWrite struct {
	desc  string
	paths []string
	sum   string
	perm  uint32
	xattr string // the value of user.other, when set
	uid   uint32 // the owner, when the other writer set it
}

// concurrentHistory runs a random history of ops operations through the
// mount and checks it; odd seeds give the original hard links. Nothing
// stays open.
func concurrentHistory(t *testing.T, seed int64, ops int) *diffRun {
	r := newDiffRunGuard(t, seed, false, seed%2 == 1 && !*flagDiffNoLinks, *flagDiffOpSet)
	r.run(ops)
	r.compareTrees("before the other writer")
	r.closeFds()
	r.links.release()
	return r
}

func concurrentCommit(t *testing.T, seed int64, ops int) {
	r := concurrentHistory(t, seed, ops)

	wrote, touched := r.otherWriter()
	left, err := walkTree(r.sb.orig, unchangedOpts)
	if err != nil {
		t.Fatal(err)
	}

	out, err := runTimeout(60*time.Second, cliBin, "commit", "-m", "concurrent", r.sb.mnt)
	code := exitCode(err)
	t.Logf("sbxfs commit: exit %d\n%s", code, out)
	switch code {
	case exitConflictCode:
		now, err := walkTree(r.sb.orig, unchangedOpts)
		if err != nil {
			t.Fatal(err)
		}
		if d := diffTrees(left, now, 25); len(d) > 0 {
			r.fail("", "a refused commit changed the original (want = as the other writer left it):\n  %s", strings.Join(d, "\n  "))
		}
		// --force lets the sandbox win where the commit named a
		// conflict, and nowhere else: what the other writer did away
		// from every named path stays. Or it fails as a whole.
		named := r.conflictPaths(string(out))
		how := "commit --force"
		args := []string{"commit", "--force", "-m", "concurrent", r.sb.mnt}
		if seed%2 == 0 {
			// Or every conflict resolved in the sandbox's favour, then
			// a plain commit: the same outcome as --force, or a
			// refusal before anything is recorded.
			how = "resolve, then commit"
			if !r.resolveAll(left) {
				return
			}
			args = []string{"commit", "-m", "concurrent", r.sb.mnt}
		}
		wins := r.sandboxWins(string(out))
		out, err = runTimeout(60*time.Second, cliBin, args...)
		t.Logf("then %s: exit %d\n%s", how, exitCode(err), out)
		if err != nil {
			// Where the other writer moved or removed a directory the
			// sandbox changes things in, or moves, the commit makes
			// the sandbox's directory anew: nothing here stops it.
			if now, werr := walkTree(r.sb.orig, unchangedOpts); werr == nil {
				if d := diffTrees(left, now, 25); len(d) > 0 {
					t.Logf("and it changed the original (want = as the other writer left it):\n  %s", strings.Join(d, "\n  "))
				}
			}
			r.fail("", "sbxfs %s after the conflicts %q: %v\n%s", how, named, err, out)
		}
		var kept []otherWrite
		for _, w := range wrote {
			if !coveredBy(w.paths, named) {
				kept = append(kept, w)
			}
		}
		got := r.checkKept(kept, how)
		for p, sum := range wins {
			if n, ok := got[p]; !ok || !isRegularInfo(n) || n.Hash != sum {
				r.fail("", "%s: the conflict %s was not settled with the sandbox's file (want its content in the original)", how, p)
			}
		}
		return
	case 0:
	default:
		r.fail("", "sbxfs commit: exit %d: %v\n%s", code, err, out)
	}

	r.checkCommitted(wrote, touched)
}

// otherWriter makes a few changes to original files and directories the
// original has now, drawn from the run's seed: what it wrote (with where
// to find it) and the original paths it changed.
func (r *diffRun) otherWriter() ([]otherWrite, map[string]bool) {
	t, seed := r.t, r.seed
	before, err := walkTree(r.sb.orig, diffViewOpts)
	if err != nil {
		t.Fatal(err)
	}
	var files, dirs []string
	for p, n := range before {
		switch {
		case isDirInfo(n):
			dirs = append(dirs, p)
		case isRegularInfo(n):
			files = append(files, p)
		}
	}
	slices.Sort(files)
	slices.Sort(dirs)
	var wrote []otherWrite
	touched := map[string]bool{} // original paths the other writer changed
	for i := range 1 + r.rng.Intn(4) {
		var desc string
		var err error
		switch k := r.rng.Intn(12); {
		case k == 0 && len(files) > 0: // content
			p := files[r.rng.Intn(len(files))]
			data := []byte(fmt.Sprintf("\nother writer %d/%d", seed, i))
			desc = "append to " + p
			err = appendFile(filepath.Join(r.sb.orig, p), data)
			touched[p] = true
			if err == nil {
				wrote = append(forget(wrote, p), otherWrite{desc: desc, paths: []string{p}, sum: fileSum(t, filepath.Join(r.sb.orig, p)), perm: permOf(t, filepath.Join(r.sb.orig, p))})
			}
		case k == 1 && len(files) > 0: // mode
			p := files[r.rng.Intn(len(files))]
			perm := []uint32{0o600, 0o640, 0o750, 0o444}[r.rng.Intn(4)]
			desc = fmt.Sprintf("chmod %04o %s", perm, p)
			err = os.Chmod(filepath.Join(r.sb.orig, p), os.FileMode(perm))
			touched[p] = true
			if err == nil {
				wrote = append(forget(wrote, p), otherWrite{desc: desc, paths: []string{p}, sum: fileSum(t, filepath.Join(r.sb.orig, p)), perm: perm})
			}
		case k == 2 && len(files) > 0: // removal
			p := files[r.rng.Intn(len(files))]
			desc = "rm " + p
			err = os.Remove(filepath.Join(r.sb.orig, p))
			touched[p] = true
			wrote = forget(wrote, p)
		case k == 3 && len(files) > 0: // a file renamed
			p := files[r.rng.Intn(len(files))]
			q := filepath.Join(filepath.Dir(p), fmt.Sprintf("other-moved-%d", i))
			desc = "mv " + p + " " + q
			sum, perm := "", uint32(0)
			if _, err := os.Lstat(filepath.Join(r.sb.orig, p)); err == nil {
				sum, perm = fileSum(t, filepath.Join(r.sb.orig, p)), permOf(t, filepath.Join(r.sb.orig, p))
			}
			err = os.Rename(filepath.Join(r.sb.orig, p), filepath.Join(r.sb.orig, q))
			touched[p], touched[q] = true, true
			wrote = forget(wrote, p)
			if err == nil {
				wrote = append(wrote, otherWrite{desc: desc, paths: []string{p, q}, sum: sum, perm: perm})
			}
		case k == 4 && len(dirs) > 1: // a directory renamed, with all in it
			d := dirs[1+r.rng.Intn(len(dirs)-1)] // not the root
			e := d + fmt.Sprintf("-other-%d", i)
			desc = "mv " + d + " " + e
			var in []otherWrite // every file in it now
			walkErr := filepath.WalkDir(filepath.Join(r.sb.orig, d), func(full string, de fs.DirEntry, err error) error {
				if err != nil || !de.Type().IsRegular() {
					return err
				}
				f, _ := filepath.Rel(r.sb.orig, full)
				in = append(in, otherWrite{desc: desc + " (" + f + ")", paths: []string{f, e + strings.TrimPrefix(f, d)},
					sum: fileSum(t, full), perm: permOf(t, full)})
				touched[f], touched[e+strings.TrimPrefix(f, d)] = true, true
				return nil
			})
			if walkErr != nil && !errors.Is(walkErr, fs.ErrNotExist) {
				t.Fatal(walkErr)
			}
			err = os.Rename(filepath.Join(r.sb.orig, d), filepath.Join(r.sb.orig, e))
			if err == nil {
				wrote = append(forget(wrote, d), in...)
			}
		case k == 5 && len(files) > 0: // an attribute
			p := files[r.rng.Intn(len(files))]
			value := fmt.Sprintf("other writer %d/%d", seed, i)
			desc = "setfattr user.other " + p
			err = unix.Lsetxattr(filepath.Join(r.sb.orig, p), "user.other", []byte(value), 0)
			touched[p] = true
			if err == nil {
				wrote = append(forget(wrote, p), otherWrite{desc: desc, paths: []string{p}, sum: fileSum(t, filepath.Join(r.sb.orig, p)),
					perm: permOf(t, filepath.Join(r.sb.orig, p)), xattr: value})
			}
		case k == 6 && len(files) > 0: // a file replaced by a directory
			p := files[r.rng.Intn(len(files))]
			desc = "rm " + p + "; mkdir " + p + "; create " + p + "/inside"
			if err = os.Remove(filepath.Join(r.sb.orig, p)); err == nil {
				err = os.Mkdir(filepath.Join(r.sb.orig, p), 0o755)
			}
			inside := filepath.Join(p, "inside")
			if err == nil {
				err = os.WriteFile(filepath.Join(r.sb.orig, inside), []byte(fmt.Sprintf("inside, by the other writer %d/%d\n", seed, i)), 0o644)
			}
			touched[p], touched[inside] = true, true
			wrote = forget(wrote, p)
			// No later change takes p for a file (a chmod or an
			// attribute of the directory is no file written).
			files = slices.DeleteFunc(files, func(f string) bool { return f == p })
			if err == nil {
				wrote = append(wrote, otherWrite{desc: desc, paths: []string{inside}, sum: fileSum(t, filepath.Join(r.sb.orig, inside)), perm: 0o644})
			}
		case k == 8 && len(files) > 0: // an owner
			p := files[r.rng.Intn(len(files))]
			desc = "chown 65534 " + p
			err = os.Lchown(filepath.Join(r.sb.orig, p), 65534, -1)
			touched[p] = true
			if err == nil {
				wrote = append(forget(wrote, p), otherWrite{desc: desc, paths: []string{p}, sum: fileSum(t, filepath.Join(r.sb.orig, p)),
					perm: permOf(t, filepath.Join(r.sb.orig, p)), uid: 65534})
			}
		case k == 9 && len(files) > 0: // an editor's save: a new file renamed over it
			p := files[r.rng.Intn(len(files))]
			full := filepath.Join(r.sb.orig, p)
			desc = "save " + p + " (write " + p + ".other-tmp, rename over it)"
			if _, err = os.Lstat(full); err == nil {
				if err = os.WriteFile(full+".other-tmp", []byte(fmt.Sprintf("saved by the other writer %d/%d\n", seed, i)), 0o644); err == nil {
					err = os.Rename(full+".other-tmp", full)
				}
			}
			touched[p] = true
			if err == nil {
				wrote = append(forget(wrote, p), otherWrite{desc: desc, paths: []string{p}, sum: fileSum(t, full), perm: 0o644})
			}
		case k == 10 && len(dirs) > 0: // a new directory with a file in it
			d := filepath.Join(dirs[r.rng.Intn(len(dirs))], fmt.Sprintf("other-dir-%d", i))
			f := filepath.Join(d, "inside")
			desc = "mkdir " + d + "; create " + f
			if err = os.Mkdir(filepath.Join(r.sb.orig, d), 0o755); err == nil {
				err = os.WriteFile(filepath.Join(r.sb.orig, f), []byte(fmt.Sprintf("made by the other writer %d/%d\n", seed, i)), 0o644)
			}
			touched[d], touched[f] = true, true
			if err == nil {
				wrote = append(wrote, otherWrite{desc: desc, paths: []string{f}, sum: fileSum(t, filepath.Join(r.sb.orig, f)), perm: 0o644})
			}
		case k == 11 && len(dirs) > 1: // a directory removed, with all in it
			d := dirs[1+r.rng.Intn(len(dirs)-1)] // not the root
			desc = "rm -r " + d
			if _, err = os.Lstat(filepath.Join(r.sb.orig, d)); err == nil {
				walkErr := filepath.WalkDir(filepath.Join(r.sb.orig, d), func(full string, de fs.DirEntry, err error) error {
					if err == nil {
						f, _ := filepath.Rel(r.sb.orig, full)
						touched[f] = true
					}
					return err
				})
				if walkErr != nil {
					t.Fatal(walkErr)
				}
				err = os.RemoveAll(filepath.Join(r.sb.orig, d))
			}
			wrote = forget(wrote, d)
		default: // a new file
			d := ""
			if len(dirs) > 0 {
				d = dirs[r.rng.Intn(len(dirs))]
			}
			p := filepath.Join(d, fmt.Sprintf("other-%d", i))
			desc = "create " + p
			err = os.WriteFile(filepath.Join(r.sb.orig, p), []byte(fmt.Sprintf("made by the other writer %d/%d\n", seed, i)), 0o640)
			touched[p] = true
			if err == nil {
				wrote = append(wrote, otherWrite{desc: desc, paths: []string{p}, sum: fileSum(t, filepath.Join(r.sb.orig, p)), perm: 0o640})
			}
		}
		if err != nil && !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, fs.ErrExist) {
			t.Fatalf("other writer: %s: %v", desc, err)
		}
		r.history = append(r.history, fmt.Sprintf("%4s other writer, in the original: %s -> %v", "", desc, errOrOK(err)))
	}
	return wrote, touched
}

// checkCommitted checks a commit that succeeded after the other writer's
// changes: every file it left is there, and the paths it neither touched
// nor moved with a directory end as in the plain directory.
func (r *diffRun) checkCommitted(wrote []otherWrite, touched map[string]bool) {
	t := r.t
	got := r.checkKept(wrote, "commit")
	// And the rest is the sandbox's: paths neither the other writer
	// touched nor moved with a directory end as in the plain directory.
	want, err := walkTree(r.ref, diffViewOpts)
	if err != nil {
		t.Fatal(err)
	}
	var differ []string
	for p, w := range want {
		if !touched[p] {
			if g, ok := got[p]; ok && isRegularInfo(g) && isRegularInfo(w) && g.Hash != w.Hash && !wroteSum(wrote, g.Hash) {
				differ = append(differ, p)
			}
		}
	}
	if len(differ) > 0 {
		slices.Sort(differ)
		r.fail("", "after the commit these files have neither the sandbox's content nor the other writer's: %q", differ[:min(len(differ), 20)])
	}
}

// resolveAll resolves every conflict `sbxfs resolve` lists. It reports
// whether all were resolved (none left); when one cannot be, resolve must
// refuse with exit 7, record nothing (the commit still refuses) and leave
// the original as the other writer left it.
func (r *diffRun) resolveAll(left map[string]nodeInfo) bool {
	r.t.Helper()
	var list struct {
		Conflicts []struct {
			Path string `json:"path"`
		} `json:"conflicts"`
	}
	if err := json.Unmarshal(r.cliOutput("resolve", "--json", r.sb.mnt), &list); err != nil {
		r.t.Fatal(err)
	}
	if len(list.Conflicts) == 0 {
		r.fail("", "sbxfs resolve lists no conflicts after a refused commit")
	}
	args := []string{"resolve", "--json", r.sb.mnt}
	for _, c := range list.Conflicts {
		if !slices.Contains(args, c.Path) {
			args = append(args, c.Path)
		}
	}
	out, err := runTimeout(60*time.Second, cliBin, args...)
	r.t.Logf("sbxfs resolve of %d conflicts: exit %d\n%s", len(args)-3, exitCode(err), out)
	switch exitCode(err) {
	case 0:
		var res struct {
			Conflicts []any `json:"conflicts"`
		}
		if err := json.Unmarshal(out, &res); err != nil || len(res.Conflicts) > 0 {
			r.fail("", "sbxfs resolve of every conflict left some (%v):\n%s", err, out)
		}
		return true
	case exitConflictCode:
		now, err := walkTree(r.sb.orig, unchangedOpts)
		if err != nil {
			r.t.Fatal(err)
		}
		if d := diffTrees(left, now, 25); len(d) > 0 {
			r.fail("", "a refused resolve changed the original:\n  %s", strings.Join(d, "\n  "))
		}
		out2, err := runTimeout(60*time.Second, cliBin, "commit", "-m", "concurrent", r.sb.mnt)
		if exitCode(err) != exitConflictCode {
			r.fail("", "after a refused resolve the commit must still refuse: exit %d\n%s\n(resolve: %s)", exitCode(err), out2, out)
		}
		return false
	}
	r.fail("", "sbxfs resolve: exit %d: %v\n%s", exitCode(err), err, out)
	return false
}

// checkKept demands a file with the content and mode of each of wrote in
// the original, and returns the original's tree.
func (r *diffRun) checkKept(wrote []otherWrite, what string) map[string]nodeInfo {
	r.t.Helper()
	got, err := walkTree(r.sb.orig, diffViewOpts)
	if err != nil {
		r.t.Fatal(err)
	}
	var lost []string
	for _, w := range wrote {
		found := false
		for _, n := range got {
			found = found || isRegularInfo(n) && n.Hash == w.sum && n.Perm == w.perm && (w.xattr == "" || n.Xattrs["user.other"] == w.xattr) &&
				(w.uid == 0 || n.Uid == w.uid)
		}
		if !found {
			lost = append(lost, w.desc)
		}
	}
	if len(lost) > 0 {
		r.fail("", "%s succeeded and lost what the other writer did: %s", what, strings.Join(lost, "; "))
	}
	return got
}

// conflictPaths reads the paths a refused commit names, as original
// paths (through the sandbox's renames, which sbxfs status lists).
func (r *diffRun) conflictPaths(out string) []string {
	r.t.Helper()
	var st struct {
		Changes []layers.Change `json:"changes"`
	}
	if err := json.Unmarshal(r.cliOutput("status", "--json", r.sb.mnt), &st); err != nil {
		r.t.Fatal(err)
	}
	renamed := map[string]string{}
	for _, c := range st.Changes {
		if c.Kind == layers.Renamed {
			renamed[c.Path] = c.From
		}
	}
	var paths []string
	for _, l := range strings.Split(out, "\n") {
		if p, _, ok := strings.Cut(strings.TrimPrefix(l, "  "), ": "); ok && strings.HasPrefix(l, "  ") {
			// The original path of what is there, or of what a rename
			// there replaced.
			dir, name := layers.Split(p)
			paths = append(paths, p, layers.Counterpart(renamed, p), layers.Join(layers.Counterpart(renamed, dir), name))
		}
	}
	if len(paths) == 0 {
		r.fail("", "a refused commit names no path:\n%s", out)
	}
	return paths
}

// sandboxWins lists, with their content, the files a refused commit
// names as conflicts that --force or resolve must give the sandbox's
// content: those whose own change (status) is not of metadata alone (that
// one is applied over the other writer's content) and that the sandbox
// has as a regular file.
func (r *diffRun) sandboxWins(out string) map[string]string {
	r.t.Helper()
	var st struct {
		Changes []layers.Change `json:"changes"`
	}
	if err := json.Unmarshal(r.cliOutput("status", "--json", r.sb.mnt), &st); err != nil {
		r.t.Fatal(err)
	}
	kinds := map[string]layers.ChangeKind{}
	for _, c := range st.Changes {
		kinds[c.Path] = c.Kind
	}
	ref, err := walkTree(r.ref, diffViewOpts)
	if err != nil {
		r.t.Fatal(err)
	}
	wins := map[string]string{}
	for _, l := range strings.Split(out, "\n") {
		p, _, ok := strings.Cut(strings.TrimPrefix(l, "  "), ": ")
		if !ok || !strings.HasPrefix(l, "  ") {
			continue
		}
		if k, changed := kinds[p]; changed && k != layers.Metadata && k != layers.Deleted && isRegularInfo(ref[p]) {
			wins[p] = ref[p].Hash
		}
	}
	return wins
}

// coveredBy reports whether one of paths is, lies beneath or holds one of
// named.
func coveredBy(paths, named []string) bool {
	for _, p := range paths {
		for _, n := range named {
			if p == n || n == "" || strings.HasPrefix(p, n+"/") || strings.HasPrefix(n, p+"/") {
				return true
			}
		}
	}
	return false
}

// forget drops what the other writer wrote at p or beneath it (it has
// removed, moved or changed it since; a move or a change records it
// again).
func forget(wrote []otherWrite, p string) []otherWrite {
	return slices.DeleteFunc(wrote, func(w otherWrite) bool {
		return w.paths[0] == p || strings.HasPrefix(w.paths[0], p+"/")
	})
}

func wroteSum(wrote []otherWrite, sum string) bool {
	for _, w := range wrote {
		if w.sum == sum {
			return true
		}
	}
	return false
}

func isDirInfo(n nodeInfo) bool     { return n.Type == unix.S_IFDIR }
func isRegularInfo(n nodeInfo) bool { return n.Type == unix.S_IFREG }

// fileSum is the content hash walkTree records.
func fileSum(t *testing.T, p string) string {
	t.Helper()
	h, err := hashFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func permOf(t *testing.T, p string) uint32 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Mode & 0o7777
}

func errOrOK(err error) string {
	if err == nil {
		return "ok"
	}
	return err.Error()
}
