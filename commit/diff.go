package commit

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/layers"
)

// Diff renders a change set as git does, reading exactly the objects the
// change set names (never walking a tree). Each change has an old side,
// the original's object (at From for a rename, at the path translated
// through its renamed ancestor for a child of a renamed directory, else at
// the path), and a new side, the sandbox's object (from the upper, or the
// original's for a child of a renamed directory that was not copied up).
//
// The patch applies with git apply (and patch -p1) to a copy of the
// original and gives the sandbox's files and symlinks, with their content
// and executable bits (with Binary also binary files; without it they
// show as "Binary files ... differ", as in git). Where git has no form,
// the output says in plain words, on lines git apply passes over:
//   - "new directory P" / "deleted directory P" for a created or deleted
//     directory no other change lies beneath (git shows directories only
//     through their files);
//   - "renamed directory A -> B", followed by a rename of every file and
//     symlink that moves with it (git names each);
//   - "new fifo P", "deleted device P", "renamed socket A -> B" for the
//     objects git does not hold;
//   - "mode changed P 040755 -> 040700" for a directory or one of those;
//   - "metadata changed P" for an owner, time or xattr change (a change of
//     the permission bits of a file shows as old mode / new mode);
//   - modes are the real st_mode in octal (100640 stays 100640), not
//     git's normalised 100644/100755.
//
// A path under a renamed directory shows its original path on the a/ side
// and rename lines (diff --git a/old/f b/new/f), as in git.

// DiffOptions select the output form.
type DiffOptions struct {
	// Context is the number of context lines around a change: 0 means
	// the default 3, a negative value means none (git's -U0).
	Context int
	// Binary writes the content of binary files as git's binary patch
	// (git diff --binary, with full index lines), which git apply
	// applies.
	Binary bool
}

func (o DiffOptions) context() int {
	switch {
	case o.Context == 0:
		return 3
	case o.Context < 0:
		return 0
	}
	return o.Context
}

// Diff writes a git-style unified patch of the change set of the sandbox
// whose layers are cfg (cfg.Lowers[0] is the original, cfg.Upper the
// upper) to w.
func Diff(w io.Writer, cfg layers.Config, cs layers.ChangeSet, opt DiffOptions) error {
	bw := bufio.NewWriter(w)
	var rest spool
	defer rest.close()
	out := &patchOut{first: bw, rest: &rest}
	err := eachDiffPair(cfg, cs, pairOpts{fullBinary: opt.Binary, patch: true}, func(d *diffPair) error { return writePatch(out, d, opt) })
	if err == nil {
		err = rest.copyTo(bw)
	}
	if err != nil {
		return err
	}
	return bw.Flush()
}

// patchOut is where the patch goes: git apply takes an entry that
// creates or changes a path as acting on what earlier entries left there,
// so a deletion of an original path the change set reaches from another
// path (beneath a renamed directory, a file a renamed directory moved and
// something replaced) comes first, before an entry that may make a new
// object at that path; the rest follows in change-set order.
type patchOut struct {
	first io.Writer
	rest  *spool
}

// eachDiffPair reads the sides of every change, in change-set order (in
// Listing order with opts.listing), and hands them to fn.
func eachDiffPair(cfg layers.Config, cs layers.ChangeSet, opts pairOpts, fn func(*diffPair) error) error {
	r, err := openDiffReader(cfg, cs, opts)
	if err != nil {
		return err
	}
	defer r.close()
	changes := slices.Clone(cs.Changes)
	if opts.listing {
		changes = cs.Listing()
	}
	for i := range changes {
		changes[i] = r.shown(changes[i])
	}
	if opts.listing {
		r.leaveToListing(changes)
	}
	dirs := map[string]bool{} // every proper ancestor of a changed path
	for _, c := range changes {
		for p := c.Path; ; {
			i := strings.LastIndexByte(p, '/')
			if i < 0 {
				break
			}
			p = p[:i]
			dirs[p] = true
		}
	}
	deleted := map[string]bool{} // the original paths the patch deletes by a removal
	for _, c := range changes {
		if opts.patch && r.movedInDeletion(c) {
			continue
		}
		if old, ok := r.oldPathOf(c); opts.patch && ok && c.Kind == layers.Deleted {
			// The change set may name the removal of one original
			// object at two paths: where it was removed, and an old
			// path of it that took the lineage of the directory above
			// (mv x y; mv y/d z; mkdir y/d; a file made at y/d/f and
			// removed; rm z/f: x/d/f at z/f and at y/d/f). git apply
			// refuses a second deletion of a path.
			if deleted[old] {
				continue
			}
			deleted[old] = true
		}
		d, err := r.pair(c, dirs[c.Path])
		if err != nil {
			return err
		}
		if err := fn(d); err != nil {
			return err
		}
		if opts.listing {
			if err := eachListedExtra(d, fn); err != nil {
				return err
			}
		}
	}
	return nil
}

