package layers

// pathIndex finds, among a set of paths, those at or beneath a
// directory, in time proportional to what it finds: a journal replay
// moves every path a rename takes along, and a scan of every path kept
// so far at each rename made a replay of n renames cost n².
type pathIndex struct {
	// kids holds, by directory, the names in it of the indexed paths and
	// of their ancestors.
	kids map[string]map[string]struct{}
}

func newPathIndex() pathIndex { return pathIndex{kids: map[string]map[string]struct{}{}} }

// add indexes p (and its ancestors, so that take finds it from any).
func (x pathIndex) add(p string) {
	for p != "" {
		dir, name := Split(p)
		set := x.kids[dir]
		if set == nil {
			set = map[string]struct{}{}
			x.kids[dir] = set
		}
		if _, ok := set[name]; ok {
			return
		}
		set[name] = struct{}{}
		p = dir
	}
}

// take removes p and everything indexed beneath it, and returns them, p
// first (also when p itself was never added).
func (x pathIndex) take(p string) []string {
	out := []string{p}
	for i := 0; i < len(out); i++ {
		q := out[i]
		for n := range x.kids[q] {
			out = append(out, Join(q, n))
		}
		delete(x.kids, q)
	}
	if p != "" {
		dir, name := Split(p)
		delete(x.kids[dir], name)
	}
	return out
}
