package commit

import (
	"bytes"
	"crypto/sha1"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/fsutil"
	"github.com/sbxfs/sbxfs/layers"
)

// binarySniff is how many leading bytes decide whether content is binary
// (a NUL among them), as in git.
const binarySniff = 8000

// diffSide is one side of a change: the object at a path of one layer.
type diffSide struct {
	exists bool
	mode   uint32 // st_mode, type bits included
	size   int64
	target string // symlink target
	data   []byte // content; only the first binarySniff bytes when binary
	binary bool
	sum    [sha256.Size]byte // of the whole content, for binary files
	// blob is git's object id of the whole content of a binary file read
	// only in part (blobID); hasBlob says it is set.
	blob    [sha1.Size]byte
	hasBlob bool
	// whiteout marks an upper's whiteout (character device 0/0): the
	// path is deleted there, not present.
	whiteout bool
}

func (s *diffSide) typ() uint32 { return s.mode & unix.S_IFMT }

// hasContent reports whether the side is diffed by content: a regular
// file or a symlink (whose content is its target, as in git).
func (s *diffSide) hasContent() bool {
	return s.exists && (s.typ() == unix.S_IFREG || s.typ() == unix.S_IFLNK)
}

// lines returns the content as lines.
func (s *diffSide) lines() []string {
	if s.typ() == unix.S_IFLNK {
		return []string{s.target}
	}
	return splitLines(s.data)
}

// diffPair is one change with both of its sides read.
type diffPair struct {
	c          layers.Change
	oldPath    string // where the old side is in the original ("" if none)
	newPath    string // the path in the sandbox ("" if deleted)
	old, new   diffSide
	hasBeneath bool // another change lies beneath this path
	// impliedBy: in the listing forms, the path of the entry (a renamed,
	// removed or replaced directory) that moves or drops this object,
	// which is no change of its own.
	impliedBy string
	patchExtras
}

// pairOpts are what the patch reads beyond what the other forms need,
// and what the listing forms need.
type pairOpts struct {
	fullBinary bool // read binary files whole, for git's binary patch
	patch      bool // read the patchExtras
	// listing hands fn the changes as Listing shows them, and after
	// each the original's files the patch would name with it that no
	// entry names (eachListedExtra).
	listing bool
	// noContent reads types, modes, sizes and symlink targets only;
	// head reads only as much content as tells a binary file.
	noContent, head bool
	// dropsOnly leaves out the files a renamed directory moves, and what
	// it drops (StatusListing).
	dropsOnly bool
}

// diffReader reads the two layers of a sandbox, never following a
// symlink in any component and never leaving either root.
type diffReader struct {
	upper, orig int // O_PATH directory descriptors
	// For a sandbox over several lower layers, the original is their
	// merged view: view finds each path's layer, whose root is lowers[i]
	// (O_PATH); orig is the top layer's.
	view    *layers.LowerView
	lowers  []int
	renamed map[string]string
	opts    pairOpts
	// For the patch (diffpatch.go): the changes by sandbox path; the
	// original paths of renames; the original paths some change the
	// patch writes compares with (olds), with the same path (inPlace).
	changes                map[string]layers.Change
	sources, olds, inPlace map[string]bool
	gone                   map[string]bool // deletions added (addGone)
	recreated              map[string]bool // made again where the original has one (findRecreated)
	// For the listing forms: the original paths the Listing names
	// removed, which addGone leaves to it.
	listedRemovals map[string]bool
	// parents keeps the directory of the last object read beneath each
	// root open.
	parents parentDirs
}

