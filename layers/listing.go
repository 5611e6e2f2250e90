package layers

import (
	"slices"
	"strings"
)

// Listing is the change set as a user reads it (sbxfs status, and diff
// --name-status, --stat and --json): a removal is shown at the original
// path of the object it removed (Original) and of the original's object
// that object had replaced (Replaced), each once, and not at all where
// another change takes the original's object there (mv f g; echo new >
// f; rm g lists "M f" alone); sorted by path, a removal before a new
// object at the same path. Such a removal keeps Original, now equal to
// Path: its path is an original one, not translated through the renames
// of the set. The commit works from Changes, whose removals name final
// paths.
func (cs ChangeSet) Listing() []Change {
	renamed := map[string]string{} // Path -> From
	for _, c := range cs.Changes {
		if c.Kind == Renamed {
			renamed[c.Path] = c.From
		}
	}
	// The original paths other changes compare with.
	taken := map[string]bool{}
	for _, c := range cs.Changes {
		switch c.Kind {
		case Renamed:
			taken[c.From] = true
		case Modified, Metadata:
			taken[Counterpart(renamed, c.Path)] = true
		}
	}
	out := make([]Change, 0, len(cs.Changes))
	removed := map[string]bool{}
	moved := false
	remove := func(c Change, at string) {
		if taken[at] || removed[at] {
			return
		}
		removed[at] = true
		if at != c.Path {
			c.Path, moved = at, true
		}
		c.Original, c.Replaced = at, ""
		out = append(out, c)
	}
	for _, c := range cs.Changes {
		switch {
		case c.Kind != Deleted:
			out = append(out, c)
		case c.Original == "":
			if !removed[c.Path] {
				removed[c.Path] = true
				out = append(out, c)
			}
		default:
			remove(c, c.Original)
			if c.Replaced != "" {
				remove(c, c.Replaced)
			}
		}
	}
	for _, c := range cs.Dropped {
		remove(c, c.Path)
		moved = true
	}
	if moved {
		slices.SortStableFunc(out, func(a, b Change) int {
			if n := strings.Compare(a.Path, b.Path); n != 0 {
				return n
			}
			return deletedFirst(a) - deletedFirst(b)
		})
	}
	return out
}

func deletedFirst(c Change) int {
	if c.Kind == Deleted {
		return 0
	}
	return 1
}
