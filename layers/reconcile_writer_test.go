package layers_test

import (
	"flag"
	"fmt"
	"io/fs"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/commit"
	"github.com/sbxfs/sbxfs/layers"
)

// TestReconcileCutWhileAnotherWriterChanges (written by a review on
// 2026-11-28): a random history of the sandbox (as in
// TestReconcileAnyCutCommits), then, a tick of the clock later, another
// writer's random changes made directly in the original (a file's
// content, a chmod, a file made, a file removed, rm -r of a directory, a
// directory replaced with a file or a new directory, a file replaced, a
// rename within the original), then a commit.
//
// The oracle is differential, per seed and per cut point k:
//   - the reference: the whole journal, the server stopped cleanly (no
//     mark), the same writer's changes, a commit: refused, or a tree T;
//   - the cut: the same history in fresh directories, the journal cut
//     after record k and a mark of a power cut, the same writer's
//     changes, a commit.
//
// Where the reference refuses, the cut must refuse (going through is
// the data-loss class: the original's change overwritten or removed);
// where it gives T, the cut must give T or refuse. A refusal must leave
// the original as the writer left it. A cut that refuses where the
// reference went through is allowed (the walk cannot tell the
// sandbox's lost change from the original's since): only counted.
//
// The writer's changes are planned from the seed and the original's
// tree alone (on a copy of it), so both runs make the same ones;
// -writer.only keeps some of them (by index) for minimizing.

var (
	flagWriterSeeds    = flag.Int("writer.seeds", 10, "TestReconcileCutWhileAnotherWriterChanges: seeds")
	flagWriterSeed0    = flag.Int64("writer.seed0", 1, "TestReconcileCutWhileAnotherWriterChanges: the first seed")
	flagWriterSeed     = flag.Int64("writer.seed", 0, "TestReconcileCutWhileAnotherWriterChanges: one seed only")
	flagWriterOps      = flag.Int("writer.ops", 15, "TestReconcileCutWhileAnotherWriterChanges: operations of the sandbox's history")
	flagWriterChanges  = flag.Int("writer.changes", 3, "TestReconcileCutWhileAnotherWriterChanges: at most this many changes of the other writer")
	flagWriterOnly     = flag.String("writer.only", "", "TestReconcileCutWhileAnotherWriterChanges: the writer's planned changes to make, by index (\"0,2\"), for minimizing")
	flagWriterCut      = flag.Int("writer.cut", -1, "TestReconcileCutWhileAnotherWriterChanges: this cut point only")
	flagWriterSleep    = flag.Duration("writer.sleep", 15*time.Millisecond, "TestReconcileCutWhileAnotherWriterChanges: pause between the history and the writer")
	flagWriterSettle   = flag.Duration("writer.settle", 15*time.Millisecond, "TestReconcileCutWhileAnotherWriterChanges: pause between the original's writing and the history")
	flagWriterReuse    = flag.Bool("writer.reuse", false, "TestReconcileCutWhileAnotherWriterChanges: let the writer's new objects take the inode numbers of those it removed (by default it keeps those open until the commit is done: a commit takes an original directory with the same inode number and type for the one the sandbox saw, whatever the journal, and the filesystem's reuse differs between the two runs)")
	flagWriterRecs     = flag.Bool("writer.recs", false, "TestReconcileCutWhileAnotherWriterChanges: log the records a violating cut's commit reads")
	flagWriterParallel = flag.Bool("writer.parallel", false, "TestReconcileCutWhileAnotherWriterChanges: seeds in parallel (-parallel); faster, but other runs' files then take the inode numbers a run's removals free, which a serial run's writer gets back")
	flagWriterRefusals = flag.Bool("writer.refusals", false, "TestReconcileCutWhileAnotherWriterChanges: log each cut refused where the reference went through")
)

// wAction is one change of the other writer, in the original.
type wAction struct {
	Kind     string // edit chmod create mkdir symlink unlink rmr dir2file dir2dir file2file rename
	Path, To string
	Data     string
	Mode     uint32
}

func (a wAction) String() string {
	switch a.Kind {
	case "chmod":
		return fmt.Sprintf("chmod %o %s", a.Mode, a.Path)
	case "rename":
		return fmt.Sprintf("mv %s %s", a.Path, a.To)
	case "symlink":
		return fmt.Sprintf("symlink %s -> %s", a.Path, a.Data)
	case "edit", "create", "dir2file", "file2file", "dir2dir":
		return fmt.Sprintf("%s %s %q", a.Kind, a.Path, a.Data)
	}
	return a.Kind + " " + a.Path
}

