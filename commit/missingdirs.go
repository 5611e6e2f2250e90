package commit

import (
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/layers"
)

// withMissingDirs adds to cs the creation of each directory its changes
// are made in that the original no longer has as a directory (removed,
// moved away or replaced since the sandbox saw it), where the commit is
// told to apply anyway: with --force (force), or where a conflict on
// that directory was resolved in the sandbox's favour (resolved holds
// the original paths Resolve recorded). The directory made is the
// sandbox's, with its metadata; so is every missing one above it. What
// the original moved away stays where it went; what stands there now
// (a file in the directory's place) goes, as for any path the commit
// replaces.
func withMissingDirs(orig *tree, cs layers.ChangeSet, force bool, resolved map[string]layers.Signature) layers.ChangeSet {
	before := newRenames(cs) // the renames Resolve's paths went through
	cs, converted := withGoneOriginals(orig, cs, force, resolved)
	r := newRenames(cs)
	allowed := func(dir string) bool {
		if _, ok := resolved[before.original(dir)]; force || ok {
			return true
		}
		if acceptedSymlink(orig, resolved, orig.firstSymlink(r.original(dir))) {
			return true // beneath a symlink a resolve accepted: the sandbox's directory replaces it
		}
		for d := dir; d != ""; d, _ = layers.Split(d) {
			if converted[d] {
				return true // beneath a directory made anew: as it
			}
		}
		return false
	}
	made := map[string]bool{"": true} // directories the change set makes or moves in
	for _, c := range cs.Changes {
		// A modified directory is one that replaced a non-directory of
		// the original (the plan makes it too).
		if c.Type == "dir" && (c.Kind == layers.Created || c.Kind == layers.Renamed || c.Kind == layers.Modified) {
			made[c.Path] = true
		}
	}
	dirs := map[string]bool{} // one lookup a directory
	isDir := func(dir string) bool {
		if d, ok := dirs[dir]; ok {
			return d
		}
		there, st, err := orig.inTree(r.original(dir))
		dirs[dir] = err == nil && there && st.Mode&unix.S_IFMT == unix.S_IFDIR
		return dirs[dir]
	}
	var add []layers.Change
	for _, c := range cs.Changes {
		if c.Kind == layers.Deleted {
			continue // a removal puts nothing into its directory
		}
		dir, _ := layers.Split(c.Path)
		if made[dir] || isDir(dir) {
			continue
		}
		if !allowed(dir) {
			continue // the apply fails on it, as the conflict said
		}
		for ; !made[dir] && !isDir(dir); dir, _ = layers.Split(dir) {
			made[dir] = true
			add = append(add, layers.Change{Path: dir, Kind: layers.Created, Type: "dir"})
		}
	}
	if len(add) == 0 {
		return cs
	}
	out := layers.ChangeSet{Changes: append(slices.Clone(cs.Changes), add...)}
	slices.SortFunc(out.Changes, func(a, b layers.Change) int { return strings.Compare(a.Path, b.Path) })
	return out
}

// withGoneOriginals turns a change that needs the original's object (a
// directory moved, metadata changed) into the creation of the sandbox's
// object where the original has nothing there any more, under the same
// rule as withMissingDirs: what the sandbox made inside a moved directory
// goes into the new one (and the directories on the way to it, which
// withMissingDirs makes); the original's entries the sandbox saw there
// are gone from the original, so they are not in it. It returns the
// paths it turned into creations.
//
// Beneath a symlink the original put where the sandbox saw a directory,
// once a resolve accepted that symlink (or with force), the original's
// tree has nothing: a directory moved or whose metadata changed is made
// anew in the sandbox's directory that replaces the symlink, and a
// removal has nothing to remove (it is dropped: the symlink stays unless
// something else needs the directory).
func withGoneOriginals(orig *tree, cs layers.ChangeSet, force bool, resolved map[string]layers.Signature) (layers.ChangeSet, map[string]bool) {
	r := newRenames(cs)
	out := make([]layers.Change, 0, len(cs.Changes))
	changed := false
	converted := map[string]bool{}
	for _, c := range cs.Changes {
		gone := c.Kind == layers.Deleted
		if c.Kind != layers.Metadata && !gone && !(c.Kind == layers.Renamed && c.Type == "dir") {
			out = append(out, c)
			continue
		}
		key := conflictKey(r, c)
		there, _, err := orig.inTree(key)
		if err != nil || there {
			out = append(out, c)
			continue
		}
		_, ok := resolved[key]
		if q := orig.firstSymlink(key); q != "" {
			ok = force || acceptedSymlink(orig, resolved, q)
		} else {
			ok = (force || ok) && !gone // removed from the original too: nothing to do, as before
		}
		switch {
		case !ok:
			out = append(out, c)
		case gone:
			changed = true
		default:
			out = append(out, layers.Change{Path: c.Path, Kind: layers.Created, Type: c.Type})
			converted[c.Path], changed = true, true
		}
	}
	if !changed {
		return cs, converted
	}
	return layers.ChangeSet{Changes: out}, converted
}
