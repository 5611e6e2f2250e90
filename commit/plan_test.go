package commit

import (
	"math/rand"
	"slices"
	"strings"
	"testing"
)

// comparePaths compares bytes; it must order as a comparison of the
// paths' components does (a directory right before what is beneath it).
func TestComparePathsIsComponentOrder(t *testing.T) {
	r := rand.New(rand.NewSource(1))
	names := []string{"a", "b", "a-b", "a.b", "ab", "a b", "\xff", "é"}
	path := func() string {
		parts := make([]string, 1+r.Intn(3))
		for i := range parts {
			parts[i] = names[r.Intn(len(names))]
		}
		return strings.Join(parts, "/")
	}
	sign := func(n int) int { return min(max(n, -1), 1) }
	for i := 0; i < 20000; i++ {
		a, b := path(), path()
		want := slices.Compare(strings.Split(a, "/"), strings.Split(b, "/"))
		if got := comparePaths(a, b); sign(got) != sign(want) {
			t.Fatalf("comparePaths(%q, %q) = %d, components say %d", a, b, got, want)
		}
	}
}
