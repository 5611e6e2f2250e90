package layers

import (
	"errors"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/fsutil"
)

// Root returns the entry of the overlay root.
func (l *Layers) Root() (Entry, error) {
	var e Entry
	if err := unix.Stat(l.upper, &e.Stat); err != nil {
		return e, err
	}
	e.Upper = true
	e.Stat.Ino = l.stableIno(e.Stat.Dev, e.Stat.Ino)
	if l.isOpaque(l.upper) {
		return e, nil
	}
	e.Lowers = l.lowerRoots(0)
	e.Stat.Nlink = 1
	var st unix.Stat_t
	e.prot, _ = fsutil.Lstatx(unix.AT_FDCWD, l.lowers[0], &st)
	return e, nil
}

// Lookup finds name in the directory dirRel whose lower directories are
// dir.Lowers. It answers ENOENT for a missing or whited-out name.
func (l *Layers) Lookup(dirRel string, dir Obj, name string) (Entry, error) {
	e, err := l.lookup(dirRel, dir, name)
	if err == nil {
		markInProtected(&e, &dir)
	}
	return e, err
}

func (l *Layers) lookup(dirRel string, dir Obj, name string) (Entry, error) {
	var e Entry
	gen, trusted := l.dirGen.now()
	err := error(unix.ENOENT)
	if !trusted || !dir.absentIn(gen) {
		var up fsutil.Short
		up, err = l.upperAt(Join(dirRel, name))
		if err == nil {
			err = unix.Lstat(up.Path, &e.Stat)
		}
		switch {
		case err == nil && fsutil.IsWhiteout(&e.Stat):
			up.Close()
			return Entry{}, unix.ENOENT
		case err == nil:
			e.Upper = true
			settled, redirect := l.upperAttrs(up.Path, &e)
			up.Close()
			if settled || !e.IsDir() {
				return e, nil
			}
			if redirect != "" {
				// Renamed in its directory by kernel overlayfs, which
				// writes the old name (sbxfs writes absolute redirects).
				name = redirect
			}
		case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ENOTDIR):
			up.Close()
		default:
			up.Close()
			return Entry{}, err
		}
	}
	first, dirs, err := l.stepLowers(dir.Lowers, name, e.Upper)
	if err != nil {
		return Entry{}, err
	}
	switch {
	case e.Upper:
		e.Lowers = dirs
	case first != nil:
		e.Stat, e.prot = first.st, first.prot
		e.Stat.Ino = l.stableIno(first.st.Dev, first.st.Ino)
		if e.IsDir() {
			e.Lowers = dirs
			if trusted {
				e.absentAt = gen + 1
			}
		} else {
			e.Lowers = []Origin{first.origin}
		}
	default:
		return Entry{}, unix.ENOENT
	}
	if e.Upper && len(e.Lowers) > 0 {
		e.Stat.Nlink = 1 // merged directory: a link count would lie
	}
	return e, nil
}

// upperAttrs fills the stable inode number and the lower directories of an
// upper entry from its attributes. It reports true when the lower part is
// settled (a non-directory, an opaque or a directory with an absolute
// redirect); else a directory's relative redirect, if any: the name of
// the lower directory it merges in its parent's (kernel overlayfs writes
// one for a rename inside one directory).
func (l *Layers) upperAttrs(upath string, e *Entry) (bool, string) {
	e.Stat.Ino = l.stableIno(e.Stat.Dev, e.Stat.Ino)
	names, _ := fsutil.LListXattrs(upath)
	has := func(n string) bool {
		for _, x := range names {
			if x == n {
				return true
			}
		}
		return false
	}
	if has(l.ns.protattr) {
		e.prot = l.readProtattr(upath)
	}
	if has(l.ns.origin) {
		if o, ok := l.readOrigin(upath); ok {
			if o.ino != 0 {
				e.Stat.Ino = o.ino
			}
			if !e.IsDir() {
				e.Lowers = []Origin{{Layer: o.layer, Path: o.path}}
			}
		}
	}
	if !e.IsDir() {
		return true, ""
	}
	if has(l.ns.opaque) && l.isOpaque(upath) {
		return true, ""
	}
	if has(l.ns.redirect) {
		r := l.redirectOf(upath)
		if strings.HasPrefix(r, "/") {
			e.Lowers = l.lowerDirsAt(strings.TrimPrefix(r, "/"))
			return true, ""
		}
		if r != "." && r != ".." && !strings.ContainsRune(r, '/') {
			return false, r
		}
	}
	return false, ""
}

