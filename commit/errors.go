package commit

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"path"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/fsutil"
	"github.com/sbxfs/sbxfs/layers"
)

// Stage says where a commit failed.
type Stage string

// The stages of a commit.
const (
	StagePrepare Stage = "prepare" // nothing was applied
	StageApply   Stage = "apply"
	StageUndo    Stage = "undo"
	StageFinish  Stage = "finish" // committed; cleanup failed
	StageRecover Stage = "recover"
)

// Error is the one shape of every commit failure.
type Error struct {
	Stage      Stage
	Conflicts  []Conflict // paths the original changed underneath the sandbox
	Paths      []string   // the paths a failed step or undo was about
	RolledBack bool       // an applied part was undone: the original is as before
	Kept       string     // transaction directory kept with backups that could not be restored
	Cause      error      // the failure an undo was answering, when the undo failed too
	Err        error
}

// WhileRead reports whether every conflict of e is a look of the commit
// that met the original changing (a symlink where a directory was a
// moment before): a retry once the original is still may pass.
func (e *Error) WhileRead() bool {
	for _, c := range e.Conflicts {
		if c.Reason != ReasonChangedWhileRead {
			return false
		}
	}
	return len(e.Conflicts) > 0
}

func (e *Error) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "commit %s: %v", e.Stage, e.Err)
	if len(e.Conflicts) > 0 {
		b.WriteString(":")
		for _, c := range e.Conflicts {
			fmt.Fprintf(&b, "\n  %s: %s", shownPath(c.Path), c.Reason)
		}
	}
	if e.Cause != nil {
		fmt.Fprintf(&b, " (while undoing after: %v)", e.Cause)
	}
	if e.RolledBack {
		b.WriteString("; the original is unchanged")
	}
	if e.Kept != "" {
		fmt.Fprintf(&b, "; backups kept in %s", e.Kept)
	}
	return b.String()
}

func (e *Error) Unwrap() error { return e.Err }

// shownPath is a sandbox path as messages name it: the root is ".", as
// status names it.
func shownPath(p string) string {
	if p == "" {
		return "."
	}
	return p
}

// Errors to match with errors.Is.
var (
	ErrConflict = errors.New("the original changed underneath the sandbox")
	// ErrOtherMount says a change lies on a filesystem mounted inside the
	// original: a commit moves objects by rename(2), which does not cross
	// mounts. Nothing was applied.
	ErrOtherMount = errors.New("a change lies on another filesystem mounted inside the original")
	ErrBusy       = errors.New("sandbox busy")
	// ErrSeveralLowers says the sandbox lies over several lower layers:
	// its original is their merged view, which no one directory holds,
	// so there is nowhere to apply its changes. Nothing was applied.
	ErrSeveralLowers = errors.New("a sandbox over several lower layers cannot be committed: its original is their merged view, which no one directory holds")
)

// Conflict is one path the original changed after the sandbox first
// changed it.
type Conflict struct {
	Path   string `json:"path"`
	Reason string `json:"reason"`
}

// conflictB64 is Conflict's path_b64: its exact path, when it is not
// valid UTF-8 (fsutil.B64IfInvalid).
type conflictB64 struct {
	PathB64 string `json:"path_b64,omitempty"`
}

// MarshalJSON writes c with path_b64 beside a path that is not UTF-8.
func (c Conflict) MarshalJSON() ([]byte, error) {
	type plain Conflict
	return json.Marshal(struct {
		plain
		conflictB64
	}{plain(c), conflictB64{fsutil.B64IfInvalid(c.Path)}})
}

// UnmarshalJSON reads what MarshalJSON writes, the exact path included.
func (c *Conflict) UnmarshalJSON(b []byte) error {
	type plain Conflict
	v := struct {
		*plain
		conflictB64
	}{plain: (*plain)(c)}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	return fsutil.DecodeB64Fields([]*string{&c.Path}, []string{v.PathB64})
}

// conflict is a Conflict with the original path whose state Resolve
// records as the base ("" is the root), unresolvable where recording it
// cannot make the commit work (the original's object is needed and gone,
// or a symlink is on the way).
type conflict struct {
	Conflict
	key string
}

