package commit

import (
	"os"
	"path"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/layers"
)

// What the patch needs beyond the two sides of each change, so that git
// apply, which checks every path against the tree and against the other
// entries of the patch, gives the sandbox's files:
//   - a directory rename moves every file beneath it: each is named, as
//     git names them (moved); one whose place in the sandbox another
//     object took is deleted (gone);
//   - the files beneath a removed original directory that no change
//     names are deleted with it (gone);
//   - an original object that the sandbox replaced without a change of
//     its own (a file renamed over it: `mv y x`; a directory moved away
//     by an exchange and a new one in its place) is deleted first
//     (replaced; for a directory also the files beneath it no other
//     change deals with, gone), else the patch would lose it without a
//     word and git apply would refuse to put the new object there;
//   - a change that compares with an original object another entry
//     claims (a change at its path compares with it in place: `mv f f~;
//     echo new > f`, f is modified and f~ a copy of f; or it is renamed
//     elsewhere, and a new object took its place in a renamed directory)
//     is written as a copy of it (copied), since git apply refuses to
//     change a path an entry renamed away, and reads a copy's source as
//     the original has it.

// patchExtras are a pair's patch-only parts. first: a deletion the
// patch writes before the rest (patchOut).
type patchExtras struct {
	copied, first bool
	moved         []movedFile
	gone          []diffPair
	replaced      *diffSide
}

// movedFile is a file that moves with its renamed directory, from its
// original path to its path in the sandbox; copied as in patchExtras.
// The listing forms also read its side (no content: it is the same on
// both sides).
type movedFile struct {
	from, to        string
	copied, symlink bool
	side            diffSide
}

// readMovedSides reads, for the listing forms, the side of each file a
// renamed directory moves (without content: it is the same on both
// sides, and only its first bytes tell a binary file).
func (r *diffReader) readMovedSides(d *diffPair) error {
	for i := range d.moved {
		m := &d.moved[i]
		side, err := r.readOrig(m.from, pairOpts{noContent: r.opts.noContent, head: true})
		if err != nil {
			return err
		}
		m.side = side
	}
	return nil
}

func (r *diffReader) readPatchExtras(d *diffPair) error {
	c := d.c
	_, hasOld := r.oldPathOf(c)
	d.copied = hasOld && r.claimed(d.oldPath, c)
	d.first = c.Kind == layers.Deleted && d.oldPath != c.Path
	if c.Kind != layers.Deleted && (!hasOld || d.oldPath != c.Path) && !r.handled(c.Path) {
		old, err := r.readOrig(c.Path, r.opts)
		if err != nil {
			return err
		}
		if old.exists && !r.gone[c.Path] { // not deleted with a directory before
			d.replaced = &old
			r.gone[c.Path] = true
		}
		if old.typ() == unix.S_IFDIR {
			if err := r.goneBeneath(d, c.Path); err != nil {
				return err
			}
		}
	}
	switch {
	case d.old.typ() != unix.S_IFDIR:
	case d.new.typ() == unix.S_IFDIR && c.Kind == layers.Renamed:
		if r.opts.dropsOnly {
			return nil
		}
		return r.movedWith(d, d.oldPath, c.Path)
	case d.new.typ() != unix.S_IFDIR && !d.copied && !r.sources[d.oldPath]:
		// An original directory removed (or replaced by another type):
		// its files went first, where the change set may name them by
		// paths they had elsewhere; those it does not name go with it.
		// (Not one another entry moves elsewhere whole: its files go
		// with it.)
		return r.goneBeneath(d, d.oldPath)
	}
	return nil
}

// claimed reports whether another entry of the patch takes the
// original's object at old, which c compares with: a change at old that
// compares with it in place, or a rename of it elsewhere.
func (r *diffReader) claimed(old string, c layers.Change) bool {
	if old == c.Path {
		return false
	}
	return r.inPlace[old] || r.sources[old] && !(c.Kind == layers.Renamed && c.From == old)
}

// movedInDeletion reports whether c removes an object whose original
// (as the change set translates its path) another entry claims: the
// object removed was moved there from elsewhere (`mv x z; mv y x; rm x`:
// the change set says x and y are deleted, and x is renamed to z). Such
// a change names no original object of its own: what it removed is a
// deletion at its own original path (y), or is replaced there, and the
// patch leaves it out.
func (r *diffReader) movedInDeletion(c layers.Change) bool {
	return c.Kind == layers.Deleted && r.claimed(r.counterpart(c.Path), c)
}

// handled reports whether other entries of the patch deal with the
// original's object at p: a change compares with it, or it or a
// directory above it is renamed.
func (r *diffReader) handled(p string) bool {
	return r.olds[p] || r.movedAway(p)
}

// movedWith fills d.moved and d.gone with the files and symlinks beneath
// the original directory from, which the rename moves to beneath to:
// moved where nothing changed them, gone where another object took their
// place or a directory above them is gone from where it moved; those
// with a change of their own (or one that claims them) are left to it.
func (r *diffReader) movedWith(d *diffPair, from, to string) error {
	return r.walkOriginal(from, to, func(o, n string, typ os.FileMode) (bool, error) {
		c, changed := r.changes[n]
		dir := typ.IsDir()
		switch {
		case !changed:
			if !dir {
				d.moved = append(d.moved, movedFile{from: o, to: n, copied: r.inPlace[o], symlink: typ&os.ModeSymlink != 0})
			}
			return true, nil
		case dir && (c.Kind == layers.Deleted || !comparesWith(r, c, o) || c.Type != "dir"):
			// Removed, replaced by another object, or turned into a
			// non-directory: nothing beneath moves with the rename.
			return false, r.goneBeneath(d, o)
		case dir, comparesWith(r, c, o), r.inPlace[o]:
			return true, nil
		}
		return false, r.addGone(d, o)
	})
}