type lowerHit struct {
	origin Origin
	st     unix.Stat_t
	prot   fsutil.Protection
}

func (h *lowerHit) isDir() bool { return h.st.Mode&unix.S_IFMT == unix.S_IFDIR }

// stepLowers looks name up in each lower directory, top first, honouring
// whiteouts, opaque directories and redirects of the lower layers. It
// returns the topmost object found and, when that is a directory (or
// upperAbove says an upper directory sits above), every lower directory
// merged beneath it.
func (l *Layers) stepLowers(lowers []Origin, name string, upperAbove bool) (*lowerHit, []Origin, error) {
	var first *lowerHit
	var dirs []Origin
	for i, lo := range lowers {
		o := lo.child(name)
		var st unix.Stat_t
		prot, err := l.lowerLstatx(o, &st)
		if err != nil {
			if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
				continue
			}
			return nil, nil, err
		}
		if fsutil.IsWhiteout(&st) {
			break
		}
		isDir := st.Mode&unix.S_IFMT == unix.S_IFDIR
		if first == nil && !upperAbove {
			first = &lowerHit{origin: o, st: st, prot: prot}
			if !isDir {
				break
			}
		}
		if !isDir {
			break
		}
		dirs = append(dirs, o)
		if o.Layer == len(l.lowers)-1 {
			break
		}
		var opaque bool
		var r string
		_ = l.lowerDo(o, func(p string) error {
			opaque, r = l.isOpaque(p), l.redirectOf(p)
			return nil
		})
		if opaque {
			break
		}
		if r != "" {
			// A layer's directory renamed (an upper serving as a lower):
			// the layers below continue where the redirect points, as in
			// kernel overlayfs.
			below, err := l.redirected(o, r, lowers[i+1:])
			if err != nil {
				return nil, nil, err
			}
			dirs = append(dirs, below...)
			break
		}
	}
	return first, dirs, nil
}

// redirected returns the directories of the layers below o's merged
// beneath o, whose redirect is r: absolute, a path from the roots of those
// layers; relative, a name in the directories of those layers merged
// beneath o's parent (rest). Their Path is o's: where they show in the
// original.
func (l *Layers) redirected(o Origin, r string, rest []Origin) ([]Origin, error) {
	var below []Origin
	switch {
	case strings.HasPrefix(r, "/"):
		below = l.lowerDirsFrom(strings.TrimPrefix(r, "/"), o.Layer+1)
	case r != "." && r != ".." && !strings.Contains(r, "/"):
		var err error
		if _, below, err = l.stepLowers(rest, r, true); err != nil {
			return nil, err
		}
	}
	for i := range below {
		b := &below[i]
		if real := b.layerPath(); real != o.Path {
			b.real = real
		} else {
			b.real = ""
		}
		b.Path = o.Path
	}
	return below, nil
}

// lowerDirsAt resolves a lower path from the lower roots, as a redirect
// names it, and returns the lower directories merged there.
func (l *Layers) lowerDirsAt(path string) []Origin { return l.lowerDirsFrom(path, 0) }

// lowerDirsFrom is lowerDirsAt in the layers from the layer from down.
func (l *Layers) lowerDirsFrom(path string, from int) []Origin {
	cur := l.lowerRoots(from)
	for _, name := range strings.Split(path, "/") {
		if name == "" {
			continue
		}
		_, dirs, err := l.stepLowers(cur, name, true)
		if err != nil {
			return nil
		}
		cur = dirs
	}
	return cur
}

// lowerRoots are the roots of the layers from the layer from down that
// merge, top first: an opaque root hides the layers below it.
func (l *Layers) lowerRoots(from int) []Origin {
	var roots []Origin
	for i := from; i < len(l.lowers); i++ {
		roots = append(roots, Origin{Layer: i})
		if i < len(l.lowers)-1 && l.isOpaque(l.lowers[i]) {
			break
		}
	}
	return roots
}