// unresolvable is the key of a conflict Resolve cannot settle: no path.
const unresolvable = "\x00"

// conflicts compares each changed path's original with what the sandbox
// saw when it first changed it (bases: the journal's, with what an undo or
// Resolve recorded over them; saw: the journal's alone).
func conflicts(orig *tree, upper string, cs layers.ChangeSet, bases, saw map[string]layers.Signature) []Conflict {
	var out []Conflict
	for _, c := range findConflicts(orig, upper, cs, bases, saw) {
		out = append(out, c.Conflict)
	}
	return out
}

// resolvedGone is the base Resolve records where the original has nothing:
// its absence is what the sandbox's change replaces.
var resolvedGone = layers.Signature{}

func findConflicts(orig *tree, upper string, cs layers.ChangeSet, bases, saw map[string]layers.Signature) []conflict {
	r := newRenames(cs)
	// newDirs: true for a directory the sandbox made, false for one it
	// moved (an original directory, wherever it went).
	newDirs := map[string]bool{}
	for _, c := range cs.Changes {
		switch {
		case c.Kind == layers.Created && c.Type == "dir":
			newDirs[c.Path] = true
		case c.Kind == layers.Renamed && c.Type == "dir":
			newDirs[c.Path] = false
		}
	}
	var out []conflict
	add := func(p, reason, key string) { out = append(out, conflict{Conflict{Path: p, Reason: reason}, key}) }
	// symlinkOnTheWay names the symlink the original put where the
	// sandbox saw a directory, at original path q: resolving it lets the
	// commit make the sandbox's directory there.
	symlinkOnTheWay := func(q string) { add(r.final(q), "replaced in the original", q) }
	check := func(c layers.Change, p string, target bool) {
		if c.Kind == layers.Deleted && c.Original != "" {
			// A removal is named by the original path of what it
			// removes, as status lists it.
			c.Path = p
		}
		base, seen := bases[p]
		if !seen && inNewDir(newDirs, c.Path) {
			// Nothing to compare, and whatever the original has there
			// goes with its directory (see the cases below).
			return
		}
		there, st, err := orig.inTree(p)
		switch {
		case err != nil:
			add(c.Path, err.Error(), unresolvable)
		case !seen && there && p != "" && c.Kind != layers.Deleted && !inNewDir(newDirs, c.Path):
			// The sandbox never saw an original object there (it would
			// have recorded its signature before changing it): the
			// original made it since. Beneath a directory the sandbox
			// made in place of the original's, the original's objects
			// go with their directory (moved away, or checked by
			// unaccounted when it is deleted).
			add(c.Path, "created in the original too", p)
		case !seen:
		case !there && c.Kind == layers.Deleted && !target && orig.firstSymlink(p) == "":
			// Removed from the original too (or moved away, which keeps
			// it): the commit has nothing to remove.
		case !there && base == resolvedGone:
		case !there && acceptedSymlink(orig, bases, orig.firstSymlink(p)):
			// Beneath a symlink the original put in a directory's place
			// and a resolve accepted as the base: the commit makes the
			// sandbox's directory there (withMissingDirs), and this in it.
		case !there && !target:
			// Resolvable: the commit puts the sandbox's object there
			// (for a directory it moves or changes the metadata of, it
			// makes the sandbox's directory anew: withMissingDirs).
			// Beneath a symlink, by resolving the symlink's conflict.
			key := p
			if q := orig.firstSymlink(p); q != "" {
				key = unresolvable
				symlinkOnTheWay(q)
			}
			add(c.Path, "removed from the original", key)
		case !there:
			// What the rename replaced is gone from the original too.
		case layers.SignatureOf(&st) == base:
		case !target && entriesOnly(c, base, &st):
			// A directory the sandbox moves or changes the attributes
			// of, whose entries the original changed: each entry the
			// sandbox changed is checked on its own, and the others go
			// with the directory, as the mount shows them. Its owner
			// and attributes must be the sandbox's, as the commit sets
			// them: the original changed none, or changed them as the
			// sandbox did. (One it removes goes with its attributes.)
			if c.Kind != layers.Deleted && !sameAttrs(orig, p, upper, c.Path) {
				add(c.Path, "changed in the original, and its owner or attributes differ from the sandbox's", p)
			}
		default:
			add(c.Path, describe(base, &st), p)
		}
	}
	keyed := map[string]bool{}
	for _, c := range cs.Changes {
		keyed[conflictKey(r, c)] = true
	}
	for _, c := range cs.Changes {
		check(c, conflictKey(r, c), false)
		if c.Kind == layers.Deleted && c.Replaced != "" && !keyed[c.Replaced] {
			// The original object the removed one had replaced goes
			// too: it must be as the sandbox saw it, or gone.
			check(c, c.Replaced, true)
		}
		if c.Kind != layers.Renamed {
			continue
		}
		// A rename also replaces what the original has at its target
		// (the sandbox recorded its signature when the rename replaced
		// it), or puts the object where the original has none: the
		// object the original has there now must be that one, or none.
		if p, ok := r.replacedAt(c.Path); ok && !keyed[p] {
			check(c, p, true)
		}
	}
	// The directories the changes are made in: an original one the
	// sandbox changed the entries of (it recorded its signature) must
	// still be that directory, else the commit could not put them there
	// (moved or removed in the original: the apply would fail and undo,
	// or, replaced, put them into another directory).
	parents := map[string]bool{}
	for _, c := range cs.Changes {
		if c.Kind == layers.Deleted {
			continue // a removal puts nothing into its directory
		}
		dir, _ := layers.Split(c.Path)
		q := r.original(dir)
		if dir == "" || parents[q] || keyed[q] || newDirs[dir] || inNewDir(newDirs, dir) {
			continue
		}
		parents[q] = true
		base, seen := bases[q]
		if !seen {
			continue
		}
		switch there, st, err := orig.inTree(q); {
		case err != nil:
			add(dir, err.Error(), unresolvable)
		case !there && base == resolvedGone:
		case !there && acceptedSymlink(orig, bases, orig.firstSymlink(q)):
			// Beneath a symlink a resolve accepted: made anew.
		case !there:
			// Resolvable: the commit makes the sandbox's directory
			// again (withMissingDirs); beneath a symlink, by resolving
			// the symlink's conflict.
			key := q
			if s := orig.firstSymlink(q); s != "" {
				key = unresolvable
				symlinkOnTheWay(s)
			}
			add(dir, "removed from the original", key)
		case !sameObject(base, &st):
			add(dir, "replaced in the original", q)
		}
	}
	return distinct(append(out, unaccounted(orig, cs, r, bases, saw)...))
}

