package layers

import (
	"flag"
	"fmt"
	"io/fs"
	"maps"
	"math/rand"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// Random histories held to the trees they leave: what `sbxfs status`
// lists must name every path where the sandbox's view differs from the
// original, and name nothing that is not so. The same checks as the
// differential tests' checkListing and checkDiffCoverage (tests/
// differential_listing_test.go), without a mount: those found the
// removals one path's change hid (TestChangeSetTwoRemovalsAtOnePath)
// after hours; these histories run thousands a minute.

var (
	flagListingSeeds = flag.Int("listing.seeds", 40, "TestListingMatchesTheTrees: random histories")
	flagListingSeed  = flag.Int64("listing.seed", 0, "TestListingMatchesTheTrees: this seed alone")
	flagListingFirst = flag.Int64("listing.first", 1, "TestListingMatchesTheTrees: the first seed")
	flagListingOps   = flag.Int("listing.ops", 0, "TestListingMatchesTheTrees: operations per history (0: 20 to 200, by seed)")
)

func TestListingMatchesTheTrees(t *testing.T) {
	first, n := *flagListingFirst, int64(*flagListingSeeds)
	if *flagListingSeed != 0 {
		first, n = *flagListingSeed, 1
	}
	dir := t.TempDir()
	var failed []int64
	for seed := first; seed < first+n; seed++ {
		bad, hist := listingRun(t, filepath.Join(dir, fmt.Sprint(seed)), seed, nil)
		if len(bad) == 0 {
			continue
		}
		failed = append(failed, seed)
		if len(failed) <= 5 { // the rest by seed alone
			t.Errorf("seed %d:\n  %s\nhistory:\n  %s", seed, strings.Join(bad, "\n  "), strings.Join(hist, "\n  "))
		}
	}
	if len(failed) > 0 {
		t.Errorf("%d of %d seeds failed (rerun one with -listing.seed): %v", len(failed), n, failed)
	}
}

// listingRun runs the seed's history in dir (or the operations of
// replay, described as the history describes them, on the seed's
// original) and returns what its listing gets wrong, and the history.
func listingRun(t *testing.T, dir string, seed int64, replay []string) (bad, hist []string) {
	cfg := Config{Upper: filepath.Join(dir, "upper"), Work: filepath.Join(dir, "work"), Lowers: []string{filepath.Join(dir, "lower")}}
	defer os.RemoveAll(dir)
	l, hist, rng, ok := ListingHistory(t, cfg, seed, replay)
	defer l.Close()
	if !ok {
		return nil, nil
	}
	s := &stack{Layers: l, t: t, lower: cfg.Lowers[0], c: Caller{Pid: 1}}

	recs, err := s.Journal().Records()
	require.NoError(t, err)
	cs, err := s.changes(recs)
	require.NoError(t, err)
	listing := cs.Listing()
	bad = listingWrong(listing, originalTree(t, cfg.Lowers[0]), viewTree(s))
	for _, d := range hist {
		if strings.HasPrefix(d, "unreported:") {
			// The kernel refuses such an operation before it asks
			// (revOp's checks should have): the history is not one a
			// mount can see.
			bad = append(bad, "an operation failed after its record: "+d)
		}
	}
	// A compaction at any point lists the same (at each, for a replay).
	cuts := []int{rng.Intn(len(recs) + 1)}
	if replay != nil {
		cuts = nil
		for k := range len(recs) + 1 {
			cuts = append(cuts, k)
		}
	}
	for _, k := range cuts {
		cs2, err := s.changes(append(compacted(t, slices.Clip(recs[:k])), recs[k:]...))
		require.NoError(t, err)
		if a, b := listingLines(listing), listingLines(cs2.Listing()); !slices.Equal(a, b) {
			bad = append(bad, fmt.Sprintf("compacted after %d of %d records, the listing is\n    %s\n  not\n    %s", k, len(recs),
				strings.Join(b, "\n    "), strings.Join(a, "\n    ")))
			break
		}
	}
	if len(bad) > 0 {
		bad = append(bad, "listing:\n    "+strings.Join(listingLines(listing), "\n    "))
	}
	return bad, hist
}

// ListingHistory makes the directories of cfg, writes the seed's
// original (revLower, or for an even seed a random one, with some user
// attributes), opens a stack on it and runs the seed's random history
// (or the operations of replay, described as a history describes them).
// ok is false when replay asks what a kernel would refuse before asking
// (an operation failed after its record). rng is the seed's, for more.
// Also for the external package's TestListingHistoriesCommit.
func ListingHistory(t *testing.T, cfg Config, seed int64, replay []string) (l *Layers, hist []string, rng *rand.Rand, ok bool) {
	rng = rand.New(rand.NewSource(seed))
	files := revLower
	if seed%2 == 0 {
		files = randomOriginal(rng)
	}
	for _, d := range []string{cfg.Upper, cfg.Work, cfg.Lowers[0]} {
		require.NoError(t, os.MkdirAll(d, 0o755))
	}
	writeTree(t, cfg.Lowers[0], files)
	for _, p := range slices.Sorted(maps.Keys(files)) {
		if !strings.HasPrefix(files[p], "-> ") && rng.Intn(4) == 0 { // an attribute of the original's, to keep or change (none on a symlink)
			require.NoError(t, unix.Lsetxattr(filepath.Join(cfg.Lowers[0], p), "user.o", []byte("orig"), 0))
		}
	}
	l, err := Open(cfg)
	require.NoError(t, err)
	s := &stack{Layers: l, t: t, lower: cfg.Lowers[0], c: Caller{Pid: 1}}
	if replay == nil {
		return l, listingHistory(s, rng), rng, true
	}
	n := len(listingRecords(s))
	for _, d := range replay {
		done := replayOp(s, d)
		recs := listingRecords(s)
		if !done && len(recs) > n {
			return l, hist, rng, false
		}
		n = len(recs)
		if done {
			hist = append(hist, d)
		}
	}
	return l, hist, rng, true
}

// listingHistory runs a random history on s: revOp's operations, and
// listingOp's.
func listingHistory(s *stack, rng *rand.Rand) (hist []string) {
	ops := *flagListingOps
	if ops == 0 {
		ops = 20 + rng.Intn(181)
	}
	historyMu.Lock() // revOp keeps its renames in revMoves
	defer historyMu.Unlock()
	defer delete(revMoves, s)
	size := func() int64 {
		j := s.Journal()
		j.mu.Lock()
		defer j.mu.Unlock()
		return j.size
	}
	for range ops {
		before := size()
		d := ""
		if r := rng.Intn(20); r < 4 {
			d = listingOp(s, rng, r)
		} else {
			d = revOp(s, rng)
		}
		if d == "" && size() > before {
			// The records past before, read as a journal of their own.
			b, err := os.ReadFile(s.Journal().path)
			require.NoError(s.t, err)
			recs, _, err := DecodeJournal(append(b[:journalHeaderLen:journalHeaderLen], b[before:]...))
			require.NoError(s.t, err)
			d = "unreported:" + strings.ReplaceAll(fmtRecs(recs), "\n", " ")
		}
		if d != "" {
			hist = append(hist, d)
		}
	}
	return hist
}

// listingRecords is s's journal: what an operation that failed left
// in it tells whether it failed before or after its record.
func listingRecords(s *stack) []Record {
	recs, err := s.Journal().Records()
	require.NoError(s.t, err)
	return recs
}

func listingLines(cs []Change) []string {
	var out []string
	for _, c := range cs {
		l := string(c.Kind) + " " + c.Path
		if c.From != "" {
			l += " from " + c.From
		}
		out = append(out, l+" ("+c.Type+")")
	}
	return out
}

// randomOriginal is a small tree of a few names, which the histories'
// names (revOp's) meet: directories up to three deep, files, symlinks.
func randomOriginal(rng *rand.Rand) map[string]string {
	files := map[string]string{}
	names := []string{"a", "b", "c", "n", "x"}
	var fill func(dir string, depth int)
	fill = func(dir string, depth int) {
		for _, n := range names {
			p := n
			if dir != "" {
				p = dir + "/" + n
			}
			switch r := rng.Intn(10); {
			case r < 3 && depth < 3:
				files[p+"/"] = ""
				fill(p, depth+1)
			case r < 5:
				files[p] = "o " + p
			case r < 6:
				files[p] = "-> " + names[rng.Intn(len(names))]
			}
		}
	}
	fill("", 0)
	return files
}

// listingOp runs one operation revOp has not: a user attribute set or
// removed (op 0, 1), a chown (2) or a truncate, a FIFO or a linked
// O_TMPFILE (3). It returns a description or "" when nothing was done.
func listingOp(s *stack, rng *rand.Rand, op int) string {
	var all, dirs []string
	var walk func(p string)
	walk = func(p string) {
		for _, n := range s.names(p) {
			q := Join(p, n)
			all = append(all, q)
			if e, err := s.lookup(q); err == nil && e.IsDir() {
				walk(q)
			}
		}
	}
	walk("")
	dirs = append(dirs, "")
	for _, p := range all {
		if e, err := s.lookup(p); err == nil && e.IsDir() {
			dirs = append(dirs, p)
		}
	}
	if len(all) == 0 {
		return ""
	}
	p := all[rng.Intn(len(all))]
	e, err := s.lookup(p)
	if err != nil {
		return ""
	}
	typ := e.Stat.Mode & unix.S_IFMT
	switch op {
	case 0, 1:
		if typ != unix.S_IFREG && typ != unix.S_IFDIR { // the kernel refuses user.* on the others
			return ""
		}
		name := []string{"user.o", "user.k"}[rng.Intn(2)]
		if op == 1 {
			if s.Removexattr(p, &e.Obj, name, s.c) != nil {
				return ""
			}
			return "removexattr " + p + " " + name
		}
		if s.Setxattr(p, &e.Obj, name, []byte(fmt.Sprint("v", rng.Intn(3))), 0, s.c) != nil {
			return ""
		}
		return "setxattr " + p + " " + name
	case 2:
		uid := uint32(1000 + rng.Intn(2))
		if _, err := s.Setattr(p, &e.Obj, -1, SetAttr{Uid: &uid}, s.c); err != nil {
			return ""
		}
		return fmt.Sprint("chown ", p, " ", uid)
	}
	if r := rng.Intn(3); r == 0 {
		size := uint64(rng.Intn(3))
		if typ != unix.S_IFREG {
			return ""
		}
		if _, err := s.Setattr(p, &e.Obj, -1, SetAttr{Size: &size}, s.c); err != nil {
			return ""
		}
		return fmt.Sprint("truncate ", p, " ", size)
	}
	d := dirs[rng.Intn(len(dirs))]
	n := []string{"a", "b", "c", "n", "m"}[rng.Intn(5)]
	if _, err := s.lookup(Join(d, n)); err == nil {
		return ""
	}
	if rng.Intn(2) == 0 {
		if _, err := s.Mknod(d, s.dir(d), n, unix.S_IFIFO|0o644, 0, s.c); err != nil {
			return ""
		}
		return "mkfifo " + Join(d, n)
	}
	fd, _, err := s.Tmpfile(d, s.dir(d), 0o644, s.c)
	if err != nil {
		return ""
	}
	defer unix.Close(fd)
	unix.Write(fd, []byte("tmp"))
	if _, err := s.LinkFd(fd, d, s.dir(d), n, s.c); err != nil {
		return ""
	}
	return "tmpfile linked at " + Join(d, n)
}

// A tree: path -> "type perm owner content-or-target xattrs" (no perm
// for a symlink, whose bits mean nothing).
type tree map[string]string

func describeObj(st *unix.Stat_t, data string, xattrs []string) string {
	mode := st.Mode
	perm := fmt.Sprintf("%o %d:%d", mode&0o7777, st.Uid, st.Gid)
	if mode&unix.S_IFMT == unix.S_IFLNK {
		perm = fmt.Sprintf("- %d:%d", st.Uid, st.Gid)
	}
	slices.Sort(xattrs)
	return fmt.Sprintf("%s %s %q %s", TypeName(mode), perm, data, strings.Join(xattrs, ","))
}

// originalTree walks root (never through a symlink).
func originalTree(t *testing.T, root string) tree {
	out := tree{}
	require.NoError(t, filepath.WalkDir(root, func(p string, _ fs.DirEntry, err error) error {
		require.NoError(t, err)
		if p == root {
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		var st unix.Stat_t
		require.NoError(t, unix.Lstat(p, &st))
		data := ""
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			b, err := os.ReadFile(p)
			require.NoError(t, err)
			data = string(b)
		case unix.S_IFLNK:
			data, err = os.Readlink(p)
			require.NoError(t, err)
		}
		var xattrs []string
		buf := make([]byte, 1024)
		n, _ := unix.Llistxattr(p, buf)
		for _, name := range strings.Split(string(buf[:n]), "\x00") {
			if strings.HasPrefix(name, "user.") {
				v := make([]byte, 256)
				m, err := unix.Lgetxattr(p, name, v)
				require.NoError(t, err)
				xattrs = append(xattrs, name+"="+string(v[:m]))
			}
		}
		out[rel] = describeObj(&st, data, xattrs)
		return nil
	}))
	return out
}

// viewTree walks the sandbox's view through the layers, as a walk of the
// mount would.
func viewTree(s *stack) tree {
	out := tree{}
	var walk func(p string)
	walk = func(p string) {
		for _, n := range s.names(p) {
			q := Join(p, n)
			e, err := s.lookup(q)
			require.NoError(s.t, err, q)
			data := ""
			switch e.Stat.Mode & unix.S_IFMT {
			case unix.S_IFREG:
				data = s.readObj(q, e.Obj)
			case unix.S_IFLNK:
				data, err = s.Readlink(q, e.Obj)
				require.NoError(s.t, err)
			case unix.S_IFDIR:
				walk(q)
			}
			names, err := s.Listxattr(q, e.Obj)
			require.NoError(s.t, err)
			var xattrs []string
			for _, name := range names {
				if strings.HasPrefix(name, "user.") {
					v := make([]byte, 256)
					m, err := s.Getxattr(q, e.Obj, name, v)
					require.NoError(s.t, err)
					xattrs = append(xattrs, name+"="+string(v[:m]))
				}
			}
			out[q] = describeObj(&e.Stat, data, xattrs)
		}
	}
	walk("")
	return out
}

// listingWrong holds a listing to the original and the view, as
// checkListing and checkDiffCoverage hold status: every path where the
// two differ is named (coverage), and what is named is so (precision).
func listingWrong(listing []Change, orig, view tree) []string {
	var bad []string
	named := map[string]bool{}    // Path and From of every entry
	standing := map[string]bool{} // Path of every entry but a removal
	var renamedDirs, renamedTo []string
	for _, c := range listing {
		named[c.Path] = true
		if c.Kind != Deleted {
			if standing[c.Path] {
				bad = append(bad, fmt.Sprintf("%s %q: a second entry other than a removal", c.Kind, c.Path))
			}
			standing[c.Path] = true
		}
		if c.From != "" {
			named[c.From] = true
			if c.Type == "dir" {
				renamedDirs = append(renamedDirs, c.From, c.Path)
			}
		}
		if c.Kind == Renamed {
			renamedTo = append(renamedTo, c.Path)
		}
	}
	beneath := func(p string, dirs []string) bool {
		return slices.ContainsFunc(dirs, func(q string) bool { return q == "" || strings.HasPrefix(p, q+"/") })
	}
	// status (commit.StatusListing) adds the original's files beneath a
	// listed directory the view has no directory at: it reads them there.
	goneWithDir := func(p string) bool {
		for d, _ := Split(p); d != ""; d, _ = Split(d) {
			if named[d] && strings.HasPrefix(orig[d], "dir ") && !strings.HasPrefix(view[d], "dir ") {
				return true
			}
		}
		return false
	}

	// Coverage: the status form, where a rename names all beneath it.
	check := func(p string) {
		o, inOrig := orig[p]
		v, inView := view[p]
		if inOrig && inView && o == v || named[p] || beneath(p, renamedDirs) || !inView && goneWithDir(p) {
			return
		}
		bad = append(bad, fmt.Sprintf("%q named by no entry: original %s, view %s", p, orNone(o, inOrig), orNone(v, inView)))
	}
	for p := range orig {
		check(p)
	}
	for p := range view {
		if _, ok := orig[p]; !ok {
			check(p)
		}
	}

	// Precision.
	removed := map[string]bool{}
	for _, c := range listing {
		_, inOrig := orig[c.Path]
		_, inView := view[c.Path]
		switch c.Kind {
		case Deleted:
			switch {
			case removed[c.Path]:
				bad = append(bad, fmt.Sprintf("D %q: listed twice", c.Path))
			case !inOrig:
				bad = append(bad, fmt.Sprintf("D %q: the original has no such path", c.Path))
			case inView && !standing[c.Path] && !beneath(c.Path, renamedTo):
				bad = append(bad, fmt.Sprintf("D %q: the view still has it, and no entry says what is there now", c.Path))
			}
			removed[c.Path] = true
		case Renamed:
			if _, ok := orig[c.From]; !ok || !inView {
				bad = append(bad, fmt.Sprintf("R %q -> %q: the original has no such source, or the view no such target", c.From, c.Path))
			}
		default:
			if !inView {
				bad = append(bad, fmt.Sprintf("%s %q: the view has no such path", c.Kind, c.Path))
			}
		}
	}
	slices.Sort(bad)
	return bad
}

func orNone(s string, ok bool) string {
	if !ok {
		return "none"
	}
	return s
}

// The flags, for the external test package's TestListingHistoriesCommit.
var (
	FlagListingSeeds  = flagListingSeeds
	FlagListingSeed   = flagListingSeed
	FlagListingFirst  = flagListingFirst
	FlagListingReplay = flagListingMinimize
)
