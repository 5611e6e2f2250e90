package layers

import (
	"fmt"
	"maps"
	"math/rand"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// naiveTouched is the replay as it was before the path index: every
// rename scans every path kept so far. It is the reference the indexed
// replay must agree with.
type naiveTouched struct {
	paths, times, made map[string]bool
	from, link         map[string]string
}

func naiveReplay(recs []Record) naiveTouched {
	t := naiveTouched{paths: map[string]bool{}, times: map[string]bool{}, made: map[string]bool{}, from: map[string]string{}, link: map[string]string{}}
	for _, r := range recs {
		switch r.Op {
		case OpBase:
		case OpRename:
			if r.Flags&unix.RENAME_EXCHANGE != 0 {
				tmp := "\x00exchange"
				t.move(r.Path, tmp)
				t.move(r.Path2, r.Path)
				t.move(tmp, r.Path2)
				delete(t.paths, tmp)
				continue
			}
			t.move(r.Path, r.Path2)
		case OpSetattr, OpSetxattr, OpRemovexattr:
			t.paths[r.Path] = t.paths[r.Path] || false
			if r.Op == OpSetattr && r.Flags&AttrTimes != 0 {
				t.times[r.Path] = true
			}
		case OpLink:
			t.paths[r.Path] = true
			t.paths[r.Path2] = true
			t.link[r.Path] = r.Path2
			t.made[r.Path] = true
		case OpCreate, OpMkdir, OpMknod, OpSymlink:
			t.paths[r.Path] = true
			t.made[r.Path] = true
		case OpUnlink, OpRmdir:
			t.paths[r.Path] = true
			delete(t.made, r.Path)
		default:
			t.paths[r.Path] = true
		}
	}
	return t
}

func (t naiveTouched) move(old, new string) {
	origFrom := Counterpart(t.from, old)
	if t.made[old] {
		origFrom = madeHere
	}
	delete(t.made, new)
	for _, m := range []map[string]string{t.from, t.link} {
		for k, v := range m {
			if nk, ok := underPrefix(k, old, new); ok {
				delete(m, k)
				m[nk] = v
			}
		}
	}
	for k, v := range t.link {
		if nv, ok := underPrefix(v, old, new); ok {
			t.link[k] = nv
		}
		if t.link[k] == k {
			delete(t.link, k) // moved over its other name: one name is left
		}
	}
	for _, m := range []map[string]bool{t.paths, t.times, t.made} {
		for k, v := range m {
			if nk, ok := underPrefix(k, old, new); ok {
				delete(m, k)
				m[nk] = v
			}
		}
	}
	t.paths[old] = true
	t.paths[new] = true
	t.from[new] = origFrom
}

func underPrefix(p, old, new string) (string, bool) {
	if p == old {
		return new, true
	}
	if strings.HasPrefix(p, old+"/") {
		return new + p[len(old):], true
	}
	return "", false
}

// TestReplayAgreesWithTheNaiveOne: random journals over a small
// namespace (renames of files and directories, over each other and
// exchanged, links, writes, attribute changes) replay to the same paths,
// times, renames and links as the scan-everything replay did.
func TestReplayAgreesWithTheNaiveOne(t *testing.T) {
	names := []string{"a", "b", "c", "a/b", "a/c", "b/a", "a/b/c", "c/a/b", "d"}
	ops := []Op{OpCreate, OpMkdir, OpWrite, OpUnlink, OpRmdir, OpLink, OpRename, OpRename, OpRename, OpSetattr, OpSetxattr}
	for seed := int64(1); seed <= 500; seed++ {
		rng := rand.New(rand.NewSource(seed))
		recs := genRecords(rng, 1+rng.Intn(40), names, ops)
		got, want := replay(recs), naiveReplay(recs)
		for _, c := range []struct {
			name string
			eq   bool
		}{
			{"paths", maps.Equal(got.paths, want.paths)},
			{"times", maps.Equal(got.times, want.times)},
			{"from", maps.Equal(got.from, want.from)},
			{"link", maps.Equal(got.link, want.link)},
			{"made", maps.Equal(got.made, want.made)},
		} {
			if !c.eq {
				t.Fatalf("seed %d: %s differ\njournal: %v\ngot  paths %v times %v from %v link %v\nwant paths %v times %v from %v link %v",
					seed, c.name, fmt.Sprint(recs), got.paths, got.times, got.from, got.link, want.paths, want.times, want.from, want.link)
			}
		}
	}
}
