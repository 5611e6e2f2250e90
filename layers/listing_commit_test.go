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

// TestCommitANewDirectoryOverAnOriginalOneBeneathRenamedOnes: mv a/b q;
// mv q a/b; mkdir a/b/n; mv a/b/n a/b/c (over the original's empty
// a/b/c); mv a m. The change set reads R m <- a, R m/b <- a/b (moved
// away and back), A m/b/c; the commit moves a to m, the original's a/b/c
// with it, and then refuses: "m/b/c: made in the original during the
// commit; the original is unchanged". Nobody changed the original.
// Without the move away and back (no entry of m/b's own) the commit goes
// through. Found by TestListingHistoriesCommit, seed 5411 (and 5250,
// 5262, 5402, 5648, 5796, 5902 of 5000 to 5999 refused alike, not
// minimized). Not fixed yet: the commit refuses, it loses nothing.
func TestCommitANewDirectoryOverAnOriginalOneBeneathRenamedOnes(t *testing.T) {
	t.Skip("known: the commit refuses this sandbox (a false conflict); see the comment")
	dir := t.TempDir()
	cfg := layers.Config{Upper: filepath.Join(dir, "upper"), Work: filepath.Join(dir, "work"), Lowers: []string{filepath.Join(dir, "lower")}}
	l, _, _, ok := layers.ListingHistory(t, cfg, 1, []string{"rename a/b q 0", "mvback q a/b", "mkdir a/b/n", "rename a/b/n a/b/c 0", "rename a m 0"})
	require.True(t, ok)
	want := layers.MergedView(t, l)
	require.NoError(t, l.Close())
	x, err := commit.Prepare(cfg, commit.Options{})
	if err == nil {
		err = commit.Commit(x)
	}
	require.NoError(t, err)
	require.Empty(t, diffMaps(want, treeOf(t, cfg.Lowers[0])))
}