// goneBeneath fills d.gone with the files and symlinks beneath the
// original directory at p, which the sandbox removed or replaced, that
// no other change deals with; for the listing forms also the directories
// no entry names (as rm -r lists each).
func (r *diffReader) goneBeneath(d *diffPair, p string) error {
	return r.walkOriginal(p, p, func(o, _ string, typ os.FileMode) (bool, error) {
		if typ.IsDir() {
			if _, named := r.changes[o]; r.opts.listing && !named && !r.olds[o] {
				return true, r.addGone(d, o)
			}
			return true, nil
		}
		if r.olds[o] {
			return true, nil
		}
		return false, r.addGone(d, o)
	})
}

// addGone adds the deletion of the original's o to d, unless the patch
// deletes it already (two changes may reach one removed directory).
func (r *diffReader) addGone(d *diffPair, o string) error {
	if r.gone[o] || r.listedRemovals[o] {
		return nil
	}
	r.gone[o] = true
	old, err := r.readOrig(o, r.opts)
	if err != nil {
		return err
	}
	d.gone = append(d.gone, diffPair{c: layers.Change{Path: o, Kind: layers.Deleted}, oldPath: o, old: old})
	return nil
}

// walkOriginal calls fn for every directory, file and symlink beneath the
// original directory from (o) (for the listing forms also every FIFO,
// socket and device), with its path beneath to (n), leaving out
// what is renamed on its own (a rename source, and everything beneath
// one), and enters a directory when fn says so. It lists the original's
// directories, in name order.
func (r *diffReader) walkOriginal(from, to string, fn func(o, n string, typ os.FileMode) (bool, error)) error {
	ents, err := r.listOrig(from)
	if err != nil {
		return err
	}
	for _, e := range ents {
		o, n := path.Join(from, e.name), path.Join(to, e.name)
		isDir := e.typ.IsDir()
		if r.sources[o] || !r.opts.listing && !isDir && !e.typ.IsRegular() && e.typ&os.ModeSymlink == 0 {
			continue
		}
		enter, err := fn(o, n, e.typ)
		if err == nil && enter && isDir {
			err = r.walkOriginal(o, n, fn)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// comparesWith reports whether c compares with the original's object at o.
func comparesWith(r *diffReader, c layers.Change, o string) bool {
	old, ok := r.oldPathOf(c)
	return ok && old == o
}

// leaveToListing makes addGone leave the removals of listing to it.
func (r *diffReader) leaveToListing(listing []layers.Change) {
	r.listedRemovals = map[string]bool{}
	for _, c := range listing {
		if c.Kind == layers.Deleted {
			r.listedRemovals[c.Path] = true
		}
	}
}

// StatusListing is the change set as sbxfs status lists it: Listing, and
// a removal of each original file or symlink beneath a directory the
// sandbox removed or replaced (or replaced by another type) that no entry
// names: a file that went without a removal of its own (another object
// moved over it, then removed with a directory that had been moved
// away). It reads the original's object at the paths of the entries
// that may have replaced a directory, and the listings of those that
// did; not those beneath a renamed directory, which is one entry here
// (the diff forms name what it moves).
func StatusListing(cfg layers.Config, cs layers.ChangeSet) ([]layers.Change, error) {
	r, err := openDiffReader(cfg, cs, pairOpts{listing: true, noContent: true, dropsOnly: true})
	if err != nil {
		return nil, err
	}
	defer r.close()
	listing := cs.Listing()
	for i := range listing {
		listing[i] = r.shown(listing[i])
	}
	r.leaveToListing(listing)
	out := slices.Clone(listing)
	var walked []string // the directories read beneath so far
	for _, c := range listing {
		if c.Type != "dir" && c.Kind != layers.Modified && c.Kind != layers.Renamed && !(c.Kind == layers.Deleted && c.Original != "") {
			// Replaced no directory: a new file or link where the
			// original has one is a change of type (Modified), and what
			// a new object took the place of moved away. (A removal
			// named by another path, the original object a removed one
			// took the place of, has the removed one's type: the
			// original there may be a directory, exchanged away.) A
			// rename's target may replace an original directory that
			// was exchanged away and then removed where it went, under
			// a name another new directory took and left (mv d n1; the
			// exchange of e and n1/f04; mv n1/f04 h/n2; rm -r h/n2;
			// mkdir h/n2; mv h/n2 y): no change names its files, which
			// the diff deletes with it (readPatchExtras), and until
			// 2026-11-27 status did not list them.
			continue
		}
		if slices.ContainsFunc(walked, func(w string) bool { return w == "" || strings.HasPrefix(c.Path, w+"/") }) {
			continue // read with a directory above it (rm -r lists each)
		}
		d, err := r.pair(c, false)
		if err != nil {
			return nil, err
		}
		for _, g := range d.gone {
			out = append(out, layers.Change{Path: g.c.Path, Kind: layers.Deleted, Type: layers.TypeName(g.old.mode), Original: g.c.Path})
		}
		if d.old.typ() == unix.S_IFDIR && d.new.typ() != unix.S_IFDIR || d.replaced != nil && d.replaced.typ() == unix.S_IFDIR {
			walked = append(walked, c.Path) // removed or replaced: read beneath
		}
	}
	if len(out) > len(listing) {
		slices.SortStableFunc(out, func(a, b layers.Change) int {
			return compareListed(listedKey{a.Path, a.Kind == layers.Deleted}, listedKey{b.Path, b.Kind == layers.Deleted})
		})
	}
	return out, nil
}
