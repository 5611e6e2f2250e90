package layers

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/fsutil"
)

// ChangeKind is the final state of a touched path.
type ChangeKind string

// The kinds of change.
const (
	Created  ChangeKind = "created"
	Modified ChangeKind = "modified"
	Metadata ChangeKind = "metadata" // mode, owner, times or xattrs only
	Deleted  ChangeKind = "deleted"
	Renamed  ChangeKind = "renamed" // From is the original path
	Linked   ChangeKind = "linked"  // a new hard link; From is another name of the file
)

// Change is one path of a change set.
type Change struct {
	Path string     `json:"path"`
	Kind ChangeKind `json:"kind"`
	From string     `json:"from,omitempty"`
	Type string     `json:"type"`
	// Original, for a removal, is the original path of the object the
	// sandbox removed when that is not Path: the object, or a directory
	// above it, was moved before it was removed (mv d e; rm -r e). The
	// change set names a removal by the object's last path, as the
	// commit's planner works in final paths; Listing shows it here.
	Original string `json:"original,omitempty"`
	// Replaced, for a removal with an Original, is the original path of
	// the original's object that was in Path's place before the removed
	// object was moved there, which went with it (mv y x; rm x removes
	// y's object and x's: Original y, Replaced x). Listing shows both.
	Replaced string `json:"replaced,omitempty"`
}

// ChangeSet is every path a sandbox changed, sorted by path.
type ChangeSet struct {
	Changes []Change `json:"changes"`
	// Dropped are removals for Listing alone, named by original paths:
	// an original object the sandbox moved, then removed where a new
	// object stands now (mv a/b m; rm -r m; mkdir m). Changes has no path
	// for them (m is the new object's), and the commit needs none: the
	// original's object at its own path is replaced by what stands there
	// now, or removed by the change of that path. Also the original
	// objects removed at a path before another removal there (rm -rf
	// f01; mv empty f01; rm f01/f01: f01/f01 is empty/f01's removal),
	// which the commit removes with the directory replaced above them.
	Dropped []Change `json:"dropped,omitempty"`
	// bases are the journal's base signatures the change set was read
	// with (Bases).
	bases map[string]Signature
}

// Bases returns the first base signature the journal records of every
// original path (as the function Bases gives), read with the change set,
// so that a caller needs no second read of the journal (which may have
// grown since, while the mount is live). Nil for a change set not read
// from a journal. The map is the change set's: do not change it.
func (cs *ChangeSet) Bases() map[string]Signature { return cs.bases }

// Changes computes the change set of a sandbox from its journal and the
// state of exactly the paths the journal names, without a mount and without
// walking either tree (but once after an unclean stop: Records).
func Changes(cfg Config) (ChangeSet, error) {
	l, err := newLayers(cfg)
	if err != nil {
		return ChangeSet{}, err
	}
	defer l.closeLowerRoots()
	recs, err := l.readRecords()
	if err != nil {
		return ChangeSet{}, err
	}
	return l.changes(recs)
}

// Changes computes the change set of this stack (see the function Changes).
func (l *Layers) Changes() (ChangeSet, error) {
	recs, err := l.Journal().Records()
	if err != nil {
		return ChangeSet{}, err
	}
	return l.changes(recs)
}

// touched replays the journal's namespace operations: which paths were
// touched (under their final names), what each was renamed from, what it
// was linked to, and whether its content (not only metadata) changed.
type touched struct {
	paths map[string]bool // path -> content op seen
	times map[string]bool // path -> times set explicitly (utimensat)
	from  map[string]string
	link  map[string]string
	// made holds the paths whose object the sandbox made (created,
	// linked as a new name): moved, such an object has no original
	// counterpart (from gets madeHere), whatever original its old path
	// would map to through its directory.
	made map[string]bool
	// linkRev inverts link (the other name -> the names linked to it),
	// and index holds every path of the maps above, so that a rename
	// finds what it moves without a scan of them all.
	linkRev map[string]map[string]bool
	index   pathIndex
	// seen holds the signature of the object the sandbox saw at an
	// original path before it changed it (the journal's base records,
	// the first one of a path). Keyed by original path, so renames never
	// move it. The change set hands it on (ChangeSet.Bases).
	seen map[string]Signature
	// movedFrom is from inverted once the journal is replayed: the
	// paths something was moved to from an original path (movedAway).
	movedFrom map[string][]string
	dirs      dirCache
	// linked holds the paths classify found an upper non-directory at
	// with more than one link, in order: the names linkGroups groups
	// (every other path has one name, and is not looked at again).
	linked []string
	// dropped collects ChangeSet.Dropped (noteDropped).
	dropped []Change
	// fresh holds the paths whose object the sandbox made where the
	// replay had nothing: no record had named the path, nor linked to
	// it, or it was dead. dead holds those whose fresh object went again
	// (removed, or moved away): per the journal the path holds nothing
	// and never held anything of the original's, as if it had never been
	// touched (git's index.lock, made and renamed over the index again
	// and again, stays fresh).
	// A compaction drops a dead path once the upper confirms it
	// (dropDead): git's temporary object files, an editor's save file.
	fresh, dead map[string]bool
	// removedHere holds the paths where the sandbox removed the
	// original's object of that same path, and removedAs, by path, the
	// original paths of other original objects it removed there (moved
	// there, or beneath a directory renamed since): the lineage each
	// removal had when it was made. A later rename into a directory
	// above changes a path's lineage, and the path's change names the
	// last object removed there alone: rm -rf f01; mv empty f01; rm
	// f01/f01 removes the original's f01/f01 and empty/f01 at one path.
	// The listing names the others (earlierRemovals).
	removedHere map[string]bool
	removedAs   map[string][]string
	// earlier collects the removals earlierRemovals finds.
	earlier []Change
}

func replay(recs []Record) *touched {
	t := newTouched()
	for _, r := range recs {
		t.apply(&r)
	}
	return t
}

func newTouched() *touched {
	return &touched{paths: map[string]bool{}, times: map[string]bool{}, from: map[string]string{}, link: map[string]string{},
		made: map[string]bool{}, linkRev: map[string]map[string]bool{}, index: newPathIndex(), seen: map[string]Signature{}, dirs: dirCache{},
		fresh: map[string]bool{}, dead: map[string]bool{}, removedHere: map[string]bool{}, removedAs: map[string][]string{}}
}

