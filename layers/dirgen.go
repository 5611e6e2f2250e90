package layers

import "sync/atomic"

// A lookup in a directory that has no upper directory need not look in the
// upper layer: nothing can be there (kernel overlayfs's lookup stops at the
// upper likewise when the parent has none). sbxfs learns that a directory
// has none from the lookup that found it (Obj.absentAt), and trusts it as
// long as no directory appeared in the upper since: dirGen counts each
// upper directory made (mkdir, a directory's copy-up, one moved into a
// whiteout's place) and each rename (which moves upper directories, and
// changes the paths of the nodes below the names it moves), and Reset.
// A non-directory appearing changes nothing: a directory's children live
// in the upper only inside an upper directory of its own.
//
// The count is raised after the change, so a lookup that found a name
// absent before it holds an older count; a lookup running while the
// change is in flight may still skip the upper, as it would had it run
// just before. While another process may change the upper (the mount is
// frozen for a commit or its undo: SetShared), nothing is skipped and
// nothing learnt; the count is raised as that starts and ends.
//
// It saves an lstat(2) of the upper path for every name looked up in a
// directory the sandbox has not touched: ~1.5 us of the ~40 of a cold
// lookup through /dev/fuse (BenchmarkLowerLookup; docs/design.md,
// "Lookups that skip the upper").
type dirGen struct {
	n      atomic.Uint64
	shared atomic.Bool
}

// now returns the count and whether absence may be trusted and learnt.
func (g *dirGen) now() (uint64, bool) {
	n := g.n.Load()
	return n, !g.shared.Load()
}

// changed notes that a directory may have appeared in the upper.
func (g *dirGen) changed() { g.n.Add(1) }

// absentIn reports whether o is known to have nothing in the upper layer at
// count n (which now returned trusted).
func (o *Obj) absentIn(n uint64) bool { return !o.Upper && o.absentAt == n+1 }

// SetShared says whether another process may change the upper layer (a
// commit or its undo while the mount is frozen): while it does, lookups
// look in the upper for every name.
func (l *Layers) SetShared(on bool) {
	l.dirGen.shared.Store(on)
	l.dirGen.changed()
}
