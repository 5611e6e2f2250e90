package commit

import (
	"os"
	"path"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/fsutil"
	"github.com/sbxfs/sbxfs/layers"
)

// What the patch needs beyond the two sides of each change, so that git
// apply, which checks every path against the tree and against the other
// entries of the patch, gives the sandbox's files:
//   - a directory rename moves every file beneath it: each is named, as
//     git names them (moved); one whose place in the sandbox another
//     object took is deleted (gone);
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
type movedFile struct {
	from, to string
	copied   bool
}

func (r *diffReader) readPatchExtras(d *diffPair) error {
	c := d.c
	_, hasOld := r.oldPathOf(c)
	d.copied = hasOld && r.claimed(d.oldPath, c)
	d.first = c.Kind == layers.Deleted && d.oldPath != c.Path
	if c.Kind != layers.Deleted && (!hasOld || d.oldPath != c.Path) && !r.handled(c.Path) {
		old, err := readSide(r.orig, c.Path, r.opts.fullBinary)
		if err != nil {
			return err
		}
		if old.exists {
			d.replaced = &old
		}
		if old.typ() == unix.S_IFDIR {
			if err := r.goneBeneath(d, c.Path); err != nil {
				return err
			}
		}
	}
	if c.Kind == layers.Renamed && d.old.typ() == unix.S_IFDIR && d.new.typ() == unix.S_IFDIR {
		return r.movedWith(d, d.oldPath, c.Path)
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
	if r.olds[p] {
		return true
	}
	for q := p; ; {
		if r.sources[q] {
			return true
		}
		i := strings.LastIndexByte(q, '/')
		if i < 0 {
			return false
		}
		q = q[:i]
	}
}

// movedWith fills d.moved and d.gone with the files and symlinks beneath
// the original directory from, which the rename moves to beneath to,
// leaving out those with a change of their own.
func (r *diffReader) movedWith(d *diffPair, from, to string) error {
	return r.walkOriginal(from, to, func(o, n string) error {
		switch {
		case !hasChange(r.changes, n):
			d.moved = append(d.moved, movedFile{o, n, r.inPlace[o]})
		case !comparesWith(r, r.changes[n], o):
			// Another object took its place in the sandbox.
			return r.addGone(d, o)
		}
		return nil
	})
}

// goneBeneath fills d.gone with the files and symlinks beneath the
// original directory at p, which the sandbox replaced, that no other
// change deals with.
func (r *diffReader) goneBeneath(d *diffPair, p string) error {
	return r.walkOriginal(p, p, func(o, _ string) error {
		if r.olds[o] {
			return nil
		}
		return r.addGone(d, o)
	})
}

func (r *diffReader) addGone(d *diffPair, o string) error {
	old, err := readSide(r.orig, o, r.opts.fullBinary)
	if err != nil {
		return err
	}
	d.gone = append(d.gone, diffPair{c: layers.Change{Path: o, Kind: layers.Deleted}, oldPath: o, old: old})
	return nil
}

// walkOriginal calls fn for every file and symlink beneath the original
// directory from (o), with its path beneath to (n), leaving out what is
// renamed on its own (a rename source, and everything beneath one). It
// lists the original's directories beneath from, in name order.
func (r *diffReader) walkOriginal(from, to string, fn func(o, n string) error) error {
	fd, err := fsutil.OpenBeneath(r.orig, from, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return err
	}
	f := os.NewFile(uintptr(fd), from)
	ents, err := f.ReadDir(-1)
	f.Close()
	if err != nil {
		return err
	}
	slices.SortFunc(ents, func(a, b os.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
	for _, e := range ents {
		o, n := path.Join(from, e.Name()), path.Join(to, e.Name())
		switch {
		case r.sources[o]:
		case e.IsDir():
			err = r.walkOriginal(o, n, fn)
		case e.Type().IsRegular() || e.Type()&os.ModeSymlink != 0:
			err = fn(o, n)
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

func hasChange(m map[string]layers.Change, p string) bool {
	_, ok := m[p]
	return ok
}
