package layers_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sbxfs/sbxfs/commit"
	"github.com/sbxfs/sbxfs/layers"
)

// TestListingHistoriesCommit: the random histories of
// TestListingMatchesTheTrees, committed: the original must end as the
// sandbox's view was (type, permission bits, content, target). A wrong
// listing misleads a user; a wrong commit loses work. A fifth of
// -listing.seeds, from -listing.first (or -listing.seed alone, with the
// history of -listing.minimize's file if given).
func TestListingHistoriesCommit(t *testing.T) {
	first, n := *layers.FlagListingFirst, int64(max(1, *layers.FlagListingSeeds/5))
	if *layers.FlagListingSeed != 0 {
		first, n = *layers.FlagListingSeed, 1
	}
	var replay []string
	if *layers.FlagListingReplay != "" {
		b, err := os.ReadFile(*layers.FlagListingReplay)
		require.NoError(t, err)
		for _, l := range strings.Split(string(b), "\n") {
			if l = strings.TrimSpace(l); l != "" {
				replay = append(replay, l)
			}
		}
	}
	var failed []int64
	for seed := first; seed < first+n; seed++ {
		dir := filepath.Join(t.TempDir(), fmt.Sprint(seed))
		cfg := layers.Config{Upper: filepath.Join(dir, "upper"), Work: filepath.Join(dir, "work"), Lowers: []string{filepath.Join(dir, "lower")}}
		l, hist, _, ok := layers.ListingHistory(t, cfg, seed, replay)
		want := layers.MergedView(t, l)
		require.NoError(t, l.Close())
		if !ok {
			t.Fatalf("seed %d: the replay asked what the kernel refuses", seed)
		}
		x, err := commit.Prepare(cfg, commit.Options{})
		if err == nil {
			err = commit.Commit(x)
		}
		if d := diffMaps(want, treeOf(t, cfg.Lowers[0])); err != nil || len(d) > 0 {
			failed = append(failed, seed)
			if len(failed) <= 3 {
				t.Errorf("seed %d: the commit %v, the original differs from the view: %q\nhistory:\n  %s", seed, err, d, strings.Join(hist, "\n  "))
			}
		}
		os.RemoveAll(dir)
	}
	if len(failed) > 0 {
		t.Errorf("%d of %d seeds failed: %v", len(failed), n, failed)
	}
}

// TestListingHistoriesThatWereRefused: two sandboxes the commit
// refused though nobody changed the original (TestListingHistoriesCommit
// found 7 in seeds 5000 to 5999; minimized; each fails on the code before
// its fix):
//   - mv a/b q; mv q a/b; mkdir a/b/n; mv a/b/n a/b/c (over the
//     original's empty a/b/c); mv a m, read as R m <- a, R m/b <- a/b
//     (moved away and back), A m/b/c: the plan took the original's a/b,
//     moved aside first, for the object at m/b to back up whole, and then
//     refused the original's a/b/c, moved in with it: "m/b/c: made in the
//     original during the commit" (commit/plan.go, replacedAt; seed 5411);
//   - b/x/c/c and b/x/a/c exchanged; rm -r b; mv x b; mv b x (x a symlink):
//     the records of b's removed files went with the symlink to x, and
//     the change set named their removal at x/x/a/c, beneath a symlink:
//     "the original changed while the commit read it (a symlink on the
//     way)" (layers/changeset.go, classifyPath; seed 5796).
func TestListingHistoriesThatWereRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		seed int64 // ListingHistory's original: 1 is revLower
		ops  []string
	}{
		{"a directory renamed away and back beneath a renamed one", 1,
			[]string{"rename a/b q 0", "mvback q a/b", "mkdir a/b/n", "rename a/b/n a/b/c 0", "rename a m 0"}},
		{"removals carried off by a symlink", 5796,
			[]string{"rename b/x/c/c b/x/a/c 2", "rm -r b", "rename x b 0", "mvback b x"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			cfg := layers.Config{Upper: filepath.Join(dir, "upper"), Work: filepath.Join(dir, "work"), Lowers: []string{filepath.Join(dir, "lower")}}
			l, hist, _, ok := layers.ListingHistory(t, cfg, tc.seed, tc.ops)
			require.True(t, ok)
			require.Equal(t, tc.ops, hist, "every operation was made")
			want := layers.MergedView(t, l)
			require.NoError(t, l.Close())
			x, err := commit.Prepare(cfg, commit.Options{})
			if err == nil {
				err = commit.Commit(x)
			}
			require.NoError(t, err)
			require.Empty(t, diffMaps(want, treeOf(t, cfg.Lowers[0])))
		})
	}
}