// apply makes the change beneath root; an error says it could not be
// made as planned (nothing, or part of it, was done). With hold, every
// object it removes is kept open (its descriptor added to hold) so that
// its inode number is not used again until they are closed (see
// -writer.reuse).
func (a wAction) apply(root string, hold *[]int) error {
	p := filepath.Join(root, a.Path)
	keep := func(p string) {
		if hold == nil {
			return
		}
		_ = filepath.WalkDir(p, func(q string, _ fs.DirEntry, err error) error {
			if err == nil {
				if fd, err := unix.Open(q, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0); err == nil {
					*hold = append(*hold, fd)
				}
			}
			return nil
		})
	}
	switch a.Kind {
	case "unlink", "rmr", "dir2file", "dir2dir", "file2file":
		keep(p)
	case "rename":
		keep(filepath.Join(root, a.To))
	}
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		if a.Kind == "create" || a.Kind == "mkdir" || a.Kind == "symlink" {
			switch a.Kind {
			case "create":
				return os.WriteFile(p, []byte(a.Data), 0o644)
			case "mkdir":
				return os.Mkdir(p, 0o755)
			default:
				return os.Symlink(a.Data, p)
			}
		}
		return err
	}
	typ := st.Mode & unix.S_IFMT
	isDir, isLnk := typ == unix.S_IFDIR, typ == unix.S_IFLNK
	switch a.Kind {
	case "create", "mkdir", "symlink":
		return unix.EEXIST
	case "edit":
		if typ != unix.S_IFREG {
			return unix.EINVAL
		}
		return os.WriteFile(p, []byte(a.Data), 0)
	case "chmod":
		if isLnk {
			return unix.EINVAL
		}
		return os.Chmod(p, fs.FileMode(a.Mode))
	case "unlink":
		if isDir {
			return unix.EISDIR
		}
		return os.Remove(p)
	case "rmr":
		if !isDir || a.Path == "" {
			return unix.ENOTDIR
		}
		return os.RemoveAll(p)
	case "dir2file", "dir2dir":
		if !isDir || a.Path == "" {
			return unix.ENOTDIR
		}
		if err := os.RemoveAll(p); err != nil {
			return err
		}
		if a.Kind == "dir2file" {
			return os.WriteFile(p, []byte(a.Data), 0o644)
		}
		if err := os.Mkdir(p, 0o755); err != nil {
			return err
		}
		if a.Data != "" {
			return os.WriteFile(filepath.Join(p, "n"), []byte(a.Data), 0o644)
		}
		return nil
	case "file2file":
		if isDir {
			return unix.EISDIR
		}
		if err := os.Remove(p); err != nil {
			return err
		}
		return os.WriteFile(p, []byte(a.Data), 0o644)
	case "rename":
		q := filepath.Join(root, a.To)
		if a.To == a.Path || strings.HasPrefix(a.To, a.Path+"/") {
			return unix.EINVAL
		}
		return os.Rename(p, q)
	}
	return fmt.Errorf("unknown change %q", a.Kind)
}

// lowerPaths lists root's paths (sorted) and its directories ("" too).
func lowerPaths(t *testing.T, root string) (all, dirs, files []string) {
	dirs = []string{""}
	require.NoError(t, filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		require.NoError(t, err)
		if p == root {
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		all = append(all, rel)
		switch {
		case d.IsDir():
			dirs = append(dirs, rel)
		case d.Type().IsRegular():
			files = append(files, rel)
		}
		return nil
	}))
	return all, dirs, files
}

// copyTree copies src (files, directories, symlinks, modes) to dst.
func copyTree(t *testing.T, src, dst string) {
	require.NoError(t, filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		require.NoError(t, err)
		rel, _ := filepath.Rel(src, p)
		q := filepath.Join(dst, rel)
		var st unix.Stat_t
		require.NoError(t, unix.Lstat(p, &st))
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			require.NoError(t, os.MkdirAll(q, 0o755))
		case unix.S_IFLNK:
			tg, err := os.Readlink(p)
			require.NoError(t, err)
			require.NoError(t, os.Symlink(tg, q))
			return nil
		default:
			b, err := os.ReadFile(p)
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(q, b, 0o644))
		}
		return os.Chmod(q, fs.FileMode(st.Mode&0o777))
	}))
}

