package commit

import (
	"cmp"
	"slices"
	"strconv"
	"strings"

	"github.com/sbxfs/sbxfs/layers"
)

// renames maps paths between the original's namespace and the sandbox's
// final one, through the renamed directories of a change set.
type renames struct {
	dirs   []layers.Change   // Renamed directories
	byPath map[string]string // final path -> original path, of dirs
	byFrom map[string]string // original path -> final path, of dirs
}

func newRenames(cs layers.ChangeSet) renames {
	r := renames{byPath: map[string]string{}, byFrom: map[string]string{}}
	for _, c := range cs.Changes {
		if c.Kind == layers.Renamed && c.Type == "dir" {
			r.dirs = append(r.dirs, c)
			r.byPath[c.Path] = c.From
			r.byFrom[c.From] = c.Path
		}
	}
	return r
}

// original is the original path of what the sandbox has at final path p.
// (A lookup of p's ancestors, in time proportional to p's depth.)
func (r renames) original(p string) string { return layers.Counterpart(r.byPath, p) }

// final is where the original path p ends up once directories are moved.
func (r renames) final(p string) string { return layers.Counterpart(r.byFrom, p) }

// replacedAt returns the original path of the object that stands at the
// final path p once the renamed directories are in place (before the
// commit puts anything there): what the original has under p's name in
// p's directory, and false when that object is elsewhere by then (a
// renamed directory took it along: p's directory is a new one, or p
// itself was renamed away).
//
// An original directory renamed to p itself is elsewhere too: phase 1
// moves it aside before anything is detached. (mv a/b q; mv q a/b; mv a
// m lists R a -> m and R a/b -> m/b: m/b's original, a/b, was taken for
// the object standing there, to be backed up whole, and a directory
// made at m/b/c then refused as if someone had made the original's
// a/b/c there during the commit:
// TestCommitANewDirectoryOverAnOriginalOneBeneathRenamedOnes.)
func (r renames) replacedAt(p string) (string, bool) {
	dir, name := layers.Split(p)
	o := layers.Join(r.original(dir), name)
	if _, renamed := r.byFrom[o]; renamed {
		return o, false
	}
	return o, r.final(o) == p
}

func under(p, dir string) bool {
	return len(p) >= len(dir) && p[:len(dir)] == dir && (len(p) == len(dir) || p[len(dir)] == '/')
}

// planner builds the steps of a transaction from a change set.
type planner struct {
	r       renames
	n       int
	phase1  []step            // renamed directories moved aside, deepest first
	byPath  map[string][]step // detach and create steps, by final path
	metas   []step
	install map[string]bool // final paths that get a staged object
}

func (p *planner) slot(kind string) string {
	p.n++
	return kind + "/" + strconv.Itoa(p.n)
}

func (p *planner) at(path string, s step) { p.byPath[path] = append(p.byPath[path], s) }

// plan returns the ordered steps for cs: phase 1 (directories aside), then
// by final path with parents first (what is there goes to the backup area,
// then the new object comes in), then metadata with children first.
// Metadata before the change (Old) is filled in later, from the original.
func plan(cs layers.ChangeSet) []step {
	p := &planner{r: newRenames(cs), byPath: map[string][]step{}, install: map[string]bool{}}
	dirs := slices.Clone(p.r.dirs)
	slices.SortFunc(dirs, func(a, b layers.Change) int { return depth(b.From) - depth(a.From) })
	moved := map[string]string{}
	for _, d := range dirs {
		s := step{Kind: opDetach, Path: d.From, Slot: p.slot("m")}
		moved[d.Path] = s.Slot
		p.phase1 = append(p.phase1, s)
	}
	for _, c := range cs.Changes {
		p.change(c, moved)
	}
	for _, c := range cs.Changes {
		if c.Kind == layers.Linked && !p.install[c.From] {
			p.replace(c.From) // keep the link: both names get the new inode
		}
	}
	paths := make([]string, 0, len(p.byPath))
	for k := range p.byPath {
		paths = append(paths, k)
	}
	slices.SortFunc(paths, comparePaths)
	steps := make([]step, 0, len(p.phase1)+2*len(paths)+len(p.metas))
	steps = append(steps, p.phase1...)
	for _, k := range paths {
		// Whatever is at a path goes before anything comes in, whichever
		// change asked for the detach.
		group := p.byPath[k]
		slices.SortStableFunc(group, func(a, b step) int { return detachFirst(a) - detachFirst(b) })
		steps = append(steps, group...)
	}
	slices.SortStableFunc(p.metas, func(a, b step) int { return depth(b.Path) - depth(a.Path) })
	return append(nest(steps), p.metas...)
}