// eachListedExtra hands fn, after a pair, a pair for each file it moves
// (a renamed directory's files, as renames) and each original file it
// drops that no entry names (beneath a directory it removes or
// replaces, or one another object took the place of in a renamed
// directory, as removals), both with impliedBy set.
func eachListedExtra(d *diffPair, fn func(*diffPair) error) error {
	for _, m := range d.moved {
		moved := diffPair{
			c:       layers.Change{Path: m.to, Kind: layers.Renamed, From: m.from, Type: layers.TypeName(m.side.mode)},
			oldPath: m.from, newPath: m.to, old: m.side, new: m.side, impliedBy: d.c.Path,
		}
		if err := fn(&moved); err != nil {
			return err
		}
	}
	for i := range d.gone {
		g := &d.gone[i]
		g.c.Type, g.impliedBy = layers.TypeName(g.old.mode), d.c.Path
		if err := fn(g); err != nil {
			return err
		}
	}
	return nil
}

// listedKey is where a pair of the listing forms sorts, as git sorts its
// output: by path (a removal by its old one), a removal before a new
// object at the same path.
type listedKey struct {
	path    string
	removal bool
}

func keyOf(d *diffPair) listedKey {
	if d.c.Kind == layers.Deleted {
		return listedKey{d.c.Path, true}
	}
	return listedKey{d.c.Path, false}
}

func compareListed(a, b listedKey) int {
	if n := strings.Compare(a.path, b.path); n != 0 {
		return n
	}
	switch {
	case a.removal == b.removal:
		return 0
	case a.removal:
		return -1
	}
	return 1
}

// diffContent is the content comparison of a pair.
type diffContent struct {
	binary, differs bool
	a, b            []string // lines of the old and new content
	script          []diffLine
}

// content compares the content of the two sides. Objects without content
// (directories, devices) compare as empty.
func (d *diffPair) content() diffContent {
	old, new := &d.old, &d.new
	var dc diffContent
	if !old.hasContent() && !new.hasContent() {
		return dc
	}
	dc.binary = old.binary || new.binary
	if dc.binary {
		dc.differs = !old.hasContent() || !new.hasContent() || old.size != new.size || old.sum != new.sum
		return dc
	}
	if old.hasContent() {
		dc.a = old.lines()
	}
	if new.hasContent() {
		dc.b = new.lines()
	}
	if old.exists && new.exists && old.typ() != new.typ() {
		// A type change replaces one object by another.
		dc.script = append(diffLines(dc.a, nil), diffLines(nil, dc.b)...)
		dc.differs = true
		return dc
	}
	dc.script = diffLines(dc.a, dc.b)
	for _, l := range dc.script {
		dc.differs = dc.differs || l.op != ' '
	}
	return dc
}