// writerPlan plans the other writer's changes of the original at lower,
// from the seed alone: made on a copy of it, each one picked from the
// copy's tree as the earlier ones left it.
func writerPlan(t *testing.T, lower string, seed int64) []wAction {
	scratch := filepath.Join(t.TempDir(), "plan")
	copyTree(t, lower, scratch)
	rng := rand.New(rand.NewSource(seed*7919 + 17))
	names := []string{"a", "b", "c", "n", "m", "o"}
	var plan []wAction
	n := 1 + rng.Intn(*flagWriterChanges)
	for tries := 0; len(plan) < n && tries < 50; tries++ {
		all, dirs, files := lowerPaths(t, scratch)
		pick := func(xs []string) string {
			if len(xs) == 0 {
				return ""
			}
			return xs[rng.Intn(len(xs))]
		}
		sub := dirs[1:] // no root
		var a wAction
		switch rng.Intn(11) {
		case 0, 1:
			a = wAction{Kind: "edit", Path: pick(files), Data: fmt.Sprint("W", rng.Intn(1000))}
		case 2:
			modes := []uint32{0o700, 0o750, 0o711, 0o600, 0o640}
			p := pick(append(slices.Clone(all), ""))
			a = wAction{Kind: "chmod", Path: p, Mode: modes[rng.Intn(len(modes))]}
		case 3:
			kinds := []string{"create", "create", "mkdir", "symlink"}
			a = wAction{Kind: kinds[rng.Intn(len(kinds))], Path: layers.Join(pick(dirs), pick(names)), Data: fmt.Sprint("N", rng.Intn(1000))}
		case 4:
			a = wAction{Kind: "unlink", Path: pick(files)}
		case 5:
			a = wAction{Kind: "rmr", Path: pick(sub)}
		case 6:
			a = wAction{Kind: "dir2file", Path: pick(sub), Data: fmt.Sprint("D", rng.Intn(1000))}
		case 7:
			data := ""
			if rng.Intn(2) == 0 {
				data = fmt.Sprint("I", rng.Intn(1000))
			}
			a = wAction{Kind: "dir2dir", Path: pick(sub), Data: data}
		case 8:
			a = wAction{Kind: "file2file", Path: pick(files), Data: fmt.Sprint("R", rng.Intn(1000))}
		case 9, 10:
			p := pick(all)
			tn := pick(names)
			if rng.Intn(2) == 0 {
				_, tn = layers.Split(p)
			}
			a = wAction{Kind: "rename", Path: p, To: layers.Join(pick(dirs), tn)}
		}
		if a.Path == "" && a.Kind != "chmod" {
			continue
		}
		if a.apply(scratch, nil) != nil {
			continue
		}
		plan = append(plan, a)
	}
	return plan
}

// writerOnly is -writer.only: the indexes kept, nil for all.
func writerOnly(t *testing.T) map[int]bool {
	if *flagWriterOnly == "" {
		return nil
	}
	keep := map[int]bool{}
	for _, f := range strings.Split(*flagWriterOnly, ",") {
		i, err := strconv.Atoi(strings.TrimSpace(f))
		require.NoError(t, err)
		keep[i] = true
	}
	return keep
}

type writerResult struct {
	hist   []string
	plan   []wAction
	done   []string          // the writer's changes made
	n      int               // records of the whole journal
	before map[string]string // the original as the writer left it
	after  map[string]string // after the commit
	recs   []layers.Record   // what the commit read (-writer.recs)
	jrecs  int               // records left in the journal
	err    error
}

// writerRun builds the seed's history in fresh directories, stops the
// server (cleanly for k < 0; else the journal cut after k records and a
// power cut's mark), has the other writer change the original, and
// commits.
func writerRun(t *testing.T, seed int64, k int) writerResult {
	dir := t.TempDir()
	cfg := layers.Config{Upper: filepath.Join(dir, "upper"), Work: filepath.Join(dir, "work"), Lowers: []string{filepath.Join(dir, "lower")}}
	for _, d := range []string{cfg.Upper, cfg.Work, cfg.Lowers[0]} {
		require.NoError(t, os.MkdirAll(d, 0o755))
	}
	var r writerResult
	var l *layers.Layers
	l, r.hist = layers.RandomHistorySettled(t, cfg, seed, *flagWriterOps, *flagWriterSettle)
	require.NoError(t, l.Close()) // synced, the mark removed
	jp := filepath.Join(cfg.Work, "journal")
	ends := recordEnds(t, jp)
	r.n = len(ends) - 1
	if k >= 0 {
		require.Less(t, k, len(ends))
		require.NoError(t, os.Truncate(jp, ends[k]))
		require.NoError(t, os.WriteFile(jp+".server", []byte("v1 the-boot-before 1 1\n"), 0o600))
	}
	left, err := layers.ReadJournal(jp)
	require.NoError(t, err)
	r.jrecs = len(left)

	time.Sleep(*flagWriterSleep)
	lower := cfg.Lowers[0]
	r.plan = writerPlan(t, lower, seed)
	keep := writerOnly(t)
	var held []int
	hold := &held
	if *flagWriterReuse {
		hold = nil
	}
	defer func() {
		for _, fd := range held {
			unix.Close(fd)
		}
	}()
	for i, a := range r.plan {
		if keep != nil && !keep[i] {
			continue
		}
		if err := a.apply(lower, hold); err == nil {
			r.done = append(r.done, fmt.Sprintf("%d:%s", i, a))
		} else {
			r.done = append(r.done, fmt.Sprintf("%d:(failed: %s: %v)", i, a, err))
		}
	}
	r.before = treeOf(t, lower)
	if *flagWriterRecs {
		r.recs, err = layers.Records(cfg)
		require.NoError(t, err)
	}
	x, err := commit.Prepare(cfg, commit.Options{})
	if err == nil {
		err = commit.Commit(x)
	}
	r.err = err
	r.after = treeOf(t, lower)
	return r
}

