package manager

import (
	"fmt"
	"path/filepath"
	"sort"

	"github.com/sbxfs/sbxfs/layers"
)

// nestedIn reports whether sandbox a is nested in sandbox b: a's original
// lies inside b's mountpoint, so committing a changes b's view (and b's
// upper, through b's mount).
func nestedIn(a, b *record) bool {
	return a.ID != b.ID && within(a.Original, b.Mountpoint)
}

// nestedActive refuses (ErrNested) to take r's mount away while an active
// sandbox is nested in it.
func (m *Manager) nestedActive(r *record) error {
	for _, o := range m.snapshot("") {
		if o.State == Active && nestedIn(&o, r) {
			return fmt.Errorf("%w: sandbox %s (its original %s is this sandbox's mount): commit, roll back or destroy it first, or the whole plan %s", ErrNested, o.ID, o.Original, r.Plan)
		}
	}
	return nil
}

// commitLevels splits rs (any order) into levels: level 0 holds the
// sandboxes with no sandbox of rs nested in them; level n+1 those whose
// nested sandboxes are all in levels up to n. A level is committed only
// after the levels below it are applied, so a parent's change set holds
// what its children wrote through its mount. Within a level, sandboxes
// keep List order (creation time, then id).
func commitLevels(rs []record) ([][]record, error) {
	ptrs := make([]*record, len(rs))
	for i := range rs {
		ptrs[i] = &rs[i]
	}
	sorted := sortRecords(ptrs)
	level := map[string]int{}
	var depth func(r *record, seen int) (int, error)
	depth = func(r *record, seen int) (int, error) {
		if l, ok := level[r.ID]; ok {
			return l, nil
		}
		if seen > len(sorted) {
			return 0, fmt.Errorf("%w: sandboxes nested in a cycle (at %s)", ErrInvalid, r.ID)
		}
		l := 0
		for _, c := range sorted {
			if nestedIn(c, r) {
				cl, err := depth(c, seen+1)
				if err != nil {
					return 0, err
				}
				l = max(l, cl+1)
			}
		}
		level[r.ID] = l
		return l, nil
	}
	var out [][]record
	for _, r := range sorted {
		l, err := depth(r, 0)
		if err != nil {
			return nil, err
		}
		for len(out) <= l {
			out = append(out, nil)
		}
		out[l] = append(out[l], *r)
	}
	return out, nil
}

// commitOrder is commitLevels flattened: children before parents.
func commitOrder(rs []record) ([]record, error) {
	levels, err := commitLevels(rs)
	if err != nil {
		return nil, err
	}
	var out []record
	for _, l := range levels {
		out = append(out, l...)
	}
	return out, nil
}

// checkOverlaps refuses a plan in which two sandboxes change the same
// path of the filesystem, or one replaces, removes or renames a directory
// under which another changes something: applying both would silently
// keep one side only. Metadata-only changes of a directory do not cover
// its children. O(touched paths × depth).
func checkOverlaps(parts []*participant) error {
	type owner struct {
		id   string
		kind layers.ChangeKind
	}
	at := map[string]owner{}
	var paths []string
	for _, p := range parts {
		if p.txn == nil {
			continue
		}
		for _, c := range p.txn.Changes() {
			for _, rel := range []string{c.Path, c.From} {
				if rel == "" {
					continue
				}
				abs := filepath.Join(p.rec.Original, rel)
				if o, ok := at[abs]; ok && o.id != p.rec.ID {
					return fmt.Errorf("%w: %s (sandboxes %s and %s)", ErrOverlap, abs, o.id, p.rec.ID)
				}
				at[abs] = owner{id: p.rec.ID, kind: c.Kind}
				paths = append(paths, abs)
			}
		}
	}
	sort.Strings(paths)
	for _, q := range paths {
		id := at[q].id
		for d := filepath.Dir(q); ; d = filepath.Dir(d) {
			if o, ok := at[d]; ok && o.id != id && o.kind != layers.Metadata {
				return fmt.Errorf("%w: sandbox %s changes %s, which sandbox %s %s", ErrOverlap, id, q, o.id, o.kind)
			}
			if d == "/" || d == "." {
				break
			}
		}
	}
	return nil
}