// nest stages every object beneath a wholly new directory inside that
// directory's own staged copy, so that the directory's one rename brings
// in the whole tree (an `npm install` of 50,000 files: one rename in the
// original, not 50,000 renames and as many looks). The steps of those
// objects stay in the plan, with In naming where they are staged: the
// apply skips them, and an undo moves each back on its own (to its own
// slot) before the directory, exactly as when each had been moved in.
// They lose their detach steps: nothing can be beneath a directory the
// commit itself brings in (its rename refuses to replace anything).
//
// A new directory is staged whole only when everything beneath it is new
// (installs, new directories, their metadata): a directory renamed into
// it comes from the original at the apply, and a removal or a rename away
// beneath it means the original has something there.
func nest(steps []step) []step {
	tops := map[string]string{} // new directory -> its slot
	made := map[string]bool{}   // paths given a new object
	for _, s := range steps {
		switch s.Kind {
		case opMkdir:
			tops[s.Path] = s.Slot
			made[s.Path] = true
		case opInstall:
			made[s.Path] = true
		}
	}
	if len(tops) == 0 {
		return steps
	}
	for _, s := range steps {
		switch {
		case s.Kind == opInstall, s.Kind == opMkdir, s.Kind == opMeta:
			continue
		case s.Kind == opDetach && strings.HasPrefix(s.Slot, "b/") && made[s.Path]:
			continue // what the original has at a path given a new object
		}
		for d := parentRel(s.Path); d != ""; d = parentRel(d) {
			delete(tops, d)
		}
	}
	out := steps[:0]
	for _, s := range steps {
		if top := topNew(tops, s.Path); top != "" && s.Kind != opMeta {
			if s.Kind == opDetach {
				continue
			}
			s.In = tops[top] + s.Path[len(top):]
		}
		out = append(out, s)
	}
	return out
}

// topNew returns the outermost directory of tops strictly above p, or "".
func topNew(tops map[string]string, p string) string {
	for i := strings.IndexByte(p, '/'); i > 0; i = nextSlash(p, i) {
		if _, ok := tops[p[:i]]; ok {
			return p[:i]
		}
	}
	return ""
}

func nextSlash(p string, i int) int {
	if j := strings.IndexByte(p[i+1:], '/'); j >= 0 {
		return i + 1 + j
	}
	return -1
}

func (p *planner) change(c layers.Change, moved map[string]string) {
	switch {
	case c.Kind == layers.Renamed && c.Type == "dir":
		p.at(c.Path, step{Kind: opDetach, Path: c.Path, Slot: p.slot("b")})
		p.at(c.Path, step{Kind: opAttach, Path: c.Path, Slot: moved[c.Path]})
		p.metas = append(p.metas, step{Kind: opMeta, Path: c.Path, New: &meta{}})
	case c.Kind == layers.Renamed:
		from := p.r.final(c.From)
		p.at(from, step{Kind: opDetach, Path: from, Slot: p.slot("b")})
		p.replace(c.Path)
	case c.Kind == layers.Deleted:
		p.at(c.Path, step{Kind: opDetach, Path: c.Path, Slot: p.slot("b")})
	case c.Kind == layers.Metadata:
		p.metas = append(p.metas, step{Kind: opMeta, Path: c.Path, New: &meta{}})
	case c.Type == "dir": // created, or a non-directory replaced by one
		p.at(c.Path, step{Kind: opDetach, Path: c.Path, Slot: p.slot("b")})
		p.at(c.Path, step{Kind: opMkdir, Path: c.Path, Slot: p.slot("s")})
		p.metas = append(p.metas, step{Kind: opMeta, Path: c.Path, New: &meta{}})
	default: // created, modified or linked non-directory
		p.replace(c.Path)
	}
}

// replace moves whatever the original has at path aside and installs the
// sandbox's object there.
func (p *planner) replace(path string) {
	if p.install[path] {
		return
	}
	p.install[path] = true
	p.at(path, step{Kind: opDetach, Path: path, Slot: p.slot("b")})
	p.at(path, step{Kind: opInstall, Path: path, Slot: p.slot("s")})
}

func depth(p string) int { return strings.Count(p, "/") }

// comparePaths orders paths component by component, so a directory comes
// right before everything beneath it: byte by byte, with the separator
// before every other byte (a component ends before any longer name that
// starts with it).
func comparePaths(a, b string) int {
	for i := 0; i < len(a) && i < len(b); i++ {
		if ca, cb := a[i], b[i]; ca != cb {
			switch {
			case ca == '/':
				return -1
			case cb == '/':
				return 1
			}
			return cmp.Compare(ca, cb)
		}
	}
	return cmp.Compare(len(a), len(b))
}

func detachFirst(s step) int {
	if s.Kind == opDetach {
		return 0
	}
	return 1
}