func recLines(rs []layers.Record) string {
	var b strings.Builder
	for i, r := range rs {
		fmt.Fprintf(&b, "\n   %d %s %q %q %d", i, r.Op, r.Path, r.Path2, r.Flags)
	}
	return b.String()
}

func TestReconcileCutWhileAnotherWriterChanges(t *testing.T) {
	var seeds []int64
	if *flagWriterSeed != 0 {
		seeds = []int64{*flagWriterSeed}
	} else {
		for i := 0; i < *flagWriterSeeds; i++ {
			seeds = append(seeds, *flagWriterSeed0+int64(i))
		}
	}
	var mu sync.Mutex
	var refRefused, refThrough, cuts, cutRefusedOnly, cutBothRefused, cutSame int
	var throughWhereRefused, otherTree, refusedButChanged []string
	t.Run("seeds", func(t *testing.T) {
		for _, seed := range seeds {
			t.Run(fmt.Sprint(seed), func(t *testing.T) {
				if *flagWriterParallel {
					t.Parallel()
				}
				ref := writerRun(t, seed, -1)
				mu.Lock()
				if ref.err != nil {
					refRefused++
				} else {
					refThrough++
				}
				mu.Unlock()
				if ref.err != nil && len(diffMaps(ref.before, ref.after)) > 0 {
					t.Errorf("seed %d: the reference refused (%v) and changed the original: %q", seed, ref.err, diffMaps(ref.before, ref.after))
				}
				for k := 0; k <= ref.n; k++ {
					if *flagWriterCut >= 0 && k != *flagWriterCut {
						continue
					}
					r := writerRun(t, seed, k)
					require.Equal(t, ref.hist, r.hist, "the history is the seed's")
					require.Equal(t, ref.plan, r.plan, "the writer's plan is the seed's")
					require.Equal(t, ref.before, r.before, "the writer's changes are the seed's")
					head := fmt.Sprintf("seed %d cut %d/%d (records left %d)\n hist %q\n writer %q\n reference: %v",
						seed, k, ref.n, r.jrecs, r.hist, r.done, ref.err)
					if *flagWriterRecs {
						head += "\n records read:" + recLines(r.recs)
					}
					mu.Lock()
					cuts++
					switch {
					case r.err != nil && len(diffMaps(r.before, r.after)) > 0:
						refusedButChanged = append(refusedButChanged, fmt.Sprint(seed, "/", k))
						t.Errorf("REFUSED BUT CHANGED THE ORIGINAL: %s\n cut: %v\n original (as the writer left it -> after): %q", head, r.err, diffMaps(r.before, r.after))
					case ref.err != nil && r.err == nil:
						throughWhereRefused = append(throughWhereRefused, fmt.Sprint(seed, "/", k))
						t.Errorf("CUT WENT THROUGH WHERE THE REFERENCE REFUSED: %s\n what the commit did to the writer's original: %q", head, diffMaps(r.before, r.after))
					case ref.err == nil && r.err == nil && len(diffMaps(ref.after, r.after)) > 0:
						otherTree = append(otherTree, fmt.Sprint(seed, "/", k))
						t.Errorf("CUT GAVE ANOTHER TREE: %s\n reference tree -> cut tree: %q\n the writer's original -> cut tree: %q", head, diffMaps(ref.after, r.after), diffMaps(r.before, r.after))
					case ref.err == nil && r.err != nil:
						cutRefusedOnly++
						if *flagWriterRefusals {
							t.Logf("cut refused where the reference went through: %s\n cut: %v", head, r.err)
						}
					case r.err != nil:
						cutBothRefused++
					default:
						cutSame++
					}
					mu.Unlock()
				}
			})
		}
	})
	t.Logf("seeds %d: reference refused %d, through %d; cuts %d: same tree %d, both refused %d, refused only cut %d; "+
		"VIOLATIONS: through where the reference refused %d %v, another tree %d %v, refused but changed %d %v",
		len(seeds), refRefused, refThrough, cuts, cutSame, cutBothRefused, cutRefusedOnly,
		len(throughWhereRefused), throughWhereRefused, len(otherTree), otherTree, len(refusedButChanged), refusedButChanged)
}