func openDiffReader(cfg layers.Config, cs layers.ChangeSet, opts pairOpts) (*diffReader, error) {
	if cfg.Upper == "" || len(cfg.Lowers) == 0 {
		return nil, fmt.Errorf("diff: the layers need an upper and an original")
	}
	r := &diffReader{upper: -1, orig: -1, renamed: map[string]string{}, opts: opts, changes: map[string]layers.Change{},
		sources: map[string]bool{}, olds: map[string]bool{}, inPlace: map[string]bool{}, gone: map[string]bool{}, parents: parentDirs{}}
	var err error
	if r.upper, err = unix.Open(cfg.Upper, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err != nil {
		return nil, fmt.Errorf("diff: open upper %q: %w", cfg.Upper, err)
	}
	if r.orig, err = unix.Open(cfg.Lowers[0], unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err != nil {
		r.close()
		return nil, fmt.Errorf("diff: open original %q: %w", cfg.Lowers[0], err)
	}
	if len(cfg.Lowers) > 1 {
		if err := r.openLowers(cfg); err != nil {
			r.close()
			return nil, err
		}
	}
	for _, c := range cs.Changes {
		if c.Kind == layers.Renamed {
			r.renamed[c.Path] = c.From
			r.sources[c.From] = true
		}
	}
	if err := r.findRecreated(cs.Changes); err != nil {
		r.close()
		return nil, err
	}
	for _, c := range cs.Changes {
		c = r.shown(c)
		if old, ok := r.oldPathOf(c); ok && old == c.Path && !r.listedElsewhere(c) {
			r.inPlace[old] = true
		}
	}
	for _, c := range cs.Changes {
		c = r.shown(c)
		r.changes[c.Path] = c
		if r.movedInDeletion(c) {
			continue
		}
		if r.listedElsewhere(c) {
			r.olds[c.Original] = true
			if c.Replaced != "" {
				r.olds[c.Replaced] = true
			}
			continue
		}
		if old, ok := r.oldPathOf(c); ok {
			r.olds[old] = true
		}
	}
	return r, nil
}

// listedElsewhere reports whether the listing forms name c, a removal,
// by original paths other than its own (Listing): the original's object
// at c.Path, if any, is not the one c removed. After rm -r n0; mkdir -p
// n0/b; an exchange of e/f and n0/b; mv n0/b/y e/f/n3, the change at
// n0/b/y removes e/f/y (the exchange brought it there), while the
// original's own n0/b/y went with the original n0/b, which the walk of
// that replaced directory lists (TestListingsNameARemovalCarriedOff-
// ByANewDirectory). The patch still reads c at its own path.
func (r *diffReader) listedElsewhere(c layers.Change) bool {
	return r.opts.listing && c.Kind == layers.Deleted && c.Original != "" && c.Original != c.Path
}

// findRecreated finds the files and symlinks the sandbox made beneath a
// directory it made in place of the original's (rm -r d; mkdir d; a file
// at a path the original has one: git checkout, a build that cleans its
// output first, npm ci). The change set has them new, as the commit
// applies them (the new directory replaces the original's whole); shown,
// each compares with the original's object at its path, as git compares
// them (shown). Before, status listed them removed and made (D and A of
// one path), and the patch deleted each twice (git apply refused it).
func (r *diffReader) findRecreated(changes []layers.Change) error {
	replacing := map[string]bool{} // new directories where the original has one
	for _, c := range changes {
		if c.Kind == layers.Created && c.Type == "dir" && !r.movedAway(c.Path) {
			t, err := r.origType(c.Path)
			if err != nil {
				return err
			}
			replacing[c.Path] = t == "dir"
		}
	}
	r.recreated = map[string]bool{}
	for _, c := range changes {
		if c.Kind != layers.Created || c.Type == "dir" || !underAny(replacing, c.Path) || r.movedAway(c.Path) {
			continue
		}
		t, err := r.origType(c.Path)
		if err != nil {
			return err
		}
		r.recreated[c.Path] = t != "" && t != "dir"
	}
	return nil
}

// underAny reports whether a proper ancestor of p is in set.
func underAny(set map[string]bool, p string) bool {
	for {
		i := strings.LastIndexByte(p, '/')
		if i < 0 {
			return false
		}
		p = p[:i]
		if set[p] {
			return true
		}
	}
}

// movedAway reports whether the original's object at p, or a directory
// above it, is renamed elsewhere.
func (r *diffReader) movedAway(p string) bool {
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

// shown is c as the diff forms and the listing show it: a file the
// sandbox made again where the original has one (findRecreated) is
// modified.
func (r *diffReader) shown(c layers.Change) layers.Change {
	if c.Kind == layers.Created && r.recreated[c.Path] {
		c.Kind = layers.Modified
	}
	return c
}

// oldPathOf is the original path c compares with (false for a new
// object).
func (r *diffReader) oldPathOf(c layers.Change) (string, bool) {
	switch {
	case c.Kind == layers.Created || c.Kind == layers.Linked:
		return "", false
	case c.Kind == layers.Deleted && c.Original != "" && c.Original == c.Path:
		return c.Original, true // a Listing's removal: an original path
	}
	return r.counterpart(c.Path), true
}

func (r *diffReader) close() {
	r.parents.close()
	if r.view != nil {
		r.view.Close()
	}
	for _, fd := range append([]int{r.upper, r.orig}, r.lowers...) {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
}

// counterpart is the original path of what is at p in the sandbox: p
// translated through its nearest renamed ancestor (or its own rename).
func (r *diffReader) counterpart(p string) string { return layers.Counterpart(r.renamed, p) }

// pair reads both sides of c. beneath tells whether another change of
// the set lies under c.Path.
func (r *diffReader) pair(c layers.Change, beneath bool) (*diffPair, error) {
	d := &diffPair{c: c, hasBeneath: beneath}
	cp := r.counterpart(c.Path)
	var err error
	if old, ok := r.oldPathOf(c); ok {
		d.oldPath = old
		if d.old, err = r.readOrig(old, r.opts); err != nil {
			return nil, fmt.Errorf("diff %q: original %q: %w", c.Path, old, err)
		}
	}
	if c.Kind != layers.Deleted {
		d.newPath = c.Path
		if d.new, err = r.readSide(r.upper, c.Path, r.opts); err != nil {
			return nil, fmt.Errorf("diff %q: upper: %w", c.Path, err)
		}
		if !d.new.exists || d.new.whiteout {
			// Not copied up: a child of a renamed directory shows the original.
			if d.new, err = r.readOrig(cp, r.opts); err != nil {
				return nil, fmt.Errorf("diff %q: original %q: %w", c.Path, cp, err)
			}
		}
	}
	if r.opts.patch || r.opts.listing {
		err = r.readPatchExtras(d)
	}
	if err == nil && r.opts.listing {
		err = r.readMovedSides(d)
	}
	if err != nil {
		return nil, fmt.Errorf("diff %q: %w", c.Path, err)
	}
	return d, nil
}

// readSide reads the object at rel beneath the directory root. A missing
// object, or one behind a non-directory or a symlink, gives a side that
// does not exist.
func (r *diffReader) readSide(root int, rel string, opts pairOpts) (diffSide, error) {
	var s diffSide
	var st unix.Stat_t
	dir, base, ok, err := lstatBeneath(root, rel, &st, r.parents)
	if err != nil || !ok {
		return s, err
	}
	s.exists, s.mode, s.size = true, st.Mode, st.Size
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFLNK:
		s.target, err = readlinkAt(dir, base)
		s.size = int64(len(s.target))
	case unix.S_IFREG:
		if !opts.noContent {
			err = s.readFile(dir, base, opts)
		}
	case unix.S_IFCHR:
		s.whiteout = fsutil.IsWhiteout(&st)
	}
	return s, err
}

// lstatBeneath stats rel beneath root without following symlinks. When
// the object exists it returns the directory that holds it (root itself
// for the root) and its name there. That directory is dirs' when dirs is
// not nil, else the caller closes it (unless it is root).
func lstatBeneath(root int, rel string, st *unix.Stat_t, dirs parentDirs) (int, string, bool, error) {
	clean, err := fsutil.CleanRel(rel)
	if err != nil {
		return -1, "", false, err
	}
	dir, base := root, ""
	if clean != "" {
		base = path.Base(clean)
		if dirs != nil {
			dir, err = dirs.open(root, path.Dir(clean))
		} else {
			dir, err = fsutil.OpenDirBeneath(root, clean)
		}
		if err != nil {
			if absent(err) {
				err = nil
			}
			return -1, "", false, err
		}
	}
	if err := unix.Fstatat(dir, base, st, unix.AT_SYMLINK_NOFOLLOW|unix.AT_EMPTY_PATH); err != nil {
		if dir != root && dirs == nil {
			unix.Close(dir)
		}
		if absent(err) {
			err = nil
		}
		return -1, "", false, err
	}
	return dir, base, true, nil
}

// parentDirs keeps, for each root, the directory of the last object
// looked at beneath it open: a diff reads its pairs in path order, so the
// next object mostly lies in the same directory (one openat2 a directory,
// not one an object). Only diff and status read through it: an object
// whose directory moved since is read where it went, as a read made a
// moment earlier would have.
type parentDirs map[int]*parentDir

// parentDir is a directory beneath a root, open, or the error that told
// it is absent (a new directory of the sandbox, looked for in the
// original: every object in it is absent there).
type parentDir struct {
	rel string
	fd  int
	err error
}

// open returns the directory dirRel beneath root (root itself for "."),
// which stays dirs' to close.
func (dirs parentDirs) open(root int, dirRel string) (int, error) {
	if dirRel == "." {
		return root, nil
	}
	if d := dirs[root]; d != nil {
		if d.rel == dirRel {
			return d.fd, d.err
		}
		d.release()
		delete(dirs, root)
	}
	fd, err := fsutil.OpenBeneath(root, dirRel, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		err = fmt.Errorf("open parent %q: %w", dirRel, err)
		if !absent(err) {
			return -1, err
		}
	}
	dirs[root] = &parentDir{rel: dirRel, fd: fd, err: err}
	return fd, err
}

func (d *parentDir) release() {
	if d.fd >= 0 {
		unix.Close(d.fd)
	}
}

func (dirs parentDirs) close() {
	for root, d := range dirs {
		d.release()
		delete(dirs, root)
	}
}

// origType is the type name of the original's object at rel ("" when
// there is none).
func (r *diffReader) origType(rel string) (string, error) {
	root, rel, ok, err := r.inOrig(rel)
	if err != nil || !ok {
		return "", err
	}
	var st unix.Stat_t
	if _, _, ok, err := lstatBeneath(root, rel, &st, r.parents); err != nil || !ok {
		return "", err
	}
	return layers.TypeName(st.Mode), nil
}

func absent(err error) bool {
	return errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP)
}

func readlinkAt(dir int, name string) (string, error) {
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, err := unix.Readlinkat(dir, name, buf)
		if err != nil {
			return "", fmt.Errorf("readlink: %w", err)
		}
		if n < size {
			return string(buf[:n]), nil
		}
	}
}

// readFile reads the content: only the first binarySniff bytes when they
// hold a NUL (unless opts.fullBinary) or with opts.head, all of it
// otherwise.
func (s *diffSide) readFile(dir int, name string, opts pairOpts) error {
	fd, err := unix.Openat(dir, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return fmt.Errorf("open: %w", err)
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	// As much as the file held when it was stat'ed (and a byte more, to
	// tell it grew since), up to the sniff: most files are small.
	head := make([]byte, min(s.size+1, binarySniff))
	n, err := io.ReadFull(f, head)
	if err == nil && n < binarySniff {
		head = append(head, make([]byte, binarySniff-n)...) // it grew: sniff as much as ever
		var m int
		m, err = io.ReadFull(f, head[n:])
		n += m
	}
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("read: %w", err)
	}
	s.data = head[:n]
	if s.binary = bytes.IndexByte(s.data, 0) >= 0; opts.head {
		return nil
	}
	if s.binary && !opts.fullBinary {
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			return fmt.Errorf("stat: %w", err)
		}
		h, blob := sha256.New(), newBlobHash(st.Size)
		w := io.MultiWriter(h, blob)
		w.Write(s.data) // hashes do not fail
		if _, err := io.Copy(w, f); err != nil {
			return fmt.Errorf("read: %w", err)
		}
		h.Sum(s.sum[:0])
		blob.Sum(s.blob[:0])
		s.hasBlob = true
		return nil
	}
	if n == binarySniff {
		rest, err := io.ReadAll(f)
		if err != nil {
			return fmt.Errorf("read: %w", err)
		}
		s.data = append(s.data, rest...)
	}
	if s.binary {
		s.sum = sha256.Sum256(s.data)
	}
	return nil
}
