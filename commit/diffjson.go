package commit

import (
	"fmt"
	"slices"

	"golang.org/x/sys/unix"

	"github.com/sbxfs/sbxfs/fsutil"
	"github.com/sbxfs/sbxfs/layers"
)

// FileDiff is what a program needs of one change. A field of a side that
// does not exist (the old side of a created path, the new side of a
// deleted one) is left out. Strings that are not valid UTF-8 also come
// base64-encoded in the matching _b64 field, as JSON cannot hold them.
type FileDiff struct {
	Path    string `json:"path"`
	PathB64 string `json:"path_b64,omitempty"`
	Kind    string `json:"kind"`   // a layers.ChangeKind
	Status  string `json:"status"` // the NameStatus letter: A M D R T m
	From    string `json:"from,omitempty"`
	FromB64 string `json:"from_b64,omitempty"`
	// OldPath is where the old side is in the original, when that is not
	// Path: From for a rename, the translated path under a renamed
	// directory.
	OldPath    string `json:"old_path,omitempty"`
	OldPathB64 string `json:"old_path_b64,omitempty"`
	Type       string `json:"type"` // the new side's type (the old one's when deleted)
	OldType    string `json:"old_type,omitempty"`
	OldMode    string `json:"old_mode,omitempty"` // st_mode in octal, "100644"
	NewMode    string `json:"new_mode,omitempty"`
	// Sizes are of regular files and symlinks (the target's length).
	OldSize      *int64 `json:"old_size,omitempty"`
	NewSize      *int64 `json:"new_size,omitempty"`
	OldTarget    string `json:"old_target,omitempty"` // symlinks
	OldTargetB64 string `json:"old_target_b64,omitempty"`
	NewTarget    string `json:"new_target,omitempty"`
	NewTargetB64 string `json:"new_target_b64,omitempty"`
	Binary       bool   `json:"binary"`  // either side has a NUL in its first 8000 bytes
	Added        int    `json:"added"`   // lines; 0 for binary content
	Deleted      int    `json:"deleted"` // lines; 0 for binary content
	// ImpliedBy is set on an entry that is no change of its own but
	// follows from another: the path of that entry, a renamed directory
	// that moves the object (kind "renamed") or a directory the sandbox
	// removed, replaced or renamed that drops it (kind "deleted": the
	// object went with the directory, or another object took its place).
	ImpliedBy    string `json:"implied_by,omitempty"`
	ImpliedByB64 string `json:"implied_by_b64,omitempty"`
}

// DiffJSON returns, per change of the Listing, the paths, kind, types,
// modes, sizes, symlink targets and line counts of both sides, and the
// entries that follow from them (ImpliedBy): each file a renamed
// directory moves and each original file a change drops that no entry
// names; sorted by path, as the other forms.
func DiffJSON(cfg layers.Config, cs layers.ChangeSet) ([]FileDiff, error) {
	out := []FileDiff{}
	type entry struct {
		key listedKey
		f   FileDiff
	}
	var entries []entry
	err := eachDiffPair(cfg, cs, pairOpts{listing: true}, func(d *diffPair) error {
		entries = append(entries, entry{keyOf(d), fileDiffOf(d)})
		return nil
	})
	if err != nil {
		return nil, err
	}
	slices.SortStableFunc(entries, func(a, b entry) int { return compareListed(a.key, b.key) })
	for _, e := range entries {
		out = append(out, e.f)
	}
	return out, nil
}

func fileDiffOf(d *diffPair) FileDiff {
	c := d.c
	f := FileDiff{
		Path: c.Path, PathB64: fsutil.B64IfInvalid(c.Path), Kind: string(c.Kind),
		From: c.From, FromB64: fsutil.B64IfInvalid(c.From), Type: c.Type,
		ImpliedBy: d.impliedBy, ImpliedByB64: fsutil.B64IfInvalid(d.impliedBy),
	}
	oldType := c.Type
	if d.old.exists {
		oldType = layers.TypeName(d.old.mode)
		f.OldType = oldType
		f.OldMode = fmt.Sprintf("%06o", d.old.mode)
		f.OldSize = sideSize(&d.old)
		f.OldTarget, f.OldTargetB64 = d.old.target, fsutil.B64IfInvalid(d.old.target)
		if d.oldPath != c.Path {
			f.OldPath, f.OldPathB64 = d.oldPath, fsutil.B64IfInvalid(d.oldPath)
		}
	}
	if d.new.exists {
		f.NewMode = fmt.Sprintf("%06o", d.new.mode)
		f.NewSize = sideSize(&d.new)
		f.NewTarget, f.NewTargetB64 = d.new.target, fsutil.B64IfInvalid(d.new.target)
	}
	f.Status = statusLetter(c, oldType)
	dc := d.content()
	f.Binary = dc.binary
	if !dc.binary {
		f.Added, f.Deleted = countLines(dc.script)
	}
	return f
}

func sideSize(s *diffSide) *int64 {
	if s.typ() == unix.S_IFDIR || !s.hasContent() {
		return nil
	}
	n := s.size
	return &n
}