// distinct drops repeated conflicts (one symlink on the way of several
// changes is named once).
func distinct(cf []conflict) []conflict {
	seen := map[Conflict]bool{}
	out := cf[:0]
	for _, c := range cf {
		if !seen[c.Conflict] {
			seen[c.Conflict] = true
			out = append(out, c)
		}
	}
	return out
}

// acceptedSymlink reports whether the symlink at q (none: "") is what
// its base says: the sandbox never saw a symlink where it changed things
// beneath, so that base is one Resolve recorded.
func acceptedSymlink(orig *tree, bases map[string]layers.Signature, q string) bool {
	if q == "" {
		return false
	}
	base, ok := bases[q]
	st, err := orig.lstat(q)
	return ok && err == nil && layers.SignatureOf(&st) == base
}

// entriesOnly reports whether the change c is of a directory the
// sandbox moves, changes the metadata of or removes, and the original
// changed no more of it than its entries and times could show: the same
// directory, with the same mode. (The entries of a directory removed are
// each checked: those the sandbox removed by their own changes, any other
// by unaccounted.)
func entriesOnly(c layers.Change, base layers.Signature, st *unix.Stat_t) bool {
	return c.Type == "dir" && (c.Kind == layers.Renamed || c.Kind == layers.Metadata || c.Kind == layers.Deleted) &&
		base.Mode&unix.S_IFMT == unix.S_IFDIR && sameObject(base, st) && base.Mode == st.Mode
}

