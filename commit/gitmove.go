package commit

import (
	"errors"
	"fmt"
	"io"
	"path"
	"strings"

	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/object"

	"github.com/sbxfs/sbxfs/fsutil"
	"github.com/sbxfs/sbxfs/layers"
)

// GitMove is a path of the original the sandbox renamed (to To) or
// removed (To is empty). A git commit records what HEAD has at From (a
// file, or the files beneath a directory) at the same places beneath To,
// with HEAD's content (a change of their own, listed among the paths,
// records its new state), and moves their index entries likewise, as
// git mv does: files git does not track stay untracked, a staged change
// stays staged. Every rename counts, a file's too: a file renamed out of
// a renamed directory leaves it. A removal takes out what HEAD and the
// index have beneath From, but for what a rename from beneath it moved
// away first: the change set names a removal by the path its object had
// last, which need not be where git has it (mv d e; rm -r e).
type GitMove struct {
	From, To string
}

// GitMoves lists the renames and removals of the changes, for
// GitCommitOptions.Moves.
func GitMoves(changes []layers.Change) []GitMove {
	var out []GitMove
	for _, c := range changes {
		switch {
		case c.Kind == layers.Renamed && isGitDir(c.From):
			// Out of a .git directory: an addition (GitPaths has it).
		case c.Kind == layers.Renamed && isGitDir(c.Path):
			out = append(out, GitMove{From: c.From}) // into one: a removal
		case c.Kind == layers.Renamed:
			out = append(out, GitMove{From: c.From, To: c.Path})
		case c.Kind == layers.Deleted:
			from := c.Path
			if c.Original != "" {
				from = c.Original
			}
			if !isGitDir(from) {
				out = append(out, GitMove{From: from})
			}
		}
	}
	return out
}

// gitMoves are the renames and removals of a commit, work-tree-relative
// to the top.
type gitMoves []GitMove

// destinations lists where the moves put something.
func (m gitMoves) destinations() []string {
	var out []string
	for _, mv := range m {
		if mv.To != "" {
			out = append(out, mv.To)
		}
	}
	return out
}

func (g *gitWork) workMoves(moves []GitMove) (gitMoves, error) {
	var out gitMoves
	for _, m := range moves {
		ends := []string{m.From}
		if m.To != "" {
			ends = append(ends, m.To)
		}
		clean, err := g.workPaths(ends)
		if err != nil {
			return nil, err
		}
		if len(clean) != len(ends) || m.From == "" {
			return nil, fmt.Errorf("git commit: a rename of %q to %q: %w", m.From, m.To, fsutil.ErrPathEscapes)
		}
		from, _ := fsutil.CleanRel(m.From)
		w := GitMove{From: path.Join(g.prefix, from)}
		if m.To != "" {
			to, _ := fsutil.CleanRel(m.To)
			w.To = path.Join(g.prefix, to)
		}
		out = append(out, w)
	}
	return out, nil
}

// translate is where p (a path of HEAD or the index) is after the moves:
// at or beneath the target of the nearest source at or above it. moved
// is false for a path at or beneath no source. gone is true for a path
// whose nearest source is a removal, or that lands at or beneath a
// target other than its own move's, deeper than that: that rename
// replaced what was there (the sandbox cannot rename a directory over
// one that is not empty).
func (ms gitMoves) translate(p string) (to string, moved, gone bool) {
	best := -1
	for i, m := range ms {
		if (p == m.From || strings.HasPrefix(p, m.From+"/")) && (best < 0 || len(m.From) > len(ms[best].From) ||
			len(m.From) == len(ms[best].From) && m.To != "") {
			best = i
		}
	}
	to, own := p, ""
	if best >= 0 {
		if ms[best].To == "" {
			return p, false, true
		}
		to, own, moved = ms[best].To+p[len(ms[best].From):], ms[best].To, true
	}
	for i, m := range ms {
		if i != best && m.To != "" && len(m.To) > len(own) && (own == "" || strings.HasPrefix(m.To, own+"/")) &&
			(to == m.To || strings.HasPrefix(to, m.To+"/")) {
			return to, moved, true
		}
	}
	return to, moved, false
}

// move applies the moves to the tree (still HEAD's): every file of
// HEAD's at or beneath a rename's source goes to its place at or beneath
// the target; what was at the sources, the targets and the removed paths
// goes.
func (t *gitTree) move(ms gitMoves) error {
	if len(ms) == 0 || t.root.hash.IsZero() {
		return nil
	}
	type placed struct {
		path string
		mode filemode.FileMode
		hash plumbing.Hash
	}
	var files []placed
	seen := map[string]bool{}
	for _, m := range ms {
		if m.To == "" {
			continue
		}
		found, err := t.storedFiles(m.From)
		if err != nil {
			return err
		}
		for _, f := range found {
			if seen[f.Name] {
				continue // beneath two sources: listed once
			}
			seen[f.Name] = true
			if to, moved, gone := ms.translate(f.Name); moved && !gone {
				files = append(files, placed{to, f.Mode, f.Hash})
			}
		}
	}
	for _, m := range ms {
		for _, p := range []string{m.From, m.To} {
			if p == "" {
				continue
			}
			if err := t.remove(p, false); err != nil {
				return err
			}
		}
	}
	for _, f := range files {
		if err := t.set(f.path, f.mode, f.hash); err != nil {
			return err
		}
	}
	return nil
}

// storedFiles lists the file or submodule at p of the stored tree, or
// those beneath the directory p, by their paths from the top (none when
// p is not there).
func (t *gitTree) storedFiles(p string) ([]object.TreeEntry, error) {
	root, err := object.GetTree(t.s, t.root.hash)
	if err != nil {
		return nil, fmt.Errorf("read tree %s: %w", t.root.hash, err)
	}
	e, err := root.FindEntry(p)
	if errors.Is(err, object.ErrDirectoryNotFound) || errors.Is(err, object.ErrEntryNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read tree %q: %w", p, err)
	}
	if e.Mode != filemode.Dir {
		f := *e
		f.Name = p
		return []object.TreeEntry{f}, nil
	}
	sub, err := root.Tree(p)
	if err != nil {
		return nil, fmt.Errorf("read tree %q: %w", p, err)
	}
	w := object.NewTreeWalker(sub, true, nil)
	defer w.Close()
	var out []object.TreeEntry
	for {
		name, e, err := w.Next()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("read tree %q: %w", p, err)
		}
		if e.Mode != filemode.Dir {
			e.Name = p + "/" + name
			out = append(out, e)
		}
	}
}