// apply replays one record.
func (t *touched) apply(r *Record) {
	switch r.Op {
	case OpBase: // names an original path, not a change
		if _, ok := t.seen[r.Path]; !ok {
			if sig, err := ParseSignature(r.Path2); err == nil {
				t.seen[r.Path] = sig
			}
		}
	case OpRename:
		if r.Flags&unix.RENAME_EXCHANGE != 0 {
			t.exchange(r.Path, r.Path2)
			return
		}
		ontoNothing := r.Flags&unix.RENAME_NOREPLACE != 0
		if !ontoNothing {
			// The object the rename replaces is removed here, as by an
			// unlink: its lineage now, which a later rename above may
			// change before the change set is read (replacedInPlace
			// would then look in the wrong place), or a rename of its
			// own had already moved away from its original path (mv
			// a/x a/a; mv f a/a).
			t.noteRemoval(r.Path2)
		}
		t.move(r.Path, r.Path2, ontoNothing)
	case OpSetattr, OpSetxattr, OpRemovexattr:
		t.touch(r.Path, t.paths[r.Path])
		if r.Op == OpSetattr && r.Flags&AttrTimes != 0 {
			t.times[r.Path] = true
		}
	case OpLink:
		// Both names now share one inode, and the journal records a
		// later write under whichever name the file was opened by.
		fresh := t.unnamed(r.Path) || t.dead[r.Path]
		t.touch(r.Path, true)
		t.touch(r.Path2, true)
		t.setLink(r.Path, r.Path2)
		t.madeAt(r.Path)
		t.setFresh(r.Path, fresh)
	case OpCreate, OpMkdir, OpMknod, OpSymlink:
		fresh := t.unnamed(r.Path) || t.dead[r.Path]
		t.touch(r.Path, true)
		t.madeAt(r.Path)
		t.setFresh(r.Path, fresh)
	case OpUnlink, OpRmdir:
		t.noteRemoval(r.Path)
		fresh := t.fresh[r.Path]
		t.touch(r.Path, true)
		delete(t.made, r.Path)
		delete(t.fresh, r.Path)
		if fresh {
			t.dead[r.Path] = true
		}
	case OpKeep, OpKeepLink:
		t.restore(r)
	default:
		t.touch(r.Path, true)
	}
}

// noteRemoval records the lineage of the object removed at p
// (removedHere, removedAs), unless the sandbox made it.
func (t *touched) noteRemoval(p string) {
	switch q := t.counterpartHere(p); {
	case madeLineage(q):
	case q == p:
		t.removedHere[p] = true
	case !slices.Contains(t.removedAs[p], q):
		t.removedAs[p] = append(t.removedAs[p], q)
	}
}

// moveRemovals moves the removals recorded at p to np, where a rename
// took what p was in: the original path of a removal at p's own path is
// p.
func (t *touched) moveRemovals(p, np string) {
	qs := t.removedAs[p]
	if t.removedHere[p] {
		qs = append([]string{p}, qs...)
	}
	delete(t.removedHere, p)
	delete(t.removedAs, p)
	for _, q := range qs {
		if q == np {
			t.removedHere[np] = true
		} else if !slices.Contains(t.removedAs[np], q) {
			t.removedAs[np] = append(t.removedAs[np], q)
		}
	}
}

// touch records p as touched (content: a content op seen there).
func (t *touched) touch(p string, content bool) {
	t.paths[p] = content
	t.index.add(p)
	delete(t.dead, p) // something is there again
}

// unnamed reports whether no record so far named p: not touched, not
// linked from or to. (A path beneath p is never touched while p is not:
// whatever a record does beneath p touches p when p goes.)
func (t *touched) unnamed(p string) bool {
	_, touched := t.paths[p]
	_, linked := t.link[p]
	return !touched && !linked && len(t.linkRev[p]) == 0
}

func (t *touched) setFresh(p string, fresh bool) {
	if fresh {
		t.fresh[p] = true
	} else {
		delete(t.fresh, p)
	}
}

// madeAt records that the sandbox made a new object at p. Its rename
// lineage (from) stays: what was removed beneath p before it was made is
// found through it. counterpartHere tells the new object has none.
func (t *touched) madeAt(p string) {
	t.made[p] = true
}

// setLink records that the name k was linked to the object at v.
func (t *touched) setLink(k, v string) {
	if was, ok := t.link[k]; ok {
		delete(t.linkRev[was], k)
	}
	t.link[k] = v
	if t.linkRev[v] == nil {
		t.linkRev[v] = map[string]bool{}
	}
	t.linkRev[v][k] = true
	t.index.add(k)
	t.index.add(v)
}

// move renames old to new in every record kept so far, subtree included:
// the keys of every map, and the other name of a link. ontoNothing tells
// that nothing was at new (the record's RENAME_NOREPLACE).
func (t *touched) move(old, new string, ontoNothing bool) {
	origFrom := t.counterpart(old)
	if t.made[old] {
		origFrom = madeHere
	}
	fresh := t.fresh[old]
	// An object the sandbox made, moved where nothing was and no record
	// named the path (or where it was dead), makes that path fresh as a
	// create there would: a package manager's directories filled aside
	// and moved into place, a build's output renamed from its temporary
	// name. Moved over a fresh path's object (an editor saving a new
	// file again), the path still never held the original's.
	freshNew := t.made[old] && (t.fresh[new] || ontoNothing && (t.unnamed(new) || t.dead[new]))
	delete(t.made, new) // what the rename replaces there is gone
	for _, p := range t.index.take(old) {
		np := new + p[len(old):]
		// Beneath the moved object each flag moves to a path no record
		// named (or a dead one), as a create there would make it fresh:
		// elsewhere what is beneath a moved directory meets what the
		// target held before.
		carry := p != old && (t.unnamed(np) || t.dead[np])
		wasFresh, wasDead := carry && t.fresh[p], carry && t.dead[p]
		delete(t.fresh, p)
		delete(t.dead, p)
		delete(t.fresh, np)
		delete(t.dead, np)
		if wasFresh {
			t.fresh[np] = true
		}
		if wasDead {
			t.dead[np] = true
		}
		if v, ok := t.from[p]; ok {
			delete(t.from, p)
			t.from[np] = v
		}
		// A link moved over its own other name (gone since: a rename
		// between two names of one inode never reaches the filesystem)
		// is no link any more: one name is left.
		if v, ok := t.link[p]; ok {
			delete(t.linkRev[v], p)
			delete(t.link, p)
			if v != np {
				t.setLink(np, v)
			}
		}
		for k := range t.linkRev[p] {
			if k == np {
				delete(t.link, k)
				continue
			}
			t.setLink(k, np)
		}
		delete(t.linkRev, p)
		for _, m := range []map[string]bool{t.paths, t.times, t.made} {
			if v, ok := m[p]; ok {
				delete(m, p)
				m[np] = v
			}
		}
		if p != old {
			// Removals at old itself were of earlier objects there: they
			// stay with the place.
			t.moveRemovals(p, np)
		}
		t.index.add(np)
	}
	t.touch(old, true)
	t.touch(new, true)
	t.from[new] = origFrom
	t.setFresh(new, freshNew)
	if fresh {
		t.dead[old] = true // the object the sandbox made there went
	}
}