// sameAttrs reports whether the original object rel has the owner and
// extended attributes of the sandbox's object at upperRel in the upper.
func sameAttrs(orig *tree, rel, upper, upperRel string) bool {
	o, err := orig.metaAt(rel)
	if err != nil {
		return false
	}
	fd, err := openUpperObj(upper, upperRel)
	if err != nil {
		return false
	}
	defer unix.Close(fd)
	u, err := metaOf(fd, orig.isLayout)
	if err != nil {
		return false
	}
	return o.Uid == u.Uid && o.Gid == u.Gid && maps.EqualFunc(o.Xattrs, u.Xattrs, bytes.Equal)
}

// unaccounted checks the original directories a commit takes away whole
// (removed, or replaced by a new directory, a file, a link or a renamed
// object): every entry they hold must
// be one the sandbox deleted or moved away, else the commit would drop
// it with the directory. The sandbox removed an entry if the change set
// says so or if the sandbox changed it at all (its base signature is in the
// journal: whatever it became, the change set has it). An entry that is
// neither was made in the original after the sandbox emptied the
// directory, or the original changed while the change set was read.
func unaccounted(orig *tree, cs layers.ChangeSet, r renames, bases, saw map[string]layers.Signature) []conflict {
	changed := map[string]bool{}   // original paths the change set changes
	movedAway := map[string]bool{} // original paths renamed elsewhere
	for _, c := range cs.Changes {
		changed[conflictKey(r, c)] = true
		if c.Kind == layers.Renamed {
			changed[c.From], movedAway[c.From] = true, true
		}
	}
	keys := maps.Clone(changed)
	for p := range bases {
		keys[p] = true
	}
	own := map[string]bool{} // original paths a change takes away (each walked for it)
	for _, c := range cs.Changes {
		if p, ok := takesAway(r, c); ok {
			own[p] = true
		}
	}
	var out []conflict
	// walk checks the entries (names) of the original directory p, which
	// the commit drops (shown: where the sandbox's change names it).
	var walk func(p, shown string, names []string)
	walk = func(p, shown string, names []string) {
		for _, n := range names {
			q, s := path.Join(p, n), path.Join(shown, n)
			if !keys[q] {
				out = append(out, conflict{Conflict{Path: s, Reason: unaccountedReason}, q})
				continue
			}
			if changed[q] || movedAway[q] || own[q] {
				continue // checked with its own change
			}
			// Removed along, by the sandbox (it recorded the base), at
			// a path that holds another object now: no change names it
			// (mv h g/x after rm -r h and mkdir -p h/i). Check it as its
			// removal would be, and what it holds. Before 2026-11-27 the
			// commit dropped what the original made or replaced beneath
			// it without a conflict (TestRemovalBeneathARemadeDirectory).
			base, seen := bases[q]
			there, st, err := orig.inTree(q)
			switch {
			case err != nil:
				out = append(out, conflict{Conflict{Path: s, Reason: err.Error()}, unresolvable})
				continue
			case !seen || !there || base == resolvedGone:
				continue
			case layers.SignatureOf(&st) == base:
			case base.Mode&unix.S_IFMT == unix.S_IFDIR && sameObject(base, &st) && base.Mode == st.Mode:
				// Only its entries changed: each is checked below.
			default:
				// (What it holds now is named too, as for a change's
				// own path.)
				out = append(out, conflict{Conflict{Path: s, Reason: describe(base, &st)}, q})
			}
			if _, removed := saw[q]; removed && st.Mode&unix.S_IFMT == unix.S_IFDIR {
				// (Not one only a resolve accepted, whole: the sandbox
				// never saw it, and removes it with what it holds.)
				if beneath, err := orig.names(q); err == nil {
					walk(q, s, beneath)
				}
			}
		}
	}
	absent := map[string]bool{} // original paths with nothing there: nor beneath
	for _, c := range cs.Changes {
		p, ok := takesAway(r, c)
		if !ok || movedAway[p] || beneathAbsent(absent, p) {
			continue // nothing replaced, or the original's directory there moves elsewhere, whole
		}
		names, err := orig.names(p)
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
			// (Changes come parents first: a new tree costs one look.)
			absent[p] = true
		}
		if errors.Is(err, unix.ELOOP) && c.Type == "dir" && c.Kind != layers.Renamed {
			// A symlink at p or on the way. One the sandbox replaces is
			// expected; any other, where the change set saw a directory,
			// means the original is changing under the commit (one the
			// sandbox only saw, a directory then, too).
			switch q := orig.firstSymlink(p); {
			case q == "":
				out = append(out, conflict{Conflict{Path: c.Path, Reason: ReasonChangedWhileRead}, unresolvable})
			case changed[q] || acceptedSymlink(orig, bases, q):
				// Nothing of the original's is beneath: it goes, or a
				// resolve accepted it.
			default:
				out = append(out, conflict{Conflict{Path: r.final(q), Reason: "replaced in the original"}, q})
			}
			continue
		}
		if err != nil {
			continue // not a directory there (any more): nothing is dropped
		}
		shown := c.Path
		switch {
		case c.Kind == layers.Renamed:
			shown = r.final(p)
		case c.Kind == layers.Deleted && c.Original != "":
			shown = c.Original // as status lists the removal
		}
		walk(p, shown, names)
	}
	return out
}