// writePatch writes the patch of one change.
func writePatch(out *patchOut, d *diffPair, opt DiffOptions) error {
	if d.replaced != nil || len(d.gone) > 0 {
		if d.replaced != nil {
			del := diffPair{c: layers.Change{Path: d.newPath, Kind: layers.Deleted}, oldPath: d.newPath, old: *d.replaced}
			if err := writePatch(out, &del, opt); err != nil {
				return err
			}
		}
		for i := range d.gone {
			d.gone[i].first = true
			if err := writePatch(out, &d.gone[i], opt); err != nil {
				return err
			}
		}
		rest := *d
		rest.replaced, rest.gone = nil, nil
		d = &rest
	}
	old, new := &d.old, &d.new
	switch {
	case !old.exists && !new.exists:
		return nil
	case old.exists && new.exists && old.typ() != new.typ():
		// A type change is a deletion and a creation, as in git.
		// (Of a copy, only the creation: the old object stays.)
		del, add := *d, *d
		del.new, del.newPath = diffSide{}, ""
		del.first = d.oldPath != d.newPath
		add.old, add.oldPath, add.patchExtras = diffSide{}, "", patchExtras{}
		if !d.copied {
			if err := writePatch(out, &del, opt); err != nil {
				return err
			}
		}
		return writePatch(out, &add, opt)
	}
	var w io.Writer = out.rest
	if d.first && !new.exists {
		w = out.first
	}
	switch {
	case !old.exists && new.typ() == unix.S_IFDIR:
		return writeDirLine(w, d, "new directory ", d.newPath)
	case !new.exists && old.typ() == unix.S_IFDIR:
		return writeDirLine(w, d, "deleted directory ", d.oldPath)
	case !inGit(old) || !inGit(new):
		if err := writePlain(w, d); err != nil {
			return err
		}
		return writeMoved(w, d)
	}
	aName, bName := d.oldPath, d.newPath
	if !old.exists {
		aName = bName
	}
	if !new.exists {
		bName = aName
	}
	hdr := patchHeader(d)
	dc := d.content()
	if len(hdr) == 0 && !dc.differs {
		label := "metadata changed "
		if d.c.Kind != layers.Metadata {
			label = "changed "
		}
		_, err := io.WriteString(w, label+gitQuote(d.c.Path)+"\n")
		return err
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "diff --git %s %s\n", gitQuote("a/"+aName), gitQuote("b/"+bName))
	for _, h := range hdr {
		b.WriteString(h + "\n")
	}
	switch {
	case !dc.differs:
	case dc.binary && opt.Binary:
		writeBinaryPatch(&b, old, new)
	case dc.binary:
		// The index line tells git apply where this patch ends and that
		// it cannot apply it ("without full index line"); without one it
		// misreads the patches that follow.
		fmt.Fprintf(&b, "index %s..%s\nBinary files %s and %s differ\n", abbrevBlobID(old), abbrevBlobID(new), sideName(old, "a/", aName), sideName(new, "b/", bName))
	default:
		fmt.Fprintf(&b, "--- %s\n+++ %s\n", fileLineName(old, "a/", aName), fileLineName(new, "b/", bName))
	}
	if _, err := w.Write(b.Bytes()); err != nil {
		return err
	}
	if !dc.differs || dc.binary {
		return nil
	}
	return writeHunks(w, dc.a, dc.b, dc.script, opt.context())
}

// inGit reports whether git holds the object of a side (a missing one
// too): a regular file or a symlink.
func inGit(s *diffSide) bool {
	return !s.exists || s.typ() == unix.S_IFREG || s.typ() == unix.S_IFLNK
}