// lowerDirsOf resolves the lower directories merged beneath the overlay
// directory rel, walking from the root and following the upper layer's
// opaque marks and redirects. Used where no cached parent is at hand.
func (l *Layers) lowerDirsOf(rel string) []Origin {
	root, err := l.Root()
	if err != nil {
		return nil
	}
	cur, dirRel := root.Lowers, ""
	for _, name := range splitRel(rel) {
		e, err := l.Lookup(dirRel, Obj{Lowers: cur}, name)
		if err != nil || !e.IsDir() {
			return nil
		}
		cur, dirRel = e.Lowers, Join(dirRel, name)
	}
	return cur
}

func splitRel(rel string) []string {
	if rel == "" {
		return nil
	}
	return strings.Split(rel, "/")
}

// lowerHas reports whether a lower layer shows something at name in a
// directory whose lower directories are lowers: deleting or replacing that
// name then needs a whiteout.
func (l *Layers) lowerHas(lowers []Origin, name string) (bool, error) {
	first, dirs, err := l.stepLowers(lowers, name, false)
	return first != nil || len(dirs) > 0, err
}

// real says where the current state of the object at rel is: its upper
// copy, whose path (upperAt) the caller closes, or (lower) its original,
// o.Lowers[0], read through lowerfs.go.
func (l *Layers) real(rel string, o Obj) (up fsutil.Short, lower bool, err error) {
	onlyLower := !o.Upper && len(o.Lowers) > 0
	up, err = l.upperAt(rel)
	if err != nil {
		if onlyLower { // not in the upper, as a failed lstat says below
			return fsutil.Short{}, true, nil
		}
		return fsutil.Short{}, false, err
	}
	if !onlyLower {
		return up, false, nil
	}
	var st unix.Stat_t
	if unix.Lstat(up.Path, &st) == nil && !fsutil.IsWhiteout(&st) {
		return up, false, nil
	}
	up.Close()
	return fsutil.Short{}, true, nil
}

// realDo calls f with a path of the current state of the object at rel
// (lowerDo for an original's); f must not follow the last component.
func (l *Layers) realDo(rel string, o Obj, f func(path string) error) error {
	up, lower, err := l.real(rel, o)
	if err != nil {
		return err
	}
	if !lower {
		defer up.Close()
		return f(up.Path)
	}
	return l.lowerDo(o.Lowers[0], f)
}

// Stat returns the attributes of the object at rel (the inode number is the
// real one; callers substitute the stable number they hold).
//
// One lstat of the upper path answers both questions real asks and the
// attributes (until 2026-11-27 a merged directory's GETATTR, which the
// kernel sends after every create or unlink in it, made three).
func (l *Layers) Stat(rel string, o Obj) (unix.Stat_t, error) {
	var st unix.Stat_t
	err := l.upperLstat(rel, &st)
	if !o.Upper && len(o.Lowers) > 0 && (err != nil || fsutil.IsWhiteout(&st)) {
		// Not in the upper (as real decides): the original's.
		st = unix.Stat_t{}
		return st, l.lowerLstat(o.Lowers[0], &st)
	}
	if err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR && len(o.Lowers) > 0 {
		st.Nlink = 1 // merged directory: a link count would lie
	}
	return st, err
}

func (l *Layers) inUpper(rel string) bool {
	var st unix.Stat_t
	return l.upperLstat(rel, &st) == nil && !fsutil.IsWhiteout(&st)
}

// upperLstat is lstat of rel in the upper (upperAt).
func (l *Layers) upperLstat(rel string, st *unix.Stat_t) error {
	return l.UpperDo(rel, func(p string) error { return unix.Lstat(p, st) })
}

// upperOpaque reports whether the upper directory at rel is opaque.
func (l *Layers) upperOpaque(rel string) (opaque bool) {
	_ = l.UpperDo(rel, func(p string) error { opaque = l.isOpaque(p); return nil })
	return opaque
}

// Readlink returns the target of the symlink at rel.
func (l *Layers) Readlink(rel string, o Obj) (string, error) {
	up, lower, err := l.real(rel, o)
	if err != nil {
		return "", err
	}
	if lower {
		return l.lowerReadlink(o.Lowers[0])
	}
	defer up.Close()
	buf := make([]byte, unix.PathMax)
	n, err := unix.Readlink(up.Path, buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}