// beneathAbsent reports whether a directory above p is in absent.
func beneathAbsent(absent map[string]bool, p string) bool {
	for i := strings.LastIndexByte(p, '/'); i > 0 && len(absent) > 0; i = strings.LastIndexByte(p[:i], '/') {
		if absent[p[:i]] {
			return true
		}
	}
	return false
}

// takesAway returns the original path whose object the change c replaces
// or removes whole, if any: its own (removed, or replaced by a new
// directory, a file or a link), or a rename's target. Where the original
// has a directory there, the commit drops everything in it.
func takesAway(r renames, c layers.Change) (string, bool) {
	switch c.Kind {
	case layers.Deleted:
		if c.Original != "" {
			// Removed where the sandbox had moved it (mv h n; rm -r n):
			// the original's object is at its own path, which the
			// commit takes away with what it holds. Before 2026-11-27
			// the path it was removed at was looked at instead, where
			// the original has nothing, and what the original made
			// beneath went unnamed, dropped with the backups.
			return c.Original, true
		}
		return r.replacedAt(c.Path)
	case layers.Created, layers.Modified, layers.Linked:
		// Only where the original's object there still stands at c's
		// path once the renamed directories are in place: in a new
		// directory exchanged for an original one, it went along.
		return r.replacedAt(c.Path)
	case layers.Renamed:
		if p, ok := r.replacedAt(c.Path); ok && p != c.From {
			return p, true
		}
	}
	return "", false
}

// ReasonChangedWhileRead is the reason of a conflict found when a look
// of the commit met a symlink on the way: the original changing under it.
const ReasonChangedWhileRead = "the original changed while the commit read it (a symlink on the way)"

const unaccountedReason = "in the original but not in the sandbox's view of it (made in the original since, or the original changed while the commit read it)"

// inNewDir reports whether p is beneath a directory the sandbox made,
// with no directory it moved between (dirs: true for one made, false for
// one moved): beneath a moved directory are the original's objects.
func inNewDir(dirs map[string]bool, p string) bool {
	for i := strings.LastIndexByte(p, '/'); i > 0; i = strings.LastIndexByte(p[:i], '/') {
		if made, ok := dirs[p[:i]]; ok {
			return made
		}
	}
	return false
}

// conflictKey is the original path a change is checked against.
func conflictKey(r renames, c layers.Change) string {
	switch {
	case c.Kind == layers.Renamed:
		return c.From
	case c.Kind == layers.Deleted && c.Original != "":
		// The object removed came from there: through exchanges and
		// moves of its directories the renames alone may not lead back
		// to it (they name another original object, or none).
		return c.Original
	}
	return r.original(c.Path)
}

func describe(base layers.Signature, st *unix.Stat_t) string {
	now := layers.SignatureOf(st)
	switch {
	case !sameObject(base, st):
		return "replaced in the original"
	case base.Size != now.Size || base.Mtime != now.Mtime:
		return "content changed in the original"
	case base.Mode != now.Mode:
		return "mode changed in the original"
	}
	return "changed in the original"
}