// writePlain writes, in plain words, a change git has no form for: of a
// directory (renamed, or its mode), or of a FIFO, socket or device.
func writePlain(w io.Writer, d *diffPair) error {
	old, new := &d.old, &d.new
	var b strings.Builder
	switch {
	case !old.exists:
		fmt.Fprintf(&b, "new %s %s\n", typeWord(new), gitQuote(d.newPath))
	case !new.exists:
		fmt.Fprintf(&b, "deleted %s %s\n", typeWord(old), gitQuote(d.oldPath))
	default:
		if d.oldPath != d.newPath {
			fmt.Fprintf(&b, "renamed %s %s -> %s\n", typeWord(new), gitQuote(d.oldPath), gitQuote(d.newPath))
		}
		if old.mode != new.mode {
			fmt.Fprintf(&b, "mode changed %s %06o -> %06o\n", gitQuote(d.newPath), old.mode, new.mode)
		}
		if b.Len() == 0 {
			label := "metadata changed "
			if d.c.Kind != layers.Metadata {
				label = "changed "
			}
			b.WriteString(label + gitQuote(d.c.Path) + "\n")
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// writeMoved writes the renames of the files a renamed directory moves.
func writeMoved(w io.Writer, d *diffPair) error {
	var b strings.Builder
	for _, m := range d.moved {
		fmt.Fprintf(&b, "diff --git %s %s\n", gitQuote("a/"+m.from), gitQuote("b/"+m.to))
		if m.symlink && !m.copied {
			b.WriteString(symlinkModeLines + "\n")
		}
		b.WriteString("similarity index 100%\n")
		for _, l := range moveLines(m.from, m.to, m.copied) {
			b.WriteString(l + "\n")
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// moveLines are the header lines of an object moved from one path to
// another: a rename, or a copy when the patch changes the first path in
// place too.
func moveLines(from, to string, copied bool) []string {
	verb := "rename"
	if copied {
		verb = "copy"
	}
	return []string{verb + " from " + gitQuote(from), verb + " to " + gitQuote(to)}
}

// typeWord names the type of a side's object in a plain-words line.
func typeWord(s *diffSide) string {
	if s.typ() == unix.S_IFDIR {
		return "directory"
	}
	return layers.TypeName(s.mode)
}

// writeDirLine writes the line of a created or deleted directory, unless
// changes beneath it show it already.
func writeDirLine(w io.Writer, d *diffPair, label, p string) error {
	if d.hasBeneath {
		return nil
	}
	_, err := io.WriteString(w, label+gitQuote(p)+"\n")
	return err
}

// symlinkModeLines name the mode of a symlink that moves. git apply
// takes a symlink as gone from its old path (and a file made beneath that
// path, after mv l m; mkdir l; touch l/x, as not beyond a symlink) only
// when the entry that moves it says it is one.
const symlinkModeLines = "old mode 120777\nnew mode 120777"

// patchHeader returns the extended header lines of a pair: file modes
// (also of a symlink that moves: symlinkModeLines) and renames.
func patchHeader(d *diffPair) []string {
	old, new := &d.old, &d.new
	var hdr []string
	switch {
	case !old.exists:
		hdr = append(hdr, fmt.Sprintf("new file mode %06o", new.mode))
	case !new.exists:
		hdr = append(hdr, fmt.Sprintf("deleted file mode %06o", old.mode))
	default:
		if old.mode != new.mode || old.typ() == unix.S_IFLNK && d.oldPath != d.newPath && !d.copied {
			hdr = append(hdr, fmt.Sprintf("old mode %06o", old.mode), fmt.Sprintf("new mode %06o", new.mode))
		}
		if d.oldPath != d.newPath {
			// Renamed, or beneath a renamed directory.
			hdr = append(hdr, moveLines(d.oldPath, d.newPath, d.copied)...)
		}
	}
	return hdr
}

func sideName(s *diffSide, prefix, p string) string {
	if !s.exists {
		return "/dev/null"
	}
	return gitQuote(prefix + p)
}

// fileLineName is a name of a ---/+++ line: git ends one holding a space
// with a tab, so that a trailing space stays visible to patch(1).
func fileLineName(s *diffSide, prefix, p string) string {
	n := sideName(s, prefix, p)
	if strings.Contains(n, " ") {
		n += "\t"
	}
	return n
}

// gitQuote returns p as is, or C-quoted in double quotes as git quotes
// paths when p holds control characters, '"', '\' or bytes that are not
// UTF-8. Inside the quotes, valid UTF-8 stays as it is (git's
// core.quotePath=false) and every other byte that needs it is escaped.
func gitQuote(p string) string {
	needs := false
	for i, r := range p {
		if r == '"' || r == '\\' || unicode.IsControl(r) || (r == utf8.RuneError && !validAt(p, i)) {
			needs = true
			break
		}
	}
	if !needs {
		return p
	}
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(p); {
		r, size := utf8.DecodeRuneInString(p[i:])
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r < 0x80 && strings.ContainsRune("\a\b\t\n\v\f\r", r):
			b.WriteByte('\\')
			b.WriteByte("abtnvfr"[strings.IndexRune("\a\b\t\n\v\f\r", r)])
		case (r == utf8.RuneError && size == 1) || unicode.IsControl(r):
			for _, c := range []byte(p[i : i+size]) {
				fmt.Fprintf(&b, "\\%03o", c)
			}
		default:
			b.WriteString(p[i : i+size])
		}
		i += size
	}
	b.WriteByte('"')
	return b.String()
}

// validAt reports whether the RuneError at p[i] is the real U+FFFD.
func validAt(p string, i int) bool {
	_, size := utf8.DecodeRuneInString(p[i:])
	return size > 1
}