// madeHere is the counterpart of an object the sandbox made, once moved
// (and, below it, of what it holds): no original path, never found in
// the original.
const madeHere = "\x00made"

func (t *touched) exchange(a, b string) {
	tmp := "\x00exchange"
	t.move(a, tmp, false)
	t.move(b, a, false)
	t.move(tmp, b, false)
	delete(t.paths, tmp)
}

// changingRetries are the pauses before reading the change set again
// when the original changed while it was read (a directory swapped for a
// moment, as a checkout or a tool replacing a directory does): most such
// changes are over within them. After the last, ErrOriginalChanging.
var changingRetries = []time.Duration{5 * time.Millisecond, 50 * time.Millisecond, 250 * time.Millisecond}

// Test hooks: testHookRead runs before each read of the change set,
// testHookResolved between the overlay lookup of a path and the lookup of
// its original.
var (
	testHookRead     func()
	testHookResolved func(p string)
)

func (l *Layers) changes(recs []Record) (ChangeSet, error) {
	for attempt := 0; ; attempt++ {
		if testHookRead != nil {
			testHookRead()
		}
		cs, err := l.changesOnce(recs)
		if !errors.Is(err, ErrOriginalChanging) || attempt == len(changingRetries) {
			return cs, err
		}
		time.Sleep(changingRetries[attempt])
	}
}

func (l *Layers) changesOnce(recs []Record) (ChangeSet, error) {
	if err := checkPaths(recs); err != nil {
		return ChangeSet{}, err
	}
	t := replay(recs)
	if !l.testKeepDead {
		t.dropDead(l.goneFromUpper) // as a compaction would (compact.go)
	}
	keys := make([]string, 0, len(t.paths))
	for p := range t.paths {
		if !strings.Contains(p, "\x00") {
			keys = append(keys, p)
		}
	}
	slices.Sort(keys)
	var cs ChangeSet
	parts, err := l.classifyAll(keys, t)
	if err != nil {
		return cs, err
	}
	cs.Changes = parts[0].changes
	for _, w := range parts[1:] {
		cs.Changes = append(cs.Changes, w.changes...)
		t.linked = append(t.linked, w.t.linked...)
		t.dropped = append(t.dropped, w.t.dropped...)
		t.earlier = append(t.earlier, w.t.earlier...)
		for p, e := range w.t.dirs {
			t.dirs[p] = e
		}
	}
	// A link's other name must be something a commit can install: a path
	// of the change set, or one the original has (its parents exist).
	listed := map[string]bool{}
	for _, c := range cs.Changes {
		listed[c.Path] = true
	}
	for i, c := range cs.Changes {
		if c.Kind != Linked || listed[c.From] {
			continue
		}
		if _, inLo, err := l.lowerInPlace(t.dirs, c.From); err != nil || !inLo {
			cs.Changes[i].Kind, cs.Changes[i].From = Created, ""
		}
	}
	l.linkGroups(&cs, t.linked, t.dirs)
	for _, w := range parts {
		// Each worker's own: two may have looked a directory up at
		// different moments.
		if err := l.checkDirs(w.t.dirs); err != nil {
			return cs, err
		}
	}
	cs.bases = t.seen
	// A rename's source is gone by the rename itself.
	renamedFrom := map[string]bool{}
	for _, c := range cs.Changes {
		if c.Kind == Renamed {
			renamedFrom[c.From] = true
		}
	}
	cs.Changes = slices.DeleteFunc(cs.Changes, func(c Change) bool {
		return c.Kind == Deleted && renamedFrom[t.counterpart(c.Path)]
	})
	// An earlier removal at a path where an object stands now is that
	// object's change (rm -r d; mkdir d lists A d).
	standing := map[string]bool{}
	for _, c := range cs.Changes {
		if c.Kind != Deleted {
			standing[c.Path] = true
		}
	}
	for _, c := range t.earlier {
		if !standing[c.Path] {
			t.dropped = append(t.dropped, c)
		}
	}
	if len(t.dropped) > 0 {
		slices.SortFunc(t.dropped, func(a, b Change) int { return strings.Compare(a.Path, b.Path) })
		cs.Dropped = slices.CompactFunc(t.dropped, func(a, b Change) bool { return a.Path == b.Path })
	}
	return cs, nil
}

// classifyWorkers bounds the goroutines that classify a change set's
// paths (8, and GOMAXPROCS), and classifyPerWorker is the fewest paths
// worth one: a path costs ~7 us (two or three system calls), a goroutine
// and its own directory cache far less. (The package's tests classify
// on four, a path each: TestMain.)
var (
	classifyWorkers   = min(8, runtime.GOMAXPROCS(0))
	classifyPerWorker = 1024
)

// classified is what one worker of classifyAll found: its paths' changes,
// in order, and t as it left it (its own dirs, linked, dropped).
type classified struct {
	changes []Change
	t       *touched
}

// classifyAll classifies keys (sorted) in contiguous runs, each on a
// goroutine of its own with its own directory cache (the paths of a run
// share their directories); every other map of t is only read. The
// first run's classified.t is t itself. An error is the first run's that
// had one.
func (l *Layers) classifyAll(keys []string, t *touched) ([]classified, error) {
	t.movedFrom = map[string][]string{} // movedAway's, read by all
	for q, from := range t.from {
		if q != from && !strings.Contains(q, "\x00") {
			t.movedFrom[from] = append(t.movedFrom[from], q)
		}
	}
	n := max(1, min(classifyWorkers, len(keys)/classifyPerWorker))
	parts := make([]classified, n)
	errs := make([]error, n)
	for w := range parts {
		parts[w].t = t
		if w > 0 {
			c := *t // before any worker writes t
			c.dirs, c.linked, c.dropped, c.earlier = dirCache{}, nil, nil, nil
			parts[w].t = &c
		}
	}
	var wg sync.WaitGroup
	for w := range n {
		wt := parts[w].t
		run := keys[w*len(keys)/n : (w+1)*len(keys)/n]
		wg.Go(func() {
			for _, p := range run {
				c, ok, err := l.classify(p, wt)
				if err != nil {
					errs[w] = err
					return
				}
				if ok {
					parts[w].changes = append(parts[w].changes, c)
				}
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return parts, nil
}

// linkGroups makes the names of one upper inode one inode in the original
// (keys: the paths to look at, sorted):
// the journal names a link's source by whichever name the kernel used,
// which may be gone since, so names are grouped by the upper inode they
// share. One name is the anchor: an unchanged original name (the commit
// replaces it by the shared object), else a name the commit installs;
// every other new name is Linked to it, and a metadata-only name is
// replaced too (Modified), since its inode changes.
func (l *Layers) linkGroups(cs *ChangeSet, keys []string, dirs dirCache) {
	groups := map[[2]uint64][]string{}
	types := map[[2]uint64]string{}
	for _, p := range keys {
		var st unix.Stat_t
		if l.upperLstat(p, &st) != nil || st.Mode&unix.S_IFMT == unix.S_IFDIR || st.Nlink < 2 || fsutil.IsWhiteout(&st) {
			continue
		}
		k := [2]uint64{st.Dev, st.Ino}
		groups[k] = append(groups[k], p)
		types[k] = TypeName(st.Mode)
	}
	idx := map[string]int{}
	for i, c := range cs.Changes {
		idx[c.Path] = i
	}
	var added []Change
	for k, names := range groups {
		if len(names) < 2 {
			continue
		}
		anchor := ""
		for _, q := range names {
			if _, listed := idx[q]; !listed {
				if _, ok, err := l.lowerInPlace(dirs, q); err == nil && ok {
					anchor = q
					break
				}
			}
		}
		if anchor == "" {
			for _, q := range names {
				if i, ok := idx[q]; ok && cs.Changes[i].Kind != Linked {
					anchor = q
					break
				}
			}
		}
		if anchor == "" {
			continue
		}
		replaced := false
		for _, q := range names {
			i, ok := idx[q]
			if !ok {
				continue
			}
			switch c := &cs.Changes[i]; {
			case c.Kind == Metadata:
				c.Kind = Modified
			case q != anchor && (c.Kind == Created || c.Kind == Linked):
				c.Kind, c.From = Linked, anchor
			}
			replaced = replaced || (q != anchor && cs.Changes[i].Kind == Modified)
		}
		// A Modified name gets the shared object, so an unlisted anchor
		// must too, or it keeps the original's inode and the names part
		// (the commit replaces the From of a Linked name likewise).
		if _, listed := idx[anchor]; !listed && replaced {
			added = append(added, Change{Path: anchor, Kind: Modified, Type: types[k]})
		}
	}
	if len(added) > 0 {
		cs.Changes = append(cs.Changes, added...)
		slices.SortFunc(cs.Changes, func(a, b Change) int { return strings.Compare(a.Path, b.Path) })
	}
}

// ErrOriginalChanging: the original changed while the change set was
// read, again at every retry (changingRetries); reading it again once the
// original is still gives a true one.
var ErrOriginalChanging = errors.New("the original kept changing while the change set was read; try again once it is still")

// checkPaths refuses a journal whose records name paths that are not
// clean and relative (a damaged or forged journal): the change set must
// never lead outside the sandbox.
func checkPaths(recs []Record) error {
	for i, r := range recs {
		paths := []string{r.Path}
		if r.Op == OpRename || r.Op == OpLink || r.Op == OpKeepLink || r.Op == OpKeep && r.Flags&keepFrom != 0 {
			paths = append(paths, r.Path2)
		}
		for _, p := range paths {
			if c, err := fsutil.CleanRel(p); err != nil || c != p {
				return fmt.Errorf("%w: record %d (%v) names the path %q, which is not clean and relative; rollback to discard the sandbox", ErrJournalDamaged, i, r.Op, p)
			}
		}
	}
	return nil
}

// counterpart is the original path of what sits at p now: p itself, or
// p translated through the nearest renamed ancestor (or p's own rename).
func (t *touched) counterpart(p string) string { return Counterpart(t.from, p) }

// counterpartHere is counterpart for a path the overlay has now: madeHere
// for an object the sandbox made, or one beneath a directory it made
// (nearer than any rename), which has no original counterpart, whatever
// lineage an earlier object at that path left: mv d d2; rm -r d2; mkdir
// -p d2/sub, and rm -r d/c; mkdir d/c; mv d e (e/c/x is not the
// original's d/c/x). Only for a path there now: the made flags are of the
// objects at those paths now, and a removed path may have lain in
// another object that had one's name (its lineage is from's).
func (t *touched) counterpartHere(p string) string {
	for q := p; ; {
		if t.made[q] {
			return madeHere + p[len(q):]
		}
		if from, ok := t.from[q]; ok {
			return from + p[len(q):]
		}
		i := strings.LastIndexByte(q, '/')
		if i < 0 {
			return p
		}
		q = q[:i]
	}
}

// Counterpart translates p through renamed (a path -> the original path
// it was renamed from): p's own rename, else its nearest renamed
// ancestor's, else p itself.
func Counterpart(renamed map[string]string, p string) string {
	for q := p; ; {
		if from, ok := renamed[q]; ok {
			return from + p[len(q):]
		}
		i := strings.LastIndexByte(q, '/')
		if i < 0 {
			return p
		}
		q = q[:i]
	}
}

// replacedInPlace returns the original path of the object the original
// has in p's place, where the sandbox removed an object it had moved to
// p (original, its original path): what the original had there, if
// anything, is gone too. "" when there is nothing, or it is that object.
// (Where the directory p is in is gone as well, its place is found
// through that directory's lineage.)
func (l *Layers) replacedInPlace(p, original string, t *touched) (string, error) {
	in, ok, err := l.lowerInPlace(t.dirs, p)
	if err == nil && !ok {
		dir, name := Split(p)
		in, ok, err = l.resolveLower(Join(t.counterpart(dir), name))
	}
	if err != nil || !ok || in.origin.Path == original {
		return "", err
	}
	return in.origin.Path, nil
}

// classify compares the final overlay state of p with the original's,
// and notes the removals at p its change does not name (earlierRemovals).
func (l *Layers) classify(p string, t *touched) (Change, bool, error) {
	c, ok, err := l.classifyPath(p, t)
	if err == nil && (t.removedHere[p] || len(t.removedAs[p]) > 0) {
		err = l.earlierRemovals(p, c, ok, t)
	}
	return c, ok, err
}

// earlierRemovals records in t.earlier the removals at p of original
// objects other than the one p's change c names (ok: there is one): the
// original objects of p's earlier lineages (removedHere, removedAs) the
// original still has and the overlay no longer shows. (A removal is
// recorded before it is made, and may fail: rm of an immutable file is
// refused after its record.) Where p holds an object now, the removal of
// the original's object at p itself is that object's change, as when a
// rename replaced it (rm a; mv b a lists R b -> a).
func (l *Layers) earlierRemovals(p string, c Change, ok bool, t *touched) error {
	qs := t.removedAs[p]
	if t.removedHere[p] {
		qs = append([]string{p}, qs...)
	}
	for _, q := range qs {
		if ok && (c.Kind != Deleted && q == p || c.Kind == Deleted && (q == cmp.Or(c.Original, c.Path) || q == c.Replaced)) {
			continue
		}
		if err := l.listRemoval(q, t); err != nil {
			return err
		}
	}
	return nil
}

// listRemoval records in t.earlier the removal of the original object
// at q, for the listing alone, where the original has q and the view
// shows it nowhere. Where the view shows an object at q, the change of
// q says what is there, and so does its absence: the object compares
// equal to the original's (rm f; ln g f, or cp -p g f, f and g alike),
// which the commit keeps. Where it shows the original object elsewhere,
// the removal failed (showsOriginal).
func (l *Layers) listRemoval(q string, t *touched) error {
	if madeLineage(q) {
		return nil
	}
	lo, inLo, err := l.resolveLower(q)
	if err != nil || !inLo {
		return err
	}
	_, inOv, err := l.resolveIn(t.dirs, q)
	if err != nil {
		return err
	}
	if !inOv {
		if inOv, err = l.showsOriginal(q, t); err != nil {
			return err
		}
	}
	if !inOv {
		t.earlier = append(t.earlier, Change{Path: q, Kind: Deleted, Type: TypeName(lo.st.Mode), Original: q})
	}
	return nil
}

// showsOriginal reports whether the overlay shows the original object at
// x where a rename of x or of a directory above it took it (listRemoval
// looked at x itself).
func (l *Layers) showsOriginal(x string, t *touched) (bool, error) {
	var at []string
	for a := x; ; {
		for _, m := range t.movedFrom[a] {
			at = append(at, m+x[len(a):])
		}
		i := strings.LastIndexByte(a, '/')
		if i < 0 {
			break
		}
		a = a[:i]
	}
	for _, q := range at {
		ov, ok, err := l.resolveIn(t.dirs, q)
		if err != nil {
			return false, err
		}
		if ok && l.cameFrom(&ov, x) {
			return true, nil
		}
	}
	return false, nil
}

// classifyPath is classify but for the earlier removals.
func (l *Layers) classifyPath(p string, t *touched) (Change, bool, error) {
	if p == "" {
		return l.classifyRoot(t.times[""])
	}
	ov, inOv, err := l.resolveIn(t.dirs, p)
	if err != nil {
		return Change{}, false, err
	}
	if inOv && ov.Upper && !ov.IsDir() && ov.Stat.Nlink > 1 {
		t.linked = append(t.linked, p)
	}
	if testHookResolved != nil {
		testHookResolved(p)
	}
	if !inOv && t.dead[p] && l.goneFromUpper([]string{p})[0] {
		// What was removed at p was an object the sandbox made there
		// (fresh), not the original's object its lineage leads to:
		// mv a/b h; mkdir -p a/b/c; mv a e; mv h/x e/b/c/y; rm -r e
		// removes the new e/b/c, not the original's a/b/c (now at h/c).
		// Until 2026-11-28 it was named a removal of a/b/c: the commit
		// refused, a false conflict (its entries "not in the sandbox's
		// view"; found by scripts/fuzz-differential.sh, seed
		// 851176547). A whiteout
		// there (the original gained an object at p since) is a
		// removal of that object, classified below.
		return Change{Path: p}, false, nil
	}
	if !inOv && ov.Stat.Mode != 0 && !ov.IsDir() {
		// A non-directory stands above p (resolveIn returns it): p's
		// records are of objects removed beneath a directory that
		// stood there, carried along by a move of the object there now
		// (rm -r b; mv x b; mv b x takes b's records to x). Their
		// removal goes with that directory's, a change of its own; no
		// commit reaches a path beneath a non-directory (it refused:
		// "a symlink on the way"). The listing names the original
		// object. (Found by TestListingHistoriesCommit, seed 5796.)
		return Change{Path: p}, false, l.listRemoval(t.counterpart(p), t)
	}
	cp := t.counterpart(p)
	if inOv {
		cp = t.counterpartHere(p)
	}
	lo, inLo, err := l.resolveLower(cp)
	if err != nil {
		return Change{}, false, err
	}
	if inOv && ov.Upper && ov.IsDir() {
		if err := l.checkMerged(p, &ov, cp, lo, inLo); err != nil {
			return Change{}, false, err
		}
	}
	if seen := t.seen[cp].Mode; seen != 0 && (!inLo || lo.st.Mode&unix.S_IFMT != seen&unix.S_IFMT) {
		// The sandbox saw the original's object at cp (it recorded its
		// base), which the original no longer shows (nothing there, or
		// an object of another type): the original
		// changed since, or is changing while this is read (a directory
		// on the way swapped for a symlink). Where the sandbox removed
		// that object, or holds its copy (moved, or not), the change
		// is one of that object, so that the commit's conflict check
		// compares the original with the base: gone, the commit is
		// refused; back, the change applies to it. Never a creation:
		// a new directory replaces the original's whole, with every
		// entry the sandbox never touched.
		c := Change{Path: p}
		switch {
		case !inOv:
			c.Kind, c.Type = Deleted, TypeName(seen)
			if cp != p {
				c.Original = cp
				// What the original has in p's place goes too, as
				// below: the conflict check compares it with what the
				// sandbox saw there (until 2026-11-28 a file the
				// original saved there since was removed unchecked).
				if c.Replaced, err = l.replacedInPlace(p, cp, t); err != nil {
					return c, false, err
				}
			}
			return c, true, nil
		case l.isOriginalsCopy(p, cp, &ov, seen):
			c.Type = TypeName(ov.Stat.Mode)
			switch {
			case t.from[p] == cp && cp != p:
				c.Kind, c.From = Renamed, cp
			case ov.IsDir():
				c.Kind = Metadata
			default:
				c.Kind = Modified
			}
			return c, true, nil
		}
	}
	if !inLo && cp != p {
		if inOv && strings.HasPrefix(cp, madeHere) {
			if err := l.noteDropped(p, t); err != nil {
				return Change{}, false, err
			}
		}
		// What p was renamed from was made in the sandbox: p has no
		// counterpart elsewhere, only the original's object in its place.
		if lo, inLo, err = l.lowerInPlace(t.dirs, p); err != nil {
			return Change{}, false, err
		}
		if !inLo && !inOv {
			// Deleted beneath a directory made in the sandbox: the
			// original's object at the same path, if any, went with the
			// directory it replaced.
			if lo, inLo, err = l.resolveLower(p); err != nil {
				return Change{}, false, err
			}
		}
	}
	c := Change{Path: p}
	switch {
	case !inOv && !inLo:
		return c, false, nil
	case !inOv:
		c.Kind, c.Type = Deleted, TypeName(lo.st.Mode)
		if lo.origin.Path != p {
			c.Original = lo.origin.Path
			if cp != p {
				if c.Replaced, err = l.replacedInPlace(p, c.Original, t); err != nil {
					return c, false, err
				}
			}
		}
		return c, true, nil
	}
	c.Type = TypeName(ov.Stat.Mode)
	if from, ok := t.from[p]; ok && from != p {
		if inLo && l.cameFrom(&ov, from) {
			c.Kind, c.From = Renamed, from
			return c, true, nil
		}
		// The moved object was replaced since: compare with the original's
		// object in p's place.
		if lo, inLo, err = l.lowerInPlace(t.dirs, p); err != nil {
			return c, false, err
		}
	}
	if cp == p && inLo {
		// No rename in p's lineage: its original is the object the
		// overlay merges in its place, which a directory made in the
		// sandbox above p hides (the original's went with the directory
		// it was in, moved away).
		if lo, inLo, err = l.lowerInPlace(t.dirs, p); err != nil {
			return c, false, err
		}
	}
	if inLo && !l.cameFrom(&ov, lo.origin.Path) && l.movedAway(lo.origin.Path, p, t) {
		// The original's object in p's place lives on at another path,
		// renamed there (that path's change takes it from here): what p
		// holds now replaces it, whatever their contents say, and is
		// never that object with other metadata. A file stays Modified,
		// so that an editor's save (the original renamed to a backup,
		// a new file written) diffs against the original's content.
		c.Kind = Modified
		if ov.IsDir() {
			c.Kind = Created
		}
		return c, true, nil
	}
	if !inLo {
		c.Kind = Created
		if to, ok := t.link[p]; ok && to != p && l.sameUpperObject(p, to) {
			c.Kind, c.From = Linked, to
		}
		return c, true, nil
	}
	if ov.IsDir() && lo.st.Mode&unix.S_IFMT == unix.S_IFDIR && len(ov.Lowers) == 0 && l.inUpper(p) && !l.upperOpaque(p) {
		// An upper directory that is not opaque merges the original's
		// directory in its place, yet the lookup just made found none:
		// the original changed while it was read (a directory swapped).
		return c, false, fmt.Errorf("%w: %s", ErrOriginalChanging, p)
	}
	if ov.IsDir() && lo.st.Mode&unix.S_IFMT == unix.S_IFDIR && !l.cameFrom(&ov, lo.origin.Path) {
		// Another directory stands where the original's was (made here,
		// or moved in after the original's moved away): a new directory
		// replaces it, whatever their metadata says.
		c.Kind = Created
		return c, true, nil
	}
	if !l.inUpper(p) {
		return c, false, nil // the original shows through unchanged
	}
	kind, err := l.compare(p, &ov, lo, t.paths[p], t.times[p])
	if err != nil {
		return c, false, err
	}
	if kind != Modified && lo.st.Mode&unix.S_IFMT != unix.S_IFDIR && lo.st.Nlink > 1 {
		// The copy-up parted p from the original's other names (as
		// overlayfs does without index=on): in the sandbox it is a file
		// of its own, even when only its atime changed or nothing did
		// (an open for writing), and the other names keep the old
		// metadata. Changing the original inode in place would change
		// them too, and a name outside the original as well: the commit
		// installs the copy instead.
		kind = Modified
	}
	if kind == "" {
		return c, false, nil
	}
	c.Kind = kind
	return c, true, nil
}

// checkMerged checks that the upper directory ov at p merges the
// original's directory its attributes name (lowerPathOf) exactly when the
// original has a directory there now. The overlay lookup of p and the
// lookup of its original are made one after the other, and another
// process may swap a directory of the original for a moment (for a
// symlink, say) between the two: the sandbox's copy of a directory it
// moved would then read as a new directory, which the commit would put in
// place of the original's, removing everything in it the sandbox never
// touched (seen under TestHostileSymlinkSwapDuringCommit). Such a read
// is read again (ErrOriginalChanging). lo and inLo are cp's original,
// just looked up.
func (l *Layers) checkMerged(p string, ov *Entry, cp string, lo *lowerHit, inLo bool) error {
	x, ok := l.lowerPathOf(p)
	if !ok || p == "" {
		return nil
	}
	if x != cp {
		var err error
		if lo, inLo, err = l.resolveLower(x); err != nil {
			return err
		}
	}
	if now := inLo && lo.st.Mode&unix.S_IFMT == unix.S_IFDIR; now != l.cameFrom(ov, x) {
		return fmt.Errorf("%w: %s", ErrOriginalChanging, p)
	}
	return nil
}

// checkDirs checks the overlay directories the read kept (dirs) against
// the original as it is now: a directory on the way looked up while the
// original's was away for a moment (or there for a moment) answered every
// lookup beneath it from that moment. A directory of the upper merges
// the original's its attributes name exactly when the original has it; one
// the original alone shows is still a directory there.
func (l *Layers) checkDirs(dirs dirCache) error {
	for p, e := range dirs {
		switch {
		case p == "":
		case e.Upper:
			if err := l.checkMerged(p, &e, "", nil, false); err != nil {
				return err
			}
		case len(e.Lowers) > 0:
			lo, ok, err := l.resolveLower(e.Lowers[0].Path)
			if err != nil {
				return err
			}
			if !ok || lo.st.Mode&unix.S_IFMT != unix.S_IFDIR {
				return fmt.Errorf("%w: %s", ErrOriginalChanging, p)
			}
		}
	}
	return nil
}

// noteDropped records in t.dropped the removal of the original object
// that p's rename lineage names, where the object at p now is one the
// sandbox made after that object, moved to p, was removed there (mv a/b
// m; rm -r m; mkdir m): no path of the change set names that removal.
// Where the object lives on (moved elsewhere, or still at its own path),
// nothing was removed. Before 2026-11-27 status never named it: a/b and
// what it held went unlisted when a/b's own path held another object
// (an exchange put one there).
func (l *Layers) noteDropped(p string, t *touched) error {
	q := t.counterpart(p)
	if q == p || strings.HasPrefix(q, madeHere) {
		return nil
	}
	lo, ok, err := l.resolveLower(q)
	if err != nil || !ok || l.movedAway(q, p, t) {
		return err
	}
	ov, ok, err := l.resolveIn(t.dirs, q)
	if err != nil || ok && l.cameFrom(&ov, q) {
		return err
	}
	t.dropped = append(t.dropped, Change{Path: q, Kind: Deleted, Type: TypeName(lo.st.Mode), Original: q})
	return nil
}

// isOriginalsCopy reports whether the overlay object ov at p is the
// sandbox's copy of the original object at o that it saw (seen: that
// object's mode): a directory of the upper layer that merges the
// original's o (lowerPathOf), or a file whose origin is o.
func (l *Layers) isOriginalsCopy(p, o string, ov *Entry, seen uint32) bool {
	if seen&unix.S_IFMT != ov.Stat.Mode&unix.S_IFMT {
		return false
	}
	if !ov.IsDir() {
		return l.cameFrom(ov, o)
	}
	lp, ok := l.lowerPathOf(p)
	return ok && lp == o
}

// lowerPathOf is the original path whose directory the upper directory
// at p merges, as its attributes say (whether or not the original has
// it now): its redirect, or its parent's lower path and its name; none
// (false) beneath an opaque directory or where p is not in the upper.
func (l *Layers) lowerPathOf(p string) (string, bool) {
	if !l.inUpper(p) || l.upperOpaque(p) {
		return "", false
	}
	var r string
	_ = l.UpperDo(p, func(up string) error { r = l.redirectOf(up); return nil })
	if strings.HasPrefix(r, "/") {
		return strings.TrimPrefix(r, "/"), true
	}
	if p == "" {
		return "", true
	}
	dir, name := Split(p)
	parent, ok := l.lowerPathOf(dir)
	if !ok {
		return "", false
	}
	if r == "" {
		r = name
	}
	return Join(parent, r), true
}

// movedAway reports whether the original object at x is, in the overlay,
// at a path other than p that a rename took it to.
func (l *Layers) movedAway(x, p string, t *touched) bool {
	for _, q := range t.movedFrom[x] {
		if q == p {
			continue
		}
		if ov, ok, err := l.resolveIn(t.dirs, q); err == nil && ok && l.cameFrom(&ov, x) {
			return true
		}
	}
	return false
}

// cameFrom reports whether the overlay object e is the original object
// from (a renamed file carries its origin, a renamed directory its redirect).
func (l *Layers) cameFrom(e *Entry, from string) bool {
	return len(e.Lowers) > 0 && e.Lowers[0].Path == from
}

// compare classifies an object present in both the overlay (copied up) and
// the original: Modified, Metadata or "" when nothing differs. A
// directory's mtime counts only when its times were set explicitly
// (touch, tar, rsync): otherwise it moves with every entry made or removed
// in it, and the commit moves it likewise.
func (l *Layers) compare(p string, ov *Entry, lo *lowerHit, content, times bool) (ChangeKind, error) {
	up, err := l.upperAt(p)
	if err != nil {
		return "", err
	}
	defer up.Close()
	var ust unix.Stat_t
	if err := unix.Lstat(up.Path, &ust); err != nil {
		return "", err
	}
	if ust.Mode&unix.S_IFMT != lo.st.Mode&unix.S_IFMT {
		return Modified, nil
	}
	var kind ChangeKind
	err = l.lowerDo(lo.origin, func(lpath string) (err error) {
		kind, err = l.compareWith(up.Path, &ust, lpath, lo, times, content)
		return err
	})
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
		// There when p was looked up, gone now (a directory on the way
		// swapped for a symlink): read again.
		return "", fmt.Errorf("%w: %s", ErrOriginalChanging, p)
	}
	return kind, err
}

// compareWith is compare with the upper object up (ust) and the original's
// at lpath.
func (l *Layers) compareWith(up string, ust *unix.Stat_t, lpath string, lo *lowerHit, times, content bool) (ChangeKind, error) {
	switch ust.Mode & unix.S_IFMT {
	case unix.S_IFLNK:
		a, err1 := readlink(up)
		b, err2 := readlink(lpath)
		if err1 != nil || err2 != nil || a != b {
			return Modified, nil
		}
	case unix.S_IFREG:
		if content {
			same, err := sameContent(up, lpath, ust.Size, lo.st.Size)
			if err != nil {
				return "", err
			}
			if !same {
				return Modified, nil
			}
		}
	case unix.S_IFCHR, unix.S_IFBLK:
		if ust.Rdev != lo.st.Rdev {
			return Modified, nil
		}
	}
	if ust.Mode != lo.st.Mode || ust.Uid != lo.st.Uid || ust.Gid != lo.st.Gid ||
		(ust.Mode&unix.S_IFMT != unix.S_IFDIR && ust.Mtim != lo.st.Mtim) || !l.sameXattrs(up, lpath) {
		return Metadata, nil
	}
	if t := ust.Mode & unix.S_IFMT; (t == unix.S_IFREG || t == unix.S_IFDIR) && !l.sameFlags(up, lpath) {
		return Metadata, nil // chattr (SetFlags)
	}
	if ust.Mode&unix.S_IFMT == unix.S_IFDIR && times {
		// Set explicitly, even to the original's time: the commit's
		// changes beneath it would move it otherwise.
		return Metadata, nil
	}
	return "", nil
}

func sameContent(a, b string, sa, sb int64) (bool, error) {
	if sa != sb {
		return false, nil
	}
	fa, err := os.OpenFile(a, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return false, err
	}
	defer fa.Close()
	fb, err := os.OpenFile(b, os.O_RDONLY|unix.O_NOFOLLOW, 0) // the original's: never a symlink swapped in
	if err != nil {
		return false, err
	}
	defer fb.Close()
	n := min(sa+1, 256<<10) // small files are the common case
	ba, bb := make([]byte, n), make([]byte, n)
	for {
		na, ea := io.ReadFull(fa, ba)
		nb, eb := io.ReadFull(fb, bb)
		if na != nb || !bytes.Equal(ba[:na], bb[:nb]) {
			return false, nil
		}
		if ea != nil || eb != nil {
			return errors.Is(ea, io.EOF) || errors.Is(ea, io.ErrUnexpectedEOF), nil
		}
	}
}

func (l *Layers) sameXattrs(a, b string) bool {
	na, _ := fsutil.LListXattrs(a)
	nb, _ := fsutil.LListXattrs(b)
	na = slices.DeleteFunc(na, l.Private)
	nb = slices.DeleteFunc(nb, l.Private)
	slices.Sort(na)
	slices.Sort(nb)
	if !slices.Equal(na, nb) {
		return false
	}
	for _, n := range na {
		va, _ := fsutil.LGetXattr(a, n)
		vb, _ := fsutil.LGetXattr(b, n)
		if !bytes.Equal(va, vb) {
			return false
		}
	}
	return true
}

// resolve looks p up in the overlay from the root.
func (l *Layers) resolve(p string) (Entry, bool, error) {
	return l.resolveIn(nil, p)
}

// dirCache holds the overlay directories one change set resolved: its
// paths share their parents, and the overlay does not change while the
// change set is read (the mount is frozen for a commit).
type dirCache map[string]Entry

// resolveIn is resolve with the directories on the way taken from, and
// added to, dirs (nil: none kept).
func (l *Layers) resolveIn(dirs dirCache, p string) (Entry, bool, error) {
	if e, ok := dirs[p]; ok {
		return e, true, nil
	}
	var e Entry
	var err error
	if p == "" {
		e, err = l.Root()
	} else {
		dir, name := Split(p)
		parent, ok, perr := l.resolveIn(dirs, dir)
		if perr != nil || !ok || !parent.IsDir() {
			return parent, false, perr
		}
		e, err = l.Lookup(dir, parent.Obj, name)
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
			return e, false, nil
		}
	}
	if err != nil {
		return e, false, err
	}
	if dirs != nil && e.IsDir() {
		dirs[p] = e
	}
	return e, true, nil
}

// lowerInPlace is the original's object in p's place: the name looked up
// in the original directories the overlay merges at p's parent (which a
// renamed parent carries along), as the overlay itself would find it.
func (l *Layers) lowerInPlace(dirs dirCache, p string) (*lowerHit, bool, error) {
	dir, name := Split(p)
	parent, ok, err := l.resolveIn(dirs, dir)
	if err != nil || !ok || !parent.IsDir() || len(parent.Lowers) == 0 {
		return nil, false, err
	}
	first, _, err := l.stepLowers(parent.Lowers, name, false)
	if err != nil || first == nil {
		return nil, false, err
	}
	return first, true, nil
}

// resolveLower looks p up in the lower layers only: the original. A
// counterpart beneath madeHere is in no original.
func (l *Layers) resolveLower(p string) (*lowerHit, bool, error) {
	if strings.HasPrefix(p, madeHere) {
		return nil, false, nil
	}
	cur := l.lowerRoots(0)
	names := splitRel(p)
	for i, name := range names {
		first, dirs, err := l.stepLowers(cur, name, false)
		if err != nil || first == nil {
			return nil, false, err
		}
		if i == len(names)-1 {
			return first, true, nil
		}
		cur = dirs
	}
	return nil, false, nil
}

// TypeName is the type word of a mode, as in Change.Type.
func TypeName(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFREG:
		return "file"
	case unix.S_IFDIR:
		return "dir"
	case unix.S_IFLNK:
		return "symlink"
	case unix.S_IFIFO:
		return "fifo"
	case unix.S_IFSOCK:
		return "socket"
	}
	return "device"
}

// sameUpperObject reports whether the upper objects at a and b are one
// inode (a hard link the journal recorded may since have been renamed or
// replaced).
func (l *Layers) sameUpperObject(a, b string) bool {
	var sa, sb unix.Stat_t
	if l.upperLstat(a, &sa) != nil || l.upperLstat(b, &sb) != nil {
		return false
	}
	return sa.Ino == sb.Ino && sa.Dev == sb.Dev && !fsutil.IsWhiteout(&sa)
}

// classifyRoot reports a metadata change of the root (mode, owner, times
// of a kind a user sets, xattrs): the root is always in the upper.
func (l *Layers) classifyRoot(times bool) (Change, bool, error) {
	var ust, lst unix.Stat_t
	if err := unix.Lstat(l.upper, &ust); err != nil {
		return Change{}, false, err
	}
	if err := unix.Lstat(l.lowers[0], &lst); err != nil {
		return Change{}, false, err
	}
	if ust.Mode == lst.Mode && ust.Uid == lst.Uid && ust.Gid == lst.Gid && !times && l.sameXattrs(l.upper, l.lowers[0]) &&
		l.sameFlags(l.upper, l.lowers[0]) {
		return Change{}, false, nil
	}
	return Change{Path: "", Kind: Metadata, Type: "dir"}, true, nil
}
